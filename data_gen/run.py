"""The labeling run: settings, a Lightning prediction loop over batches of prompts, shards, manifest, resume.

``Trainer.predict`` drives the loop, so the same command runs on N GPUs or nodes under Lightning's DDP: every
rank labels every world_size-th batch and writes its own shards. Batches are fixed before the run (grouped by
split and category, sorted by length), each with a stable key; a shard named after its key exists only once
its batch is fully written, so a resumed run skips exactly the finished batches. They are labeled spread over the
splits and lengths (``labeling_order``), so the batches finished at any time are a sample of the whole run, which
``data_gen.snapshot`` turns into a dataset to train on while the run goes on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
import torch
from lightning_utilities.core import rank_zero as lightning_rank_zero
from pytorch_lightning.callbacks import BasePredictionWriter, TQDMProgressBar

from core import label_math as lm
from core import shards
from core.adapter import HFCausalLM, tap_layers
from core.errors import UserError
from core.llama_cpp import BACKENDS, MAX_SEQUENCES
from core.models import (DTYPES, ModelSpec, check_vocabularies, context_window, eos_token_ids, load_llama_model,
                         load_model, resolve_dtype)
from core.prompts import PromptConfig, input_digests, load_prompt_table, split_by_prompt, tokenize_prompt
from core.quantization import decode_numerics
from core.folder_lock import launching_process
from core.runfolder import RunFolder, read_json, write_json
from core.sampling import Sampling
from data_gen.labeler import SEQUENCES, Labeler, Prompt
from data_gen.llama_labeler import LlamaLabeler


class LabelingError(UserError):
    """A labeling run that cannot go on: its settings, its output folder or its prompts."""


class LabelingInterrupted(LabelingError):
    """The run stopped (Ctrl-C, or a DDP rank whose launcher is gone) before every batch was written; the same
    command resumes it."""


@dataclass
class LabelConfig:
    """Settings of one labeling run (``python -m data_gen --config configs/labels/….yaml``)."""

    draft: ModelSpec
    """The draft model (its last hidden state is the heads' input feature)."""
    target: ModelSpec
    """The target model."""
    prompts: PromptConfig = field(default_factory=PromptConfig)
    """Where the prompts come from."""
    sampling: Sampling = field(default_factory=Sampling)
    """How the target samples responses; also the label distributions' warping."""
    output_dir: str = "runs/labels/default"
    """Folder for shards and manifest (resumed when it holds an unfinished run with the same settings)."""
    response_source: Literal["target", "dataset"] = "target"
    """``target``: the target samples each response (on-policy, SpecDec++ §4.4). ``dataset``: teacher-force the
    dataset's reference answers instead (much faster; recorded in the manifest)."""
    mixing_ratio: float = 0.15
    """Share r of target tokens in the token-mixed response Z (``interleaved`` prefixes, ``token_mixed`` rows)."""
    categories: list[str] = field(default_factory=lambda: list(lm.CATEGORIES))
    """SPRINTER prefix categories to produce, in equal shares of prompts."""
    split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    """Shares of prompts in train/val/test."""
    batch_size: int = 8
    """Prompts per batch (one shard per batch)."""
    seed: int = 0
    """Seed of every random draw (splits, categories, samples)."""
    dtype: str = "auto"
    """Model dtype: float32, bfloat16, float16, or ``auto`` (the default, as the shipped configs and the eval say),
    resolved as the evaluation resolves it
    (``core.models.resolve_dtype``: bfloat16 on CUDA and on CPUs with native bf16, else float32), so that labels,
    heads and decoding read features of one precision."""
    backend: str = "transformers"
    """The runtime of both models (``core.llama_cpp.BACKENDS``; the pair file sets it): labels of one backend serve
    the heads and calibrations of that backend only (``data_gen.llama_labeler`` labels on llama.cpp)."""
    threads: int | None = None
    """CPU threads of a llama.cpp model (the pair file sets it; unused by transformers; all cores when unset)."""
    accelerator: str = "auto"
    """Lightning accelerator: auto (CUDA when present, else CPU), cpu, gpu."""
    devices: int | str = "auto"
    """Lightning devices (N GPUs run DDP, each rank writing its own shards)."""
    num_nodes: int = 1
    """Lightning nodes."""
    overwrite: bool = False
    """Delete an existing run in ``output_dir`` instead of resuming it."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.categories) - set(lm.CATEGORIES))
        if unknown or not self.categories:
            raise LabelingError(f"unknown categories {unknown}; known: {', '.join(lm.CATEGORIES)}")
        if not 0 <= self.mixing_ratio < 1:
            raise LabelingError(f"mixing_ratio must be in [0, 1), got {self.mixing_ratio}")
        if self.batch_size < 1:
            raise LabelingError(f"batch_size must be positive, got {self.batch_size}")
        if self.dtype not in DTYPES and self.dtype != "auto":
            raise LabelingError(f"unknown dtype {self.dtype!r}; choose auto or one of {sorted(DTYPES)}")
        if self.backend not in BACKENDS:
            raise LabelingError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.backend == "llama_cpp":
            if self.accelerator in ("gpu", "cuda") or self.devices not in ("auto", 1) or self.num_nodes != 1:
                raise LabelingError("backend llama_cpp labels in one process on the CPU: use accelerator auto or "
                                    "cpu, devices 1 and num_nodes 1")
            if self.sampling.max_new_tokens + 1 > MAX_SEQUENCES or self.batch_size > MAX_SEQUENCES:
                raise LabelingError(f"backend llama_cpp labels at most {MAX_SEQUENCES - 1} new tokens a prompt (a "
                                    f"sequence per candidate) and {MAX_SEQUENCES} prompts a batch, got max_new_tokens "
                                    f"{self.sampling.max_new_tokens} and batch_size {self.batch_size}")
        if self.threads is not None and self.threads < 1:
            raise LabelingError(f"threads must be at least 1, got {self.threads}")
        # Lightning's own checks of these come after the run's record is written, as a traceback
        if self.accelerator not in ("auto", "cpu", "gpu", "cuda"):
            raise LabelingError(f"accelerator must be auto, cpu, gpu or cuda, got {self.accelerator!r}")
        if self.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            raise LabelingError(f"accelerator: {self.accelerator}, but torch sees no CUDA GPU on this machine; use "
                                "auto or cpu")
        if self.devices != "auto" and not (isinstance(self.devices, int) and self.devices >= 1):
            raise LabelingError(f"devices must be auto or a count of at least 1, got {self.devices!r}")
        if self.num_nodes < 1:
            raise LabelingError(f"num_nodes must be at least 1, got {self.num_nodes}")

    @property
    def model_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved for the device the run labels on."""
        gpu = self.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
        return resolve_dtype(self.dtype, torch.device("cuda" if gpu else "cpu"))

    @classmethod
    def from_record(cls, record: dict, output_dir: str | Path) -> "LabelConfig":
        """The settings of the run that wrote ``record`` (its ``run.json``: ``settings()`` and the inputs) into
        ``output_dir``."""
        d = {k: v for k, v in record.items() if k not in ("schema_version", "inputs", MODEL_FILES)}
        return cls(**{**d, "draft": recorded_model(record, "draft"), "target": recorded_model(record, "target"),
                      "prompts": PromptConfig(**d["prompts"]), "sampling": Sampling(**d["sampling"]),
                      "split_fractions": tuple(d["split_fractions"]), "output_dir": str(output_dir)})

    def settings(self) -> dict:
        """What a resume must match (everything that changes the rows, the shards' schema included)."""
        d = dataclasses.asdict(self)
        for k in ("output_dir", "accelerator", "devices", "num_nodes", "overwrite"):
            d.pop(k)
        d.pop("threads")  # how fast, not what: the rows do not depend on it
        if self.backend == "transformers":  # named only where it is another, as runs before it was a setting
            d.pop("backend")
        for model in (d["draft"], d["target"]):  # a check of the input, not a setting (the manifest has the digest)
            model.pop("gguf_sha256")
            if model["tokenizer"] is None:  # named only where set, as runs before it was a setting
                model.pop("tokenizer")
        d["dtype"] = self.model_dtype
        return {"schema_version": shards.SCHEMA_VERSION, **d}


# ------------------------------------------------------------------ batches
def make_batches(records: list[dict], batch_size: int) -> list[dict]:
    """Fixed batches keyed ``split/category-NNNN``: one category per batch, similar lengths together."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["split"], r["prompt"].category), []).append(r)
    batches = []
    for (split, cat), rs in sorted(groups.items()):
        rs.sort(key=lambda r: (-len(r["prompt"].input_ids), r["prompt"].prompt_id))
        for i in range(0, len(rs), batch_size):
            chunk = rs[i : i + batch_size]
            batches.append({"key": f"{split}/{cat}-{i // batch_size:04d}", "prompts": [r["prompt"] for r in chunk]})
    return batches


GOLDEN = (5 ** 0.5 - 1) / 2


def labeling_order(batches: list[dict]) -> list[dict]:
    """The order a run labels ``batches`` in (the same on every resume and rank): each split and category's batches
    in a golden-ratio sequence through its longest-first list, the groups interleaved in proportion to their sizes.
    So the batches finished at any time cover every split and the whole range of lengths, rather than one split's
    longest prompts first."""
    groups: dict[str, list[dict]] = {}
    for b in batches:
        groups.setdefault(b["key"].rsplit("-", 1)[0], []).append(b)
    timed = []
    for group in groups.values():
        spread = sorted(range(len(group)), key=lambda i: ((i * GOLDEN) % 1, i))
        timed += [((rank + 0.5) / len(group), group[i]["key"], group[i]) for rank, i in enumerate(spread)]
    return [b for _, _, b in sorted(timed, key=lambda t: t[:2])]


class BatchList(torch.utils.data.Dataset):
    def __init__(self, batches: list[dict]):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict:
        return self.batches[i]


# ---------------------------------------------------------------- lightning
class LabelingModule(pl.LightningModule):
    """Holds draft and target; ``predict_step`` labels one batch of prompts."""

    def __init__(self, draft, target, labeler_kwargs: dict):
        super().__init__()
        self.draft, self.target = draft, target
        self.labeler_kwargs = labeler_kwargs

    def on_predict_start(self) -> None:
        self.labeler = new_labeler(self.draft, self.target, self.labeler_kwargs)

    def predict_step(self, batch, batch_idx):
        return {"key": batch["key"], "n_prompts": len(batch["prompts"]), "cols": self.labeler.label(batch["prompts"], self.device)}


def labeler_settings(cfg: LabelConfig, target, tok) -> dict:
    """The keyword arguments of a labeler for ``cfg``'s run of a loaded pair (``load_pair``)."""
    return dict(sampling=cfg.sampling, seed=cfg.seed, eos_token_ids=eos_token_ids(target, tok),
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                mixing_ratio=cfg.mixing_ratio)


def new_labeler(draft, target, settings: dict):
    """The labeler of the pair's backend (``LlamaLabeler`` for llama.cpp models, else ``Labeler``)."""
    if is_llama(draft):
        return LlamaLabeler(draft, target, **settings)
    return Labeler(HFCausalLM(draft), HFCausalLM(target), mask_dtype=next(draft.parameters()).dtype, **settings)


class ShardWriter(BasePredictionWriter):
    """Writes each batch's rows as one shard, atomically, as soon as the batch is labeled.

    A rank started by another process (Lightning's DDP launcher) stops before its next batch once that process is
    gone, so that no orphaned rank labels on, and writes shards, after the run was killed."""

    def __init__(self, out_dir: Path, sizes: dict[str, int]):
        super().__init__(write_interval="batch")
        self.out_dir, self.sizes = out_dir, sizes
        self._launcher: int | None = None

    def on_predict_start(self, trainer, pl_module) -> None:
        self._launcher = os.getppid() if trainer.global_rank > 0 else None

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self._launcher is not None and os.getppid() != self._launcher:
            raise LabelingInterrupted(f"rank {trainer.global_rank}: the process that launched this run is gone; "
                                      "stopping (the same command resumes the run)")

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        shard = self.out_dir / f"{prediction['key']}.arrow"
        shards.write_sequences(shards.sequences_path(shard), prediction["cols"][SEQUENCES])
        shards.write_shard(shard, prediction["cols"], self.sizes)  # last: the batch is done


class LabelProgress(TQDMProgressBar):
    """Lightning's progress bar, with prompts/s and labeled tokens/s."""

    def on_predict_epoch_start(self, trainer, pl_module) -> None:
        super().on_predict_epoch_start(trainer, pl_module)
        self._t0, self._prompts, self._tokens = time.perf_counter(), 0, 0

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._prompts += outputs["n_prompts"]
        self._tokens += len(outputs["cols"]["prompt_id"])
        dt = max(time.perf_counter() - self._t0, 1e-9)
        self.predict_progress_bar.set_postfix(prompts_s=f"{self._prompts / dt:.2f}", tok_s=f"{self._tokens / dt:.1f}")
        super().on_predict_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)


# ---------------------------------------------------------------------- run
MANIFEST = "manifest.json"
RUN_FILE = "run.json"
"""The run's settings and input digests, written before its first shard: a folder holding it is a labeling run's."""


PAIR_FILE = "pair.json"
"""The pair as the run loaded it, written beside ``run.json`` when the run starts: ``load_pair``'s identities, the
draft's layer count and the context both models read, with the ``run.json`` they were loaded for. A snapshot reads
it instead of loading both models again."""


def pair_fields(models: dict, draft, target) -> dict:
    """What ``PAIR_FILE`` records of a loaded pair (``load_pair``'s models and identities)."""
    return {"models": models, "draft_layers": None if is_llama(draft) else draft.config.num_hidden_layers,
            "context": min(context_window(draft), context_window(target))}


def write_pair_record(out: Path, record: dict, models: dict, draft, target) -> None:
    write_json(out / PAIR_FILE, {"run": record, **pair_fields(models, draft, target)})


def read_pair_record(out: Path, record: dict) -> dict | None:
    """The pair the run of ``record`` (its ``run.json``) loaded; None when the run wrote none (it started before the
    record was kept), wrote it for another ``run.json``, or it is damaged."""
    try:
        pair = json.loads((out / PAIR_FILE).read_text())
    except (OSError, ValueError):  # none, or damaged: what it records is read from the models again
        return None
    return pair if isinstance(pair, dict) and pair.get("run") == record else None


MODEL_FILES = "model_files"
"""``run.json``'s record of each local model path as an absolute one, so that a folder made with relative paths can
be audited or snapshotted from another directory; not a setting (a resume from elsewhere is the same run)."""


def run_differences(previous: dict, record: dict) -> list[str]:
    """The settings, and the inputs, in which ``previous`` (a ``run.json``) differs from ``record``."""
    changed = sorted(k for k in record if k not in ("inputs", MODEL_FILES) and previous.get(k) != record[k])
    old = previous.get("inputs") or {}
    changed += [f"inputs.{k} (content changed)" for k in record["inputs"] if old and old.get(k) != record["inputs"][k]]
    if not old:
        changed.append("inputs (not recorded: labeled before input digests were kept)")
    return changed


def run_record(cfg: LabelConfig, inputs: dict) -> dict:
    """``run.json``: the settings, and the digests of the inputs, that a resume must match."""
    files = {role: str(Path(spec.path).resolve()) for role, spec in (("draft", cfg.draft), ("target", cfg.target))
             if spec.path and Path(spec.path).exists()}
    return json.loads(json.dumps({**cfg.settings(), "inputs": inputs, MODEL_FILES: files}))  # tuples -> lists


def recorded_model(record: dict, role: str) -> ModelSpec:
    """The ``role`` model of a ``run.json``: its spec, with a relative path that does not exist from here replaced
    by the absolute one the run recorded (``MODEL_FILES``)."""
    spec = ModelSpec(**record[role])
    recorded = record.get(MODEL_FILES, {}).get(role)
    if spec.path and not Path(spec.path).exists() and recorded and Path(recorded).exists():
        spec = dataclasses.replace(spec, path=recorded)
    return spec


def previous_run(out: Path) -> dict | None:
    """The ``run.json`` of the run in ``out``, None when there is none."""
    path = out / RUN_FILE
    if not path.exists():
        return None
    previous = read_json(path, "pass --overwrite true to start over, or choose another output_dir")
    if not isinstance(previous, dict) or not {"draft", "target", "inputs"} <= set(previous):
        raise LabelingError(f"{path} is not a labeling run's record; pass --overwrite true to start over (where the "
                            "folder holds a labeling run's dataset), or choose another output_dir")
    return previous


def _refuse_other_run(out: Path, cfg: LabelConfig, inputs: dict) -> None:
    """Refuse a folder labeled with other settings or from other inputs, unless asked to start over, and shards of
    this folder's whose run's record is gone. Whose folder it is, ``RunFolder.check`` has decided."""
    if cfg.overwrite:
        return
    previous = previous_run(out)
    if previous is not None:
        changed = run_differences(previous, run_record(cfg, inputs))
        if changed:
            raise LabelingError(
                f"{out} holds a labeling run with other settings or inputs ({', '.join(changed)}); "
                "pass --overwrite true or choose another output_dir"
            )
    elif shards.dataset_files(out) or (out / MANIFEST).exists():
        raise LabelingError(f"{out} holds shards of a labeling run whose {RUN_FILE} is gone, so their settings are "
                            "unknown; pass --overwrite true to start over, or choose another output_dir")


def label_folder(out: Path) -> RunFolder:
    """A labeling run's output folder: its record, its pair, its manifest, and every shard with its record."""
    return RunFolder(out, "labels", "--output_dir",
                     (RUN_FILE, PAIR_FILE, MANIFEST, *(f"{split}/{sub}*.arrow{ext}" for split in shards.SPLITS
                                                      for sub in ("", "sequences/") for ext in ("", ".json"))))


def _refuse_unlisted(out: Path, names, manifest: bool) -> None:
    """Refuse shards in the dataset's folders that this run does not write (``names``: the manifest's, or this
    run's batches'): a reader would take their rows for the dataset's."""
    stray = shards.unlisted_shards(out, names)
    if stray:
        more = f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""
        whose = "listed in the manifest" if manifest else "a batch of this run"
        raise LabelingError(f"{stray[0]}{more} is not {whose}: a reader would take its rows for the dataset's; move it "
                            "out of the dataset's folders and run again")


def build_records(cfg: LabelConfig, tokenizer, context: int, table: list[dict] | None = None) -> list[dict]:
    """Every prompt as a record with its split and SPRINTER category; ``table``: the prompt rows, if read already."""
    if table is None:
        table = load_prompt_table(cfg.prompts, need_response=cfg.response_source == "dataset")
    splits = split_by_prompt(len(table), cfg.split_fractions, cfg.seed)
    records = []
    for split in shards.SPLITS:
        idx = [i for i, s in enumerate(splits) if s == split]
        cats = lm.assign_categories(len(idx), tuple(cfg.categories), torch.Generator().manual_seed(cfg.seed + 1))
        for i, cat in zip(idx, cats):
            ids = tokenize_prompt(tokenizer, table[i]["text"], cfg.prompts.chat_template)
            if len(ids) + cfg.sampling.max_new_tokens > context:
                raise LabelingError(
                    f"prompt {i} has {len(ids)} tokens; with max_new_tokens={cfg.sampling.max_new_tokens} it exceeds "
                    f"the context window of {context} tokens"
                )
            if len(ids) < 2 and cat == "original":
                raise LabelingError(f"prompt {i} has fewer than 2 tokens: nothing to label in its original prefix")
            resp = None
            if cfg.response_source == "dataset":
                resp = tokenizer(table[i]["response"] or "", add_special_tokens=False)["input_ids"]
                resp = resp or [tokenizer.eos_token_id]
            records.append({"split": split, "prompt": Prompt(i, ids, cat, resp)})
    return records


def run_labels(cfg: LabelConfig, *, callbacks: list | None = None, quiet: bool = False) -> dict:
    """Label (or resume labeling) and write the manifest; return it. Every input is read and checked (prompts,
    models' paths and digests) before the output folder is touched, and the folder is held (``core.runfolder``) while
    the run reads and writes it."""
    t_start = time.perf_counter()
    table = load_prompt_table(cfg.prompts, need_response=cfg.response_source == "dataset")
    inputs = input_digests(table, cfg.response_source == "dataset", {"draft": cfg.draft, "target": cfg.target})
    out = Path(cfg.output_dir)
    folder = label_folder(out)
    folder.check(beside=cfg.overwrite)  # before the lock creates the folder
    with folder.hold("a labeling run"):
        folder.check(beside=cfg.overwrite)
        manifest = _finished_run(out, cfg, inputs, quiet)
        if manifest is None:
            _refuse_other_run(out, cfg, inputs)  # before minutes of model loading
            draft, target, tok, models = load_pair(cfg)
            records = build_records(cfg, tok, min(context_window(draft), context_window(target)), table)
            batches = make_batches(records, cfg.batch_size)
            if launching_process():  # the ranks it starts write into the folder it prepared
                if cfg.overwrite:
                    folder.clear()
                folder.start([RUN_FILE, PAIR_FILE, MANIFEST,
                              *(p.as_posix() for b in batches for p in shards.batch_files(b["key"]))])
                folder.clean_temporaries()  # what a killed run left half-written
                write_json(out / RUN_FILE, run_record(cfg, inputs))
                write_pair_record(out, run_record(cfg, inputs), models, draft, target)
                _refuse_unlisted(out, [p.as_posix() for b in batches for p in shards.batch_files(b["key"])],
                                 manifest=False)
            if not _label_batches(cfg, out, draft, target, tok, models, batches, callbacks, quiet):
                return {}  # another rank: rank 0 writes the manifest
            _check_complete(out, batches)
            manifest = write_run_manifest(out, cfg, models, inputs, batches,
                                          pair_fields(models, draft, target)["draft_layers"],
                                          seconds=time.perf_counter() - t_start)
    if not quiet:
        print_summary(manifest, out)
    return manifest


def write_run_manifest(out: Path, cfg: LabelConfig, models: dict, inputs: dict, batches: list[dict],
                       draft_layers: int | None, seconds: float, snapshot: dict | None = None) -> dict:
    """The manifest of the dataset of ``batches`` in ``out``, labeled by a run of ``cfg`` from ``inputs``;
    ``draft_layers`` None where the rows have no tapped layers (llama.cpp)."""
    count = sum(len(b["prompts"]) for b in batches)
    return shards.write_manifest(
        out, models=models, prompts={**dataclasses.asdict(cfg.prompts), "count": count},
        response_source=cfg.response_source, sampling=dataclasses.asdict(cfg.sampling), inputs=inputs,
        keys=[b["key"] for b in batches],
        mixing_ratio=cfg.mixing_ratio, categories=cfg.categories, seed=cfg.seed,
        settings_sha256=hashlib.sha256(json.dumps(cfg.settings(), sort_keys=True).encode()).hexdigest(),
        seconds=round(seconds, 1), tapped_layers=tap_layers(draft_layers) if draft_layers else None,
        snapshot=snapshot,
    )


def _finished_run(out: Path, cfg: LabelConfig, inputs: dict, quiet: bool) -> dict | None:
    """The manifest of a finished run with these settings and inputs in ``out`` (nothing to do), else None. A
    finished run whose shards fail verification, or whose manifest is unreadable, is reopened: its manifest goes,
    and its damaged shards are redone; shards its manifest does not list are refused."""
    if cfg.overwrite or not (out / MANIFEST).exists():
        return None
    previous = previous_run(out)
    if previous is None or run_differences(previous, run_record(cfg, inputs)):
        return None
    try:
        manifest = shards.read_manifest(out, verify=False)
    except UserError as e:  # not JSON: written again from the shards
        problems = [str(e)]
    else:
        if "shards" in manifest:  # (a manifest from before shards were listed is written again)
            _refuse_unlisted(out, manifest["shards"], manifest=True)
        problems = shards.verify_shards(out, manifest)
        if not problems:
            return manifest
    if not quiet:
        print(f"{out}: {len(problems)} problem(s) with the shards, first: {problems[0]}; redoing them")
    (out / MANIFEST).unlink(missing_ok=True)
    return None


def finished(shard: Path) -> bool:
    """Whether a batch's shard and its sequences are written and intact (read only)."""
    seqs = shards.sequences_path(shard)
    try:
        return shard.exists() and shards.shard_problem(shard) is None and seqs.exists() \
            and shards.shard_problem(seqs) is None
    except FileNotFoundError:  # removed while it was read (another rank, or the run a snapshot reads)
        return False


def _done(shard: Path) -> bool:
    """Whether a batch's shard and its sequences are written and intact; a damaged shard is removed, so that the
    batch is labeled again."""
    if not shard.exists():
        return False
    if finished(shard):
        return True
    shard.unlink(missing_ok=True)  # every rank checks the same list
    return False


LLAMA_WINDOW = 2048
"""The longest prompt + response a llama.cpp labeling run reads (a longer prompt is refused before any work): its
contexts hold a batch of such sequences. The transformers labeler reads up to the models' own window."""


def is_llama(model) -> bool:
    return getattr(model, "backend", None) == "llama_cpp"


def load_pair(cfg: LabelConfig):
    """(draft, target, the target's tokenizer, {"draft": identity, "target": identity}), one vocabulary checked.
    An int8 model computes each token as the decoder's steps do (``core.quantization.decode_numerics``), so that a
    row does not depend on the batch it is labeled in. On llama.cpp each model's context holds a batch of
    ``LLAMA_WINDOW``-token sequences, and the draft's one sequence per candidate of a prompt besides."""
    if cfg.backend == "llama_cpp":
        threads = cfg.threads or os.cpu_count() or 1
        n_ctx = cfg.batch_size * LLAMA_WINDOW
        # the draft holds a prompt's candidates beside its context, in cells its sequences share
        draft, d_tok, d_id = load_llama_model(cfg.draft, threads, n_ctx + cfg.sampling.max_new_tokens,
                                              sequences=max(cfg.batch_size, cfg.sampling.max_new_tokens + 1),
                                              shared_cells=True)
        target, t_tok, t_id = load_llama_model(cfg.target, threads, n_ctx, sequences=cfg.batch_size)
        for model in (draft, target):
            model.config.max_position_embeddings = min(model.config.max_position_embeddings, LLAMA_WINDOW)
        check_vocabularies(d_id, t_id, same_tokens=d_tok.get_vocab() == t_tok.get_vocab())
        return draft, target, t_tok, {"draft": d_id, "target": t_id}
    draft, d_tok, d_id = load_model(cfg.draft, cfg.model_dtype)
    target, t_tok, t_id = load_model(cfg.target, cfg.model_dtype)
    draft, target = decode_numerics(draft), decode_numerics(target)
    check_vocabularies(d_id, t_id, same_tokens=d_tok.get_vocab() == t_tok.get_vocab())
    return draft, target, t_tok, {"draft": d_id, "target": t_id}


def _no_ctrl_c_line(record: logging.LogRecord) -> bool:
    """A log filter: drops Lightning's "Detected KeyboardInterrupt, attempting graceful shutdown", which would come
    before the command's own line about the Ctrl-C (``LabelingInterrupted``)."""
    return "Detected KeyboardInterrupt" not in record.getMessage()


def _label_batches(cfg: LabelConfig, out: Path, draft, target, tok, models: dict, batches: list[dict],
                   callbacks: list | None, quiet: bool) -> bool:
    """Label the batches without a shard in ``out`` through ``Trainer.predict``; True on rank 0."""
    todo = [b for b in labeling_order(batches) if not _done(out / f"{b['key']}.arrow")]
    module = LabelingModule(draft, target, labeler_settings(cfg, target, tok))
    llama = is_llama(draft)
    sizes = shards.vector_sizes(models["draft"]["hidden_size"], models["target"]["hidden_size"], tapped=not llama)
    trainer = pl.Trainer(
        accelerator="cpu" if llama else cfg.accelerator,
        devices=1 if llama else cfg.devices,
        num_nodes=cfg.num_nodes,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        enable_progress_bar=not quiet,
        callbacks=[ShardWriter(out, sizes), *([] if quiet else [LabelProgress()]),
                   *(callbacks or [])],
    )
    if not quiet:
        n_prompts = sum(len(b["prompts"]) for b in batches)
        print(f"labeling {n_prompts} prompts in {len(batches)} batches ({len(batches) - len(todo)} already done)")
    if todo:
        # every rank labels every world_size-th remaining batch (the list is the same on all ranks)
        rank, world = trainer.global_rank, trainer.world_size
        loader = torch.utils.data.DataLoader(BatchList(todo[rank::world]), batch_size=None, collate_fn=lambda b: b)
        lightning_log = lightning_rank_zero.log  # where Lightning says it caught a Ctrl-C: ours says it instead
        lightning_log.addFilter(_no_ctrl_c_line)
        try:
            trainer.predict(module, loader, return_predictions=False)
        except SystemExit as e:
            if not isinstance(e.__context__, KeyboardInterrupt):  # Lightning's exit on Ctrl-C, not another one
                raise
            # Lightning answers Ctrl-C with exit status 1 and leaves SIGINT ignored
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise LabelingInterrupted("stopped by Ctrl-C; every finished batch is kept: run the same command again "
                                      "to resume") from None
        finally:
            lightning_log.removeFilter(_no_ctrl_c_line)
        trainer.strategy.barrier()
    return trainer.global_rank == 0


def _check_complete(out: Path, batches: list[dict]) -> None:
    missing = [b["key"] for b in batches if not (out / f"{b['key']}.arrow").exists()]
    if missing:
        raise LabelingInterrupted(
            f"stopped with {len(missing)} of {len(batches)} batches left (first: {missing[0]}); "
            "run the same command again to resume"
        )


def print_summary(manifest: dict, out: Path) -> None:
    print(f"labels in {out} (response source: {manifest['response_source']})")
    print(f"{'split':<6} {'prompts':>8} {'rows':>8} {'loss rows':>10} {'mean acceptance':>16} {'mean 1-TV':>10}")
    for split, s in manifest["splits"].items():
        acc, tv = (f"{s[k]:.4f}" if s.get(k) is not None else "-" for k in ("mean_acceptance", "mean_1_minus_tv"))
        print(f"{split:<6} {s['prompts']:>8} {s['rows']:>8} {s['loss_rows']:>10} {acc:>16} {tv:>10}")
    print(f"took {manifest['seconds']:.0f} s")

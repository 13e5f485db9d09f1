"""Settings of one evaluation run (``specheads eval --config configs/eval/humaneval.yaml``)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse import ArgumentParser

from core.cache import file_sha256
from core.arguments import parse_settings, settings_parser
from core.errors import UserError
from core.backends import BACKENDS, backend
from evaluation.llama_peer import FAMILIES as LLAMA_FAMILIES
from evaluation.llama_peer import WALL as LLAMA_WALL
from evaluation.llama_peer import LlamaPeer
from core.models import ModelSpec, resolve_device, resolve_dtype
from core.prompts import PromptConfig
from core.sampling import Sampling
from decoding.costs import CostModel
from decoding.policies import POLICIES, head_family
from decoding.state import DECODERS
from evaluation.latency import latency_fits
from evaluation.rundir import RunDir

HF_FAMILY = "hf_assisted"
"""Runs of Hugging Face's ``target.generate(assistant_model=draft)`` with its own stop rules (the external peer)."""
HF_TARGET_ONLY = "hf_target_only"
"""Runs of the target's own ``generate()`` with no draft."""
HF_HEAD_FAMILIES = {role: f"hf_{head_family(role)}" for role in ("stop", "verifier")}
"""Runs of ``generate()`` with an exported head (``decoding.runtimes.hf``), by the head's role: ``hf_`` and the
family of our decoder that runs that head (``hf_specdecpp``, ``hf_sprinter``)."""
HF_GOODPUT = "hf_goodput"
"""Runs of ``generate()`` with the goodput stop (``decoding.runtimes.hf``) on a stop head's or a calibrated
confidence's estimates: ``hf_`` and the family of our decoder that runs that stop (``goodput``)."""
PEER_FAMILIES = (HF_FAMILY, HF_TARGET_ONLY, *HF_HEAD_FAMILIES.values(), HF_GOODPUT, *LLAMA_FAMILIES)
"""Every run of transformers' ``generate()``: peers, not policies of our decoder."""
ESTIMATE_FILES = ("head", "calibration")
"""The keyword arguments of a policy that name a file its decisions read: an exported head, goodput's calibrated
confidence."""


class EvalError(UserError):
    """An evaluation setting or input that cannot be used."""


@dataclass
class Mode:
    """One sampling setting under which the policies are compared."""

    name: str
    """Short name used in run keys and the report (``sample``, ``greedy``)."""
    temperature: float = 1.0
    """Softmax temperature (0 = greedy)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    families: list[str] | None = None
    """Policy families (and peers: ``hf_assisted``, ``hf_target_only``, ``hf_specdecpp``, ``hf_sprinter``,
    ``hf_goodput``) run in this mode; None = every configured one."""

    def __post_init__(self) -> None:
        self.sampling(1)  # its settings checked now (a NaN temperature too), not when the first prompt decodes
        unknown = sorted(set(self.families or ()) - set(POLICIES) - set(PEER_FAMILIES))
        if unknown:
            raise EvalError(f"mode {self.name!r}: unknown families {unknown}; "
                            f"known: {', '.join([*POLICIES, *PEER_FAMILIES])}")

    def sampling(self, max_new_tokens: int) -> Sampling:
        return Sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                        max_new_tokens=max_new_tokens)

    def runs(self, family: str) -> bool:
        return self.families is None or family in self.families

    def samples_like(self, sampling: dict) -> bool:
        """Whether this mode warps p and q as ``sampling`` (a labels manifest's ``sampling``) did."""
        return (self.temperature, self.top_k, self.top_p) == (sampling["temperature"], sampling["top_k"],
                                                              sampling["top_p"])


def _finite_or_not_a_number(value: Any) -> bool:
    """False for a number a policy cannot take: a float that is not finite, or text that reads as a number (``nan``,
    ``Infinity``, ``'0.5'``), which YAML leaves a string; True for anything else (a finite number, a file's path)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return True
        return False
    return not isinstance(value, float) or math.isfinite(value)


@dataclass
class Sweep:
    """One policy family: fixed keyword arguments plus a grid swept over (every combination is one setting)."""

    family: str
    """A registered policy (``decoding.policies.POLICIES``); the report lists families in this order."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed unchanged, e.g. ``{head: checkpoints/heads/sprinter_lam1.safetensors}``; the
    family's own setting (``k`` of ``sd``) given here runs as a one-point grid (``sd[k=4]``)."""
    grid: dict[str, list[Any]] = field(default_factory=dict)
    """Keyword arguments swept, e.g. ``{k: [2, 4, 6]}``; ``null`` means the policy's default (a head file's own
    threshold). With more than one setting the lowest-latency one represents the family in the table."""

    def __post_init__(self) -> None:
        if self.family not in POLICIES:
            raise EvalError(f"unknown policy family {self.family!r}; known: {', '.join(POLICIES)}")
        empty = [k for k, v in self.grid.items() if not isinstance(v, list) or not v]
        if empty:
            raise EvalError(f"{self.family}: grid entries {empty} must be non-empty lists")
        given = [*self.fixed.items(), *((k, v) for k, values in self.grid.items() for v in values)]
        for key, value in given:  # NaN passes every bound a policy checks; YAML reads Infinity as text
            if not _finite_or_not_a_number(value):
                raise EvalError(f"{self.family}: {key} must be a finite number, got {value!r}")
        setting = POLICIES.get_class(self.family).setting
        if setting in self.fixed:
            # a run's name holds its family's setting (``sd[k=4]``), where the choice of K, h, τ and the report
            # read it: a fixed setting is a one-point grid
            if setting in self.grid:
                raise EvalError(f"{self.family}: {setting} is both fixed and swept; give it in one of them")
            self.grid = {setting: [self.fixed[setting]], **self.grid}
            self.fixed = {k: v for k, v in self.fixed.items() if k != setting}

    def settings(self) -> list[dict[str, Any]]:
        """Every swept combination, as keyword arguments (without ``fixed``)."""
        keys = list(self.grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(self.grid[k] for k in keys))]


@dataclass
class HFPeer:
    """Hugging Face assisted generation on the same prompts."""

    enabled: bool = True
    """Run it at all."""
    defaults: bool = True
    """One run with the draft's generation-config defaults (20 assistant tokens, confidence threshold 0.4)."""
    confidence_thresholds: list[float] = field(default_factory=lambda: [0.2, 0.6])
    """One run per ``assistant_confidence_threshold`` (other settings at their defaults)."""
    same_k_as_sd: bool = True
    """One run with a constant schedule of K = the best fixed-K SD's K and no confidence stop (the like-for-like
    comparison of our SD with HF's)."""
    target_only: bool = False
    """One run of the target's own ``generate()`` with no draft (``hf_target_only``: the baseline of the runs
    below)."""
    heads: list[str] = field(default_factory=list)
    """Exported heads run inside ``generate()`` by ``decoding.runtimes.hf``: a stop head as ``hf_specdecpp`` (SpecDec++ in
    transformers' assisted decoding), a verifier as ``hf_sprinter``."""
    thresholds: dict[str, float] = field(default_factory=dict)
    """A head's threshold (h of a stop head, τ of a verifier) by file, in place of the one exported with it."""
    same_threshold_as_ours: bool = True
    """A head not in ``thresholds`` takes the threshold of our decoder's chosen run of the same head in the mode
    (the simulator's pick with ``select_by: simulated``), so both loops run one stop rule; with no such run, or
    False, the one exported with it. Likewise a ``goodput`` entry takes λ of our decoder's chosen ``goodput`` run
    of the same file, else target-only's rate 1 / verify(1) under ``timing``."""
    goodput: list[str] = field(default_factory=list)
    """The goodput stop inside ``generate()`` (``hf_goodput``, ``decoding.runtimes.hf.HeadDecoding`` with costs), one
    run per file: a stop head (``.safetensors``) whose sigmoid estimates each candidate's acceptance, or a calibrated
    confidence of the draft (``.json``, ``make calibrate``). Needs ``timing``."""
    timing: str | None = None
    """A ``make bench-timing`` JSON: the costs (a draft step, a verification of m tokens) the ``goodput`` runs price
    a round with."""

    def __post_init__(self) -> None:
        if self.goodput and self.timing is None:
            raise EvalError("hf_peer.goodput needs hf_peer.timing (a `make bench-timing` JSON): the goodput stop "
                            "prices each round with its costs")
        self.goodput_sources()  # a file of neither kind is a one-line error when the config loads

    def goodput_sources(self) -> list[tuple[str, str]]:
        """(``head`` or ``calibration``, file) of each ``goodput`` entry, told apart by the file's suffix."""
        kinds = {".safetensors": "head", ".json": "calibration"}
        out = []
        for path in map(str, self.goodput):
            kind = kinds.get(Path(path).suffix)
            if kind is None:
                raise EvalError(f"hf_peer.goodput: {path} is neither a stop head (.safetensors) nor a calibrated "
                                "confidence (.json, `make calibrate`)")
            out.append((kind, path))
        return out


@dataclass
class Goals:
    """The targets the report checks its measurements against (its ``Goals`` table)."""

    sd_vs_hf: float = 1.0
    """Our fixed-K SD's tokens/s over HF assisted generation's at the same K, in the greedy mode."""
    specdecpp_vs_sd: float = 1.10
    """SpecDec++'s tokens/s over the best fixed-K SD's."""
    sprinter_vs_sd: float = 1.6
    """SPRINTER's tokens/s over SD's."""
    sprinter_pass_drop: float = 0.03
    """The most pass@1 SPRINTER may lose against SD."""
    hf_head_vs_hf: float = 1.05
    """``generate()`` with our SpecDec++ head, or with the goodput stop, over transformers' best own rule
    (tokens/s), per mode."""
    runtime_overhead: float = 0.10
    """The most our decoder may be faster than ``generate()`` with the same head (tokens/s ratio − 1)."""
    hf_sprinter_vs_target: float = 1.0
    """``generate()`` with a SPRINTER verifier over the target's own ``generate()`` (tokens/s)."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            share = name in ("sprinter_pass_drop", "runtime_overhead")
            if not (isinstance(value, (int, float)) and (0 <= value if share else 0 < value) and value < math.inf):
                raise EvalError(f"goals.{name} must be {'a share of 0 or more' if share else 'a ratio above 0'}, "
                                f"got {value!r}")


@dataclass
class EvalConfig:
    """Settings of one evaluation run: the pair, the prompts, the sampling modes, the policies and their grids."""

    draft: ModelSpec
    """The draft model (the heads read its last hidden state); same entry as the labeling config."""
    target: ModelSpec
    """The target model; same entry as the labeling config."""
    policies: list[Sweep]
    """The policy families and their grids, each ``{family: sd, fixed: {…}, grid: {k: [2, 4, 6]}}``
    (``--policies.help`` lists a family's fields; the families: ``decoding.policies.POLICIES``), usually given in
    the ``--config`` file."""
    prompts: PromptConfig = field(default_factory=lambda: PromptConfig(limit=20))
    """Where the prompts come from (``humaneval`` enables pass@1; ``limit`` keeps the CPU run short)."""
    modes: list[Mode] = field(default_factory=lambda: [Mode("sample", 1.0)])
    """Sampling settings; every family runs in every mode unless the mode lists its families."""
    max_new_tokens: int = 128
    """Response length cap of every run."""
    sweep_prompts: int | None = None
    """Sweeps (more than one setting) run on the first this many prompts only; the chosen setting then runs on
    all prompts. None = sweep on every prompt."""
    select_by: Literal["measured", "predicted", "simulated"] = "measured"
    """Choose K, h, τ by measured latency (s/token) on the sweep prompts, by Eq. 5.1's latency with the fitted
    (or ``timing``'s) per-forward times, or (``simulated``, exact families in modes sampled like the labels) by the
    trace simulator over every labeled prompt of ``labels_dir`` (``evaluation.simulate``) at the pair's timed
    per-forward costs on this device (or ``timing``'s): then only the chosen setting runs."""
    max_pass_drop: float = 0.03
    """Approximate policies (SPRINTER, Fuzzy SD) are chosen among settings whose pass@1 is at most this far below
    the chosen SD's (ignored when pass@1 is unavailable)."""
    hf_peer: HFPeer = field(default_factory=HFPeer)
    """The external peer."""
    llama_peer: LlamaPeer = field(default_factory=LlamaPeer)
    """llama.cpp's own decoding (``evaluation.llama_peer``; backend llama_cpp)."""
    goals: Goals = field(default_factory=Goals)
    """What the report's goals table checks (not part of the run's settings: a report can be rewritten with
    other goals)."""
    train_dir: str | None = "runs/train"
    """Training's output folder; its ``roc.png`` and ``metrics.json`` go into the report (skipped when absent)."""
    labels_dir: str | None = "runs/labels/humaneval-heldout"
    """A labeled dataset of the pair (``data_gen`` output; by default the held-out HumanEval labels, which no head
    trains on): ``select_by: simulated`` replays its traces, less the prompts this eval decodes, and the mean
    TV(p, q) of its test rows predicts SPRINTER's rate of kept draft tokens (Theorem 7) in the report (skipped when
    absent or None)."""
    timing: str | None = None
    """A ``bench_timing`` JSON; latencies are also predicted with its per-forward times (e.g. a GPU's)."""
    timing_draft: str = "draft"
    """Name of the draft's entry in ``timing``."""
    timing_target: str = "target"
    """Name of the target's entry in ``timing``."""
    exec_timeout: float = 10.0
    """Seconds each HumanEval program may run."""
    output_dir: str = "runs/eval/humaneval"
    """Folder for ``results.jsonl`` (resumed), ``report.md``, ``report.json`` and the PNGs."""
    seed: int = 0
    """Seed of each prompt's generator (the same for every policy: common random numbers)."""
    dtype: str = "auto"
    """Model dtype: float32, bfloat16, float16 or ``auto`` (``resolve_dtype``: bfloat16 where the device computes it
    natively, else float32)."""
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu`` or ``cuda``."""
    backend: str = "transformers"
    """The runtime of both models (``core.backends.BACKENDS``): ``transformers``, or ``llama_cpp`` (the GGUF files
    as llama.cpp runs them, on ``threads`` CPU threads; the pair file sets it)."""
    threads: int | None = None
    """CPU threads of each llama.cpp model (None: torch's thread count, as the transformers backend runs)."""
    untimed_prefill: bool = False
    """Each run's clock starts after its models read the prompt (``decoding.state.ModelPair.untimed_prefill``), as
    llama.cpp's own tools time decoding: tokens per second of generation alone, alike for ours and its runs."""
    decoder: str = "auto"
    """How our decoder runs the models (``decoding.state.DECODERS``): ``eager`` (transformers' dynamic cache),
    ``static`` (a preallocated cache), ``graphs`` (that cache with each short forward a CUDA graph: CUDA only),
    ``compiled`` (graphs over decoder layers compiled first; off a GPU the compiled layers without graphs), or
    ``auto``: graphs on CUDA, eager on the CPU."""
    warmup: bool = True
    """One untimed short generation per mode before the timed runs."""
    timing_repeats: int = 1
    """Runs of each generation, in turns over a prompt's runs: each keeps the repeat of median wall time (its tokens
    are the same: the same seed). On a machine whose speed varies by several percent from one run to the next, a
    paired ratio needs either this or many more prompts."""
    overwrite: bool = False
    """Delete an existing run in ``output_dir`` instead of resuming it."""
    loglik: bool = True
    """Score every output's mean target log-likelihood per token (one target forward per output, about 5 s each
    for the real pair on 2 CPU cores): the quality metric of approximate policies, not needed to compare exact
    ones."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise EvalError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if not self.modes:
            raise EvalError("at least one mode is needed")
        names = [m.name for m in self.modes]
        if len(set(names)) != len(names):
            raise EvalError(f"mode names must be unique, got {names}")
        fams = [s.family for s in self.policies]
        if len(set(fams)) != len(fams):
            raise EvalError(f"each family appears once in `policies`, got {fams}")
        if self.select_by == "simulated" and not self.labels_dir:
            raise EvalError("select_by: simulated replays the label traces of `labels_dir`; set it")
        device = resolve_device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EvalError(f"device: {self.device}, but torch sees no CUDA GPU on this machine; use device: auto or "
                            "cpu")
        if self.backend not in BACKENDS:
            raise EvalError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.threads is not None and self.threads < 1:
            raise EvalError(f"threads must be at least 1, got {self.threads}")
        runtime = backend(self.backend)
        if runtime.cpu_only and self.device != "auto" and device.type != "cpu":
            raise EvalError(f"backend {self.backend} runs on the CPU; set device: cpu or auto (got {self.device})")
        if runtime.keeps_own_cache and self.decoder not in ("auto", "eager"):
            raise EvalError(f"decoder {self.decoder} runs transformers models; backend {self.backend} keeps its own "
                            "cache (decoder: auto or eager)")
        if runtime.keeps_own_cache and self.hf_peer.enabled:
            raise EvalError(f"hf_peer runs transformers' generate() on transformers models; with backend "
                            f"{self.backend} set hf_peer.enabled: false")
        if self.llama_peer.enabled and not runtime.keeps_own_cache:
            raise EvalError("llama_peer runs llama.cpp's own binaries beside our decoder on the same GGUF files: it "
                            "needs backend: llama_cpp")
        if self.llama_peer.enabled and not self.untimed_prefill:
            raise EvalError("llama_peer times decoding without the prompt's prefill, as llama.cpp's tools do: set "
                            "untimed_prefill: true so our runs are timed alike")
        if self.decoder not in ("auto", *DECODERS):
            raise EvalError(f"decoder must be auto, {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.timing_repeats < 1:
            raise EvalError(f"timing_repeats must be at least 1, got {self.timing_repeats}")
        if self.sweep_prompts is not None and self.sweep_prompts < 1:
            raise EvalError(f"sweep_prompts must be positive or null, got {self.sweep_prompts}")
        ours = {str(s.fixed["timing"]) for s in self.policies if s.family == "goodput" and s.fixed.get("timing")}
        peer = self.hf_peer
        if peer.enabled and peer.goodput and peer.same_threshold_as_ours and ours - {str(peer.timing)}:
            raise EvalError(f"hf_peer.goodput runs at our goodput run's λ, which is tokens/s under {sorted(ours)[0]}, "
                            f"but prices rounds with hf_peer.timing {peer.timing}: name the same file, or set "
                            "hf_peer.same_threshold_as_ours: false")

    def settings(self) -> dict:
        """What a resumed run must share with the results already on disk: also the sha256 of every head file (and
        goodput's calibration file) the policies and the peer name, so that heads trained again at the same paths do
        not join results of the old ones."""
        heads = {str(v) for sweep in self.policies for key in ESTIMATE_FILES
                 for v in [sweep.fixed.get(key), *sweep.grid.get(key, [])] if v is not None} \
            | set(map(str, self.hf_peer.heads)) | set(map(str, self.hf_peer.goodput))
        return {
            # a model's tokenizer is named only where set, as runs before it was a setting
            **{role: {k: v for k, v in vars(spec).items() if not (k == "tokenizer" and v is None)}
               for role, spec in (("draft", self.draft), ("target", self.target))},
            "prompts": vars(self.prompts),
            "modes": {m.name: vars(m.sampling(self.max_new_tokens)) for m in self.modes},
            "seed": self.seed, "dtype": resolve_dtype(self.dtype, resolve_device(self.device)),
            # the decoder changes every timing; named only where it is not the eager one runs were made with before
            **({"decoder": decoder} if (decoder := self.resolved_decoder()) != "eager" else {}),
            **({"backend": self.backend, "threads": self.model_threads()}
               if backend(self.backend).named_in_records else {}),
            **({"untimed_prefill": True} if self.untimed_prefill else {}),
            # what llama.cpp's own runs count as their time: named where they run, so runs timed otherwise do not mix
            **({"llama_peer_wall": LLAMA_WALL} if self.llama_peer.enabled else {}),
            **({"timing_repeats": self.timing_repeats} if self.timing_repeats > 1 else {}),
            "heads": {h: file_sha256(Path(h)) if Path(h).is_file() else None for h in sorted(heads)},
            "goodput_timing": {t: file_sha256(Path(t)) if Path(t).is_file() else None
                               for t in sorted(self.goodput_timing_files())},
        }

    def resolved_decoder(self) -> str:
        """``decoder`` with ``auto`` resolved for the device the eval runs on; graphs off CUDA refused in one line."""
        from decoding.state import default_decoder

        device = resolve_device(self.device)
        if self.decoder == "graphs" and device.type != "cuda":
            raise EvalError(f"decoder: graphs replays CUDA graphs, and this eval runs on {device}; set decoder: "
                            "eager or static, or device: cuda")
        if backend(self.backend).keeps_own_cache:  # only the eager decoder reads a cache the runtime keeps
            return "eager"
        return default_decoder(device) if self.decoder == "auto" else self.decoder

    def model_device(self) -> torch.device:
        """Where the models run: ``device`` resolved, the CPU for a backend that runs there only."""
        return torch.device("cpu") if backend(self.backend).cpu_only else resolve_device(self.device)

    def model_threads(self) -> int | None:
        """The threads each model runs on where its backend has threads of its own (llama.cpp's); None where they
        are torch's."""
        return backend(self.backend).threads(self.threads)

    def goodput_timing_files(self) -> set[str]:
        """The timing files goodput stops price rounds with (a policy's ``timing``, ``hf_peer.timing``): their
        costs are part of what a run is, so a rewritten one must not join the results of the old."""
        files = {str(f) for s in self.policies for f in [s.fixed.get("timing"), *s.grid.get("timing", [])] if f}
        return files | ({str(self.hf_peer.timing)} if self.hf_peer.enabled and self.hf_peer.timing else set())

    def latency_fits(self, records: list[dict]) -> dict[str, CostModel | None]:
        """``evaluation.latency.latency_fits`` of this evaluation: its runs ``records``, the forwards timed into
        its folder, and its ``timing`` file."""
        return latency_fits(records, RunDir(self.output_dir).forward_timing, self.timing,
                            (self.timing_draft, self.timing_target), prefill_timed=not self.untimed_prefill)


CONFIG = "configs/eval/<file>.yaml"
"""What ``--config`` takes: an evaluation's settings come from a file (the pair, the policies and their grids)."""


def parser() -> ArgumentParser:
    p = settings_parser(EvalConfig, "specheads eval", "Run every decoding policy and write the report (--out "
                        "FOLDER: --output_dir). The settings come from a file, --config " + CONFIG + ", and any flag "
                        "below overrides one of them.")
    p.add_argument("--report_only", type=bool, default=False,
                   help="rewrite the report from output_dir/results.jsonl without running anything")
    return p


def parse(argv: list[str] | None = None) -> tuple[EvalConfig, bool]:
    """The settings ``specheads eval`` reads from ``argv`` (a ``--config`` file and overrides), and whether it
    only rewrites the report."""
    p = parser()
    ns = p.instantiate(parse_settings(p, argv, CONFIG))
    report_only = ns.pop("report_only") if hasattr(ns, "pop") else False
    kw = {k: v for k, v in vars(ns).items() if k not in ("config", "report_only")}
    return EvalConfig(**kw), bool(report_only)

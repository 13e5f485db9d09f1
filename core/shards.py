"""Label shards on disk: Arrow files written through ``datasets``, one per batch, atomically; a manifest at the end.

Layout of an output folder (see data_gen/SCHEMA.md for the columns)::

    run.json                  the settings of the run (a resume must match them)
    train/<batch key>.arrow   one shard per labeled batch
    val/…  test/…
    manifest.json             written last: its presence means the dataset is complete
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import numpy as np
from datasets import Dataset, Features, List, Value, concatenate_datasets
from datasets.arrow_writer import ArrowWriter

from core import label_math as lm

SCHEMA_VERSION = 2
SPLITS = ("train", "val", "test")
FLOAT_COLUMNS = (
    "logp_draft",
    "logp_target",
    "acceptance",
    "ratio",
    "entropy_draft",
    "entropy_target",
    "tv",
    "js",
    "read_logp_draft",
    "read_entropy_draft",
)



def features(hidden_size: int) -> Features:
    return Features(
        {
            "prompt_id": Value("int64"),
            "category": Value("string"),
            "position": Value("int32"),
            "token_id": Value("int32"),
            "loss_mask": Value("bool"),
            **{c: Value("float32") for c in FLOAT_COLUMNS},
            "greedy_match": Value("bool"),
            "hidden": List(Value("float16"), length=hidden_size),
            "hidden_prev": List(Value("float16"), length=hidden_size),
        }
    )


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    _atomic_write_text(Path(path), json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_shard(path: Path, cols: dict, hidden_size: int) -> int:
    """Write one shard atomically (temporary name, then rename); return its row count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    feats = features(hidden_size)
    data = {}
    for name in feats:
        v = cols[name]
        data[name] = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    writer = ArrowWriter(features=feats, path=str(tmp))
    try:
        writer.write_batch(data)
        writer.finalize()
    finally:
        writer.close()
    os.replace(tmp, path)
    return len(data["prompt_id"])


def clean_temporaries(out_dir: Path) -> None:
    """Remove what an interrupted run left half-written (never complete-looking files)."""
    for tmp in Path(out_dir).rglob(".*.tmp*"):
        tmp.unlink(missing_ok=True)


def shard_paths(out_dir: Path, split: str) -> list[Path]:
    return sorted((Path(out_dir) / split).glob("*.arrow"))


def load_split(out_dir: str | Path, split: str) -> Dataset:
    """The rows of one split, memory-mapped, in a fixed order (shards sorted by name)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    paths = shard_paths(Path(out_dir), split)
    if not paths:
        raise FileNotFoundError(f"no shards for split {split!r} under {out_dir}")
    return concatenate_datasets([Dataset.from_file(str(p)) for p in paths])


def read_manifest(out_dir: str | Path) -> dict:
    path = Path(out_dir) / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `make labels` (or the labeling run did not finish)")
    manifest = json.loads(path.read_text())
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{path}: labels of schema version {manifest.get('schema_version')}, this code reads version "
            f"{SCHEMA_VERSION} (see data_gen/SCHEMA.md); label again with `make labels ARGS=\"--overwrite true\"`"
        )
    return manifest


def split_summary(out_dir: Path, split: str) -> dict:
    """Row counts and mean acceptance of one split, read from its shards."""
    paths = shard_paths(out_dir, split)
    if not paths:
        return {"shards": 0, "rows": 0, "loss_rows": 0, "prompts": 0, "mean_acceptance": None, "mean_1_minus_tv": None,
                "categories": {}}
    ds = load_split(out_dir, split).select_columns(["prompt_id", "category", "loss_mask", "acceptance", "tv"])
    cols = ds.with_format("numpy")[:]
    mask = cols["loss_mask"].astype(bool)
    cats, counts = np.unique(cols["category"][mask].astype(str), return_counts=True)
    return {
        "shards": len(paths),
        "rows": int(len(mask)),
        "loss_rows": int(mask.sum()),
        "prompts": int(len(np.unique(cols["prompt_id"]))),
        "mean_acceptance": float(cols["acceptance"][mask].mean()) if mask.any() else None,
        "mean_1_minus_tv": float(1 - cols["tv"][mask].mean()) if mask.any() else None,
        "categories": {str(c): int(n) for c, n in zip(cats, counts)},
    }


def write_manifest(out_dir: Path, *, models: dict, prompts: dict, response_source: str, sampling: dict,
                   mixing_ratio: float, categories: list[str], seed: int, settings_sha256: str,
                   seconds: float) -> dict:
    """Write ``manifest.json`` (last: its presence marks the dataset complete) from the run's settings and the
    shards' own counts; return it. ``read_manifest`` reads it back."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "models": models,
        "feature": {
            "columns": {"hidden": "draft last-layer hidden state (after the final norm) after reading the token",
                        "hidden_prev": "the same at the previous position: the state that produced q for the token"},
            "hidden_size": models["draft"]["hidden_size"],
            "dtype": "float16",
        },
        "prompts": prompts,
        "response_source": response_source,
        "sampling": sampling,
        "mixing_ratio": mixing_ratio,
        "label_context": {"sprinter rows (original, draft, target, interleaved)": "the candidate's own prefix",
                          f"{lm.TOKEN_MIXED} rows": "clean target prefix X<i (SpecDec++ §4.4)"},
        "rows_for_label": {k: list(v) for k, v in lm.ROWS_FOR_LABEL.items()},
        "categories": categories,
        "seed": seed,
        "splits": {s: split_summary(out_dir, s) for s in SPLITS},
        "settings_sha256": settings_sha256,
        "seconds": seconds,
    }
    write_json(out_dir / "manifest.json", manifest)
    return manifest

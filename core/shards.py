"""Label shards on disk: Arrow files written through ``datasets``, one per batch, atomically; a manifest at the end.

Layout of an output folder (see data_gen/SCHEMA.md for the columns)::

    run.json                     the settings of the run and the digests of its inputs (a resume must match them)
    pair.json                    the pair as the run loaded it (``data_gen.record.PAIR_FILE``)
    train/<batch key>.arrow      one shard per labeled batch
    train/<batch key>.arrow.json its row count and sha256, written after the shard: a shard without it, or whose
                                 bytes no longer match it, is redone by a resumed run
    train/sequences/<batch key>.arrow  (and .json) the token sequences the batch's rows were read from, one row per
                                 prompt, written before the batch's shard
    val/…  test/…
    manifest.json                written last: its presence means the dataset is complete; it lists every shard
                                 with its rows and sha256, checked whenever the dataset is read
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
from datasets import Dataset, Features, List, Value, concatenate_datasets
from datasets.arrow_writer import ArrowWriter

from core import label_math as lm
from core.adapter import TAPPED_DEPTHS
from core.cache import file_sha256
from core.columns import FEATURE_COLUMNS
from core.errors import UserError
from core.identity import prompt_digest
from core.runfolder import read_json, write_json, write_with

SCHEMA_VERSION = 4
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
    "read_margin_draft",
    "stale_entropy_target",
    "stale_top1_target",
)
TAPPED_LAYERS = len(TAPPED_DEPTHS)
"""Draft layers besides the last whose outputs a row holds (``core.adapter.tap_layers``)."""


def vector_sizes(draft_hidden: int, target_hidden: int, tapped: bool = True) -> dict[str, int]:
    """Length of each vector column; without the tapped layers' columns where the draft's runtime gives none
    (llama.cpp)."""
    taps = {"hidden_layers": TAPPED_LAYERS * draft_hidden, "hidden_layers_prev": TAPPED_LAYERS * draft_hidden}
    return {"hidden": draft_hidden, "hidden_prev": draft_hidden, **(taps if tapped else {}),
            "stale_hidden_target": target_hidden}


def features(sizes: dict[str, int]) -> Features:
    """The shards' Arrow features; ``sizes`` gives each vector column's length (``vector_sizes``)."""
    return Features(
        {
            "prompt_id": Value("int64"),
            "category": Value("string"),
            "position": Value("int32"),
            "token_id": Value("int32"),
            "loss_mask": Value("bool"),
            **{c: Value("float32") for c in FLOAT_COLUMNS},
            "greedy_match": Value("bool"),
            "round_index": Value("int32"),
            "response_index": Value("int32"),
            **{c: List(Value("float16"), length=n) for c, n in sizes.items()},
        }
    )


def _write_arrow(path: Path, feats: Features, data: dict) -> None:
    writer = ArrowWriter(features=feats, path=str(path))
    try:
        writer.write_batch(data)
        writer.finalize()
    finally:
        writer.close()


def write_shard(path: Path, cols: dict, sizes: dict[str, int]) -> int:
    """Write one shard atomically (temporary name, then rename); return its row count."""
    feats = features(sizes)
    data = {}
    for name in feats:
        v = cols[name]
        data[name] = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
    write_with(path, lambda tmp: _write_arrow(tmp, feats, data))
    rows = len(data["prompt_id"])
    write_json(_record_path(path), {"rows": rows, "sha256": file_sha256(path)})
    return rows


SEQUENCE_FEATURES = Features({
    "prompt_id": Value("int64"),
    "category": Value("string"),
    "prompt_ids": List(Value("int32")),
    "response_ids": List(Value("int32")),
    "mixed_ids": List(Value("int32")),
})
"""A batch's token sequences (``data_gen.sequences.sequences``)."""

TARGET_STATE_FEATURES = {"target_hidden": List(Value("float16")), "target_top1": List(Value("float32"))}
"""What a run of ``target_states`` adds to its sequences: the target's state along each response (flattened, the
manifest's ``feature.target_states`` wide) and its top-1 probability (``data_gen.sequences.target_state_columns``)."""


def sequences_path(shard: Path) -> Path:
    """Where the token sequences of a batch's shard ``<split>/<key>.arrow`` live."""
    return shard.parent / "sequences" / shard.name


def batch_files(key: str) -> list[Path]:
    """The files of a batch ``<split>/<key>`` relative to its dataset: its shard and its sequences, each with the
    record written with it."""
    shard = Path(f"{key}.arrow")
    return [path for p in (shard, sequences_path(shard)) for path in (p, _record_path(p))]


def write_sequences(path: Path, seqs: dict[str, list]) -> int:
    """Write a batch's token sequences atomically, with their record; return the prompt count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    feats = Features({**SEQUENCE_FEATURES, **(TARGET_STATE_FEATURES if "target_hidden" in seqs else {})})
    write_with(path, lambda tmp: _write_arrow(tmp, feats, {k: seqs[k] for k in feats}))
    write_json(_record_path(path), {"rows": len(seqs["prompt_id"]), "sha256": file_sha256(path)})
    return len(seqs["prompt_id"])


def prompt_digests(out_dir: str | Path, split: str) -> dict[int, str]:
    """``{prompt_id: core.identity.prompt_digest}`` of a split's prompts, from the stored token sequences."""
    seqs = load_sequences(out_dir, split)
    if seqs is None:
        raise ShardError(f"{out_dir} stores no token sequences (labeled by an older version); label it again")
    return {int(i): prompt_digest(ids) for i, ids in zip(seqs["prompt_id"], seqs["prompt_ids"])}


def load_sequences(out_dir: str | Path, split: str | None = None) -> Dataset | None:
    """Every stored token sequence of a dataset (of one split, or all), or None for a dataset labeled without
    them."""
    paths = sorted(Path(out_dir).glob(f"{split or '*'}/sequences/*.arrow"))
    return concatenate_datasets([Dataset.from_file(str(p)) for p in paths]) if paths else None


class ShardError(UserError):
    """A label dataset whose shards are missing, damaged or not the ones its manifest lists."""


def _record_path(shard: Path) -> Path:
    return shard.with_name(shard.name + ".json")


def shard_problem(shard: Path) -> str | None:
    """Why a written shard cannot be trusted (no record of it, or bytes that differ from the record), or None."""
    record = _record_path(shard)
    if not record.exists():
        return "no row count and digest recorded for it (an interrupted write)"
    if file_sha256(shard) != json.loads(record.read_text())["sha256"]:
        return "its bytes differ from the sha256 recorded when it was written (damaged or edited)"
    return None


def _layout_dirs(out_dir: Path) -> list[Path]:
    """The folders a dataset keeps its shards in (each split's, and its sequences'): only these are read, and a
    labeling run deletes or cleans nothing outside them."""
    return [Path(out_dir) / split / sub for split in SPLITS for sub in ("", "sequences")]


def _all_shards(out_dir: Path) -> list[Path]:
    """Every Arrow file of a dataset, as its readers see it: the rows' shards and the sequences'."""
    return sorted(p for d in _layout_dirs(out_dir) for p in d.glob("*.arrow"))


def dataset_files(out_dir: Path) -> list[Path]:
    """Every shard of a dataset's layout and the record written with it (not ``manifest.json``): what starting the
    dataset over deletes, and nothing in other folders."""
    return sorted({*_all_shards(out_dir), *(p for d in _layout_dirs(out_dir) for p in d.glob("*.arrow.json"))})


def unlisted_shards(out_dir: Path, names) -> list[Path]:
    """The dataset's shards on disk that are not among ``names`` (``train/<key>.arrow``, as the manifest lists
    them): files no labeling run of this dataset wrote, which a reader would take for rows."""
    names = set(names)
    return [p for p in _all_shards(out_dir) if p.relative_to(out_dir).as_posix() not in names]


def shard_records(out_dir: Path, keys: list[str] | None = None) -> dict[str, dict]:
    """The shards of the batches ``keys`` (``train/<key>``; None: every shard on disk) and their sequences, as
    ``{"train/<key>.arrow": {"rows": …, "sha256": …}}``, from the records written with them."""
    out_dir = Path(out_dir)
    if keys is None:
        paths = _all_shards(out_dir)
    else:
        batches = [out_dir / f"{key}.arrow" for key in keys]
        paths = sorted([*batches, *(s for s in map(sequences_path, batches) if s.exists())])
    return {p.relative_to(out_dir).as_posix(): json.loads(_record_path(p).read_text()) for p in paths}


def verify_shards(out_dir: Path, manifest: dict) -> list[str]:
    """What is wrong with the shards against the manifest: each listed shard present with its sha256, no shard
    that it does not list, each split's row count the sum of its shards'. Empty when all is well."""
    out_dir = Path(out_dir)
    listed = manifest["shards"]
    problems = []
    for name, record in listed.items():
        path = out_dir / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif file_sha256(path) != record["sha256"]:
            problems.append(f"{path}: its bytes differ from the sha256 in the manifest (damaged or edited)")
    problems += [f"{path}: not listed in the manifest" for path in unlisted_shards(out_dir, listed)]
    for split, summary in manifest.get("splits", {}).items():
        rows = sum(r["rows"] for name, r in listed.items() if Path(name).parent == Path(split))
        if summary["rows"] != rows:
            problems.append(f"{out_dir / 'manifest.json'}: split {split} has {summary['rows']} rows, its shards "
                            f"{rows}")
    return problems


def shard_paths(out_dir: Path, split: str) -> list[Path]:
    return sorted((Path(out_dir) / split).glob("*.arrow"))


def load_split(out_dir: str | Path, split: str) -> Dataset:
    """The rows of one split, memory-mapped, in a fixed order (shards sorted by name)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    paths = shard_paths(Path(out_dir), split)
    if not paths:
        raise ShardError(f"no shards for split {split!r} under {out_dir}")
    return concatenate_datasets([Dataset.from_file(str(p)) for p in paths])


def manifest_sha256(out_dir: str | Path) -> str:
    """The digest of a finished dataset's ``manifest.json`` (which lists every shard's digest), the dataset's identity
    in the records of what was chosen or measured on it; one clear error when there is none."""
    read_manifest(out_dir, verify=False)
    return file_sha256(Path(out_dir) / "manifest.json")


def read_manifest(out_dir: str | Path, verify: bool = True) -> dict:
    """The manifest of a finished dataset; with ``verify``, its shards checked against it (``ShardError``)."""
    path = Path(out_dir) / "manifest.json"
    if not path.exists():
        raise ShardError(f"{path} not found: run `make labels` (or the labeling run did not finish)")
    manifest = read_json(path, "run the labeling command again: it rewrites it")
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if version != SCHEMA_VERSION:
        raise ShardError(
            f"{path}: labels of schema version {version}, this code reads version "
            f"{SCHEMA_VERSION} (see data_gen/SCHEMA.md); label again with `make labels ARGS=\"--overwrite true\"`"
        )
    if not isinstance(manifest.get("shards"), dict):
        raise ShardError(f"{path} lists no shard digests (written by an older version of data_gen); label again with "
                         "`make labels ARGS=\"--overwrite true\"`")
    if verify and (stray := unlisted_shards(Path(out_dir), manifest["shards"])):
        more = f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""
        raise ShardError(f"{stray[0]}{more}: not listed in the manifest, so no labeling run of this dataset wrote it; "
                         "move it out of the dataset's folders")
    problems = verify_shards(Path(out_dir), manifest) if verify else []
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ShardError(f"{problems[0]}{more}; run the labeling command again: it redoes every shard that fails "
                         "this check")
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
                   seconds: float, inputs: dict | None = None, keys: list[str] | None = None,
                   tapped_layers: tuple[int, ...] | None = None, snapshot: dict | None = None,
                   target_states: bool = False) -> dict:
    """Write ``manifest.json`` (last: its presence marks the dataset complete) from the run's settings and the
    shards' own counts; return it. ``read_manifest`` reads it back. ``snapshot``: where the dataset holds the
    batches a run had finished when it was copied (``data_gen.snapshot``), which run and how much of it."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "models": models,
        "feature": {
            "columns": FEATURE_COLUMNS,
            "hidden_size": models["draft"]["hidden_size"],
            "sizes": vector_sizes(models["draft"]["hidden_size"], models["target"]["hidden_size"],
                                  tapped=bool(tapped_layers)),
            "tapped_layers": list(tapped_layers) if tapped_layers else None,
            "dtype": "float16",
            # the width of the sequences' target_hidden per response token (TARGET_STATE_FEATURES), where stored
            "target_states": models["target"]["hidden_size"] if target_states else None,
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
        "shards": shard_records(out_dir, keys),
        "settings_sha256": settings_sha256,
        "inputs": inputs,
        "seconds": seconds,
        **({"snapshot": snapshot} if snapshot else {}),
    }
    write_json(out_dir / "manifest.json", manifest)
    return manifest

"""What a labeling run records beside its shards before the first one: ``run.json`` (its settings and the digests
of its inputs, which a resume must match) and ``pair.json`` (the pair as the run loaded it)."""

from __future__ import annotations

import json
from pathlib import Path

from core.models import context_window
from core.runfolder import read_json, write_json
from core.models import MODEL_FILES
from data_gen.config import LabelConfig
from data_gen.errors import LabelingError
from data_gen.llama_labeler import is_llama

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
    """The pair the run of ``record`` (its ``run.json``) loaded; None when the run wrote none, wrote it for another
    ``run.json``, or it is damaged."""
    try:
        pair = json.loads((out / PAIR_FILE).read_text())
    except (OSError, ValueError):
        return None
    return pair if isinstance(pair, dict) and pair.get("run") == record else None


def run_differences(previous: dict, record: dict) -> list[str]:
    """The settings, and the inputs, in which ``previous`` (a ``run.json``) differs from ``record``."""
    changed = sorted(k for k in record if k not in ("inputs", MODEL_FILES) and previous.get(k) != record[k])
    old = previous["inputs"]  # previous_run refuses a record without it
    return changed + [f"inputs.{k} (content changed)" for k in record["inputs"] if old.get(k) != record["inputs"][k]]


def run_record(cfg: LabelConfig, inputs: dict) -> dict:
    """``run.json``: the settings, and the digests of the inputs, that a resume must match."""
    files = {role: str(Path(spec.path).resolve()) for role, spec in (("draft", cfg.draft), ("target", cfg.target))
             if spec.path and Path(spec.path).exists()}
    return json.loads(json.dumps({**cfg.settings(), "inputs": inputs, MODEL_FILES: files}))  # tuples -> lists


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

"""The labeling run: its prompts and models read and checked before the output folder is touched, the folder held
while the batches without a shard are labeled (``data_gen.loop``), the manifest written; the same command resumes a
run that stopped.

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
import time
from pathlib import Path

from core import shards
from core.adapter import tap_layers
from core.backends import Context, backend
from core.errors import UserError
from core.folder_lock import launching_process
from core.models import context_window
from core.prompts import input_digests, load_prompt_table
from core.runfolder import RunFolder, write_json
from data_gen.batches import build_records, make_batches
from data_gen.config import LabelConfig
from data_gen.errors import LabelingError, LabelingInterrupted
from data_gen.loop import label_batches
from data_gen.record import (PAIR_FILE, RUN_FILE, pair_fields, previous_run, run_differences, run_record,
                             write_pair_record)

MANIFEST = "manifest.json"


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
            if not label_batches(cfg, out, draft, target, tok, models, batches, callbacks, quiet):
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
        snapshot=snapshot, target_states=cfg.target_states,
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
        _refuse_unlisted(out, manifest["shards"], manifest=True)
        problems = shards.verify_shards(out, manifest)
        if not problems:
            return manifest
    if not quiet:
        print(f"{out}: {len(problems)} problem(s) with the shards, first: {problems[0]}; redoing them")
    (out / MANIFEST).unlink(missing_ok=True)
    return None


LLAMA_WINDOW = 2048
"""The longest prompt + response a llama.cpp labeling run reads (a longer prompt is refused before any work): its
contexts hold a batch of such sequences. The transformers labeler reads up to the models' own window."""


def load_pair(cfg: LabelConfig):
    """(draft, target, the target's tokenizer, {"draft": identity, "target": identity}), one vocabulary checked.
    Every token is computed as the decoder's steps compute it (``core.backends.Transformers.load``), so that a row
    does not depend on the batch it is labeled in. On llama.cpp each model's context holds a batch of
    ``LLAMA_WINDOW``-token sequences, and the draft's one sequence per candidate of a prompt besides."""
    n_ctx = cfg.batch_size * LLAMA_WINDOW
    # the draft holds a prompt's candidates beside its context, in cells its sequences share
    draft = Context(n_ctx + cfg.sampling.max_new_tokens, max(cfg.batch_size, cfg.sampling.max_new_tokens + 1),
                    shared_cells=True, window=LLAMA_WINDOW)
    target = Context(n_ctx, cfg.batch_size, window=LLAMA_WINDOW)
    pair = backend(cfg.backend).load_pair(cfg.draft, cfg.target, cfg.model_dtype, cfg.threads,
                                          draft, target, step_numerics=True)
    return pair.draft, pair.target, pair.tokenizer, pair.models


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

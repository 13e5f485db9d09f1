"""``python -m data_gen.snapshot RUN OUT``: the batches a labeling run has finished so far, as a dataset of their own.

A large labeling run takes hours. Its folder is a dataset only once every batch is written (the manifest comes
last), but a run labels its batches spread over the splits and the lengths (``data_gen.run.labeling_order``), so
the batches finished at any time are a sample of the whole run. This copies them into a new folder ``OUT`` with a
manifest of their own, to train and evaluate on while the run goes on:

    python -m data_gen.snapshot runs/labels/corpus-1500 runs/labels/corpus-1500-snap

The run's folder is only read (the run may be labeling into it meanwhile); shards are hard links where the file
system allows, else copies. The snapshot's manifest is the one the run itself would write for these batches, with
``snapshot`` saying which run, how many of its batches and prompts, and when. Its models' identity is read by loading
them, as the run does, and the prompts and models must still be the ones the run recorded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from core import shards
from core.errors import UserError, run_main
from core.lock import folder_lock
from core.models import ModelSpec
from core.prompts import PromptConfig, input_digests, load_prompt_table
from core.sampling import Sampling


class SnapshotError(UserError):
    """A folder that holds no unfinished labeling run to copy, or an output folder that is not new."""


def run_config(run_dir: Path):
    """The ``LabelConfig`` of the labeling run recorded in ``run_dir/run.json``."""
    from data_gen.run import RUN_FILE, LabelConfig, previous_run

    record = previous_run(run_dir)
    if record is None:
        raise SnapshotError(f"{run_dir} holds no labeling run (no {RUN_FILE})")
    settings = {k: v for k, v in record.items() if k not in ("schema_version", "inputs")}
    if record.get("schema_version") != shards.SCHEMA_VERSION:
        raise SnapshotError(f"{run_dir} was labeled with label schema {record.get('schema_version')}, this version "
                            f"writes {shards.SCHEMA_VERSION}")
    try:
        return LabelConfig(**{**settings, "draft": ModelSpec(**settings["draft"]),
                              "target": ModelSpec(**settings["target"]),
                              "prompts": PromptConfig(**settings["prompts"]), "sampling": Sampling(**settings["sampling"]),
                              "split_fractions": tuple(settings["split_fractions"]), "output_dir": str(run_dir)}), record
    except (TypeError, KeyError) as e:
        raise SnapshotError(f"{run_dir / RUN_FILE} is not a run record this version reads ({e})") from None


def snapshot(run_dir: str | Path, out: str | Path, quiet: bool = False) -> dict:
    """Copy the finished batches of the labeling run in ``run_dir`` into the new folder ``out`` with their manifest;
    return it."""
    from core.models import context_window
    from data_gen.run import (build_records, finished, load_pair, make_batches, run_differences, run_record,
                              write_run_manifest)

    t_start = time.perf_counter()
    run_dir, out = Path(run_dir), Path(out)
    if (run_dir / "manifest.json").exists():
        raise SnapshotError(f"{run_dir} is a finished dataset: train on it as it is")
    cfg, record = run_config(run_dir)
    if out.resolve() == run_dir.resolve() or run_dir.resolve() in out.resolve().parents:
        raise SnapshotError(f"{out} is inside the run's folder {run_dir}; choose a folder outside it")
    if out.exists() and any(out.iterdir()):
        raise SnapshotError(f"{out} is not empty; choose a new folder (a snapshot deletes nothing)")
    table = load_prompt_table(cfg.prompts, need_response=cfg.response_source == "dataset")
    inputs = input_digests(table, cfg.response_source == "dataset", {"draft": cfg.draft, "target": cfg.target})
    changed = run_differences(record, run_record(cfg, inputs))
    if changed:
        raise SnapshotError(f"the run in {run_dir} was labeled from other inputs or settings than these "
                            f"({', '.join(changed)}); its batches cannot be listed again")
    draft, target, tok, models = load_pair(cfg)
    records = build_records(cfg, tok, min(context_window(draft), context_window(target)), table)
    batches = make_batches(records, cfg.batch_size)
    done = [b for b in batches if finished(run_dir / f"{b['key']}.arrow")]
    if not done:
        raise SnapshotError(f"{run_dir} has no finished batch yet")
    written: list[Path] = []
    with folder_lock(out, "a snapshot"):
        try:
            for b in done:
                shard = Path(f"{b['key']}.arrow")
                for rel in (shard, shards.sequences_path(shard)):
                    for name in (rel, rel.with_name(rel.name + ".json")):
                        written.append(out / name)
                        _link_or_copy(run_dir / name, out / name)
            n_prompts = sum(len(b["prompts"]) for b in done)
            written.append(out / "manifest.json")
            manifest = write_run_manifest(
                out, cfg, models, inputs, done, draft.config.num_hidden_layers, seconds=time.perf_counter() - t_start,
                snapshot={"run": str(run_dir), "batches": len(done), "of_batches": len(batches), "prompts": n_prompts,
                          "of_prompts": len(records), "order": "data_gen.run.labeling_order"},
            )
            shards.read_manifest(out)  # the copies, read back against the records the run wrote with them
        except BaseException:  # an interrupted or failed snapshot leaves no half dataset (only its own files go)
            for path in written:
                path.unlink(missing_ok=True)
            raise
    if not quiet:
        from data_gen.run import print_summary

        print_summary(manifest, out)
        missing = sorted({b["key"].split("/")[0] for b in batches} - {b["key"].split("/")[0] for b in done})
        print(f"snapshot of {run_dir}: {len(done)} of {len(batches)} batches, {n_prompts} of {len(records)} prompts"
              + (f"; no batch of {', '.join(missing)} finished yet" if missing else ""))
    return manifest


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_gen.snapshot", description=__doc__.splitlines()[0])
    p.add_argument("run", help="the folder of a labeling run (finished or not)")
    p.add_argument("out", help="a new folder for the snapshot")
    a = p.parse_args(argv)
    snapshot(a.run, a.out)
    return 0


if __name__ == "__main__":
    run_main(main)

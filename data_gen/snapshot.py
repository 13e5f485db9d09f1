"""``specheads snapshot RUN OUT``: the batches a labeling run has finished so far, as a dataset of their own.

A large labeling run takes hours. Its folder is a dataset only once every batch is written (the manifest comes
last), but a run labels its batches spread over the splits and the lengths (``data_gen.batches.labeling_order``), so
the batches finished at any time are a sample of the whole run. This copies them into a new folder ``OUT`` with a
manifest of their own, to train and evaluate on while the run goes on:

    specheads snapshot runs/labels/corpus-1500 runs/labels/corpus-1500-snap

The run's folder is only read (the run may be labeling into it meanwhile); shards are hard links where the file
system allows, else copies. The snapshot's manifest is the one the run itself would write for these batches, with
``snapshot`` saying which run, how much of each split, and whether the batches are the first of the run's order (a
run started before that order, or resumed with other batches done, holds others: then they are not a sample).
Its models' identity is the one the run recorded when it loaded them (``data_gen.record.PAIR_FILE``), and the
prompts and models must still be the ones the run recorded. Every split the run labels needs a finished batch (training reads train and val).
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import time
from pathlib import Path

from core import shards
from core.arguments import CommandParser, description, path_argument, resolve_paths
from core.errors import UserError
from core.interrupt import CtrlCGuard, command_failure, interrupted_line
from core.runfolder import RunFolder

LINKLESS = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
"""Why a hard link fails where a copy does: another file system, or one without links."""


class SnapshotError(UserError):
    """A folder that holds no unfinished labeling run to copy, or an output folder that is not new."""


def _refuse_output(out: Path, run_dir: Path) -> None:
    if out.resolve() == run_dir.resolve() or run_dir.resolve() in out.resolve().parents:
        raise SnapshotError(f"{out} is inside the run's folder {run_dir}; choose a folder outside it")
    snapshot_folder(out).check(new=True)


def snapshot_folder(out: Path) -> RunFolder:
    return RunFolder(out, "snapshot", "--out")


def coverage(batches: list[dict], done: list[dict]) -> dict:
    """How much of the run ``done`` holds: batches and prompts, each split's batches, and whether they are the first
    of the run's labeling order (only then a sample of the whole run)."""
    from data_gen.batches import labeling_order

    keys = {b["key"] for b in done}
    order = [b["key"] for b in labeling_order(batches)]
    splits = sorted({b["key"].split("/")[0] for b in batches})
    return {
        "batches": [len(done), len(batches)],
        "prompts": [sum(len(b["prompts"]) for b in done), sum(len(b["prompts"]) for b in batches)],
        "splits": {s: [sum(b["key"].startswith(f"{s}/") for b in done), sum(b["key"].startswith(f"{s}/")
                                                                           for b in batches)] for s in splits},
        "first_of_order": set(order[: len(done)]) == keys,
    }


def snapshot(run_dir: str | Path, out: str | Path, quiet: bool = False) -> dict:
    """Copy the finished batches of the labeling run in ``run_dir`` into the new folder ``out`` with their manifest;
    return it."""
    from core.prompts import input_digests, load_prompt_table
    from data_gen.batches import build_records, finished, make_batches
    from data_gen.config import LabelConfig
    from data_gen.record import RUN_FILE, previous_run, run_differences, run_record
    from data_gen.run import print_summary, write_run_manifest

    t_start = time.perf_counter()
    run_dir, out = Path(run_dir), Path(out)
    if (run_dir / "manifest.json").exists():
        raise SnapshotError(f"{run_dir} is a finished dataset: train on it as it is")
    record = previous_run(run_dir)
    if record is None:
        raise SnapshotError(f"{run_dir} holds no labeling run (no {RUN_FILE})")
    if record.get("schema_version") != shards.SCHEMA_VERSION:
        raise SnapshotError(f"{run_dir} was labeled with label schema {record.get('schema_version')}; this version "
                            f"writes {shards.SCHEMA_VERSION}")
    try:
        cfg = LabelConfig.from_record(record, run_dir)
    except (TypeError, KeyError) as e:
        raise SnapshotError(f"{run_dir / RUN_FILE} is not a run record this version reads ({e})") from None
    _refuse_output(out, run_dir)
    table = load_prompt_table(cfg.prompts, need_response=cfg.response_source == "dataset")
    inputs = input_digests(table, cfg.response_source == "dataset", {"draft": cfg.draft, "target": cfg.target})
    changed = run_differences(record, run_record(cfg, inputs))
    if changed:
        raise SnapshotError(f"the run in {run_dir} was labeled from other inputs or settings than these "
                            f"({', '.join(changed)}); its batches cannot be listed again")
    tok, pair = _pair(cfg, run_dir, record)
    records = build_records(cfg, tok, pair["context"], table)
    batches = make_batches(records, cfg.batch_size)
    done = [b for b in batches if finished(run_dir / f"{b['key']}.arrow")]
    covered = coverage(batches, done)
    empty = [s for s, (n, _) in covered["splits"].items() if n == 0]
    if empty:
        raise SnapshotError(f"{run_dir} has no finished batch of {', '.join(empty)} yet ({len(done)} of "
                            f"{len(batches)} batches done); training needs train and val: snapshot it later")
    folder = snapshot_folder(out)
    with folder.hold("a snapshot"):
        _refuse_output(out, run_dir)  # again, now that no other snapshot can write into it
        folder.start([*(rel.as_posix() for b in done for rel in shards.batch_files(b["key"])), "manifest.json"])
        try:
            for b in done:
                for rel in shards.batch_files(b["key"]):
                    _link_or_copy(run_dir / rel, out / rel)
            if previous_run(run_dir) != record:
                raise SnapshotError(f"the run in {run_dir} was started over while it was copied; run the snapshot "
                                    "again")
            manifest = write_run_manifest(out, cfg, pair["models"], inputs, done, pair["draft_layers"],
                                          seconds=time.perf_counter() - t_start,
                                          snapshot={"run": str(run_dir.resolve()), **covered})
            shards.read_manifest(out)  # the copies, read back against the records the run wrote with them
        except BaseException:  # an interrupted or failed snapshot leaves no half dataset, only what it found
            folder.clear()
            raise
    if not quiet:
        print_summary(manifest, out)
        n, of = covered["prompts"]
        print(f"snapshot of {run_dir}: {len(done)} of {len(batches)} batches, {n} of {of} prompts"
              + ("" if covered["first_of_order"] else "; not the first batches of the run's labeling order (it was "
                 "started before that order, or its batches were done out of it): they may not be a sample of the "
                 "whole run"))
    return manifest


def _pair(cfg, run_dir: Path, record: dict) -> tuple:
    """(the target's tokenizer, the pair as the run loaded it: ``data_gen.record.PAIR_FILE``'s fields)."""
    from core.backends import backend
    from data_gen.record import PAIR_FILE, read_pair_record

    pair = read_pair_record(run_dir, record)
    if pair is None:
        raise SnapshotError(f"{run_dir} holds no {PAIR_FILE} of its run (started by an older version); label it "
                            "again to snapshot it")
    return backend(cfg.backend).tokenizer(cfg.target), pair


def _link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (a copy where the file system has no links), never over a file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        try:
            os.link(src, dst)
        except OSError as e:
            if e.errno not in LINKLESS:
                raise
            with open(src, "rb") as f, open(dst, "xb") as g:
                shutil.copyfileobj(f, g)
    except FileNotFoundError:
        raise SnapshotError(f"{src} went while it was copied (the run started over?); run the snapshot again") \
            from None
    except FileExistsError:
        raise SnapshotError(f"{dst} appeared while the snapshot wrote its folder; choose a new folder") from None


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog="specheads snapshot", description=description(__doc__))
    path_argument(p, "run", "--labels", "the folder of a labeling run (finished or not)")
    path_argument(p, "out", "--out", "a new folder for the snapshot")
    a = p.parse_args(argv)
    try:
        resolve_paths(a, ("run", "--labels"), ("out", "--out"))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ctrl_c = CtrlCGuard()
    try:
        with ctrl_c:
            snapshot(a.run, a.out)
    except KeyboardInterrupt:
        return _interrupted(Path(a.out))
    except Exception as e:
        return command_failure(ctrl_c, e, lambda then: _interrupted(Path(a.out), then))
    return 0


def _interrupted(out: Path, then: BaseException | None = None) -> int:
    # a half-written snapshot is removed, manifest last: one with its manifest was finished before the Ctrl-C
    done = (out / "manifest.json").exists()
    print(f"{interrupted_line(then)}; {out} " + ("holds the whole snapshot" if done else
                                                 "holds nothing of the snapshot"), file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())

"""``specheads gpu-schedule``: a trace-forced schedule (``decoding.schedule``) from held-out label traces, for
timing the decoder's real rounds on a GPU that has no real weights (``scripts/gpu_check.sh``).

    specheads gpu-schedule --labels runs/labels/heldout-20 --head checkpoints/heads/<stop head>.safetensors \\
        --calibration checkpoints/calibration.json --c 0.7 --out runs/gpu/schedule.json

Each policy's setting (SD's K, the confidence threshold, SpecDec++'s h, the goodput stop's λ) is the one the
simulator finds fastest over these traces at cost ratio c (Eq. 5.1: a draft step costs c target steps, every
verification one), which should be the c the GPU will show (0.5–0.7 for the pair's shapes on an H100 under CUDA
graphs, docs/results.md). Then one realisation of its rounds is drawn on every trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.arguments import CommandParser
from core.errors import SettingError
from core.interrupt import run_main
from core.runfolder import OutputFile
from core.shards import read_manifest
from decoding.costs import CostModel
from decoding.estimates import CalibratedConfidence
from decoding.replay import check_cost_ratios
from decoding.schedule import draw_rounds, target_only_rounds, write_schedule
from decoding.simulate import cached_head, round_lengths
from decoding.traces import load_label_traces
from evaluation.simulate import best_settings, default_grid, goodput_grid, table
from heads.export import check_labels

FAMILIES = ("sd", "confidence", "specdecpp", "goodput")
"""The policies a schedule holds beside target-only (the set the GPU check times)."""


def portable(params: dict) -> dict:
    """A policy's settings as the schedule file records them: the cost model is the file's ``c``, not an object."""
    return {k: v for k, v in params.items() if k != "costs"}


def make_schedule(labels: str, heads: list[str], calibration: str | None, c: float, traces: int | None,
                  seed: int) -> tuple[dict, str]:
    every = load_label_traces(labels, splits=("train", "val", "test"))
    chosen = sorted(every, key=lambda t: t.prompt_id)[:traces]
    costs = CostModel.eq51(c)
    grid = [(f, p) for f, p in default_grid(heads) if f in FAMILIES]
    grid += goodput_grid(chosen, heads, costs, calibration)
    text, rows = table(chosen, grid, [c])
    rng = np.random.default_rng(seed)
    policies = [{"name": "target_only", "family": "target_only", "params": {}, "predicted_speedup": 1.0,
                 "rounds": [target_only_rounds(len(t)) for t in chosen]}]
    for key, row in sorted(best_settings(rows, c).items()):
        params = row["params"]
        policies.append({"name": key, "family": row["family"], "params": portable(params),
                         "predicted_speedup": costs.speedup(row["counts"]),
                         "rounds": [draw_rounds(t.acceptance, round_lengths(t, row["family"], **params), rng)
                                    for t in chosen]})
    oracle = costs.speedup(rows[0]["counts"])
    schedule = {"labels": str(labels), "c": c, "seed": seed, "oracle_speedup": oracle,
                "traces": [{"prompt_id": t.prompt_id, "length": len(t)} for t in chosen], "policies": policies}
    return schedule, text


def main(argv: list[str] | None = None) -> dict:
    p = CommandParser(prog="specheads gpu-schedule",
                      description="A trace-forced schedule from held-out label traces, for the GPU check "
                                  "(specheads gpu-check --schedule FILE).")
    p.add_argument("--labels", required=True, help="a label folder with held-out traces (e.g. runs/labels/heldout-20)")
    p.add_argument("--head", nargs="*", default=[], help="exported stop heads (SpecDec++, and goodput on each)")
    p.add_argument("--calibration", default=None, help="a calibration file (make calibrate): goodput on the confidence")
    p.add_argument("--c", type=float, default=0.7, help="cost ratio the settings are chosen at (default 0.7)")
    p.add_argument("--traces", type=int, default=20, help="the first N traces by prompt id (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the acceptance draws")
    p.add_argument("--out", default="runs/gpu/schedule.json",
                   help="the schedule's JSON file (default runs/gpu/schedule.json)")
    a = p.parse_args(argv)
    check_cost_ratios([a.c], "--c")
    if a.traces < 1 or a.seed < 0:
        raise SettingError(f"need --traces >= 1 and --seed >= 0, got {a.traces} and {a.seed}")
    for path in [*a.head, *([a.calibration] if a.calibration else [])]:
        if not Path(path).is_file():
            raise SettingError(f"{path}: no such file")
    for path in a.head:
        if cached_head(path).role != "stop":
            raise SettingError(f"{path} is a {cached_head(path).role} head: a schedule's rounds come from stop heads")
    if a.head or a.calibration:  # estimates made for another draft than the labels' would choose nothing sound
        manifest = read_manifest(a.labels)
        for path in a.head:
            check_labels(path, manifest, a.labels)
        if a.calibration:
            CalibratedConfidence.load(a.calibration).check_draft(manifest["models"]["draft"],
                                                                 f"the draft of the labels in {a.labels}")
    out = OutputFile(a.out, "gpu-schedule", "schedule")
    out.check()
    schedule, text = make_schedule(a.labels, a.head, a.calibration, a.c, a.traces, a.seed)
    print(text)
    write_schedule(out.claim(), schedule)  # a disk that cannot take it is one line (core.runfolder)
    print(f"wrote {a.out}: {len(schedule['traces'])} traces, {len(schedule['policies'])} policies "
          f"({', '.join(p['name'] for p in schedule['policies'])})")
    return schedule


if __name__ == "__main__":
    run_main(main)

"""How the heads' edge over the training-free rules moves with data size, judged on prompts no head saw.

    specheads curve --labels runs/labels/corpus --test_labels runs/labels/humaneval-heldout

For each share of the training labels' prompts (nested: 1/16 … all) and each head config, train and export the head
(``pipeline.train_all.train_one``: early stopping and its threshold on the training labels' val split), then on the
held-out labels' test rows (``--test_labels``):

- AUROC and its difference from the best training-free score (q(Y_i), H(q), margin), with 95 % bootstrap intervals
  over prompts, and ECE of P̂ against the head's training target (min(1, p/q) for a stop head);
- a stop head's simulated SpecDec++ speedup (a head reading features the traces do not hold has none) over the held-out traces against the confidence stop, SVIP and the best
  fixed K, each at the setting that is fastest on the training labels' val traces at that cost (no setting is chosen
  on the held-out prompts), and the share of the oracle's gain, at each cost ratio c of Eq. 5.1 and, with
  ``--timing``, at this device's timed costs.

A head that saw a held-out prompt is refused (``heads.export.check_unseen``). Writes ``curve.txt``, ``curve.json``
(with the digests of both label manifests) and ``curve.png`` (data size on the x axis) under ``--out``. Curves run
apart (other shares, other heads) on the same labels join into one table and plot, training nothing:

    specheads curve --merge runs/curve runs/curve-small --out runs/curve-all
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.arguments import CommandParser, check_config_file, description
from core.errors import SettingError
from core.interrupt import run_main
from core.intervals import Interval
from core.runfolder import RunFolder, write_figure, write_text
from core.shards import prompt_digests
from decoding.calibrate import COLUMNS, errors
from decoding.costs import CostModel, read_timing
from decoding.estimates import CalibratedConfidence
from decoding.replay import STOP_H_GRID, Counts, check_cost_ratios
from decoding.simulate import replayable, simulate
from decoding.traces import Trace, load_label_traces, trace_rows
from heads.export import check_unseen, read_metadata
from pipeline.train_all import RunResult, train_one

SHARES = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
CONFIGS = ("configs/train/specdecpp_d3_w6_scores.yaml", "configs/train/specdecpp_d3_w6.yaml",
           "configs/train/specdecpp_d3_w6_all.yaml", "configs/train/sprinter_lam1.5.yaml")
"""The default stop head (hidden state and draft scores), the hidden-only head, every feature family, the SPRINTER
verifier."""
COSTS = (0.05, 0.1, 0.2)
BASELINE_GRID = {"sd": [{"k": k} for k in range(1, 11)],
                 "confidence": [{"threshold": t} for t in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)],
                 "svip": [{"h": h} for h in (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)]}
"""The training-free rules a stop head is compared with, and the settings each is chosen from."""


@dataclass
class Cost:
    """One cost model of the comparison: Eq. 5.1 at a cost ratio, or a device's timed costs."""

    name: str
    costs: CostModel | None = None
    tokens: int | None = None
    """A response's tokens, for timed costs: their per-run costs are spread over them (``predicted_speedup``)."""

    def speedup(self, counts: Counts) -> float:
        return self.costs.speedup(counts) if self.tokens is None else self.costs.predicted_speedup(counts, self.tokens)

    def oracle(self, traces: list[Trace]) -> Counts:
        return simulate(traces, "oracle", costs=self.costs)


@dataclass
class Point:
    """One head trained on one share of the prompts, judged on the held-out rows and traces."""

    share: float
    run: RunResult
    speedups: dict = field(default_factory=dict)
    """cost name → {"specdecpp": speedup, "h": h, rule: speedup of each baseline, "oracle_share": …}."""

    def record(self) -> dict:
        """The point as ``curve.json`` holds it."""
        r = self.run
        return {"name": r.name, "share": self.share, "train_prompts": r.train_prompts, "train_rows": r.train_rows,
                "test": r.test, "intervals": {k: vars(v) for k, v in r.intervals.items()}, "threshold": r.threshold,
                "speedups": self.speedups, "export": str(r.export)}

    @classmethod
    def from_record(cls, r: dict) -> "Point":
        """A point read back from ``curve.json`` (what the table and the plot need of its run)."""
        result = RunResult(r["name"], {}, r["threshold"], {}, r["test"], Path(r["export"]),
                           intervals={k: Interval(**v) for k, v in r["intervals"].items()},
                           train_prompts=r["train_prompts"], train_rows=r["train_rows"])
        return cls(r["share"], result, r["speedups"])


def chosen_settings(val: list[Trace], held_out: list[Trace], cost: Cost) -> dict[str, dict]:
    """Each training-free rule at its fastest setting on the ``val`` traces under ``cost``, replayed on
    ``held_out``: {rule: {"params", "speedup"}}."""
    out = {}
    for family, grid in BASELINE_GRID.items():
        params = max(grid, key=lambda p: cost.speedup(simulate(val, family, **p)))
        out[family] = {"params": params, "speedup": cost.speedup(simulate(held_out, family, **params))}
    return out


def head_speedup(head: str, val: list[Trace], held_out: list[Trace], cost: Cost) -> dict:
    """SpecDec++ with ``head`` at the h of ``STOP_H_GRID`` fastest on ``val`` under ``cost``, on ``held_out``."""
    h = max(STOP_H_GRID, key=lambda v: cost.speedup(simulate(val, "specdecpp", head=head, h=v)))
    return {"h": h, "speedup": cost.speedup(simulate(held_out, "specdecpp", head=head, h=h))}


def estimate_calibration(labels: str, held_out: list[Trace]) -> dict[str, float]:
    """ECE against min(1, p/q) on the held-out traces' rows of the training-free acceptance estimates
    (``decoding.estimates``): the draft's own q(Y_i), and q(Y_i) calibrated by isotonic regression on the training
    labels' train traces (``decoding.calibrate``)."""
    train = trace_rows(labels, ("train",), COLUMNS)
    calibrated = CalibratedConfidence.fit(train["logp_draft"], train["acceptance"])
    return errors(calibrated, {c: np.concatenate([getattr(t, c) for t in held_out]) for c in COLUMNS})


def run(labels: str, test_labels: str, out: Path, configs: list[str], shares: list[float], costs: list[Cost],
        held_out: list[Trace], extra: list[str] = (), quiet: bool = False) -> list[Point]:
    """Train every config on every share and judge it on ``held_out``, the test traces of ``test_labels`` (module
    docstring)."""
    val = load_label_traces(labels, ("val",))
    digests = prompt_digests(test_labels, "test")
    baselines = {cost.name: chosen_settings(val, held_out, cost) for cost in costs}
    oracles = {cost.name: cost.speedup(cost.oracle(held_out)) for cost in costs}
    points = []
    for share in shares:
        tag = f"share-{share:g}"
        for config in configs:
            args = [*extra, "--data.test_labels", test_labels, "--data.train_share", str(share)]
            result = train_one(config, labels, out / tag, out / "checkpoints" / tag, out / "heads" / tag, args,
                               quiet=quiet)
            check_unseen(read_metadata(result.export), digests, f"the test split of {test_labels}", result.export)
            point = Point(share, result)
            if result.label["kind"] == "soft" and replayable(str(result.export)):
                for cost in costs:
                    head = head_speedup(str(result.export), val, held_out, cost)
                    free = baselines[cost.name]
                    point.speedups[cost.name] = {
                        "specdecpp": head["speedup"], "h": head["h"], **{f: b["speedup"] for f, b in free.items()},
                        "oracle": oracles[cost.name],
                        "oracle_share": (head["speedup"] - 1) / max(oracles[cost.name] - 1, 1e-12)}
            points.append(point)
    return points


def table(points: list[Point], costs: list[Cost], baselines_note: str = "") -> str:
    """One line per head and share: data size, AUROC and ΔAUROC with intervals, ECE, and a stop head's speedups."""
    head = (f"{'run':<26}{'share':>7}{'prompts':>8}{'rows':>8}{'AUROC':>7}{'95% CI':>16}{'ΔAUROC':>8}{'95% CI':>18}"
            f"{'ECE':>7}" + "".join(f"{f'SD++ {c.name}':>16}{'/conf':>7}{'/svip':>7}{'/bestK':>7}{'orc%':>6}"
                                    for c in costs))
    lines = [head, "-" * len(head)]
    for p in points:
        r, t = p.run, p.run.test
        a, d = r.intervals.get("auroc"), r.intervals.get("delta")
        line = (f"{r.name[:25]:<26}{p.share:>7.4g}{r.train_prompts:>8}{r.train_rows:>8}{t['head/auroc']:>7.3f}"
                + (f"{f'[{a.low:.3f}, {a.high:.3f}]':>16}{d.value:>+8.3f}{f'[{d.low:+.3f}, {d.high:+.3f}]':>18}"
                   if a and d else f"{'':>16}{'':>8}{'':>18}") + f"{t['head/ece']:>7.3f}")
        for c in costs:
            s = p.speedups.get(c.name)
            line += (f"{s['specdecpp']:>10.3f} h={s['h']:<3g}{s['specdecpp'] / s['confidence']:>7.3f}"
                     f"{s['specdecpp'] / s['svip']:>7.3f}{s['specdecpp'] / s['sd']:>7.3f}{100 * s['oracle_share']:>6.0f}"
                     if s else f"{'':>16}{'':>7}{'':>7}{'':>7}{'':>6}")
        lines.append(line)
    lines += ["ΔAUROC: the head minus the best training-free score on the held-out rows; intervals: 95 % bootstrap "
              "over held-out prompts. ECE: against the head's training target.",
              "SD++: simulated SpecDec++ speedup over target-only on the held-out traces at its h fastest on the "
              "training labels' val traces; /conf, /svip, /bestK: divided by the confidence stop, SVIP and fixed K",
              "at their settings fastest on those val traces; orc%: SD++'s share of the oracle's gain (speedup − 1)/"
              "(oracle − 1)." + baselines_note]
    return "\n".join(lines)


def plot(points: list[Point], costs: list[Cost], path: Path) -> Path:
    """ΔAUROC (with intervals) and SpecDec++ / confidence stop against the number of training prompts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(p.run.name for p in points):
        mine = [p for p in points if p.run.name == name and "delta" in p.run.intervals]
        if mine:
            x = [p.run.train_prompts for p in mine]
            d = [p.run.intervals["delta"] for p in mine]
            err = [[i.value - i.low for i in d], [i.high - i.value for i in d]]
            left.errorbar(x, [i.value for i in d], yerr=err, marker="o", capsize=3, label=name)
        for c, style in zip(costs, ("-", "--", ":", "-.", (0, (1, 4)), (0, (5, 4)))):
            stops = [p for p in points if p.run.name == name and c.name in p.speedups]
            if stops:
                right.plot([p.run.train_prompts for p in stops],
                           [p.speedups[c.name]["specdecpp"] / p.speedups[c.name]["confidence"] for p in stops],
                           linestyle=style, marker="o", label=f"{name}, {c.name}")
    left.axhline(0, color="k", lw=0.8)
    left.set(xscale="log", xlabel="training prompts", ylabel="ΔAUROC vs best training-free score",
             title="held-out AUROC edge (95 % CI over prompts)")
    right.axhline(1, color="k", lw=0.8)
    right.set(xscale="log", xlabel="training prompts", ylabel="SpecDec++ / confidence stop",
              title="simulated speedup ratio on held-out traces")
    for ax in (left, right):
        ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        return write_figure(fig, path)
    finally:
        plt.close(fig)


TRAINING_FLAGS = {"labels": "runs/labels/corpus", "test_labels": "runs/labels/humaneval-heldout",
                  "configs": list(CONFIGS), "shares": list(SHARES), "costs": list(COSTS), "timing": None,
                  "max_epochs": None, "out": "runs/curve"}
"""The flags of a training run and their defaults (``--merge`` trains nothing and takes none of them but ``--out``)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="specheads curve", description=description(__doc__))
    d = TRAINING_FLAGS
    p.add_argument("--labels", help=f"training labels (train and val splits; default {d['labels']})")
    p.add_argument("--test_labels", help="held-out labels: their test rows and traces judge every head "
                                         f"(default {d['test_labels']})")
    p.add_argument("--configs", nargs="+", help="LightningCLI head configs (default: the four of CONFIGS)")
    p.add_argument("--shares", nargs="+", type=float, help=f"shares of the training prompts (default {d['shares']})")
    p.add_argument("--costs", nargs="+", type=float, help=f"cost ratios c of Eq. 5.1 (default {d['costs']})")
    p.add_argument("--timing", help="a bench_timing JSON of this device: also compare at its costs")
    p.add_argument("--out", help=f"output folder (default {d['out']}; required with --merge)")
    p.add_argument("--max_epochs", type=int, help="override trainer.max_epochs")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--merge", nargs="+", default=None, metavar="FOLDER",
                   help="train nothing: one table and plot in --out from the curve.json of these earlier runs, "
                        "which must be trained and judged on the same labels and timed on the same costs")
    a = p.parse_args(argv)
    given = [k for k in TRAINING_FLAGS if k != "out" and getattr(a, k) is not None]
    if a.merge:
        if given:
            raise SettingError(f"--merge trains nothing: drop --{given[0]}")
        if a.out is None:
            raise SettingError("--merge needs --out: the folder for the joined table and plot")
        return a
    for k, default in TRAINING_FLAGS.items():
        if getattr(a, k) is None:
            setattr(a, k, default)
    if any(not 0 < s <= 1 for s in a.shares):
        raise SettingError(f"--shares must lie in (0, 1], got {a.shares}")
    check_cost_ratios(a.costs, "--costs")
    if a.max_epochs is not None and a.max_epochs < 1:
        raise SettingError(f"--max_epochs must be 1 or more, got {a.max_epochs}")
    return a


def inputs_record(labels: str, test_labels: str, timing: str | None) -> dict:
    """What a curve was trained, judged and timed on: the two label folders and the timing file, with the digests
    of the labels' manifests and of the timing file (None without one)."""
    from core.cache import file_sha256
    from core.shards import manifest_sha256

    return {"labels": labels, "labels_manifest_sha256": manifest_sha256(labels), "test_labels": test_labels,
            "test_labels_manifest_sha256": manifest_sha256(test_labels), "timing": timing,
            "timing_sha256": file_sha256(Path(timing)) if timing else None}


MERGED_FROM = "merged_from"
"""The key of a joined curve's ``curve.json`` naming the curves it joins (such a file may be written again)."""


def read_curve(folder: str) -> dict:
    """A curve's ``curve.json``, or one line saying why it cannot be joined."""
    path = Path(folder) / "curve.json"
    if not path.is_file():
        raise SettingError(f"no curve.json in {folder}")
    try:
        curve = json.loads(path.read_text())
        if "inputs" not in curve:
            raise SettingError(f"{path} does not record the labels it was trained and judged on; run that curve "
                               "again")
        curve["points"] = [Point.from_record(r) for r in curve["points"]]
        for key in ("labels", "labels_manifest_sha256", "test_labels", "test_labels_manifest_sha256"):
            if key not in curve["inputs"]:
                raise KeyError(key)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise SettingError(f"{path} is not a learning curve's record ({e.__class__.__name__}: {e})") from None
    return curve


def merge(folders: list[str], out: Path) -> tuple[list[Point], list[Cost], dict, dict]:
    """The points of earlier curves (their ``curve.json``): (points, the cost models they were compared at, their
    inputs record, the training-free estimates' ECE recomputed on those labels). Refused unless every curve was
    trained and judged on the same labels, which are still the ones in those folders, and timed on the same file;
    unless no head and share appears twice; and when ``out`` is one of the curves or holds a trained curve."""
    where = [Path(f).resolve() for f in folders]
    twice = next((f for i, f in enumerate(folders) if where[i] in where[:i]), None)
    if twice is not None:
        raise SettingError(f"{twice} is given twice")
    if out.resolve() in where:
        raise SettingError(f"--out {out} is one of the curves being joined: choose another folder")
    if (out / "curve.json").is_file():
        try:
            joined = MERGED_FROM in json.loads((out / "curve.json").read_text())
        except (json.JSONDecodeError, TypeError):
            joined = False
        if not joined:
            raise SettingError(f"{out} holds a curve.json that no join wrote: choose another folder for the joined "
                               "curve")
    curves = [(f, read_curve(f)) for f in folders]
    first, inputs = folders[0], curves[0][1]["inputs"]
    checks = {"labels_manifest_sha256": ("labels", "trained"), "test_labels_manifest_sha256": ("test_labels", "judged"),
              "timing_sha256": ("timing", "timed")}
    for folder, curve in curves[1:]:
        for key, (path, verb) in checks.items():
            if curve["inputs"].get(key) != inputs.get(key):
                raise SettingError(f"{folder} was {verb} on {curve['inputs'].get(path)}, {first} on "
                                   f"{inputs.get(path)} (their digests differ); join curves of the same inputs")
    now = inputs_record(inputs["labels"], inputs["test_labels"], None)
    for key in ("labels_manifest_sha256", "test_labels_manifest_sha256"):
        if now[key] != inputs[key]:
            raise SettingError(f"{inputs[checks[key][0]]} has been labeled again since these curves were made: "
                               "run them again")
    points, seen = [], {}
    for folder, curve in curves:
        for point in curve["points"]:
            key = (point.run.name, point.share)
            if key in seen:
                raise SettingError(f"{point.run.name} at share {point.share:g} is in both {seen[key]} and {folder}")
            seen[key] = folder
            points.append(point)
    heads = list(dict.fromkeys(p.run.name for p in points))  # in the order the curves name them
    points.sort(key=lambda p: (heads.index(p.run.name), p.share))
    costs = [Cost(name) for name in dict.fromkeys(name for p in points for name in p.speedups)]
    held_out = load_label_traces(inputs["test_labels"], ("test",))
    return points, costs, inputs, estimate_calibration(inputs["labels"], held_out)


CURVE_FILES = ("curve.txt", "curve.json", "curve.png")
"""What a learning curve writes into its ``--out`` folder, beside the training runs of each share."""


def curve_folder(out: Path) -> RunFolder:
    """A learning curve's ``--out``: its table, record and plot, and the heads of each share."""
    return RunFolder(out, "curve", "--out", (*CURVE_FILES, "heads/*/*.safetensors"))


def write(out: Path, points: list[Point], costs: list[Cost], inputs: dict, ece: dict,
          merged_from: list[str] | None = None) -> None:
    """``curve.txt``, ``curve.json`` and ``curve.png`` in ``out``; ``merged_from``: the curves a join read."""
    text = table(points, costs) + "\nECE against min(1, p/q) on the held-out traces' rows, training-free estimates: " \
        + ", ".join(f"{k} {v:.3f}" for k, v in ece.items())
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    plot(points, costs, out / "curve.png")
    write_text(out / "curve.txt", text + "\n")
    record = {"inputs": inputs, "estimate_ece": ece, "points": [p.record() for p in points]}
    if merged_from is not None:
        record[MERGED_FROM] = merged_from
    write_text(out / "curve.json", json.dumps(record, indent=2, default=float) + "\n")
    print(f"table: {out / 'curve.txt'}; plot: {out / 'curve.png'}")


def main(argv: list[str] | None = None) -> list[Point]:
    a = parse_args(argv)
    if a.merge:
        points, costs, inputs, ece = merge(a.merge, Path(a.out))
        folder = curve_folder(Path(a.out))
        folder.check()
        with folder.hold("a learning curve"):
            folder.check()
            folder.start(CURVE_FILES)
            write(Path(a.out), points, costs, inputs, ece, merged_from=a.merge)
        return points
    for config in a.configs:  # one line, where LightningCLI would print its usage
        check_config_file(Path(config), "specheads lightning fit")
    inputs = inputs_record(a.labels, a.test_labels, a.timing)
    costs = [Cost(f"c={c:g}", CostModel.eq51(c)) for c in a.costs]
    held_out = load_label_traces(a.test_labels, ("test",))
    if a.timing:
        tokens = round(sum(map(len, held_out)) / len(held_out))
        costs.append(Cost("timed", read_timing(a.timing), tokens=tokens))
    out = Path(a.out)
    folder = curve_folder(out)
    folder.check()
    extra = ["--trainer.max_epochs", str(a.max_epochs)] if a.max_epochs else []
    with folder.hold("a learning curve"):
        folder.check()
        folder.start([*CURVE_FILES, *(f"heads/share-{share:g}/{Path(c).stem}.safetensors" for share in a.shares
                                      for c in a.configs)])
        points = run(a.labels, a.test_labels, out, a.configs, sorted(a.shares), costs, held_out, extra, a.quiet)
        write(out, points, costs, inputs, estimate_calibration(a.labels, held_out))
    return points


if __name__ == "__main__":
    run_main(main)

"""``make train``: train the SPRINTER verifier and the SpecDec++ head, pick thresholds, export, report.

    specheads train --labels runs/labels/corpus --test_labels runs/labels/humaneval-heldout
    specheads train --sweep          # SpecDec++ head over D ∈ 0..4 × w_rej ∈ {1, 3, 6, 12}

For each config: fit (early stopping on val/loss) → best checkpoint → threshold on validation (a verifier's τ:
Youden's J on the per-token label; a stop head's h: the one the trace simulator finds fastest on the validation
traces, ``stop_threshold``) → validate and test with that threshold → export to
``<heads_dir>/<config>.safetensors`` → ROC curves (PNG) of the head and the training-free scores on the held-out
test rows. One table compares them all.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.exceptions import MisconfigurationException
from sklearn.metrics import roc_auc_score, roc_curve
from torchmetrics import Metric

from core.arguments import CommandParser, check_config_file, description
from core.cache import file_sha256
from core.errors import SettingError
from core.interrupt import run_main
from core.intervals import Interval, grouped_interval
from core.folder_lock import launching_process
from core.runfolder import RunFolder, write_figure, write_text
from core.shards import prompt_digests, read_manifest
from decoding.costs import CostModel, read_timing
from decoding.replay import (MAX_K, STOP_H_GRID, TRACE_SCORES, check_cost_ratios, choose_stop_threshold,
                             trace_head_logits)
from decoding.traces import TraceError, load_label_traces
from heads.export import LOOKUP_HEAD_ROLE, HeadFileError, check_draft, export_head, read_metadata
from pipeline.cli import HeadCLI
from pipeline.lookup_data import LOOKUP_HIDDEN, lookup_threshold
from pipeline.metrics import BASELINES

DEFAULT_CONFIGS = ("configs/train/sprinter_lam1.yaml", "configs/train/specdecpp_d3_w6.yaml")
SWEEP_DEPTHS = (0, 1, 2, 3, 4)
SWEEP_W_REJ = (1.0, 3.0, 6.0, 12.0)
STOP_C = 0.1
"""The cost ratio c = t_draft / t_target a stop head's exported h is chosen at unless told another
(``--stop_c``): about a 0.5B draft beside a 1.5B target on a GPU."""
STOP_H_FALLBACK = 0.5
"""A stop head's exported h where the validation traces cannot replay it (said so in its metadata)."""
STOP_RULE = "stop drafting when 1 - prod P_hat over the round's drafted tokens > h (SpecDec++ Eq. 4.1)"


@dataclass
class RunResult:
    name: str
    label: dict
    threshold: dict
    val: dict
    test: dict
    export: Path | None = None
    export_sha256: str | None = None
    """The exported file's digest as written, which an eval's report checks the file against."""
    curves: dict = field(default_factory=dict)
    intervals: dict = field(default_factory=dict)
    """Test AUROC of the head and its difference from the best training-free score, with 95 % intervals over
    prompts (``auroc_intervals``)."""
    train_prompts: int = 0
    """Prompts whose rows the head trained on."""
    train_rows: int = 0


def youden_threshold(binary: np.ndarray, probs: np.ndarray) -> float:
    """The threshold on P̂ that maximises TPR − FPR on these rows (0.5 when only one class is present)."""
    if binary.min() == binary.max():
        return 0.5
    fpr, tpr, thr = roc_curve(binary, probs)
    best = int(np.argmax(tpr - fpr))
    return float(np.clip(thr[best], 0.0, 1.0))


def stop_threshold(head: torch.nn.Module, labels: str, position: str, vectors: list[str], c: float = STOP_C,
                   timing: CostModel | None = None, timing_source: str | None = None) -> dict:
    """The exported threshold of a stop head: the h of ``STOP_H_GRID`` under which SpecDec++'s rule, replayed over
    the validation split's traces (``decoding.replay``, what ``evaluation.simulate`` replays), is fastest: at the
    device costs of ``timing`` (a ``bench_timing`` file's, ``timing_source``) for responses of the traces' mean
    length when given, else at Eq. 5.1 with cost ratio ``c``. The metadata says how it was chosen. A head that
    reads features the traces do not hold, or labels without validation traces, get ``STOP_H_FALLBACK``, with the
    reason."""
    beyond = [n for n in getattr(head, "scores", []) if n not in TRACE_SCORES] + list(vectors)
    traces = []
    if not beyond:
        try:
            traces = load_label_traces(labels, ("val",))
        except TraceError:
            pass
    if not traces:
        why = f"the head reads {beyond}, which the traces do not hold" if beyond else "no validation traces"
        return {"name": "h", "value": STOP_H_FALLBACK, "rule": STOP_RULE,
                "chosen_by": {"method": f"fallback ({why})"}}
    if timing is not None:
        tokens = round(sum(map(len, traces)) / len(traces))
        cost = {"model": "timing file", "file": timing_source, "c": timing.t_draft / timing.t_target,
                "by_length": timing.verify_s is not None, "tokens": tokens}
        speedup = functools.partial(timing.predicted_speedup, tokens=tokens)
    else:
        cost = {"model": "Eq. 5.1", "c": c}
        speedup = CostModel.eq51(c).speedup
    logits = [trace_head_logits(head, position, t) for t in traces]
    pick = choose_stop_threshold([t.acceptance for t in traces], logits, position == "own", speedup, STOP_H_GRID,
                                 MAX_K)
    return {"name": "h", "value": pick["h"], "rule": STOP_RULE,
            "chosen_by": {"method": "trace simulator", "splits": ["val"], "traces": len(traces), "cost": cost,
                          "grid": list(STOP_H_GRID), "max_k": MAX_K, "speedup": pick["speedup"]}}


def _predict(trainer, model, loader) -> dict[str, np.ndarray]:
    outs = trainer.predict(model, dataloaders=loader)
    return {k: torch.cat([o[k] for o in outs]).float().numpy() for k in outs[0]}


def _scalars(metrics: dict, split: str) -> dict:
    return {k[len(split) + 1 :]: float(v) for k, v in metrics.items() if k.startswith(f"{split}/")}


def train_one(config: str, labels: str, out: Path, checkpoints: Path, heads_dir: Path | None,
              extra: list[str] = (), quiet: bool = False, name: str | None = None,
              stop_c: float = STOP_C, timing: str | None = None) -> RunResult | None:
    """Fit one config on ``labels``, choose its threshold on val, test it, export it (unless heads_dir is None);
    a stop head's h is chosen at the costs of the timing file ``timing``, else at cost ratio ``stop_c``
    (``stop_threshold``).

    Fitting runs on the devices the flags in ``extra`` ask for (DDP across several); choosing the threshold,
    testing and exporting run on one device of rank 0, on every held-out row. Other ranks return None."""
    name = name or Path(config).stem
    args = ["--config", config, "--data.labels", labels, "--trainer.default_root_dir", str(out / name),
            "--checkpoint.dirpath", str(checkpoints / name), *extra]
    if quiet:
        args += ["--trainer.enable_progress_bar", "false"]
    with warnings.catch_warnings():  # the CLI reads ``args``; it would warn that this driver has flags of its own
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = HeadCLI(args=args, run=False)
    trainer, model, dm = cli.trainer, cli.model, cli.datamodule
    # what an exported head records of its prompts, read before fitting so that unreadable sequences stop the run now
    seen = trained_on(labels, dm.rows("train").prompt_ids) if heads_dir is not None else None
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank != 0:
        return None
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if trainer.world_size > 1:  # held-out passes on one device: whole splits, no gathering
        device = "gpu" if trainer.strategy.root_device.type == "cuda" else "cpu"
        trainer = pl.Trainer(accelerator=device, devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=not quiet, enable_model_summary=False)
        for metric in (m for m in model.modules() if isinstance(m, Metric)):
            # the other ranks have moved on (to the next config's fit): this rank's metrics must not wait for them
            metric.distributed_available_fn = lambda: False
    if best:
        model.load_state_dict(torch.load(best, map_location="cpu", weights_only=True)["state_dict"])
    model.eval()

    val_pred = _predict(trainer, model, dm.val_dataloader())
    tau = youden_threshold(val_pred["binary"], val_pred["probs"])
    model.threshold = tau
    soft, lookup = dm.label == "soft", dm.label == "lookup"
    costs, timing_source = (read_timing(timing), Path(timing).name) if timing else (None, None)
    if lookup:
        label = {"kind": "lookup", "n": dm.lookup[0], "m": dm.lookup[1], "w_acc": model.w_acc, "w_rej": model.w_rej}
        threshold = lookup_threshold(model.head, dm.rows("val"), *dm.lookup,
                                     dm.manifest["sampling"]["max_new_tokens"], costs, timing_source)
    elif soft:
        label = {"kind": "soft", "w_acc": model.w_acc, "w_rej": model.w_rej}
        threshold = stop_threshold(model.head, labels, dm.feature_position, dm.vectors, stop_c, costs, timing_source)
    else:
        label = {"kind": "sprinter", "lam": dm.lam}
        threshold = {"name": "tau", "value": tau, "rule": "accept the draft token when P_hat >= tau"}
    val = _scalars(trainer.validate(model, datamodule=dm, verbose=False)[0], "val")
    test = _scalars(trainer.test(model, datamodule=dm, verbose=False)[0], "test")
    result = RunResult(name, label, threshold, val, test, train_prompts=len(dm.rows("train").prompt_ids),
                       train_rows=len(dm.rows("train")))

    test_pred = _predict(trainer, model, dm.test_dataloader())
    result.curves = {"head": (test_pred["binary"], test_pred["probs"])}
    result.curves.update({b: (test_pred["binary"], test_pred[b]) for b in BASELINES})
    result.intervals = auroc_intervals(test_pred, test)
    if heads_dir is not None:
        reads = dm.manifest["models"]["target"] if lookup else dm.draft  # the model whose states the head reads
        result.export = export_head(
            model.head, heads_dir / f"{name}.safetensors", draft=reads,
            vocab_size=int(reads["vocab_size"]), label=label,
            role=LOOKUP_HEAD_ROLE if lookup else "stop" if soft else "verifier",
            threshold=threshold, position=dm.feature_position, vectors=dm.vectors,
            hidden=LOOKUP_HIDDEN if lookup else None,
            tapped_layers=dm.manifest["feature"].get("tapped_layers"),
            metrics={**{f"val/{k}": v for k, v in val.items()}, **{f"test/{k}": v for k, v in test.items()}},
            trained_on=seen,
        )
        result.export_sha256 = file_sha256(result.export)  # now: the file may be trained over before the table
    return result


def trained_on(labels: str, train_prompts) -> dict:
    """What a head records of the prompts it has seen (``heads.export``): the train prompts whose rows it trained
    on (all of them, or a share) and every val prompt (its early stopping, and its threshold on the val traces)."""
    train = prompt_digests(labels, "train")
    digests = [train[int(i)] for i in train_prompts] + list(prompt_digests(labels, "val").values())
    return {"labels": str(labels), "splits": ["train", "val"], "prompts": len(digests),
            "digests": "".join(sorted(digests))}


def auroc_intervals(pred: dict[str, np.ndarray], test: dict) -> dict[str, Interval]:
    """The head's test AUROC and its difference from the best training-free score there, each with a bootstrap
    interval over the test prompts (``core.intervals.grouped_interval``); empty when the rows hold one class."""
    y = pred["binary"]
    if y.min() == y.max():
        return {}
    best = max(BASELINES, key=lambda b: test.get(f"{b}/auroc", float("-inf")))

    def auc(scores, rows):
        return roc_auc_score(y[rows], scores[rows]) if y[rows].min() != y[rows].max() else np.nan

    return {"auroc": grouped_interval(pred["prompt_id"], lambda r: auc(pred["probs"], r)),
            "delta": grouped_interval(pred["prompt_id"], lambda r: auc(pred["probs"], r) - auc(pred[best], r))}


def plot_roc(results: list[RunResult], path: Path) -> Path:
    """One panel per run (four to a row): ROC of the head and of each training-free score on the test rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(results))
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4.5 * rows), squeeze=False)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax, r in zip(axes.flat, results):
        for scorer, (y, s) in r.curves.items():
            if y.min() == y.max():
                continue
            fpr, tpr, _ = roc_curve(y, s)
            auc = r.test.get(f"{scorer}/auroc", float("nan"))
            ax.plot(fpr, tpr, label=f"{scorer} (AUROC {auc:.3f})")
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax.set(title=f"{r.name} ({_label_text(r.label)})", xlabel="false-positive rate η_FP",
               ylabel="true-positive rate η_TP")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        return write_figure(fig, path)
    finally:
        plt.close(fig)


def _label_text(label: dict) -> str:
    if label["kind"] == "lookup":
        return f"lookup kept, w_rej={label['w_rej']:g}"
    return f"1[q/p ≤ {label['lam']}]" if label["kind"] == "sprinter" else f"soft, w_rej={label['w_rej']:g}"


def table(results: list[RunResult]) -> str:
    """Held-out test metrics: each head next to the training-free scores on the same rows and labels."""
    head_cols = {"AUROC": "auroc", "AP": "ap", "ECE": "ece", "KL": "kl", "η_TP": "eta_tp", "η_FP": "eta_fp",
                 "η_TP*": "eta_tp_thm", "η_FP*": "eta_fp_thm", "η_FP*w": "eta_fp_thm_weighted"}
    w = max([len(r.name) for r in results] + [25]) + 1  # the run-name column fits the longest name
    cols = (f"{'run':<{w}}{'label':<20}{'scorer':<14}" + "".join(f"{c:>7}" for c in head_cols)
            + f"{'thr':>12}{'ΔAUROC':>8}{'AUROC 95% CI':>18}{'ΔAUROC 95% CI':>20}")
    lines = [cols, "-" * len(cols)]
    for r in results:
        t = r.test
        best_free = max(t.get(f"{b}/auroc", float("nan")) for b in BASELINES)
        value = r.threshold["value"]
        thr = f"{r.threshold['name']}={'none' if value is None else format(value, '.3f')}"
        lines.append(f"{r.name:<{w}}{_label_text(r.label):<20}{'head':<14}"
                     + "".join(f"{t[f'head/{k}']:>7.3f}" for k in head_cols.values())
                     + f"{thr:>12}{t['head/auroc'] - best_free:>+8.3f}" + _intervals_text(r.intervals))
        for b in BASELINES:
            lines.append(f"{'':<{w}}{'':<20}{b:<14}{t[f'{b}/auroc']:>7.3f}{t[f'{b}/ap']:>7.3f}")
    lines += ["ΔAUROC: head minus the best training-free score. Test rows only; threshold chosen on val. Intervals: "
              "95 % bootstrap over test prompts (rows of a prompt resampled together).",
              "ECE, KL: against the training target (min(1, p/q) for soft heads). η_TP, η_FP: P(P̂ ≥ τ) on rows the "
              "label accepts / rejects;",
              "η_TP*, η_FP*: on rows with q/p ≤ 1 / q/p > 1, whatever λ (SPRINTER Theorem 1's definition); η_FP*w: "
              "η_FP* weighted by the excess mass (1 − p/q)+, under which Theorem 7 holds for a token-dependent head."]
    return "\n".join(lines)


def _intervals_text(intervals: dict) -> str:
    if not intervals:
        return ""
    a, d = intervals["auroc"], intervals["delta"]
    return f"{f'[{a.low:.3f}, {a.high:.3f}]':>18}{f'[{d.low:+.3f}, {d.high:+.3f}]':>20}"


TRAIN_FILES = ("metrics.txt", "metrics.json", "roc.png")
"""What a training run writes into its ``--out`` folder, beside a folder of logs per config."""


def check_heads_folder(heads_dir: Path, labels: str) -> None:
    """Refuse a heads folder holding heads of another draft than ``labels``' (or files that are no head of ours):
    this run's heads would sit beside them, one folder of two drafts' heads, the older ones' metrics elsewhere.
    Heads of the same draft are replaced or kept beside as before."""
    found = sorted(heads_dir.glob("*.safetensors")) if heads_dir.is_dir() else []
    if not found:
        return
    models = read_manifest(labels, verify=False)["models"]
    for path in found:
        try:
            meta = read_metadata(path)
        except HeadFileError as e:
            raise SettingError(f"--heads_dir {heads_dir} holds {path.name}, which is not a head this project can read "
                               f"({e}); export into another folder") from None
        try:  # a prompt-lookup stop head reads the target's states, and records the target
            check_draft(meta, draft=models["target" if meta["role"] == LOOKUP_HEAD_ROLE else "draft"], path=path)
        except HeadFileError as e:
            raise SettingError(f"--heads_dir {heads_dir} holds heads of another draft than {labels}'s ({e}); "
                               "export into another folder, e.g. one per pair and backend") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="specheads train", description=description(__doc__))
    p.add_argument("--labels", default="runs/labels/corpus", help="labeled dataset folder (data_gen output)")
    p.add_argument("--test_labels", default=None,
                   help="test on the test split of this label folder (held-out prompts, e.g. "
                        "runs/labels/humaneval-heldout) instead of --labels'")
    p.add_argument("--train_share", type=float, default=1.0,
                   help="train on this share of the train split's prompts (nested: a learning curve's subsets)")
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), help="LightningCLI configs to train")
    p.add_argument("--out", default="runs/train", help="logs, ROC curves and the metrics table")
    p.add_argument("--checkpoints", default="checkpoints", help="Lightning checkpoints, one folder per config")
    p.add_argument("--heads_dir", default="checkpoints/heads", help="exported .safetensors heads")
    p.add_argument("--max_epochs", type=int, default=None, help="override trainer.max_epochs")
    p.add_argument("--accelerator", default=None, help="override trainer.accelerator (cpu, gpu, auto)")
    p.add_argument("--devices", default=None, help="override trainer.devices (N > 1 fits with DDP)")
    p.add_argument("--num_nodes", type=int, default=None, help="override trainer.num_nodes")
    p.add_argument("--strategy", default=None, help="override trainer.strategy (ddp, …)")
    p.add_argument("--sweep", action="store_true", help="SpecDec++ head over D × w_rej instead of --configs")
    p.add_argument("--stop_c", type=float, default=STOP_C,
                   help="cost ratio t_draft / t_target a stop head's exported h is chosen at (trace simulator)")
    p.add_argument("--timing", default=None,
                   help="a bench_timing JSON of this device (models `draft`, `target`): choose a stop head's h at "
                        "its costs instead of --stop_c")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    if a.max_epochs is not None and a.max_epochs < 1 and a.max_epochs != -1:
        raise SettingError(f"--max_epochs must be 1 or more (or -1: until early stopping), got {a.max_epochs}")
    if not 0 < a.train_share <= 1:
        raise SettingError(f"--train_share must be in (0, 1], got {a.train_share:g}")
    if a.num_nodes is not None and a.num_nodes < 1:
        raise SettingError(f"--num_nodes must be 1 or more, got {a.num_nodes}")
    if a.devices is not None and not re.fullmatch(r"auto|[1-9]\d*|\d+(,\d+)*,|\d+(,\d+)+", a.devices):
        raise SettingError(f"--devices must be auto, a number of devices (1 or more) or a list of device indices "
                           f"like 0,1; got {a.devices!r}")
    return a


def main(argv: list[str] | None = None) -> list[RunResult]:
    a = parse_args(argv)
    check_cost_ratios([a.stop_c], "--stop_c")
    if a.timing:
        read_timing(a.timing)  # a bad file is one line now, not after the first fit
    for config in a.configs:  # one line, where LightningCLI would print its usage
        check_config_file(Path(config), "specheads lightning fit")
    out, ckpt = Path(a.out), Path(a.checkpoints)
    flags = {"max_epochs": a.max_epochs, "accelerator": a.accelerator, "devices": a.devices,
             "num_nodes": a.num_nodes, "strategy": a.strategy}
    extra = [arg for k, v in flags.items() if v is not None for arg in (f"--trainer.{k}", str(v))]
    extra += [*(["--data.test_labels", a.test_labels] if a.test_labels else []), "--data.train_share",
              str(a.train_share)]
    if a.quiet:
        logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    if a.sweep:
        runs = [(DEFAULT_CONFIGS[1], f"sweep_d{d}_w{w:g}",
                 ["--model.head.init_args.depth", str(d), "--model.w_rej", str(w)])
                for d in SWEEP_DEPTHS for w in SWEEP_W_REJ]
        out = out / "sweep"
        heads_dir = None
    else:
        runs = [(c, Path(c).stem, []) for c in a.configs]
        heads_dir = Path(a.heads_dir)
    if heads_dir is not None and heads_dir.resolve() == out.resolve():
        raise SettingError(f"--out and --heads_dir are one folder ({out}): give the exported heads a folder of their "
                           "own")
    folders = [RunFolder(out, "train", "--out", TRAIN_FILES)]
    if heads_dir is not None:
        folders.append(RunFolder(heads_dir, "train", "--heads_dir", ("*.safetensors",)))
    # one folder of checkpoints per config, as Lightning writes them: a run starts each afresh, so that Lightning's
    # best.ckpt is this run's and not a best-v1.ckpt beside an older one
    checkpoints = [RunFolder(ckpt / n, "train", "--checkpoints", ("*.ckpt",)) for _, n, _ in runs]
    for folder in [*folders, *checkpoints]:  # before the locks create them
        folder.check()
    # two runs into one --out or one heads folder would leave one's heads beside the other's metrics: one at a time
    with contextlib.ExitStack() as held:
        for folder in [*folders, *checkpoints]:
            held.enter_context(folder.hold("a training run"))
            folder.check()
        for labels in filter(None, (a.labels, a.test_labels)):  # one line, before Lightning says a word
            read_manifest(labels, verify=False)
        if heads_dir is not None:
            check_heads_folder(heads_dir, a.labels)
        if launching_process():  # the ranks a distributed launcher starts write into the folders it prepared
            folders[0].start(TRAIN_FILES)
            if heads_dir is not None:
                folders[1].start(f"{n}.safetensors" for _, n, _ in runs)
            for folder in checkpoints:
                folder.clear()
                folder.start(["best.ckpt"])
        results = [train_one(c, a.labels, out, ckpt, heads_dir, [*extra, *x], quiet=a.quiet, name=n,
                             stop_c=a.stop_c, timing=a.timing) for c, n, x in runs]
        if any(r is None for r in results):  # a DDP rank other than 0: rank 0 reports
            return []
        report = table(results)
        print(report)
        write_text(out / "metrics.txt", report + "\n")
        write_text(out / "metrics.json", json.dumps(
            [{"name": r.name, "label": r.label, "threshold": r.threshold, "val": r.val, "test": r.test,
              "intervals": {k: dataclasses.asdict(v) for k, v in r.intervals.items()},
              "export": str(r.export) if r.export else None,
              "export_sha256": r.export_sha256} for r in results], indent=2) + "\n")
        png = plot_roc(results, out / "roc.png") if not a.sweep else None
        for r in results:
            if r.export:
                print(f"exported {r.export}")
        print(f"table: {out / 'metrics.txt'}" + (f"; ROC curves: {png}" if png else ""))
    return results


if __name__ == "__main__":
    run_main(main, also=(MisconfigurationException,))  # Lightning's word for a bad setting: one line as well

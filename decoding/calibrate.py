"""``make calibrate``: the draft's confidence q(Y_i) calibrated on label rows, the goodput stop's acceptance estimate
without a head (``decoding.estimates.CalibratedConfidence``: isotonic regression of min(1, p/q) on q).

    specheads calibrate --labels runs/labels/corpus --splits train --out checkpoints/calibration.json \\
        [--heldout runs/labels/humaneval-heldout --heldout_splits test]

It fits on the traces' rows (the ``target`` rows, ``decoding.traces.trace_rows``) of the label folder's splits, saves
the fit to OUT with what its rows came from (the draft, its backend, the labels' sampling: the goodput policy
refuses a decoding that differs), and prints the expected calibration error against min(1, p/q) (``calibration_error``) of the raw
q(Y_i) and of the calibrated one on the rows it was fitted on and, with ``--heldout``, on that folder's rows. The
decoder (``build_policy("goodput", calibration=OUT, …)``), the simulator (``make simulate ARGS="--timing T
--calibration OUT"``) and ``generate()`` (``HeadDecoding(None, draft, calibration=OUT, costs=…)``) read the file.

With ``--prompt_lookup N M`` it fits prompt lookup's keep chance instead (``decoding.lookup_stop``: isotonic on the
match length, over the rows ``lookup_rows`` reads along the responses the label folder stores), and prints its
AUROC and ECE against whether the target kept each candidate; the prompt-lookup policy (``calibration=OUT``) and
``specheads simulate --lookup_calibration OUT`` read it.

    specheads calibrate --labels runs/labels/edits-llama --prompt_lookup 12 48 \
        --out checkpoints/lookup-calibration.json --heldout runs/labels/edits-heldout-llama --heldout_splits test
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from core.arguments import CommandParser, description
from core.errors import UserError
from core.runfolder import OutputFile
from core.shards import SPLITS, read_manifest
from decoding.estimates import CalibratedConfidence, calibration_error
from decoding.traces import trace_rows

COLUMNS = ("logp_draft", "acceptance")


def errors(calibration: CalibratedConfidence, rows: dict[str, np.ndarray]) -> dict[str, float]:
    """ECE against the rows' min(1, p/q) of the raw q(Y_i) and of the calibrated one (``isotonic``)."""
    logq, acceptance = rows["logp_draft"], rows["acceptance"]
    return {"q(Y_i)": calibration_error(np.exp(logq), acceptance),
            "isotonic q(Y_i)": calibration_error(np.exp(calibration.log_accept(logq)), acceptance)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="specheads calibrate", description=description(__doc__))
    p.add_argument("--labels", required=True, help="a label folder whose traces' rows to fit on")
    p.add_argument("--splits", nargs="+", default=["train"], choices=SPLITS, help="its splits to fit on")
    p.add_argument("--out", required=True, help="the JSON file to write (CalibratedConfidence.save)")
    p.add_argument("--heldout", default=None, metavar="FOLDER", help="a label folder to report the ECE on too")
    p.add_argument("--heldout_splits", nargs="+", default=["val", "test"], choices=SPLITS,
                   help="its splits (default: those a fit on train has not seen, when it is the same folder)")
    p.add_argument("--prompt_lookup", type=int, nargs=2, default=None, metavar=("N", "M"),
                   help="fit prompt lookup's keep chance for proposals of N-grams copying at most M tokens (llama.cpp: "
                        "12 48) along the stored responses, instead of the draft's confidence")
    p.add_argument("--timing", default=None, metavar="FILE",
                   help="with --prompt_lookup: a bench-timing JSON whose costs the rate λ of the goodput stop is "
                        "found at, over the responses fitted on (the policy's default λ)")
    a = p.parse_args(argv)
    if a.prompt_lookup is not None and min(a.prompt_lookup) < 1:
        p.error(f"--prompt_lookup N M are at least 1, got {' '.join(map(str, a.prompt_lookup))}")
    if a.timing is not None and a.prompt_lookup is None:
        p.error("--timing prices prompt lookup's goodput stop: give --prompt_lookup N M too")
    return a


def lookup_rows_of(responses: list[tuple[list[int], list[int]]], n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The match lengths and keep indicators of ``lookup_rows`` of every response."""
    from decoding.lookup_stop import LookupRows, lookup_rows

    rows = LookupRows.join([lookup_rows(prompt, response, n, m) for prompt, response in responses])
    return rows.length, rows.kept


def stored_responses(folder: str, splits: tuple[str, ...]) -> list[tuple[list[int], list[int]]]:
    from decoding.traces import load_responses

    responses = load_responses(folder, splits)
    if not responses:
        raise UserError(f"{folder} ({', '.join(splits)}) stores no responses to read prompt lookup's rows from")
    return responses


def lookup_scores(calibration, rows: tuple[np.ndarray, np.ndarray]) -> str:
    """AUROC and ECE of the calibrated keep chance against the rows' kept flags."""
    from sklearn.metrics import roc_auc_score

    chance = calibration.keep_chance(rows[0])
    auroc = roc_auc_score(rows[1], chance) if 0 < rows[1].mean() < 1 else float("nan")
    return f"keep rate {rows[1].mean():.3f}, AUROC {auroc:.3f}, ECE {calibration_error(chance, rows[1]):.4f}"


def fit_lookup(a: argparse.Namespace, out: OutputFile):
    """``--prompt_lookup``: fit, save and report prompt lookup's keep chance."""
    from decoding.costs import read_timing
    from decoding.lookup_stop import LookupCalibration
    from decoding.replay import lookup_goodput_rate

    n, m = a.prompt_lookup
    costs = None if a.timing is None else read_timing(a.timing)
    responses = stored_responses(a.labels, tuple(a.splits))
    fitted_on = lookup_rows_of(responses, n, m)
    held_out = None if a.heldout is None else lookup_rows_of(stored_responses(a.heldout, tuple(a.heldout_splits)),
                                                              n, m)
    calibration = LookupCalibration.fit(*fitted_on, n)
    manifest = read_manifest(a.labels)
    calibration.fitted = {"target": manifest["models"]["target"], "sampling": manifest["sampling"], "m": m,
                          "timing": a.timing, "device": None if costs is None else costs.device}
    if costs is not None:
        found = lookup_goodput_rate(responses, n, m, manifest["sampling"]["max_new_tokens"], calibration, costs)
        calibration.rate = found["at"]
        print(f"λ {found['at']:.3f} tokens/s under {a.timing}: the goodput stop's replay over the responses fitted "
              f"on runs at {found['rate'] / costs.target_only_rate():.3f}x target-only ({found['stopped']})")
    calibration.save(out.claim())
    print(f"{a.out}: prompt lookup's keep chance by isotonic regression on the match length, "
          f"{len(calibration.length)} knots")
    for name, rows, where in [("fitted on", fitted_on, f"{a.labels}: {', '.join(a.splits)}"),
                              ("held out", held_out, f"{a.heldout}: {', '.join(a.heldout_splits)}")]:
        if rows is not None:
            print(f"{name} ({where}, {len(rows[1])} rows): {lookup_scores(calibration, rows)}")
    return calibration


def main(argv: list[str] | None = None):
    a = parse_args(argv)
    out = OutputFile(a.out, "calibrate", "calibration file")
    try:  # every input checked before anything is written
        out.check()
        same = a.heldout is not None and Path(a.heldout).resolve() == Path(a.labels).resolve()
        if same and set(a.splits) & set(a.heldout_splits):
            raise UserError(f"--heldout_splits {' '.join(a.heldout_splits)} and --splits {' '.join(a.splits)} share "
                            f"{' '.join(sorted(set(a.splits) & set(a.heldout_splits)))} of {a.labels}: those rows are "
                            "fitted on, not held out")
        if a.prompt_lookup is not None:
            return fit_lookup(a, out)
        fitted_on = trace_rows(a.labels, tuple(a.splits), COLUMNS)
        held_out = None if a.heldout is None else trace_rows(a.heldout, tuple(a.heldout_splits), COLUMNS)
        calibration = CalibratedConfidence.fit(fitted_on["logp_draft"], fitted_on["acceptance"])
        manifest = read_manifest(a.labels)
        calibration.fitted = {"draft": manifest["models"]["draft"], "sampling": manifest["sampling"]}
        calibration.save(out.claim())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{a.out}: min(1, p/q) by isotonic regression on q(Y_i), {len(calibration.q)} knots")
    for name, rows, where in [("fitted on", fitted_on, f"{a.labels}: {', '.join(a.splits)}"),
                              ("held out", held_out, f"{a.heldout}: {', '.join(a.heldout_splits)}")]:
        if rows is not None:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in errors(calibration, rows).items())
            print(f"ECE against min(1, p/q), {name} ({where}, {len(rows['acceptance'])} rows): {shown}")
    return calibration


if __name__ == "__main__":
    main()

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
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> CalibratedConfidence:
    a = parse_args(argv)
    out = OutputFile(a.out, "calibrate", "calibration file")
    try:  # every input checked before anything is written
        out.check()
        same = a.heldout is not None and Path(a.heldout).resolve() == Path(a.labels).resolve()
        if same and set(a.splits) & set(a.heldout_splits):
            raise UserError(f"--heldout_splits {' '.join(a.heldout_splits)} and --splits {' '.join(a.splits)} share "
                            f"{' '.join(sorted(set(a.splits) & set(a.heldout_splits)))} of {a.labels}: those rows are "
                            "fitted on, not held out")
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

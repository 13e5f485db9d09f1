"""The training-free estimate â of the probability that a draft candidate is accepted (min(1, p/q) in expectation)
for the goodput stop (``decoding.rules.GoodputStop``) and its replay: the draft's own confidence q(Y_i) calibrated on
label rows (``CalibratedConfidence``); a trained stop head's is its sigmoid (``decoding.rules.log_accept``).
``calibration_error`` measures an estimate against min(1, p/q) on rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import UserError
from core.runfolder import write_text

FLOOR = 1e-12
"""The least â an estimate reports, so that log â is finite."""


class EstimateFileError(UserError):
    """A file that does not hold a saved ``CalibratedConfidence``."""


@dataclass
class CalibratedConfidence:
    """The draft's confidence q(Y_i) mapped to acceptance by isotonic regression of min(1, p/q) on q over label
    rows: â is the piecewise-linear map through ``q``, ``acceptance`` (clipped beyond them), which is what sklearn's
    ``IsotonicRegression.predict`` computes, so the saved knots are the whole model. The entropy H(q) is not read;
    a fit that needs it (logistic on [log q, H]) would take the same interface."""

    q: np.ndarray
    acceptance: np.ndarray
    rows: int = 0
    """The label rows it was fitted on."""
    fitted: dict | None = None
    """What the rows came from (``make calibrate``): the ``draft`` that drew them (its identity, backend included)
    and the ``sampling`` they were labeled at; the goodput policy refuses another draft, backend or sampling. None
    in files written before it was recorded."""

    def __post_init__(self) -> None:
        """Knots that define a map from [0, 1] to [0, 1]: as many of each, at least one, finite, q non-decreasing;
        a file that breaks this would otherwise be interpolated into nonsense without a word."""
        self.q, self.acceptance = np.asarray(self.q, float), np.asarray(self.acceptance, float)
        if self.q.ndim != 1 or self.acceptance.ndim != 1 or len(self.q) != len(self.acceptance) or not len(self.q):
            raise ValueError(f"q and acceptance must be lists of equal length >= 1, got {self.q.shape} and "
                             f"{self.acceptance.shape}")
        for name, knots in (("q", self.q), ("acceptance", self.acceptance)):
            if not np.all(np.isfinite(knots)) or knots.min() < 0 or knots.max() > 1:
                raise ValueError(f"{name} must hold probabilities in [0, 1], got {knots.min()} … {knots.max()}"
                                 + ("" if np.all(np.isfinite(knots)) else " and non-finite values"))
        if np.any(np.diff(self.q) < 0):
            raise ValueError("q must be non-decreasing (the knots of an interpolation)")
        if self.rows < 0:
            raise ValueError(f"rows must be >= 0, got {self.rows}")

    @classmethod
    def fit(cls, logp_draft: np.ndarray, acceptance: np.ndarray) -> "CalibratedConfidence":
        """Fit on rows: each candidate's log q(Y_i) and its min(1, p/q)."""
        # imported here, in a try block: a custom_generate folder copies this module to apply saved knots with
        # torch, transformers and safetensors alone, and transformers' check of a folder's imports skips try blocks
        try:
            from sklearn.isotonic import IsotonicRegression
        except ImportError:
            raise ImportError("fitting a calibrated confidence needs scikit-learn (pip install scikit-learn)") from None
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing="auto", out_of_bounds="clip")
        iso.fit(np.exp(logp_draft), acceptance)
        return cls(q=iso.X_thresholds_, acceptance=iso.y_thresholds_, rows=len(acceptance))

    def log_accept(self, logp_draft, entropy_draft=None, head_logit=None) -> np.ndarray:
        return np.log(np.maximum(np.interp(np.exp(logp_draft), self.q, self.acceptance), FLOOR))

    def check_draft(self, draft: dict, whose: str) -> None:
        """Refuse, in one line, a calibration fitted on rows of another draft (or backend) than ``draft`` (an
        identity record, as a manifest or a head file keeps it), ``whose`` naming where that draft comes from; a file
        that records no draft passes (the decoder warns of it)."""
        from core.identity import check_same_model

        if self.fitted and self.fitted.get("draft"):
            check_same_model(self.fitted["draft"], draft,
                             f"the calibration was fitted on rows of draft {self.fitted['draft'].get('name')!r}, "
                             f"{whose} is another")


    def to_dict(self) -> dict:
        """What ``save`` writes as JSON (and ``decoding.runtimes.hf_export`` bundles into a folder)."""
        return {"estimate": "calibrated_confidence", "rows": self.rows, "q": self.q.tolist(),
                "acceptance": self.acceptance.tolist(), **({"fitted": self.fitted} if self.fitted else {})}

    def save(self, path: str | Path) -> None:
        """Written whole or not at all (a temporary file renamed over it), so a reader never sees half a fit."""
        write_text(Path(path), json.dumps(self.to_dict()))

    @classmethod
    def from_dict(cls, saved: dict, where: str | Path) -> "CalibratedConfidence":
        """The calibration ``to_dict`` gave, or one ``EstimateFileError`` naming ``where`` it was read from."""
        try:
            if saved.get("estimate") != "calibrated_confidence":
                raise ValueError(f"it holds {saved.get('estimate')!r}")
            return cls(q=np.array(saved["q"], float), acceptance=np.array(saved["acceptance"], float),
                       rows=int(saved["rows"]), fitted=saved.get("fitted"))  # checked by __post_init__
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise EstimateFileError(f"{where}: not a saved calibrated confidence ({e})") from None

    @classmethod
    def load(cls, path: str | Path) -> "CalibratedConfidence":
        try:
            saved = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise EstimateFileError(f"calibration file {path}: no such file (fit one with `make calibrate`)") from None
        except (OSError, ValueError) as e:
            raise EstimateFileError(f"{path}: not a saved calibrated confidence ({e})") from None
        return cls.from_dict(saved, path)


def load_calibration(calibration: str | Path | CalibratedConfidence) -> CalibratedConfidence:
    """A saved calibration file (``CalibratedConfidence.save``, ``make calibrate``), loaded; one already loaded as
    it is."""
    return calibration if isinstance(calibration, CalibratedConfidence) else CalibratedConfidence.load(calibration)


def calibration_error(estimate: np.ndarray, acceptance: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error of estimates â against rows' min(1, p/q): the share-weighted |mean â − mean
    min(1, p/q)| over equal-width bins of â. The target is a probability, not a 0/1 label, so the binary ECE of
    torchmetrics does not apply; a bin's gap is the sum of its rows' â − min(1, p/q) over the rows."""
    estimate, acceptance = np.asarray(estimate, float), np.asarray(acceptance, float)
    which = np.minimum((estimate * bins).astype(int), bins - 1)
    return float(np.abs(np.bincount(which, weights=estimate - acceptance, minlength=bins)).sum() / len(estimate))

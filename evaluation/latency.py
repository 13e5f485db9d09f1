"""Fitting the latency model of SpecDec++ Eq. 5.1 (``decoding.costs``, whose docstring says what SpecDec++ §5.2
fits and why) to an evaluation's runs, and the costs an evaluation knows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from decoding.costs import CostModel, read_timing
from decoding.policies import POLICIES


def fit_latency(n_draft, n_target, wall_s, intercept: bool = True) -> CostModel:
    """Least-squares fit of ``wall_s`` on (``n_draft``, ``n_target``) with non-negative coefficients
    (sklearn's ``LinearRegression(positive=True)``).

    When some runs drafted and some did not, a target call gets one coefficient in each (``t_target``,
    ``t_target_step``): a verification of a few tokens and a one-token step are different forwards
    (``decoding.costs``), and one coefficient for both fits neither.
    """
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import r2_score

    n_draft, n_target = np.asarray(n_draft, float), np.asarray(n_target, float)
    y = np.asarray(wall_s, float)
    if len(y) < 2:
        raise ValueError(f"need at least 2 runs to fit the latency model, got {len(y)}")
    drafted = n_draft > 0
    split = bool(drafted.any() and (~drafted).any())
    x = np.column_stack([n_draft, n_target * drafted, n_target * ~drafted] if split else [n_draft, n_target])
    reg = LinearRegression(fit_intercept=intercept, positive=True).fit(x, y)
    pred = reg.predict(x)
    r2 = float(r2_score(y, pred)) if np.ptp(y) > 0 else 1.0
    return CostModel(t_draft=float(reg.coef_[0]), t_target=float(reg.coef_[1]),
                      t_target_step=float(reg.coef_[2]) if split else None,
                      intercept=float(reg.intercept_) if intercept else 0.0, r2=r2, n_runs=len(y))


def fit_records(records: list[dict], intercept: bool = True) -> CostModel | None:
    """Fit on every run whose counts are known (our decoder's policies', not the HF peer's); None with fewer
    than 3.

    The peers are left out: their counts come from hooks, and transformers' loop has costs of its own that the
    fit would take for the draft's."""
    rows = [r["stats"] for r in records if r.get("family") in POLICIES
            and r["stats"].get("draft_calls") is not None
            and r["stats"].get("target_calls") is not None]
    if len(rows) < 3:
        return None
    return fit_latency([s["draft_calls"] for s in rows], [s["target_calls"] for s in rows],
                       [s["wall_s"] for s in rows], intercept=intercept)


def latency_fits(records: list[dict], forwards: str | Path | None = None, timing: str | Path | None = None,
                 timing_models: tuple[str, str] = ("draft", "target"),
                 prefill_timed: bool = True) -> dict[str, CostModel | None]:
    """The fits an evaluation knows: ``fit``, from its runs ``records`` (the peers left out); ``forwards``, from
    the pair's timed forwards (a ``bench_timing`` file, when it exists); and ``timing``, from a timing file of
    another device when one is named, read for its (draft, target) entries ``timing_models``. Where a run's clock
    starts after its prompt is read (not ``prefill_timed``), the timed models charge no prefill to a run; the fit
    over the runs' walls has whatever intercept they show."""
    fits = {"fit": fit_records(records)}
    if forwards is not None and Path(forwards).exists():
        fits["forwards"] = read_timing(forwards)
    if timing:
        fits["timing"] = read_timing(timing, *timing_models)
    if not prefill_timed:
        fits.update({name: fit.without_prefill() for name, fit in fits.items() if name != "fit"})
    return fits


def selection_fit(fits: dict[str, CostModel | None], simulated: bool = False) -> CostModel | None:
    """The fit that chooses settings: the timing file's (another device), else, for ``select_by: simulated``, the
    pair's timed forwards on this one (the only costs known before any run), else the runs'."""
    return fits.get("timing") or (fits.get("forwards") if simulated else None) or fits["fit"]

"""95 % intervals over prompts (``scipy.stats.bootstrap``): the eval report's speedups and means, the training
table's AUROCs.

Every policy decodes the same prompts with the same seeds, so a ratio between two policies is resampled by prompt,
both policies' runs of a prompt together (``paired=True``): the prompt-to-prompt spread (short and long answers,
easy and hard code) cancels out of the ratio instead of widening its interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

RESAMPLES = 9999
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval."""

    value: float
    low: float
    high: float

    def clears(self, bar: float) -> bool:
        """The whole interval lies at or above ``bar``."""
        return self.low >= bar

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def _throughput_ratio(tokens_a, wall_a, tokens_b, wall_b, axis=-1):
    return (np.sum(tokens_a, axis) / np.sum(wall_a, axis)) / (np.sum(tokens_b, axis) / np.sum(wall_b, axis))


def speedup_interval(a: list[dict], b: list[dict], seed: int = 0) -> Interval:
    """Tokens per second of runs ``a`` over runs ``b`` (their ``stats``, one per prompt, in the same prompt order),
    with a paired bootstrap interval over the prompts."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"need the same prompts (at least 2) on both sides, got {len(a)} and {len(b)}")
    data = tuple(np.array([s[k] for s in side], dtype=float) for side in (a, b) for k in ("new_tokens", "wall_s"))
    value = float(_throughput_ratio(*data))
    if np.ptp(data[0] / data[1]) == 0 and np.ptp(data[2] / data[3]) == 0:
        return Interval(value, value, value)  # every prompt gives the same ratio: nothing to resample
    res = stats.bootstrap(data, _throughput_ratio, paired=True, vectorized=True, n_resamples=RESAMPLES,
                          confidence_level=CONFIDENCE, method="percentile", random_state=np.random.default_rng(seed))
    return Interval(value, float(res.confidence_interval.low), float(res.confidence_interval.high))


def new_set_interval(a: list[dict], b: list[dict], prompts: int, seed: int = 0, level: float = 0.9) -> Interval:
    """Tokens per second of runs ``a`` over runs ``b`` (as ``speedup_interval`` reads them) on another ``prompts``
    prompts like these: its median and central ``level`` range over draws of that many prompts from a bootstrap
    resample of these (the spread between prompts, and the uncertainty of what these stand for). Wider than
    ``speedup_interval``'s, which is the mean's over these prompts: what a check on other prompts may measure."""
    data = np.array([[s[k] for s in side] for side in (a, b) for k in ("new_tokens", "wall_s")], dtype=float)
    rng, n = np.random.default_rng(seed), data.shape[1]
    resampled = rng.integers(0, n, size=(RESAMPLES, n))
    draws = np.take_along_axis(resampled, rng.integers(0, n, size=(RESAMPLES, prompts)), axis=1)
    ratios = _throughput_ratio(*data[:, draws])
    low, mid, high = np.quantile(ratios, [(1 - level) / 2, 0.5, (1 + level) / 2])
    return Interval(float(mid), float(low), float(high))


def mean_interval(values, seed: int = 0) -> Interval:
    """The mean of per-prompt values (pass@1, a log-likelihood) with a bootstrap interval over the prompts."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return Interval(float(x.mean()), float(x.min()), float(x.max()))
    res = stats.bootstrap((x,), np.mean, n_resamples=RESAMPLES, confidence_level=CONFIDENCE, method="percentile",
                          random_state=np.random.default_rng(seed))
    return Interval(float(x.mean()), float(res.confidence_interval.low), float(res.confidence_interval.high))


def grouped_interval(groups, statistic, seed: int = 0, resamples: int = 1999) -> Interval:
    """``statistic(rows)`` (a function of an index array of rows) with a bootstrap interval over groups: each
    resample draws whole groups (prompts) with replacement and takes all their rows, so that rows of one prompt,
    which are correlated, are never counted as independent evidence. Resamples where the statistic is NaN are left
    out."""
    groups = np.asarray(groups)
    members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    value = float(statistic(np.arange(len(groups))))
    if len(members) < 2:
        return Interval(value, value, value)

    def on_groups(chosen):
        return statistic(np.concatenate([members[int(i)] for i in chosen]))

    res = stats.bootstrap((np.arange(len(members)),), on_groups, vectorized=False, n_resamples=resamples,
                          confidence_level=CONFIDENCE, method="percentile", random_state=np.random.default_rng(seed))
    # a resample can leave the statistic undefined (an AUROC over rows of one class): the percentiles of the
    # defined ones, which is what the percentile method reports when every resample is defined
    tail = 50 * (1 - CONFIDENCE)
    low, high = np.nanpercentile(res.bootstrap_distribution, [tail, 100 - tail])
    return Interval(value, float(low), float(high))

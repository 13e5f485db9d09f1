"""Paired bootstrap intervals over prompts: they cover the true ratio at about the stated rate, pairing narrows them,
and an unpaired resampler (the broken variant) is told apart by the same checks."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from core.intervals import Interval, mean_interval, speedup_interval


def runs(rng, n, speed, difficulty):
    """Per-prompt stats: prompt difficulty scales wall time for every policy alike (48 tokens, or fewer at an EOS
    that depends on the prompt)."""
    tokens = np.minimum(48, (30 * difficulty).astype(int) + 10)
    wall = tokens * difficulty / speed * rng.lognormal(0, 0.05, size=n)
    return [{"new_tokens": int(t), "wall_s": float(w)} for t, w in zip(tokens, wall)]


def test_identical_runs_give_a_point():
    a = [{"new_tokens": 10, "wall_s": 2.0}, {"new_tokens": 20, "wall_s": 4.0}]
    assert speedup_interval(a, a) == Interval(1.0, 1.0, 1.0)


def test_paired_interval_covers_the_true_ratio_and_is_narrow():
    rng = np.random.default_rng(0)
    covered, widths = 0, []
    for _ in range(40):
        difficulty = rng.lognormal(0, 0.6, size=20)  # prompts differ a lot
        iv = speedup_interval(runs(rng, 20, 1.2, difficulty), runs(rng, 20, 1.0, difficulty))
        covered += iv.low <= 1.2 <= iv.high
        widths.append(iv.high - iv.low)
    assert covered >= 33  # ~95 % of 40, with room for chance
    assert np.median(widths) < 0.1  # the difficulty cancels out


def test_an_unpaired_bootstrap_is_much_wider():
    """The broken variant: resampling each side's prompts independently lets the difficulty spread in."""
    rng = np.random.default_rng(1)
    difficulty = rng.lognormal(0, 0.6, size=20)
    a, b = runs(rng, 20, 1.2, difficulty), runs(rng, 20, 1.0, difficulty)
    paired = speedup_interval(a, b)
    data = tuple(np.array([s[k] for s in side], float) for side in (a, b) for k in ("new_tokens", "wall_s"))
    ratio = lambda ta, wa, tb, wb, axis=-1: (ta.sum(axis) / wa.sum(axis)) / (tb.sum(axis) / wb.sum(axis))  # noqa: E731
    unpaired = stats.bootstrap(data, ratio, paired=False, vectorized=True, n_resamples=2000, method="percentile",
                               random_state=np.random.default_rng(0)).confidence_interval
    assert (unpaired.high - unpaired.low) > 3 * (paired.high - paired.low)


def test_mean_interval_and_bad_input():
    iv = mean_interval([0, 1, 1, 0, 1, 1, 1, 0, 1, 1])
    assert iv.value == pytest.approx(0.7) and iv.low < 0.7 < iv.high and iv.clears(0.3) and not iv.clears(0.5)
    assert mean_interval([1, 1, 1]) == Interval(1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="same prompts"):
        speedup_interval([{"new_tokens": 1, "wall_s": 1.0}] * 3, [{"new_tokens": 1, "wall_s": 1.0}] * 2)


def test_a_grouped_interval_resamples_prompts_not_rows():
    """Rows of one prompt are copies here: the interval over prompts is the one of the prompts' own values, far
    wider than a bootstrap that took the 500 rows as independent would give."""
    from core.intervals import grouped_interval

    values = np.random.default_rng(0).normal(size=10)
    rows, groups = np.repeat(values, 50), np.repeat(np.arange(10), 50)
    grouped = grouped_interval(groups, lambda r: rows[r].mean())
    by_prompt = mean_interval(values)
    assert grouped.value == pytest.approx(values.mean())
    assert grouped.high - grouped.low == pytest.approx(by_prompt.high - by_prompt.low, rel=0.15)
    by_row = mean_interval(rows)
    assert by_row.high - by_row.low < 0.3 * (grouped.high - grouped.low)

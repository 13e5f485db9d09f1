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


def test_another_set_of_prompts_lands_in_the_spread_the_mean_interval_leaves_out():
    """Prompts whose speedups differ a lot (prompt lookup copies much of some responses, little of others): the
    ratio measured on 20 other prompts lies in ``new_set_interval``'s 90 % range for about 90 % of draws, where the
    mean's interval over the 40 traced prompts (the broken stand-in) holds it far less often."""
    from core.intervals import new_set_interval

    rng = np.random.default_rng(1)

    def prompts(n):  # per prompt: a speedup from 1× to about 5×, target-only's wall alike
        tokens = np.full(n, 256)
        base = tokens * 0.1 * rng.lognormal(0, 0.05, size=n)
        run = base / np.exp(rng.uniform(0, 1.6, size=n))
        return ([{"new_tokens": int(t), "wall_s": float(w)} for t, w in zip(tokens, run)],
                [{"new_tokens": int(t), "wall_s": float(w)} for t, w in zip(tokens, base)])

    inside = {"spread": 0, "mean": 0}
    trials = 150
    for trial in range(trials):
        traced, other = prompts(40), prompts(20)
        measured = speedup_interval(*other).value
        spread = new_set_interval(*traced, 20, seed=trial)
        mean = speedup_interval(*traced, seed=trial)
        assert spread.low < mean.low and mean.high < spread.high
        inside["spread"] += spread.low <= measured <= spread.high
        inside["mean"] += mean.low <= measured <= mean.high
    assert inside["spread"] / trials >= 0.85 and inside["mean"] / trials <= 0.8, inside

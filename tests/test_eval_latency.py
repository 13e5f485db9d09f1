"""SpecDec++ Eq. 5.1: the regression recovers known per-forward times; timing files feed predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.errors import UserError
from decoding.costs import CostModel, TimingFileError, read_timing
from evaluation import bench_timing
from evaluation.latency import fit_latency, fit_records


def test_fit_recovers_known_times():
    rng = np.random.default_rng(0)
    nd = rng.integers(0, 400, 60)
    nt = rng.integers(1, 150, 60)
    wall = 0.012 * nd + 0.071 * nt + 0.3
    fit = fit_latency(nd, nt, wall)
    assert fit.t_draft == pytest.approx(0.012, rel=1e-6)
    assert fit.t_target == pytest.approx(0.071, rel=1e-6)
    assert fit.intercept == pytest.approx(0.3, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)
    assert fit.predict(100, 10) == pytest.approx(0.012 * 100 + 0.071 * 10 + 0.3)


def test_fit_with_noise_has_high_but_not_perfect_r2():
    rng = np.random.default_rng(1)
    nd, nt = rng.integers(0, 400, 200), rng.integers(1, 150, 200)
    wall = 0.01 * nd + 0.05 * nt + rng.normal(0, 0.05, 200)
    fit = fit_latency(nd, nt, wall, intercept=False)
    assert fit.t_draft == pytest.approx(0.01, rel=0.05) and fit.t_target == pytest.approx(0.05, rel=0.05)
    assert 0.95 < fit.r2 < 1.0


def test_fit_records_skips_runs_without_counts():
    recs = [{"family": "sd", "stats": {"draft_calls": d, "target_calls": t, "wall_s": 0.01 * d + 0.05 * t}}
            for d, t in [(0, 10), (10, 0), (20, 5), (7, 3)]]
    recs.append({"family": "sd", "stats": {"draft_calls": None, "target_calls": None, "wall_s": 99.0}})
    recs.append({"family": "hf_assisted", "stats": {"draft_calls": 50, "target_calls": 5, "wall_s": 99.0}})  # a peer
    fit = fit_records(recs, intercept=False)
    assert fit.n_runs == 4 and fit.t_target == pytest.approx(0.05)


def test_bench_timing_input_errors_are_user_errors(tmp_path):
    """A wrong shape is the project's one-line user error, not an exit from inside the library."""
    with pytest.raises(UserError, match="neither a built-in shape"):
        bench_timing.model_config(str(tmp_path / "missing"))


TINY = ["--model", "draft=tiny", "--model", "target=tiny", "--prefill", "4", "--cache", "4", "8", "--verify", "5",
        "--repeats", "1", "--device", "cpu", "--precision", "float32"]


def test_bench_timing_tiny_writes_json_that_predicts(tmp_path, capsys):
    out = tmp_path / "timing.json"
    bench_timing.main([*TINY, "--out", str(out)])
    printed = capsys.readouterr()
    assert "bench-timing: 100%" in printed.err and "2/2" in printed.err  # the progress bar, on stderr only
    assert "bench-timing:" not in printed.out and "\r" not in printed.out
    result = json.loads(out.read_text())
    assert "interrupted" not in result
    assert [m["name"] for m in result["models"]] == ["draft", "target"]
    assert set(result["models"][0]["decode"]) == {"4", "8"}
    assert [result["models"][1][k]["tokens"] for k in ("verify_short", "verify")] == [3, 5]
    fit = CostModel.from_timing(result)
    assert fit.t_draft > 0 and fit.t_target > 0 and fit.t_target_step > 0


def test_bench_timing_interrupted_keeps_the_models_it_timed(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the second model is timed: the first model's entry is written beside the timing file, as a
    finished run writes it (marked interrupted, never read as a timing file), the whole timing file an earlier run
    wrote there stays, and the command ends as every command does on Ctrl-C (one line, exit 130)."""
    from core.interrupt import run_main

    timed = []

    def time_model(*args):
        if timed:
            raise KeyboardInterrupt
        timed.append(real(*args))
        return timed[-1]

    real = bench_timing.time_model
    monkeypatch.setattr(bench_timing, "time_model", time_model)
    out = tmp_path / "timing.json"
    monkeypatch.setattr(bench_timing, "time_model", real)
    bench_timing.main([*TINY, "--out", str(out)])  # an earlier, whole run
    whole = out.read_text()
    monkeypatch.setattr(bench_timing, "time_model", time_model)
    with pytest.raises(SystemExit) as e:
        run_main(lambda: bench_timing.main([*TINY, "--out", str(out)]))
    assert e.value.code == 130
    assert out.read_text() == whole
    part = tmp_path / "timing.interrupted.json"
    result = json.loads(part.read_text())
    assert result["interrupted"] is True and result["models"] == timed and timed[0]["name"] == "draft"
    err = capsys.readouterr().err
    assert "kept what was timed before the interrupt (draft@float32)" in err
    assert err.strip().splitlines()[-1].startswith("interrupted")
    with pytest.raises(TimingFileError, match="an interrupted run's"):
        read_timing(part)


def test_bench_timing_interrupted_before_a_model_is_timed_writes_nothing(tmp_path, monkeypatch):
    def time_model(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_timing, "time_model", time_model)
    with pytest.raises(KeyboardInterrupt):
        bench_timing.main([*TINY, "--out", str(tmp_path / "timing.json")])
    assert not list(tmp_path.iterdir())


def timing_file(d_step=0.05, d_prefill=0.5, t_step=0.5, t_verify=1.3, verify_tokens=9, t_prefill=3.5,
                t_verify_short=None) -> dict:
    """A ``bench_timing`` JSON with hand-set medians (``t_verify_short``: a 3-token verify too)."""
    def entry(name, step, prefill, verify, short=None):
        out = {"name": name, "precision": "float32", "prefill": {"tokens": 128, "median_s": prefill},
               "decode": {"128": {"median_s": step}}, "verify": {"tokens": verify_tokens, "median_s": verify}}
        if short is not None:
            out["verify_short"] = {"tokens": 3, "median_s": short}
        if name == "draft":  # a catch-up read that costs a step: nothing beyond it
            out["catch_up"] = {"tokens": 2, "cache": 128, "median_s": step}
        return out
    return {"models": [entry("draft", d_step, d_prefill, d_step * 2),
                       entry("target", t_step, t_prefill, t_verify, t_verify_short)]}


def test_timed_forwards_charge_the_verify_slope_per_draft_forward_and_each_prefill_once():
    """A verification of n candidates is a target forward of n + 1 tokens: step + n · slope, so each drafted
    candidate costs a draft step plus the slope; each model's prefill beyond one step is paid once per run."""
    fit = CostModel.from_timing(timing_file())
    slope = (1.3 - 0.5) / 8
    assert fit.t_draft == pytest.approx(0.05 + slope) and fit.t_target == pytest.approx(0.5)
    assert fit.intercept == pytest.approx(3.0) and fit.draft_intercept == pytest.approx(0.45)
    # SD with K = 8 and 3 rounds: 24 draft forwards, 3 verifications of 9 tokens, both prefills
    assert fit.predict(24, 3) == pytest.approx(24 * 0.05 + 3 * 1.3 + 3.0 + 0.45)
    assert fit.predict(0, 10) == pytest.approx(10 * 0.5 + 3.0)  # target-only pays no draft prefill
    flat = CostModel.from_timing(timing_file(t_verify=0.5))  # a GPU-like verify that costs one step: no slope
    assert flat.t_draft == pytest.approx(0.05)


def test_runs_timed_after_their_prompt_are_predicted_without_a_prefill(tmp_path):
    """An eval with ``untimed_prefill`` starts each run's clock after the prompt is read: its timed forwards and
    timing file charge a run no prefill (the ratio over target-only would shrink by it), while the fit over the
    runs' own walls keeps the intercept it finds."""
    import json

    from evaluation.latency import latency_fits

    path = tmp_path / "timing.json"
    path.write_text(json.dumps(timing_file()))
    timed = latency_fits([], forwards=path, timing=path)
    untimed = latency_fits([], forwards=path, timing=path, prefill_timed=False)
    for name in ("forwards", "timing"):
        assert timed[name].intercept == pytest.approx(3.0) and timed[name].draft_intercept == pytest.approx(0.45)
        assert untimed[name].intercept == untimed[name].draft_intercept == 0.0
        assert untimed[name].predict(24, 3) == pytest.approx(timed[name].predict(24, 3) - 3.45)


def test_two_verify_lengths_separate_a_verifications_fixed_and_per_token_costs():
    """On a CPU a few-token forward leaves the one-token fast path: T(3) = 0.8 s, T(9) = 1.3 s against a 0.5 s step
    give v1 = 1/12 s per token and v0 = 0.55 s; runs that draft pay v0 + v1 per call, target-only the step."""
    fit = CostModel.from_timing(timing_file(t_verify_short=0.8))
    v1 = 0.5 / 6
    assert fit.t_draft == pytest.approx(0.05 + v1) and fit.t_target == pytest.approx(0.8 - 3 * v1 + v1)
    assert fit.t_target_step == pytest.approx(0.5)
    # SD with K = 3 over 3 rounds: three 4-token verifications cost 3·T(4) = 3·(0.55 + 4·v1)
    assert fit.predict(9, 3) == pytest.approx(9 * 0.05 + 3 * (0.55 + 4 * v1) + 3.0 + 0.45)
    assert fit.predict(0, 10) == pytest.approx(10 * 0.5 + 3.0)


def test_a_table_of_verification_lengths_charges_each_call_its_own_cost():
    """On 2 CPU cores a forward's cost jumps after one token and grows slowly after a few (0.5 s, 1.07 s, 1.34 s,
    1.84 s for 1, 2, 3, 10 tokens): the line through 3 and 9 tokens would charge a two-token verification 1.26 s. With
    the table, a run with calls of known lengths pays each one's interpolated cost; one without keeps the line."""
    timing = timing_file(t_verify=1.8, t_verify_short=1.34)
    timing["models"][1]["verify_by_tokens"] = {"2": {"median_s": 1.07}, "3": {"median_s": 1.34},
                                               "11": {"median_s": 1.82}}
    fit = CostModel.from_timing(timing)
    assert fit.draft_step == pytest.approx(0.05) and fit.verify_s == {2: 1.07, 3: 1.34, 9: 1.8, 11: 1.82}
    assert [fit.verify_time(m) for m in (1, 2, 6, 10, 11, 13)] == pytest.approx([0.5, 1.07, 1.57, 1.81, 1.82, 1.84])
    calls = np.zeros(12)
    calls[2], calls[11] = 4, 2  # four one-candidate rounds and two of ten: 24 draft forwards
    assert fit.predict(24, 6, calls=calls) == pytest.approx(24 * 0.05 + 4 * 1.07 + 2 * 1.82 + 3.0 + 0.45)
    line = fit.predict(24, 6)
    assert line == pytest.approx(24 * fit.t_draft + 6 * fit.t_target + 3.0 + 0.45) and line > fit.predict(24, 6, calls=calls)
    # prompt lookup: no draft forward (nor the draft's prefill), each verification at its own length
    assert fit.predict(0, 6, calls=calls) == pytest.approx(4 * 1.07 + 2 * 1.82 + 3.0)
    steps = np.zeros(12)
    steps[1] = 10
    assert fit.predict(0, 10, calls=steps) == pytest.approx(10 * 0.5 + 3.0) == fit.predict(0, 10)  # target-only
    assert CostModel.from_timing(timing_file()).verify_s is None
    timing["models"][1]["verify_by_tokens"]["4"] = {"median_s": 1.24}  # a CPU's 4-token forward can beat 3 tokens
    assert CostModel.from_timing(timing).verify_time(4) == pytest.approx(1.24)
    timing["models"][1]["verify_by_tokens"]["12"] = {"median_s": 1.70}  # a cheaper longest length is no trend
    assert CostModel.from_timing(timing).verify_time(15) == pytest.approx(1.70)


def test_the_fit_gives_target_only_steps_their_own_cost():
    """Runs that draft verify several tokens per target call; target-only steps one: each gets its coefficient."""
    rng = np.random.default_rng(2)
    nd, nt = rng.integers(20, 60, 40), rng.integers(10, 20, 40)
    steps = rng.integers(40, 60, 10)
    wall = np.r_[0.03 * nd + 0.9 * nt, 0.4 * steps] + 4.0
    fit = fit_latency(np.r_[nd, np.zeros(10)], np.r_[nt, steps], wall)
    assert (fit.t_draft, fit.t_target, fit.t_target_step, fit.intercept) == pytest.approx((0.03, 0.9, 0.4, 4.0))
    assert fit.predict(0, 50) == pytest.approx(0.4 * 50 + 4.0) and fit.predict(30, 10) == pytest.approx(0.9 + 9 + 4)
    single = fit_latency(nd, nt, wall[:40])  # no target-only run: one target coefficient
    assert single.t_target_step is None and single.predict(0, 50) == pytest.approx(0.9 * 50 + 4.0)


def test_a_rounds_host_overhead_is_priced_wherever_a_round_drafts():
    """A timing file's ``round_overhead`` is paid by every round that verifies a candidate, in the simulator's
    prices, the goodput stop's round seconds and the eval's predictions alike, and never by target-only's steps."""
    from decoding.replay import expected_counts, sd_round_lengths

    plain, host = CostModel.from_timing(timing_file()), CostModel.from_timing({**timing_file(),
                                                                               "round_overhead": {"median_s": 0.01}})
    assert host.verify(1) == plain.verify(1) and host.verify(4) == pytest.approx(plain.verify(4) + 0.01)
    assert host.round_seconds(np.arange(3)).tolist() == pytest.approx(
        (plain.round_seconds(np.arange(3)) + [0.0, 0.01, 0.01]).tolist())
    counts = expected_counts(np.full(32, 0.7), sd_round_lengths(32, 3))
    # the rounds that verify a candidate (a round at a trace's last token has none to draft)
    assert host.price(counts) == pytest.approx(plain.price(counts) + 0.01 * counts.calls[2:].sum())
    assert host.predict(30, 10) == pytest.approx(plain.predict(30, 10) + 0.01 * 10)
    assert host.predict(0, 10) == plain.predict(0, 10)

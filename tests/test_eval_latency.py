"""SpecDec++ Eq. 5.1: the regression recovers known per-forward times; timing files feed predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evaluation import bench_timing
from evaluation.latency import fit_latency, fit_records, timing_fit


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
    recs = [{"stats": {"draft_calls": d, "target_calls": t, "wall_s": 0.01 * d + 0.05 * t}}
            for d, t in [(0, 10), (10, 0), (20, 5), (7, 3)]]
    recs.append({"stats": {"draft_calls": None, "target_calls": None, "wall_s": 99.0}})
    fit = fit_records(recs, intercept=False)
    assert fit.n_runs == 4 and fit.t_target == pytest.approx(0.05)


def test_bench_timing_tiny_writes_json_that_predicts(tmp_path):
    out = tmp_path / "timing.json"
    bench_timing.main(["--model", "draft=tiny", "--model", "target=tiny", "--prefill", "4", "--cache", "4", "8",
                       "--verify", "2", "--repeats", "1", "--device", "cpu", "--out", str(out), "--precision", "float32"])
    result = json.loads(out.read_text())
    assert [m["name"] for m in result["models"]] == ["draft", "target"]
    assert set(result["models"][0]["decode"]) == {"4", "8"}
    fit = timing_fit(result)
    assert fit.t_draft > 0 and fit.t_target > 0

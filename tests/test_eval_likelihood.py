"""The target's log-likelihood of each output: the per-token math on the tiny target, the resumable score file,
and the report's column with its paired interval."""

from __future__ import annotations

import json

import pytest
import torch
from test_eval_fakes import fake_engine, fake_loglik
from test_eval_run import make_cfg
from transformers import AutoModelForCausalLM

from evaluation.likelihood import attach_scores, mean_loglik, score_records
from evaluation.run import run_eval
from evaluation.rundir import RunDir


@torch.no_grad()
def test_mean_loglik_is_the_mean_of_each_tokens_log_probability_at_its_own_prefix(tiny_pair):
    target = AutoModelForCausalLM.from_pretrained(tiny_pair[1]).eval()
    prompt, tokens = [5, 9, 2, 7], [11, 3, 3, 20, 1]
    per_token = []
    for i, tok in enumerate(tokens):  # one forward per prefix: no shared positions to get wrong
        logits = target(torch.tensor([prompt + tokens[:i]])).logits[0, -1]
        per_token.append(torch.log_softmax(logits.float(), -1)[tok])
    expected = float(torch.stack(per_token).mean())
    assert mean_loglik(target, prompt, tokens) == pytest.approx(expected, abs=1e-5)
    shifted = float(torch.stack(per_token[1:]).mean())  # what an off-by-one slice would score
    assert abs(shifted - expected) > 1e-3
    with pytest.raises(ValueError, match="no tokens"):
        mean_loglik(target, prompt, [])


def records(tokens_of_b=(4, 5)):
    return [{"mode": "sample", "run": "a", "prompt": 0, "tokens": [1, 2, 3]},
            {"mode": "sample", "run": "b", "prompt": 0, "tokens": list(tokens_of_b)},
            {"mode": "sample", "run": "c", "prompt": 1, "tokens": []}]


def test_scores_resume_and_never_attach_to_other_tokens(tmp_path):
    calls = []

    def loglik(ids, tokens):
        calls.append(tuple(tokens))
        return -float(len(tokens))

    prompts = {0: [7], 1: [8]}
    assert score_records(tmp_path, records(), prompts, loglik, quiet=True) == 2  # the empty output is not scored
    assert score_records(tmp_path, records(), prompts, loglik, quiet=True) == 0  # resumed: nothing left
    with open(RunDir(tmp_path).loglik, "a") as f:
        f.write('{"mode": "sample", "run": "a", "pro')  # a line an interruption cut short
    changed = records(tokens_of_b=(4, 5, 6))  # the same run key, other tokens (e.g. a rerun elsewhere)
    by_run = {r["run"]: r["target_loglik"] for r in attach_scores(tmp_path, changed)}
    assert by_run == {"a": -3.0, "b": None, "c": None}
    assert score_records(tmp_path, changed, prompts, loglik, quiet=True) == 1 and calls[-1] == (4, 5, 6)
    assert {r["run"]: r["target_loglik"] for r in attach_scores(tmp_path, changed)}["b"] == -3.0


def test_report_gives_each_runs_loglik_and_its_paired_difference_from_the_exact_runs(tmp_path):
    cfg = make_cfg(tmp_path)
    out = run_eval(cfg, fake_engine(loglik=fake_loglik), quiet=True)
    rep = json.loads((out / "report.json").read_text())
    rows = {r["family"]: r for r in rep["modes"]["sample"]["table"]}
    # SD repeats target-only's tokens; SpecDec++'s (another exact sample) and draft-only's are 2 and 1 higher, so
    # their fake log-likelihoods are 0.2 and 0.1 lower. Each run is set against the mean of the *other* exact runs.
    assert rows["sd"]["loglik"] == rows["target_only"]["loglik"]
    assert rows["sd"]["loglik_vs_exact"] == pytest.approx(0.1) == rows["target_only"]["loglik_vs_exact"]
    assert rows["specdecpp"]["loglik_vs_exact"] == pytest.approx(-0.2)
    assert rows["draft_only"]["loglik_vs_exact"] == pytest.approx(-0.1 + 0.2 / 3)
    chosen_sd = next(r for r in rep["modes"]["sample"]["sweep"] if r["run"] == rows["sd"]["run"])
    assert chosen_sd["loglik_vs_exact"] == pytest.approx(0.1)  # on the sweep prompts, still not against itself
    lo, hi = rows["target_only"]["loglik_ci"]
    assert lo <= rows["target_only"]["loglik"] <= hi and lo < hi  # prompts differ: a real interval
    md = (out / "report.md").read_text()
    assert "log p/token [95 %]" in md and "Δ log p vs exact [95 %]" in md
    (tmp_path / "other").mkdir()
    no_scores = run_eval(make_cfg(tmp_path / "other"), fake_engine(), quiet=True)
    assert not RunDir(no_scores).loglik.exists()
    (tmp_path / "off").mkdir()
    switched_off = run_eval(make_cfg(tmp_path / "off", loglik=False), fake_engine(loglik=fake_loglik), quiet=True)
    assert not RunDir(switched_off).loglik.exists()

"""The trace simulator: its exact expectations against a Monte Carlo replay of the same rounds (and a broken
recursion rejected by the same check), the count identity, the stop rules' round lengths, the oracle as a ceiling,
and the command on tiny labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.shards import read_manifest
from evaluation import simulate as sim


def monte_carlo(acceptance: np.ndarray, lengths: np.ndarray, reps: int, seed: int = 0,
                calls: np.ndarray | None = None) -> np.ndarray:
    """(reps, 3) draft forwards, target calls, discarded of speculative sampling, replayed round by round;
    ``calls[r, m]`` counts replay r's target calls of m tokens."""
    rng = np.random.default_rng(seed)
    out = np.zeros((reps, 3))
    for r in range(reps):
        s = 0
        while s < len(acceptance):
            n = int(lengths[s])
            kept = 0
            while kept < n and rng.random() < acceptance[s + kept]:
                kept += 1
            out[r] += (n, 1, n - kept)
            if calls is not None:
                calls[r, n + 1] += 1
            s += kept + 1
    return out


def agrees(counts: sim.Counts, draws: np.ndarray) -> bool:
    mean, se = draws.mean(0), draws.std(0) / np.sqrt(len(draws)) + 1e-9
    return bool(np.all(np.abs(np.array([counts.draft, counts.target, counts.discarded]) - mean) < 4 * se))


def broken_expected_counts(acceptance, lengths):
    """The recursion with the next round starting at the rejected candidate instead of after it."""
    length = len(acceptance)
    draft, target, discarded = (np.zeros(length + 2) for _ in range(3))
    for s in range(length - 1, -1, -1):
        n, reach, d, t, x = int(lengths[s]), 1.0, 0.0, 0.0, 0.0
        for j in range(n):
            p = reach * (1 - acceptance[s + j])
            nxt = min(s + max(j, 1), length)
            d, t, x = d + p * draft[nxt], t + p * target[nxt], x + p * (discarded[nxt] + n - j)
            reach *= acceptance[s + j]
        nxt = min(s + n + 1, length)
        draft[s], target[s], discarded[s] = n + d + reach * draft[nxt], 1 + t + reach * target[nxt], x + reach * discarded[nxt]
    return sim.Counts(n=length, draft=draft[0], target=target[0], discarded=discarded[0])


@pytest.fixture
def trace_acceptance():
    return np.random.default_rng(1).uniform(0.3, 1.0, size=40)


@pytest.mark.parametrize("rule", ["sd3", "stops"])
def test_expectations_match_a_monte_carlo_replay_and_a_broken_recursion_does_not(trace_acceptance, rule):
    a = trace_acceptance
    if rule == "sd3":
        lengths = sim.sd_round_lengths(len(a), 3)
    else:
        lengths = sim.round_lengths(np.random.default_rng(2).random(len(a)) < 0.3, True, 6)
    draws = monte_carlo(a, lengths, reps=4000)
    assert agrees(sim.expected_counts(a, lengths), draws)
    assert not agrees(broken_expected_counts(a, lengths), draws)


def test_calls_by_verification_length_match_a_monte_carlo_replay(trace_acceptance):
    """What a cost table per verification length needs: the expected target calls of each length m (m − 1
    candidates), which sum to N_target and weight m − 1 to N_draft."""
    a = trace_acceptance
    lengths = sim.round_lengths(np.random.default_rng(3).random(len(a)) < 0.3, False, 6)
    seen = np.zeros((4000, 8))
    monte_carlo(a, lengths, reps=4000, calls=seen)
    c = sim.expected_counts(a, lengths)
    mean, se = seen.mean(0), seen.std(0) / np.sqrt(len(seen)) + 1e-9
    assert np.all(np.abs(np.pad(c.calls, (0, 8 - len(c.calls))) - mean) < 4 * se)
    assert c.calls.sum() == pytest.approx(c.target)
    assert (c.calls * np.maximum(np.arange(len(c.calls)) - 1, 0)).sum() == pytest.approx(c.draft)
    shifted = np.roll(c.calls, 1)  # each call charged one token too many: the replay tells it apart
    assert not np.all(np.abs(np.pad(shifted, (0, 8 - len(shifted))) - mean) < 4 * se)
    both = sim.Counts()
    both += c
    both += sim.expected_counts(a[:10], sim.sd_round_lengths(10, 7))
    assert both.calls.sum() == pytest.approx(both.target)


def test_every_position_is_produced_once(trace_acceptance):
    """SpecDec++ §3: N_draft + N_target = N + N_discarded, in expectation too."""
    for k in (1, 4, 9):
        lengths = sim.sd_round_lengths(len(trace_acceptance), k)
        c = sim.expected_counts(trace_acceptance, lengths)
        assert c.draft + c.target == pytest.approx(c.n + c.discarded)
    ones = sim.expected_counts(np.ones(12), sim.sd_round_lengths(12, 3))
    assert ones.target == 3 and ones.discarded == 0  # rounds of 3 + bonus: 12 tokens in 3 calls


def test_round_lengths_follow_the_decoders_rounds():
    stops = np.array([False, True, False, False, False, False])
    assert sim.round_lengths(stops, False, 20).tolist() == [2, 1, 3, 2, 1, 0]  # stop with the candidate
    assert sim.round_lengths(stops, True, 20).tolist() == [3, 2, 3, 2, 1, 0]  # one more from its forward
    assert sim.round_lengths(stops, False, 1).tolist() == [1, 1, 1, 1, 1, 0]
    # SpecDec++: 1 − ∏ sigmoid > h; log sigmoid = log 0.5 per candidate: two candidates give 0.75
    half = np.full(6, np.log(0.5))
    assert sim.head_round_lengths(half, 0.7, False, 20).tolist() == [2, 2, 2, 2, 1, 0]
    assert sim.head_round_lengths(half, 1.0, False, 20).tolist() == [5, 4, 3, 2, 1, 0]  # never stops: like SD


def test_the_oracle_is_the_ceiling(trace_acceptance):
    oracle = sim.oracle_counts(trace_acceptance)
    assert oracle.draft + oracle.target == oracle.n and oracle.discarded == 0
    for k in range(1, 10):
        lengths = sim.sd_round_lengths(len(trace_acceptance), k)
        counts = sim.expected_counts(trace_acceptance, lengths)
        for c in (0.0, 0.1, 0.5):
            assert counts.speedup(c) <= oracle.speedup(c) + 1e-9


def test_the_oracles_calls_by_length_match_a_replay(trace_acceptance):
    """The oracle's expected calls per verification length against a replay of its rounds (draft while accepted,
    call the target at the first rejection); the same pass with a call after j accepted candidates charged j
    tokens instead of j + 1 fails the check."""
    rng = np.random.default_rng(0)
    reps = 4000
    calls = np.zeros((reps, len(trace_acceptance) + 2))
    for r in range(reps):
        accepted = 0
        for a in trace_acceptance:
            if rng.random() < a:
                accepted += 1
            else:
                calls[r, accepted + 1] += 1
                accepted = 0

    def binned(c):  # lengths 1..6 and the tail, where every bin holds enough calls for the check
        c = np.atleast_2d(c)
        return np.column_stack([c[:, 1:7], c[:, 7:].sum(1)])

    mean, se = binned(calls).mean(0), binned(calls).std(0) / np.sqrt(reps)
    oracle = sim.oracle_counts(trace_acceptance)
    assert oracle.calls.sum() == pytest.approx(oracle.target)
    assert np.all(np.abs(binned(oracle.calls)[0] - mean) < 4 * se)
    assert not np.all(np.abs(binned(np.roll(oracle.calls, -1))[0] - mean) < 4 * se)


def test_the_command_on_tiny_labels(label_config, tmp_path, capsys):
    from data_gen.run import run_labels
    from heads.export import export_head
    from heads.resnet import ResNetHead
    from heads.sprinter import SprinterHead

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    draft = read_manifest(cfg.output_dir)["models"]["draft"]
    paths = []
    for head, role, name in ((ResNetHead(hidden_size=32, depth=1), "stop", "h"), (SprinterHead(hidden_size=32),
                             "verifier", "tau")):
        paths.append(str(export_head(head, tmp_path / f"{role}.safetensors", draft=draft, vocab_size=57,
                                     label={"kind": "test"}, role=role, threshold={"name": name, "value": 0.5},
                                     metrics={})))
    rows = sim.main(["--labels", str(cfg.output_dir), "--splits", "train", "val", "test", "--heads", *paths,
                     "--c", "0.1", "0.5"])
    out = capsys.readouterr().out
    assert "oracle (Thm 4.1)" in out and "fastest at c = 0.1" in out
    families = {r["family"] for r in rows}
    assert families == {"oracle", "sd", "confidence", "svip", "specdecpp", "sprinter"}
    oracle = rows[0]["counts"]
    assert all(r["counts"].speedup(0.1) <= oracle.speedup(0.1) + 1e-9 for r in rows if r["family"] != "sprinter")
    assert all(0 <= r["counts"].target <= r["counts"].n for r in rows)


def test_heads_reading_more_than_the_traces_hold_are_left_out_or_refused(label_config, tmp_path, capsys, monkeypatch):
    """By default such heads are left out with a note; named on the command line, they are one clear error."""
    import subprocess
    import sys

    from data_gen.run import run_labels
    from heads.export import export_head
    from heads.resnet import ResNetHead

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    heads = tmp_path / "checkpoints" / "heads"
    for name, scores in (("plain", []), ("runtime", ["round_index"])):
        export_head(ResNetHead(hidden_size=32, depth=1, scores=scores), heads / f"{name}.safetensors",
                    draft=read_manifest(cfg.output_dir)["models"]["draft"], vocab_size=57, label={"kind": "test"},
                    role="stop", threshold={"name": "h", "value": 0.5}, metrics={})
    monkeypatch.chdir(tmp_path)
    rows = sim.main(["--labels", str(cfg.output_dir), "--splits", "train", "val", "test", "--c", "0.1"])
    assert "not replayed (their heads read features the traces do not hold): runtime" in capsys.readouterr().out
    assert {Path(r["params"]["head"]).stem for r in rows if "head" in r["params"]} == {"plain"}
    done = subprocess.run([sys.executable, "-m", "evaluation.simulate", "--labels", str(cfg.output_dir), "--heads",
                           str(heads / "runtime.safetensors")], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1


def test_validation_against_a_finished_eval_on_the_tiny_pair(label_config, tiny_pair, prompt_file, tmp_path, capsys):
    """``--eval CONFIG``: a real (tiny) eval times its forwards, scores and traces its outputs; the simulator then
    sets each exact run beside its predictions from the label traces and from the decoder traces of its prompts.
    A run whose head file was rewritten since is not replayed, with the reason on its line."""
    import yaml

    from core.models import ModelSpec, resolve
    from data_gen.run import run_labels
    from evaluation.__main__ import main as eval_main
    from heads.export import export_head
    from heads.resnet import ResNetHead

    labels = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(labels, quiet=True)
    identity = {"name": "tiny-draft", **resolve(ModelSpec(path=str(tiny_pair[0])))[1]}

    def stop_head(seed: int) -> str:
        torch.manual_seed(seed)
        return str(export_head(ResNetHead(hidden_size=32, depth=1), tmp_path / "stop.safetensors", draft=identity,
                               vocab_size=57, label={"kind": "test"}, role="stop",
                               threshold={"name": "h", "value": 0.5, "rule": "test"}, metrics={}, position="own"))

    head = stop_head(0)
    out = tmp_path / "eval"
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "draft": {"path": str(tiny_pair[0]), "name": "tiny-draft"},
        "target": {"path": str(tiny_pair[1]), "name": "tiny-target"},
        "prompts": {"source": str(prompt_file), "response_field": "answer", "limit": 4},
        "modes": [{"name": "sample", "temperature": 1.0}],
        "policies": [{"family": "target_only"}, {"family": "sd", "grid": {"k": [2, 3]}},
                     {"family": "confidence", "grid": {"threshold": [0.3]}},
                     {"family": "specdecpp", "fixed": {"head": head}, "grid": {"h": [0.5]}}],
        "max_new_tokens": 6, "select_by": "simulated", "hf_peer": {"enabled": False}, "train_dir": None,
        "labels_dir": str(labels.output_dir), "output_dir": str(out), "device": "cpu", "warmup": False}))
    assert eval_main(["--config", str(config)]) == 0
    assert len(list((out / "traces" / "sample").glob("*.safetensors"))) == 4
    capsys.readouterr()
    text, rows, c = sim.validate(labels.output_dir, str(config))
    assert {r["family"] for r in rows} == {"sd", "confidence", "specdecpp"} and c > 0
    for r in rows:
        m = r["measured"]
        lo, hi = m["speedup_ci"]
        assert lo <= m["speedup"] <= hi
        assert set(r["speedups"]) == {f"{src}·{name}" for src in ("label", "decod")
                                      for name in ("forwards", "fit", sim.FIT_WITHOUT_RUN)}
        # every run of our decoder but this one: target-only and the other families stay in the fit
        assert r["fit_runs"][sim.FIT_WITHOUT_RUN] == r["fit_runs"]["fit"] - r["prompts"]
        for key, value in r["speedups"].items():
            assert value > 0 and r["errors"][key] == pytest.approx(value / m["speedup"] - 1)
        for source in ("label", "decod"):
            assert 0 < r["rates"][source]["target"] <= 1
    assert "predicted vs measured" in text and "decoder traces" in text and sim.FIT_WITHOUT_RUN in text
    stop_head(1)  # trained again at the same path: the run's decisions are not this file's
    text, rows, _ = sim.validate(labels.output_dir, str(config))
    assert {r["family"] for r in rows} == {"sd", "confidence"}
    assert "not replayed: its head file changed since the run" in text

"""The trace simulator: its exact expectations against a Monte Carlo replay of the same rounds (and a broken
recursion rejected by the same check), the count identity, the stop rules' round lengths, the oracle as a ceiling,
and the command on tiny labels."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import SettingError, UserError
from core.shards import read_manifest
from decoding import rules
from decoding.estimates import CalibratedConfidence, EstimateFileError
from decoding.policies import simulated
from decoding.costs import CostModel
from decoding.replay import (Counts, expected_counts, first_rejection, head_round_lengths, oracle_counts,
                             round_lengths, sd_round_lengths)
from decoding.simulate import simulate
from decoding.traces import Trace, load_label_traces
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


def agrees(counts: Counts, draws: np.ndarray) -> bool:
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
    return Counts(n=length, draft=draft[0], target=target[0], discarded=discarded[0])


@pytest.fixture
def trace_acceptance():
    return np.random.default_rng(1).uniform(0.3, 1.0, size=40)


@pytest.mark.parametrize("rule", ["sd3", "stops"])
def test_expectations_match_a_monte_carlo_replay_and_a_broken_recursion_does_not(trace_acceptance, rule):
    a = trace_acceptance
    if rule == "sd3":
        lengths = sd_round_lengths(len(a), 3)
    else:
        lengths = round_lengths(np.random.default_rng(2).random(len(a)) < 0.3, True, 6)
    draws = monte_carlo(a, lengths, reps=4000)
    assert agrees(expected_counts(a, lengths), draws)
    assert not agrees(broken_expected_counts(a, lengths), draws)


def test_calls_by_verification_length_match_a_monte_carlo_replay(trace_acceptance):
    """What a cost table per verification length needs: the expected target calls of each length m (m − 1
    candidates), which sum to N_target and weight m − 1 to N_draft."""
    a = trace_acceptance
    lengths = round_lengths(np.random.default_rng(3).random(len(a)) < 0.3, False, 6)
    seen = np.zeros((4000, 8))
    monte_carlo(a, lengths, reps=4000, calls=seen)
    c = expected_counts(a, lengths)
    mean, se = seen.mean(0), seen.std(0) / np.sqrt(len(seen)) + 1e-9
    assert np.all(np.abs(np.pad(c.calls, (0, 8 - len(c.calls))) - mean) < 4 * se)
    assert c.calls.sum() == pytest.approx(c.target)
    assert (c.calls * np.maximum(np.arange(len(c.calls)) - 1, 0)).sum() == pytest.approx(c.draft)
    shifted = np.roll(c.calls, 1)  # each call charged one token too many: the replay tells it apart
    assert not np.all(np.abs(np.pad(shifted, (0, 8 - len(shifted))) - mean) < 4 * se)
    both = Counts()
    both += c
    both += expected_counts(a[:10], sd_round_lengths(10, 7))
    assert both.calls.sum() == pytest.approx(both.target)


def test_every_position_is_produced_once(trace_acceptance):
    """SpecDec++ §3: N_draft + N_target = N + N_discarded, in expectation too."""
    for k in (1, 4, 9):
        lengths = sd_round_lengths(len(trace_acceptance), k)
        c = expected_counts(trace_acceptance, lengths)
        assert c.draft + c.target == pytest.approx(c.n + c.discarded)
    ones = expected_counts(np.ones(12), sd_round_lengths(12, 3))
    assert ones.target == 3 and ones.discarded == 0  # rounds of 3 + bonus: 12 tokens in 3 calls


def test_round_lengths_follow_the_decoders_rounds():
    stops = np.array([False, True, False, False, False, False])
    assert round_lengths(stops, False, 20).tolist() == [2, 1, 3, 2, 1, 0]  # stop with the candidate
    assert round_lengths(stops, True, 20).tolist() == [3, 2, 3, 2, 1, 0]  # one more from its forward
    assert round_lengths(stops, False, 1).tolist() == [1, 1, 1, 1, 1, 0]
    # SpecDec++: 1 − ∏ sigmoid > h; log sigmoid = log 0.5 per candidate: two candidates give 0.75
    half = np.full(6, np.log(0.5))
    assert head_round_lengths(half, 0.7, False, 20).tolist() == [2, 2, 2, 2, 1, 0]
    assert head_round_lengths(half, 1.0, False, 20).tolist() == [5, 4, 3, 2, 1, 0]  # never stops: like SD


def hand_trace(acceptance, p_draft=None, entropy=None) -> Trace:
    n = len(acceptance)
    return Trace(prompt_id=0, acceptance=np.asarray(acceptance, float),
                     logp_draft=np.log(np.asarray(p_draft if p_draft is not None else np.full(n, 0.5), float)),
                     entropy_draft=np.asarray(entropy if entropy is not None else np.zeros(n), float),
                     hidden=torch.zeros(n, 1), hidden_prev=torch.zeros(n, 1))


# P̂ per candidate; by hand at h = 0.6 (stop once 1 − ∏ P̂ > 0.6):
# s=0: 0.9, 0.45, 0.405, 0.081 → the 4th candidate stops; s=1: 0.5, 0.45, 0.09 → 3; s=2: 0.9, 0.18 → 2;
# s=3: 0.2 → 1; s=4: 0.9, 0.81, 0.486 (0.514 ≤ 0.6) → 3, the room left; s=5, 6, 7: the room left (2, 1, 0).
ACCEPT_PROB = [0.9, 0.5, 0.9, 0.2, 0.9, 0.9, 0.6, 0.9]


def test_specdecpp_multiplies_each_candidates_own_probability():
    """A varying P̂ pins which candidate each factor of the running product belongs to: the product over the
    round's candidates s … s+n−1 (a product shifted by one position stops the first round after 3, not 4)."""
    f = np.log(ACCEPT_PROB)
    assert head_round_lengths(f, 0.6, False, 20).tolist() == [4, 3, 2, 1, 3, 2, 1, 0]
    # Algorithm 1: a head on the candidate's own state stops after reading it, and submits the next candidate too
    assert head_round_lengths(f, 0.6, True, 20).tolist() == [5, 4, 3, 2, 3, 2, 1, 0]
    assert head_round_lengths(f, 0.6, False, 2).tolist() == [2, 2, 2, 1, 2, 2, 1, 0]
    # h bounds the cumulative 1 − ∏ P̂, not one candidate's 1 − P̂: at h = 0.3 the round at 0 stops after two
    # candidates of P̂ 0.9 and 0.5 (0.55), the one at 4 after three of 0.9, 0.9, 0.6 (0.514)
    assert head_round_lengths(f, 0.3, False, 20).tolist() == [2, 1, 2, 1, 3, 2, 1, 0]
    # through the simulator's own conversion of logits: log sigmoid(logit(P̂)) = log P̂
    logits = np.log(np.array(ACCEPT_PROB) / (1 - np.array(ACCEPT_PROB)))
    assert head_round_lengths(rules.log_accept(logits), 0.6, False, 20).tolist() == [4, 3, 2, 1, 3, 2, 1, 0]


def test_training_free_rules_and_fixed_k_on_hand_made_traces():
    """Each rule's round lengths, worked out by hand, through ``simulate`` on a trace whose scores vary, and the
    expected counts of one of them by hand."""
    acceptance = [0.5, 1.0, 0.0, 1.0, 0.7, 0.3]
    # confidence 0.5 stops after a candidate with q(Y) < 0.5: after positions 1 and 4
    # s=0: 2; s=1: 1; s=2: 3 (through position 4); s=3: 2; s=4: 1; s=5: 0
    conf = hand_trace(acceptance, p_draft=[0.9, 0.3, 0.8, 0.7, 0.2, 0.95])
    expected = {"confidence": [2, 1, 3, 2, 1, 0], "svip": [2, 1, 2, 1, 1, 0], "sd": [3, 3, 3, 2, 1, 0]}
    # SVIP stops after a candidate with sqrt(H) > h; sqrt(H) = 0.2, 0.7, 0.3, 0.6, 0.1, 0.5 against h = 0.55:
    # after positions 1 and 3 (H itself never exceeds 0.55)
    svip = hand_trace(acceptance, entropy=[0.04, 0.49, 0.09, 0.36, 0.01, 0.25])
    for family, trace, params in (("confidence", conf, {"threshold": 0.5}), ("svip", svip, {"h": 0.55}),
                                  ("sd", conf, {"k": 3})):
        got = simulate([trace], family, **params)
        want = expected_counts(trace.acceptance, np.array(expected[family]))
        assert (got.draft, got.target, got.discarded) == pytest.approx((want.draft, want.target, want.discarded))
    assert sd_round_lengths(6, 3).tolist() == expected["sd"]
    # by hand, K = 2 on acceptance (0.5, 1, 0, 1): the round at 0 (2 candidates, one call of 3 tokens) loses its
    # first candidate with 0.5 (2 discarded, the next round at 1) or keeps both and the bonus (next round at 3);
    # the round at 1 (probability 0.5) keeps its first and loses its second (1 discarded, next round at 3); at 3
    # no room is left: one call of one token
    c = expected_counts(np.array([0.5, 1.0, 0.0, 1.0]), sd_round_lengths(4, 2))
    assert (c.draft, c.target, c.discarded) == pytest.approx((3.0, 2.5, 1.5))
    assert c.calls.tolist() == pytest.approx([0, 1.0, 0, 1.5])


def test_the_registry_says_which_families_the_simulator_replays():
    """The families registered ``simulable`` are the ones ``simulate`` replays; an exact one's setting can be chosen
    by simulation, SPRINTER's (approximate) cannot; any other family is refused in one line."""
    assert set(simulated()) == {"sd", "confidence", "svip", "specdecpp", "goodput", "sprinter"}
    assert set(simulated(exact=True)) == set(simulated()) - {"sprinter"}
    from decoding.policies import HEAD_FAMILIES, POLICIES
    assert all(POLICIES.get_class(family).head_role == role for role, family in HEAD_FAMILIES.items())
    trace = hand_trace([0.5, 1.0], p_draft=[0.9, 0.3])
    with pytest.raises(ValueError, match="the simulator has no policy 'fuzzy'"):
        simulate([trace], "fuzzy", T=0.5)


# ---------------------------------------------------------------------------------------------------------------
# the oracle


def brute_force_oracle(a: np.ndarray, costs: CostModel) -> float:
    """The oracle's expected cost written out plainly: at each round start it knows the first rejection j and
    takes the cheapest number of candidates n, a rejection at j ≤ n ending the round with nothing more known."""
    a = np.asarray(a, float)
    length = len(a)

    def value(s: int, j: int) -> float:
        if s == length:
            return 0.0
        best = float("inf")
        for n in range(length - s):
            round_cost = costs.draft * n + costs.verify(n + 1)
            best = min(best, round_cost + (fresh(s + j + 1) if j <= n else value(s + n + 1, j - n - 1)))
        return best

    def fresh(s: int) -> float:
        if s == length:
            return 0.0
        return sum(p * value(s, j) for j, p in enumerate(first_rejection(a, s)))

    return fresh(0)


def random_costs(rng, length: int) -> CostModel:
    """Eq. 5.1 at a random c, a random monotone table, or a random table of any shape."""
    kind = rng.integers(3)
    if kind == 0:
        return CostModel.eq51(float(rng.uniform(0.01, 1.5)))
    table = rng.uniform(0.2, 2.0, size=length + 2)
    if kind == 1:
        table = np.sort(table)
    return CostModel.by_length(draft=float(rng.uniform(0.0, 0.8)), verify=table)


def random_trace(rng, length: int) -> np.ndarray:
    a = rng.uniform(0.0, 1.0, size=length)
    a[rng.random(length) < 0.2] = 1.0
    a[rng.random(length) < 0.1] = 0.0
    return a


def test_the_oracle_is_the_dynamic_program_it_claims():
    """The vectorised program and its forward pass of counts against the plain recursion, on random small traces
    and cost tables, monotone or not."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        length = int(rng.integers(1, 7))
        a, costs = random_trace(rng, length), random_costs(rng, length)
        oracle = oracle_counts(a, costs)
        assert costs.price(oracle) == pytest.approx(brute_force_oracle(a, costs), rel=1e-9, abs=1e-12)
        assert oracle.draft + oracle.target == pytest.approx(oracle.n + oracle.discarded)


def test_the_oracle_is_at_least_every_policy_on_random_traces_and_costs():
    """Property (seeded): under a random cost model (Eq. 5.1, monotone or non-monotone tables per verification
    length), the oracle's cost is at most that of fixed K, every stop rule here (random signals, random heads at
    several h, with and without Algorithm 1's extra candidate) and arbitrary round lengths; on tiny traces at most
    the best of every possible n(s), and at least an oracle that knows every draw in advance."""
    rng = np.random.default_rng(11)
    for case in range(150):
        length = int(rng.integers(2, 30))
        a, costs = random_trace(rng, length), random_costs(rng, length)
        best = costs.price(oracle_counts(a, costs))
        policies = [sd_round_lengths(length, k) for k in range(1, 9)]
        for reads in (False, True):
            policies.append(round_lengths(rng.random(length) < rng.uniform(0.1, 0.6), reads, 20))
            logits = rng.normal(1.0, 2.0, size=length)
            policies += [head_round_lengths(rules.log_accept(logits), h, reads, 20) for h in (0.1, 0.5, 0.9)]
        room = np.maximum(length - np.arange(length) - 1, 0)
        policies += [rng.integers(0, room + 1) for _ in range(5)]
        for lengths in policies:
            assert best <= costs.price(expected_counts(a, lengths)) * (1 + 1e-12) + 1e-12, case
    for _ in range(15):  # every policy of a 5-token trace, and the oracle that knows all 2^5 draws
        a, costs = random_trace(rng, 5), random_costs(rng, 5)
        best = costs.price(oracle_counts(a, costs))
        every = [np.array(n) for n in np.ndindex(5, 4, 3, 2, 1)]
        assert best <= min(costs.price(expected_counts(a, n)) for n in every) + 1e-12
        assert best >= knows_every_draw(a, costs) - 1e-12


def knows_every_draw(a: np.ndarray, costs: CostModel) -> float:
    """The expected cost of the best round lengths for each realisation of the accept/reject draws."""
    length, total = len(a), 0.0
    for bits in np.ndindex(*(2,) * length):
        p = float(np.prod(np.where(bits, a, 1 - a)))
        best = np.zeros(length + 1)
        for s in range(length - 1, -1, -1):
            reject = next((j for j in range(length - s - 1) if not bits[s + j]), length - s - 1)
            best[s] = min(costs.draft * n + costs.verify(n + 1) + best[s + min(reject, n) + 1]
                          for n in range(length - s))
        total += p * best[0]
    return total


def test_the_oracle_under_eq51_is_theorem_4_1_with_its_final_verification(trace_acceptance):
    """At c < 1 every call costs the same: the oracle drafts exactly the candidates that will be accepted, so it
    calls the target at each rejection and once more for the last token (|S| + 1), and discards nothing."""
    a = trace_acceptance
    for c in (0.05, 0.3):
        oracle = oracle_counts(a, CostModel.eq51(c))
        assert oracle.target == pytest.approx((1 - a[:-1]).sum() + 1)
        assert oracle.draft == pytest.approx(a[:-1].sum()) and oracle.discarded == pytest.approx(0)
    ones = oracle_counts(np.ones(64), CostModel.eq51(0.1))
    assert ones.target == 1 and ones.calls[64] == 1  # one call verifies all 63 candidates and adds the last token
    for k in range(1, 10):
        counts = expected_counts(a, sd_round_lengths(len(a), k))
        for c in (0.01, 0.1, 0.5):
            at = CostModel.eq51(c)
            assert at.speedup(counts) <= at.speedup(oracle_counts(a, at)) + 1e-9


def test_the_oracle_pads_rounds_when_a_longer_verification_is_cheaper():
    """CPU timings where 4 tokens verify faster than 3 (825 against 978 ms, a draft step 40 ms): on a trace that
    accepts two candidates and rejects the third, Theorem 4.1's rounds (two candidates, calls of 3 tokens) lose to
    rounds padded with the candidate that will be rejected; the oracle for these costs pads too."""
    table = {1: 0.5, 2: 0.9, 3: 0.978, 4: 0.825}
    costs = CostModel.by_length(draft=0.04, verify=lambda m: table.get(m, 0.825 + 0.15 * (m - 4)))
    a = np.array([1.0, 1.0, 0.0] * 16)
    theorem = np.zeros(48, dtype=np.int64)
    theorem[0::3] = 2
    padded = theorem.copy()
    padded[0:45:3] = 3
    thm, pad = expected_counts(a, theorem), expected_counts(a, padded)
    assert costs.speedup(pad) > costs.speedup(thm)
    oracle = oracle_counts(a, costs)
    assert costs.speedup(oracle) >= costs.speedup(pad) - 1e-12 and oracle.discarded == 15
    assert oracle_counts(a, CostModel.eq51(0.04)).discarded == 0


def test_a_fits_round_costs_are_what_it_predicts_with():
    """The oracle is computed for ``CostModel``'s round prices: the same charge as ``predict`` for a run that drafts,
    with a table per verification length and with the per-call line."""
    from decoding.costs import CostModel

    counts = expected_counts(np.random.default_rng(4).uniform(0.2, 1, 30), sd_round_lengths(30, 4))
    line = CostModel(t_draft=0.03, t_target=0.5, intercept=0.2, r2=1.0, n_runs=3, draft_intercept=0.1)
    table = CostModel(t_draft=0.05, t_target=0.6, intercept=0.2, r2=1.0, n_runs=3, draft_intercept=0.1,
                       t_target_step=0.45, verify_s={3: 0.9, 4: 0.8, 8: 1.2}, draft_step=0.04)
    for fit in (line, table):
        assert fit.price(counts) + 0.3 == pytest.approx(
            fit.predict(counts.draft, counts.target, calls=counts.calls))


def test_the_oracles_calls_by_length_match_a_replay(trace_acceptance):
    """The oracle's expected calls per verification length at Eq. 5.1 against a replay of its rounds (draft while
    accepted, call the target at the first rejection and at the last token); the same pass with a call after j
    accepted candidates charged j tokens instead of j + 1 fails the check."""
    rng = np.random.default_rng(0)
    reps = 4000
    length = len(trace_acceptance)
    calls = np.zeros((reps, length + 1))
    for r in range(reps):
        accepted = 0
        for i, a in enumerate(trace_acceptance):
            if i < length - 1 and rng.random() < a:
                accepted += 1
            else:
                calls[r, accepted + 1] += 1
                accepted = 0

    def binned(c):  # lengths 1..6 and the tail, where every bin holds enough calls for the check
        c = np.atleast_2d(c)
        return np.column_stack([c[:, 1:7], c[:, 7:].sum(1)])

    mean, se = binned(calls).mean(0), binned(calls).std(0) / np.sqrt(reps)
    oracle = oracle_counts(trace_acceptance, CostModel.eq51(0.1))
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
    for c, oracle in rows[0]["oracles"].items():
        assert all(CostModel.eq51(c).speedup(r["counts"]) <= CostModel.eq51(c).speedup(oracle) + 1e-9 for r in rows[1:]
                   if r["family"] != "sprinter")
    assert all(0 <= r["counts"].target <= r["counts"].n for r in rows)


def test_the_settings_choice_never_replays_a_prompt_the_eval_decodes(label_config):
    """``selection_traces`` (what an eval's simulated choice replays) leaves out the prompts it is told the eval
    decodes, and refuses in one line when nothing is left."""
    from data_gen.run import run_labels
    from evaluation.simulate import SimulationError, selection_traces

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    every, held_out = selection_traces(cfg.output_dir)
    decoded = {every[0].prompt_digest, held_out[0].prompt_digest}
    kept, kept_held_out = selection_traces(cfg.output_dir, decoded)
    assert len(kept) == len(every) - 2 and len(kept_held_out) == len(held_out) - 1
    assert not decoded & {t.prompt_digest for t in kept}
    with pytest.raises(SimulationError, match="every labeled prompt is one the eval decodes"):
        selection_traces(cfg.output_dir, {t.prompt_digest for t in every})


def test_labels_with_empty_splits_replay_the_splits_they_have(label_config):
    """A test-only label folder (as the held-out HumanEval labels): the choice replays its test traces, and asking
    for its empty splits alone is the one-line trace error, not a missing-shard one."""
    from data_gen.run import run_labels
    from decoding.traces import TraceError, filled_splits
    from evaluation.simulate import selection_traces

    cfg = label_config(split_fractions=(0.0, 0.0, 1.0))
    run_labels(cfg, quiet=True)
    assert filled_splits(cfg.output_dir, ("train", "val", "test")) == ["test"]
    every, held_out = selection_traces(cfg.output_dir)
    assert len(every) == len(held_out) == len(load_label_traces(cfg.output_dir, ("test",))) > 0
    with pytest.raises(TraceError, match="no 'target' rows in train, val"):
        load_label_traces(cfg.output_dir, ("train", "val"))


def test_the_command_adds_the_goodput_stop_under_a_timing_file(label_config, tmp_path, capsys):
    """With ``--timing`` each stop head, and with ``--calibration`` the draft's calibrated confidence, also runs
    the goodput stop under the file's costs by verification length, at the λ its replay settles at, and every row
    is priced by those costs beside their oracle. ``--calibration`` without ``--timing``, or a missing file: one
    line."""
    from test_eval_latency import timing_file

    from data_gen.run import run_labels
    from decoding.costs import read_timing
    from decoding.replay import goodput_rate
    from heads.export import export_head
    from heads.resnet import ResNetHead

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    head = str(export_head(ResNetHead(hidden_size=32, depth=1), tmp_path / "stop.safetensors",
                           draft=read_manifest(cfg.output_dir)["models"]["draft"], vocab_size=57,
                           label={"kind": "test"}, role="stop", threshold={"name": "h", "value": 0.5}, metrics={}))
    timing = timing_file()
    timing["models"][1]["verify_by_tokens"] = {"2": {"median_s": 1.07}, "3": {"median_s": 1.34},
                                               "4": {"median_s": 1.25}}  # 4 tokens cheaper than 3, as on a CPU
    path = tmp_path / "timing.json"
    path.write_text(json.dumps(timing))
    calibration = CalibratedConfidence.fit(np.log(np.linspace(0.05, 1.0, 20)), np.linspace(0.1, 0.9, 20))
    calibration.save(tmp_path / "calibration.json")
    args = ["--labels", str(cfg.output_dir), "--splits", "train", "val", "test", "--heads", head, "--c", "0.1"]
    rows = sim.main([*args, "--timing", str(path), "--calibration", str(tmp_path / "calibration.json")])
    out = capsys.readouterr().out
    assert "goodput[head=stop,costs=by length,lam=" in out
    assert "goodput[calibration=calibration,costs=by length,lam=" in out
    costs = read_timing(path)
    # prompt lookup, replayed along the stored responses: its line holds the counts prompt_lookup_counts gives
    from decoding.replay import Counts, prompt_lookup_counts
    from decoding.traces import load_responses

    responses = load_responses(cfg.output_dir, ("train", "val", "test"), {t.prompt_id for t in
                                                                        sim.load_label_traces(cfg.output_dir,
                                                                                              ("train", "val", "test"))})
    from evaluation.simulate_lookup import priced_interval

    max_new = max(len(r) for _, r in responses)
    each = [prompt_lookup_counts(prompt, response, 2, 8, max_new) for prompt, response in responses]
    total = Counts()
    for c in each:
        total += c
    assert responses and f"n=2  m=8   N_t/N {total.target / total.n:.3f}" in out
    assert f"priced {priced_interval(each, costs)}x" in out
    assert priced_interval(each, costs).value == pytest.approx(costs.speedup(total))
    by_head, by_calibration = [r for r in rows if r["family"] == "goodput"]
    traces, loaded = sim.load_label_traces(cfg.output_dir, ("train", "val", "test")), sim.cached_head(head)
    estimates = {"head": ([sim.rules.log_accept(sim.head_logits(loaded, t)) for t in traces], by_head,
                          loaded.position == "own"),
                 "calibration": ([calibration.log_accept(t.logp_draft) for t in traces], by_calibration, False)}
    for log_accepts, row, own in estimates.values():
        best = goodput_rate([t.acceptance for t in traces], log_accepts, costs, own)
        assert row["params"]["lam"] == best["at"]
        assert costs.speedup(row["counts"]) == pytest.approx(best["rate"] / costs.target_only_rate())
    assert all(costs.speedup(r["counts"]) <= costs.speedup(rows[0]["priced"]) + 1e-9 for r in rows[1:]
               if r["counts"].calls is not None)
    with pytest.raises(SettingError, match="--calibration adds the goodput stop, .*: give --timing"):
        sim.main([*args, "--calibration", str(tmp_path / "calibration.json")])
    with pytest.raises(EstimateFileError, match="missing.json: no such file"):
        sim.main([*args, "--timing", str(path), "--calibration", str(tmp_path / "missing.json")])
    # fitted on rows of another draft: refused by the replay, and by an export that would bundle it with the head
    from core.identity import IdentityError
    from decoding.runtimes.hf_export import write_folder

    draft = read_manifest(cfg.output_dir)["models"]["draft"]
    calibration.fitted = {"draft": {**draft, "name": "another", "weights": "0" * 64}, "sampling": {}}
    calibration.save(tmp_path / "other.json")
    with pytest.raises(IdentityError, match="fitted on rows of draft 'another', the draft of the labels"):
        sim.main([*args, "--timing", str(path), "--calibration", str(tmp_path / "other.json")])
    with pytest.raises(IdentityError, match="fitted on rows of draft 'another', the draft of head stop"):
        write_folder(head, tmp_path / "hf", path, tmp_path / "other.json")
    assert not (tmp_path / "hf").exists()


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
    assert "not replayed (their heads read features the traces do not hold): runtime" in capsys.readouterr().err
    assert {Path(r["params"]["head"]).stem for r in rows if "head" in r["params"]} == {"plain"}
    done = subprocess.run([sys.executable, "-m", "evaluation.simulate", "--labels", str(cfg.output_dir), "--heads",
                           str(heads / "runtime.safetensors")], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1


def test_a_head_of_another_draft_is_left_out_by_default_and_refused_when_named(label_config, tmp_path, capsys,
                                                                               monkeypatch):
    from data_gen.run import run_labels
    from heads.export import HeadFileError, export_head
    from heads.resnet import ResNetHead

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    draft = read_manifest(cfg.output_dir)["models"]["draft"]
    digests = {k: "0" * 64 for k in ("weights", "sha256", "fingerprint") if k in draft}
    other = {**draft, "name": "other-draft", **digests}
    heads = tmp_path / "checkpoints" / "heads"
    for name, d in (("mine", draft), ("stray", other)):
        export_head(ResNetHead(hidden_size=32, depth=1), heads / f"{name}.safetensors", draft=d, vocab_size=57,
                    label={"kind": "test"}, role="stop", threshold={"name": "h", "value": 0.5}, metrics={})
    monkeypatch.chdir(tmp_path)
    rows = sim.main(["--labels", str(cfg.output_dir), "--splits", "train", "val", "test", "--c", "0.1"])
    err = capsys.readouterr().err
    assert "not replayed (their heads were trained for another draft than the labels'): stray" in err
    assert {Path(r["params"]["head"]).stem for r in rows if "head" in r["params"]} == {"mine"}
    with pytest.raises(HeadFileError, match="the draft of the labels in"):
        sim.main(["--labels", str(cfg.output_dir), "--heads", str(heads / "stray.safetensors"), "--c", "0.1"])


def test_validation_against_a_finished_eval_on_the_tiny_pair(label_config, tiny_pair, prompt_file, tmp_path, capsys):
    """``--eval CONFIG``: a real (tiny) eval times its forwards, scores and traces its outputs; the simulator then
    sets each exact run beside its predictions from the label traces and from the decoder traces of its prompts.
    A run whose head file was rewritten since is not replayed, with the reason on its line."""
    from core.models import ModelSpec, resolve
    from data_gen.run import run_labels
    from evaluation.__main__ import main as eval_main
    from heads.export import export_head
    from heads.resnet import ResNetHead
    from testing.tiny import write_eval_config

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
    config = write_eval_config(
        tmp_path / "eval.yaml", *tiny_pair, prompt_file, out, limit=4, modes=[{"name": "sample", "temperature": 1.0}],
        policies=[{"family": "target_only"}, {"family": "sd", "grid": {"k": [2, 3]}},
                  {"family": "confidence", "grid": {"threshold": [0.3]}},
                  {"family": "specdecpp", "fixed": {"head": head}, "grid": {"h": [0.5]}}],
        max_new_tokens=6, select_by="simulated", hf_peer={"enabled": False}, labels_dir=str(labels.output_dir))
    assert eval_main(["--config", str(config)]) == 0
    assert len(list((out / "traces" / "sample").glob("*.safetensors"))) == 4
    # the choice replayed every labeled trace but those of the prompts it then decoded
    selection = json.loads((out / "selection.json").read_text())
    decoded = set(selection["inputs"]["sample"]["decoded_prompts"])
    every, _ = sim.selection_traces(labels.output_dir)
    excluded = sum(t.prompt_digest in decoded for t in every)
    assert excluded > 0 and selection["modes"]["sample"]["sd"]["traces"] == len(every) - excluded
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


@pytest.mark.parametrize("args, message", [
    (["--c", "0"], "--c must be a positive cost ratio t_draft / t_target, got 0 (a draft step costs c target steps: "
                   "0 < c < 10)"),
    (["--c", "0.1", "-0.5"], "--c must be a positive cost ratio t_draft / t_target, got -0.5"),
    (["--timing", "{missing}"], "none.json: no such file"),
    (["--timing", "{garbage}"], "not a bench_timing JSON file"),
    (["--timing", "{other}"], "other: has no model 'draft'"),
    (["--timing", "{partial}"], "not a bench_timing JSON file (no 'prefill')"),
])
def test_bad_costs_are_one_line_errors(tmp_path, args, message):
    """Checked before anything is read: the library raises the simulator's user error, and the command (run for
    the first case) prints it as one ``error:`` line and exits 2."""
    import subprocess
    import sys

    (tmp_path / "garbage").write_text("not json {")
    (tmp_path / "other").write_text('{"models": [{"name": "other"}]}')
    (tmp_path / "partial").write_text('{"models": [{"name": "draft"}, {"name": "target"}]}')
    args = [a.format(missing=tmp_path / "none.json", garbage=tmp_path / "garbage", other=tmp_path / "other",
                     partial=tmp_path / "partial") for a in args]
    with pytest.raises(UserError) as raised:
        sim.main(["--labels", str(tmp_path / "no-labels"), *args])
    assert message in str(raised.value) and "\n" not in str(raised.value)
    if args == ["--c", "0"]:
        done = subprocess.run([sys.executable, "-m", "evaluation.simulate", "--labels", str(tmp_path), *args],
                              capture_output=True, text=True, cwd=Path(__file__).parents[1])
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr == f"error: {message}\n"


def test_a_stop_heads_exported_h_is_the_simulators_choice(label_config, tmp_path):
    """``make train`` exports the cumulative h the trace simulator finds fastest on the validation traces at the
    stated c (Eq. 5.1, 0.1 by default) and says so in the metadata: replaying the exported file over the same
    traces at every h of the grid picks the same h, and the file's default replays at that speedup. At other costs
    (a head whose logit follows the draft's confidence, so the choice moves with c) the same holds; a head the
    traces cannot replay gets the stated fallback; a bad ``--stop_c`` is one line."""
    from test_eval_latency import timing_file

    from data_gen.run import run_labels
    from decoding.costs import read_timing
    from decoding.replay import STOP_H_GRID
    from decoding.traces import load_label_traces
    from heads.export import export_head, read_metadata
    from heads.resnet import ResNetHead
    from pipeline import train_all

    labels = label_config(split_fractions=(0.5, 0.25, 0.25), max_new_tokens=16)
    run_labels(labels, quiet=True)
    val = load_label_traces(labels.output_dir, ("val",))
    assert val and sum(map(len, val)) >= 16

    def check(path: str, c: float, fit=None) -> float:
        meta = read_metadata(path)["threshold"]
        assert meta["name"] == "h" and meta["chosen_by"]["splits"] == ["val"]
        assert meta["chosen_by"]["traces"] == len(val)
        if fit is None:
            assert meta["chosen_by"]["cost"] == {"model": "Eq. 5.1", "c": c}
            speedup = CostModel.eq51(c).speedup
        else:
            tokens = meta["chosen_by"]["cost"]["tokens"]
            assert meta["chosen_by"]["cost"]["model"] == "timing file" and tokens == round(np.mean(list(map(len, val))))
            speedup = functools.partial(fit.predicted_speedup, tokens=tokens)
        speedups = [speedup(simulate(val, "specdecpp", head=path, h=h)) for h in STOP_H_GRID]
        assert meta["value"] == STOP_H_GRID[int(np.argmax(speedups))]
        assert speedup(simulate(val, "specdecpp", head=path)) == pytest.approx(max(speedups))  # the default
        return meta["value"]

    config = str(Path(__file__).parents[1] / "configs" / "train" / "specdecpp_d3_w6.yaml")
    train_all.main(["--labels", str(labels.output_dir), "--configs", config, "--out", str(tmp_path / "train"),
                    "--checkpoints", str(tmp_path / "ckpt"), "--heads_dir", str(tmp_path / "heads"),
                    "--max_epochs", "1", "--quiet"])
    check(str(tmp_path / "heads" / "specdecpp_d3_w6.safetensors"), train_all.STOP_C)

    head = ResNetHead(hidden_size=32, depth=0, scores=["logp_draft"])
    with torch.no_grad():  # logit = 2 log q(Y) + 2: confident candidates look accepted
        head.out.weight.zero_()
        head.out.bias.fill_(2.0)
        head.score_term.linear.weight.fill_(2.0)
    picked = set()
    for c in (0.02, 0.3, 0.9):
        threshold = train_all.stop_threshold(head, str(labels.output_dir), "own", [], c)
        path = export_head(head, tmp_path / f"conf{c}.safetensors", draft={"name": "tiny", "source": "test"},
                           vocab_size=57, label={"kind": "soft"}, role="stop", threshold=threshold, metrics={})
        picked.add(check(str(path), c))
    assert len(picked) > 1, picked
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps(timing_file()))
    fit = read_timing(timing)
    threshold = train_all.stop_threshold(head, str(labels.output_dir), "own", [], 0.1, fit, timing.name)
    assert threshold["chosen_by"]["cost"]["file"] == "timing.json"
    path = export_head(head, tmp_path / "timed.safetensors", draft={"name": "tiny", "source": "test"},
                       vocab_size=57, label={"kind": "soft"}, role="stop", threshold=threshold, metrics={})
    check(str(path), 0.1, fit)
    fallback = train_all.stop_threshold(head, str(labels.output_dir), "own", ["layers"], 0.1)
    assert fallback["value"] == train_all.STOP_H_FALLBACK and "traces do not hold" in fallback["chosen_by"]["method"]
    with pytest.raises(UserError, match="--stop_c must be a positive"):
        train_all.main(["--labels", str(labels.output_dir), "--stop_c", "0"])
    with pytest.raises(UserError, match="not a bench_timing JSON file"):
        train_all.main(["--labels", str(labels.output_dir), "--timing", str(Path(__file__))])


def test_traces_a_head_has_seen_are_left_out_and_all_seen_is_one_line(label_config, tmp_path, capsys):
    """A head's record of the prompts it trained on (``trained_on``) keeps the simulator off those traces, for every
    policy (ratios stay paired); when a head has seen every trace, the command says so in one line."""
    import subprocess
    import sys

    from core.shards import prompt_digests
    from data_gen.run import run_labels
    from evaluation.simulate import traces_for
    from decoding.traces import load_label_traces
    from heads.export import export_head
    from heads.resnet import ResNetHead

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    labels = str(cfg.output_dir)
    train = prompt_digests(labels, "train")

    def head(name, digests):
        return str(export_head(ResNetHead(hidden_size=32, depth=1), tmp_path / f"{name}.safetensors",
                               draft=read_manifest(labels)["models"]["draft"], vocab_size=57, label={"kind": "test"},
                               role="stop", threshold={"name": "h", "value": 0.5}, metrics={},
                               trained_on={"labels": labels, "splits": ["train"], "prompts": len(digests),
                                           "digests": "".join(sorted(digests))}))

    trained = head("trained", train.values())
    every = load_label_traces(labels, ("train", "val", "test"))
    kept = traces_for("specdecpp", every, [], trained)
    assert {t.prompt_digest for t in kept} == {t.prompt_digest for t in every} - set(train.values())
    assert 0 < len(kept) < len(every) and traces_for("sd", every, [], trained) == every
    rows = sim.main(["--labels", labels, "--splits", "train", "val", "test", "--heads", trained, "--c", "0.1"])
    assert f"left out {len(every) - len(kept)} of {len(every)} traces" in capsys.readouterr().err
    assert rows[0]["counts"].n == sum(map(len, kept))  # the oracle too: every policy on the same traces
    everything = head("everything", [t.prompt_digest for t in every])
    done = subprocess.run([sys.executable, "-m", "evaluation.simulate", "--labels", labels, "--splits", "train",
                           "val", "test", "--heads", everything], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1])
    err = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(err) == 1 and "a prompt a head has seen" in err[0]


def catch_up_draws(acceptance: np.ndarray, lengths: np.ndarray, reps: int, seed: int = 0,
                   after_rejections: bool = False) -> np.ndarray:
    """Monte Carlo of the draft's catch-up: the tokens beyond one that each round's first draft forward reads (the
    last candidate and the bonus after a fully accepted round; the target's tokens of rounds that drafted nothing).
    ``after_rejections``: a broken account that also charges the corrected token of a rejected round."""
    rng = np.random.default_rng(seed)
    out = np.zeros(reps)
    for r in range(reps):
        s, unread = 0, 0
        while s < len(acceptance):
            n = int(lengths[s])
            kept = 0
            while kept < n and rng.random() < acceptance[s + kept]:
                kept += 1
            if n == 0:
                unread += 1
            else:
                out[r] += unread
                unread = 1 if kept == n or after_rejections else 0
            s += kept + 1
    return out


def test_the_drafts_catch_up_matches_a_monte_carlo_replay_and_a_broken_account_does_not(trace_acceptance):
    a = trace_acceptance
    lengths = np.minimum(np.random.default_rng(4).integers(0, 4, len(a)), len(a) - np.arange(len(a)) - 1)
    assert (lengths == 0).sum() > 5  # rounds that draft nothing, whose tokens the draft reads later
    expected = expected_counts(a, lengths).catch_up
    for broken, seed in ((False, 0), (True, 1)):
        draws = catch_up_draws(a, lengths, 4000, seed, after_rejections=broken)
        close = abs(expected - draws.mean()) < 4 * draws.std() / np.sqrt(len(draws))
        assert close != broken, (expected, draws.mean())
    costs = CostModel.by_length(draft=0.5, verify=lambda m: 1.0, catch_up=0.25)
    counts = expected_counts(a, lengths)
    assert costs.price(counts) == pytest.approx(CostModel.by_length(draft=0.5, verify=lambda m: 1.0).price(counts)
                                               + 0.25 * counts.catch_up)

"""The decoder's static-cache path (``decoding.static``, the cache CUDA graphs are captured over) against today's
dynamic cache on the tiny pair, trace-forced decoding, and schedules. Graph capture itself needs a GPU
(``scripts/gpu_check.sh``); everything it replays is the static path tested here.

- every policy, greedy and sampling on the same seeds, gives the same tokens on both caches; where floating-point
  order could flip a near tie the count of differing generations is bounded (it is 0 here, in float32), and a static
  cache whose mask lets stale positions through is caught;
- compiled layers (traced as inductor would, without its code generation) give the static path's tokens, share one
  compiled code across layers, and leave the model uncompiled for other decoders;
- a forced generation drafts and keeps exactly its rounds, on both caches, and the GPU check's forced part splits
  its wall into forwards and the rest;
- a schedule's rounds tile each trace, a damaged schedule is refused in one line, and ``python -m
  evaluation.schedule`` writes one from a label folder.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_decode_policies import CALIBRATED_GOODPUT, PROMPTS, example_kwargs, heads, models  # noqa: F401

import decoding.static
from core.sampling import Sampling
from decoding import rules
from decoding.policies import build_policy
from decoding.costs import CostModel
from decoding.replay import sd_round_lengths
from decoding.schedule import (ScheduleFileError, catch_up, draw_rounds, read_schedule,
                               target_only_rounds, tokens, write_schedule)
from decoding.state import ModelPair
from decoding.static import StaticLM, static_lm

POLICIES = ["target_only", "draft_only", "sd", "hf_heuristic", "confidence", "svip", "specdecpp", "goodput",
            "goodput_calibrated", "fuzzy", "sprinter"]
SEEDS = range(3)


def decode(models, heads, name: str, decoder: str, temperature: float, forced=None, max_new_tokens: int = 20):
    kwargs = CALIBRATED_GOODPUT if name == "goodput_calibrated" else example_kwargs(heads)[name]
    family = "goodput" if name == "goodput_calibrated" else name
    pair = ModelPair(*models, eos_token_ids=[], decoder=decoder, forced=forced,
                     sampling=Sampling(temperature=temperature, max_new_tokens=max_new_tokens))
    policy = build_policy(family, **kwargs)
    return [policy.generate(pair, prompt, torch.Generator().manual_seed(seed)) for prompt in PROMPTS
            for seed in SEEDS]


def differing(models, heads, temperature: float) -> dict[str, int]:
    """Per policy, how many generations differ between the two caches."""
    return {name: sum(a.tokens != b.tokens for a, b in zip(decode(models, heads, name, "eager", temperature),
                                                           decode(models, heads, name, "static", temperature)))
            for name in POLICIES}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_policy_gives_the_same_tokens_on_the_static_cache(models, heads, temperature):
    differ = differing(models, heads, temperature)
    generations = len(PROMPTS) * len(SEEDS) * len(POLICIES)
    # float32 on the CPU: a masked attention over the padded cache sums in another order than the dynamic cache's,
    # which can flip a near tie; none has here, and more than one in a hundred would be a bug
    assert sum(differ.values()) <= generations // 100, differ


def test_hidden_states_agree_between_the_caches(models):
    from decoding.backends import CachedLM

    dynamic, static = (CachedLM(models[1], Sampling(), static=None if kind == "eager" else StaticLM(models[1], 64))
                       for kind in ("eager", "static"))
    seq = [1, 10, 11, 12, 5, 6]
    for step in ([7, 8, 9], [7, 20], [7, 20, 21, 22]):  # each moves back over the last forward's candidates
        (h1, p1), (h2, p2) = (lm.advance(seq + step, rows=len(step)) for lm in (dynamic, static))
        assert torch.allclose(h1, h2, atol=1e-5) and torch.allclose(p1, p2, atol=1e-5)


def test_a_static_cache_that_reads_stale_positions_is_caught(models, heads, monkeypatch):
    """Rejected candidates stay in the static cache until overwritten: a mask that does not hide them (here: one
    that hides nothing) changes the tokens, so the comparison above can fail."""
    run = StaticLM._run

    def unmasked(self, ids, positions):
        self.key_positions = torch.zeros_like(self.key_positions)  # every position looks like the first
        return run(self, ids, positions)

    monkeypatch.setattr(StaticLM, "_run", unmasked)
    for model in models:  # runners made before the patch would not use it
        model.__dict__.pop(decoding.static.RUNNERS, None)
    try:
        differ = differing(models, heads, 1.0)
    finally:
        for model in models:  # nor may the broken runners outlive this test
            model.__dict__.pop(decoding.static.RUNNERS, None)
    assert differ["sd"] > 0 and differ["target_only"] > 0


def test_a_static_cache_is_shared_and_grows(models):
    draft = models[0]
    first = static_lm(draft, 100)
    assert static_lm(draft, 50) is first and first.capacity == 256
    larger = static_lm(draft, 300)
    assert larger is not first and larger.capacity == 512
    with pytest.raises(ValueError, match="past the static cache"):
        larger.forward(list(range(10)), 505)


def test_graphs_are_refused_off_a_gpu(models):
    with pytest.raises(ValueError, match="not a CUDA GPU"):
        ModelPair(*models, eos_token_ids=[], decoder="graphs")
    with pytest.raises(ValueError, match="not one of"):
        ModelPair(*models, eos_token_ids=[], decoder="fast")


COMPILED_POLICIES = ["target_only", "sd", "confidence", "specdecpp", "goodput"]


@pytest.fixture
def traced_only(monkeypatch):
    """Compiled layers through dynamo's tracing and AOT autograd without inductor's code generation: the same graph
    and guards (so the same recompiles) in seconds on the CPU; inductor itself runs in the GPU check."""
    monkeypatch.setattr(decoding.static, "COMPILE_BACKEND", "aot_eager")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compiled_layers_give_the_same_tokens(models, heads, temperature, traced_only):
    for name in COMPILED_POLICIES:
        static, compiled = (decode(models, heads, name, decoder, temperature) for decoder in ("static", "compiled"))
        assert [r.tokens for r in static] == [r.tokens for r in compiled], name
    for model in models:  # only the runner's forwards run compiled: the model itself is as it was
        assert all(layer._compiled_call_impl is None for layer in model.model.layers)


def test_layers_share_one_compiled_code(traced_only, tmp_path):
    """Each layer indexes the stacked cache by its number as a symbolic int: a deeper model compiles no more often
    (one entry per length class, layer 0 apart), and a compile per layer would be caught."""
    from transformers import AutoModelForCausalLM

    from testing.tiny import make_pair

    def compiles(layers: int) -> int:
        torch._dynamo.reset()
        model = AutoModelForCausalLM.from_pretrained(make_pair(tmp_path / str(layers), layers=layers)[1]).eval()
        runner = StaticLM(model, 64, compiled=True)
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for n in (1, 2, 3, 1, 5):
            runner.forward(list(range(n)), 10)
        return torch._dynamo.utils.counters["stats"]["unique_graphs"] - before

    assert compiles(6) == compiles(2) <= 4
    assert compiles(2) > 0  # the compiled layers ran at all


def test_acceptance_read_at_once_equals_one_test_per_candidate():
    g = torch.Generator().manual_seed(0)
    logps = torch.randn(4, 50, generator=g).log_softmax(-1)
    logqs = [torch.randn(50, generator=g).log_softmax(-1) for _ in range(3)]
    candidates = [3, 17, 40]
    chances = rules.acceptance_chances(candidates, logqs, logps)
    for n, token in enumerate(candidates):
        for u in (0.0, chances[n] - 1e-7, chances[n], 0.999):
            assert (u < chances[n]) == rules.speculative_keeps(token, logqs[n], logps[n], u)


# ---------------------------------------------------------------------------------------------------------------
# trace-forced decoding and schedules


@pytest.mark.parametrize("decoder", ["eager", "static"])
@pytest.mark.parametrize("name", ["sd", "confidence", "specdecpp", "goodput"])
def test_a_forced_generation_drafts_and_keeps_its_rounds(models, heads, name, decoder):
    rng = np.random.default_rng(3)
    length = 20
    lengths = np.minimum(sd_round_lengths(length, 3), rng.integers(1, 4, length))  # within SD's k = 3
    rounds = draw_rounds(rng.uniform(0.2, 1.0, length), lengths, rng)
    for result in decode(models, heads, name, decoder, 1.0, forced=rounds, max_new_tokens=length):
        assert len(result.tokens) == length == tokens(rounds)
        assert result.stats.accepted_lengths == [kept for _, kept in rounds]
        assert result.stats.discarded == sum(n - kept for n, kept in rounds)


def test_a_forced_round_the_policy_cannot_draft_is_an_error(models, heads):
    with pytest.raises(RuntimeError, match="forced round drafted 3 candidates, not its 5"):
        decode(models, heads, "sd", "eager", 1.0, forced=[(5, 0)] * 20)  # SD's k = 3


def test_rounds_tile_a_trace_and_are_priced_by_their_lengths():
    rng = np.random.default_rng(0)
    acceptance = rng.uniform(0, 1, 50)
    rounds = draw_rounds(acceptance, sd_round_lengths(50, 4), rng)
    assert tokens(rounds) == 50 and all(0 <= k <= n <= 4 for n, k in rounds)
    assert tokens(target_only_rounds(50)) == 50
    costs = CostModel.by_length(draft=0.1, verify=lambda m: 1.0 + 0.01 * m)
    assert costs.price_rounds(rounds) == pytest.approx(sum(0.1 * n + 1.0 + 0.01 * (n + 1) for n, _ in rounds))
    priced = CostModel.by_length(draft=0.1, verify=lambda m: 1.0 + 0.01 * m, catch_up=0.5)
    assert priced.price_rounds(rounds, catch_up(rounds)) == pytest.approx(costs.price_rounds(rounds) + 0.5 * catch_up(rounds))
    # an always-accepted trace keeps every candidate; a never-accepted one none
    assert all(k == n for n, k in draw_rounds(np.ones(30), sd_round_lengths(30, 4), rng))
    assert all(k == 0 for n, k in draw_rounds(np.zeros(30), sd_round_lengths(30, 4), rng))


def test_a_damaged_schedule_is_refused_in_one_line(tmp_path):
    path = tmp_path / "schedule.json"
    good = {"c": 0.5, "traces": [{"length": 3}],
            "policies": [{"name": "sd", "family": "sd", "params": {"k": 2}, "rounds": [[[2, 1], [0, 0]]]}]}
    write_schedule(path, good)
    assert read_schedule(path)["c"] == 0.5
    bad = json.loads(path.read_text())
    bad["policies"][0]["rounds"] = [[[2, 2], [0, 0]]]  # 4 tokens for a 3-token trace
    path.write_text(json.dumps(bad))
    with pytest.raises(ScheduleFileError, match="do not tile its 3 tokens"):
        read_schedule(path)
    path.write_text("{}")
    with pytest.raises(ScheduleFileError, match="not a trace-forced schedule"):
        read_schedule(path)


def test_a_schedule_is_made_from_label_traces(label_config, tmp_path, models, heads):
    from data_gen.run import run_labels
    from evaluation.schedule import main

    labels = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(labels, quiet=True)
    out = tmp_path / "schedule.json"
    schedule = main(["--labels", str(labels.output_dir), "--c", "0.5", "--traces", "3", "--out", str(out)])
    assert read_schedule(out)["c"] == 0.5
    assert [p["family"] for p in schedule["policies"]] == ["target_only", "confidence", "sd"]
    for policy in schedule["policies"]:  # each forced on the tiny pair, as the GPU check runs it
        for rounds, trace in zip(policy["rounds"], schedule["traces"]):
            result = build_policy(policy["family"], **policy["params"]).generate(
                ModelPair(*models, eos_token_ids=[],  # target-only has no rounds to force: its clock alone
                          forced=[] if policy["family"] == "target_only" else [tuple(r) for r in rounds],
                          sampling=Sampling(max_new_tokens=trace["length"])), [1, 10, 11], torch.Generator())
            assert len(result.tokens) == trace["length"]


def test_forced_rounds_run_every_stop_decision_the_unforced_decoding_runs(models, heads, monkeypatch):
    """A forced replay of a generation's own rounds asks its stop rule as often as the generation did (so the rule's
    cost is timed whole: a stop reads the draft's confidence each time it is asked), and forced rounds that cannot
    run are refused."""
    import decoding.state as state

    rounds, asked = [], []
    record, confidence = state.Decoding.record_round, state.Decoding.draft_confidence
    monkeypatch.setattr(state.Decoding, "record_round",
                        lambda self, kept, discarded: rounds.append((kept + discarded, kept)) or record(self, kept,
                                                                                                      discarded))
    monkeypatch.setattr(state.Decoding, "draft_confidence", lambda self, step: asked.append(1) or confidence(self, step))
    for name in ("confidence", "svip", "specdecpp", "goodput", "goodput_calibrated"):
        kwargs = CALIBRATED_GOODPUT if name == "goodput_calibrated" else example_kwargs(heads)[name]
        policy = build_policy("goodput" if name == "goodput_calibrated" else name, **kwargs)
        rounds.clear(), asked.clear()
        free = policy.generate(ModelPair(*models, eos_token_ids=[], sampling=Sampling(max_new_tokens=20)),
                               PROMPTS[0], torch.Generator().manual_seed(0))
        replayed, free_asked = list(rounds), len(asked)
        rounds.clear(), asked.clear()
        forced = policy.generate(ModelPair(*models, eos_token_ids=[], forced=replayed,
                                           sampling=Sampling(max_new_tokens=20)),
                                 PROMPTS[0], torch.Generator().manual_seed(0))
        assert rounds == replayed and forced.tokens == free.tokens and len(asked) == free_asked > 0, name
    with pytest.raises(ValueError, match="forced rounds make 4 tokens"):
        ModelPair(*models, eos_token_ids=[], forced=[(3, 3)], sampling=Sampling(max_new_tokens=20))
    with pytest.raises(ValueError, match="no EOS ids"):
        ModelPair(*models, eos_token_ids=[2], forced=[(3, 3)], sampling=Sampling(max_new_tokens=4))
    with pytest.raises(RuntimeError, match="forced rounds were never run"):
        build_policy("sprinter", **example_kwargs(heads)["sprinter"]).generate(
            ModelPair(*models, eos_token_ids=[], forced=[(3, 3)], sampling=Sampling(max_new_tokens=4)), [1, 10],
            torch.Generator())


def test_an_evals_forward_timing_times_the_forwards_its_decoder_runs(models):
    """Under a static cache (CUDA graphs on a GPU) the eval's timing file holds that decoder's own forwards, which
    the latency model then prices; its layout is read as any timing file."""
    from decoding.costs import CostModel
    from evaluation.bench_timing import time_pair
    from evaluation.timers import PAIR_VERIFY_LENGTHS

    timed = time_pair(*models, torch.device("cpu"), prompt_tokens=6, new_tokens=8, repeats=1, decoder="static")
    assert timed["decoder"] == "static"
    target = timed["models"][1]
    assert set(map(int, target["verify_by_tokens"])) == set(PAIR_VERIFY_LENGTHS)
    assert all(t["median_s"] > 0 for t in target["verify_by_tokens"].values())
    fit = CostModel.from_timing(timed)
    assert fit.verify_s is not None
    # the draft's two-token read with one row out, less its step, is what each catch-up token costs
    draft = timed["models"][0]
    assert draft["catch_up"]["tokens"] == 2
    assert fit.draft_catch_up == pytest.approx(max(0.0, draft["catch_up"]["median_s"] - fit.draft_step))
    assert fit.catch_up == fit.draft_catch_up


def test_the_gpu_checks_forced_runs_split_their_wall(models, traced_only):
    """``scripts.gpu_check``'s trace-forced part on the CPU (no graphs to capture): every policy makes its trace's
    tokens, the second pass times each forward (one a round for target-only, a draft forward per candidate plus the
    verification for SD), and the report shows the split."""
    from scripts.gpu_check import forced_decoding, report

    schedule = {"c": 0.5, "traces": [{"length": 6}, {"length": 4}],
                "policies": [{"name": "target_only", "family": "target_only", "params": {}, "rounds": []},
                             {"name": "sd k=2", "family": "sd", "params": {"k": 2},
                              "rounds": [[[2, 2], [2, 0], [1, 1]], [[2, 1], [1, 0], [0, 0]]]}]}
    costs = CostModel.by_length(draft=0.001, verify=lambda m: 0.002)
    out = forced_decoding(*models, schedule, costs, prompt_tokens=5, decoder="compiled", split=True)
    # forwards that ran: a forced run reads each prompt before its clock, so each trace's first step of each model
    # is a cached return (two traces: two fewer target forwards, and for SD two fewer draft forwards)
    assert out["target_only"]["forwards"] == 10 - 2 and out["target_only"]["rounds"] == 10
    # SD: a draft forward per candidate (8) and a target call per round (6)
    assert out["sd k=2"]["forwards"] == 8 + 6 - 2 and out["sd k=2"]["rounds"] == 6
    for row in out.values():
        assert 0 < row["forward_s"] < row["split_wall_s"]
    text = report({"device": "cpu", "torch": "", "transformers": "", "seconds": 1.0,
                   "pairs": {"tiny": {"forwards": {"draft": {"compiled": {"1": 1e-3}},
                                                   "target": {"compiled": {"1": 2e-3}}},
                                      "forced": {"compiled": out}}}})
    assert "Where the wall goes (compiled" in text and "| sd k=2 |" in text


@pytest.mark.parametrize("decoder", ["eager", "static"])
def test_the_draft_reads_the_catch_up_the_replay_counts(models, decoder, monkeypatch):
    """Forced SD rounds of a trace whose candidates are surely kept or surely rejected: the tokens beyond one that
    the draft's forwards read, and the count the run records, equal ``expected_counts``' catch-up (the last
    candidate and the bonus token after each fully accepted round), the count the simulator prices."""
    from decoding.replay import expected_counts
    from decoding.backends import CachedLM

    acceptance = np.array([1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1], dtype=float)
    lengths = sd_round_lengths(len(acceptance), 3)
    rounds = draw_rounds(acceptance, lengths, np.random.default_rng(0))
    extra = []
    advance = CachedLM.advance

    def counting(self, seq, rows=1):
        if self.model is models[0]:
            common = next((i for i, (x, y) in enumerate(zip(self.ids, seq)) if x != y), min(len(self.ids), len(seq)))
            extra.append(max(0, len(seq) - common - 1))
        return advance(self, seq, rows)

    monkeypatch.setattr(CachedLM, "advance", counting)
    pair = ModelPair(*models, eos_token_ids=[], decoder=decoder, forced=rounds,
                     sampling=Sampling(temperature=1.0, max_new_tokens=len(acceptance)))
    result = build_policy("sd", k=3).generate(pair, [1, 10, 11, 12], torch.Generator().manual_seed(0))
    expected = expected_counts(acceptance, lengths).catch_up
    assert expected > 0 and sum(extra[1:]) == expected  # the first read is the prompt's
    assert result.stats.draft_catch_up == expected  # the count a run records, which the eval's prediction prices
    assert catch_up(rounds) == expected  # and the count a schedule's prediction prices


def test_a_schedules_catch_up_is_the_replays_on_traces_of_sure_outcomes():
    """On traces whose candidates are surely kept or surely rejected, one draw of the rounds is the only one, so its
    catch-up (``decoding.schedule.catch_up``) equals the replay's expectation, rounds that draft nothing included."""
    from decoding.replay import expected_counts

    rng = np.random.default_rng(1)
    for _ in range(50):
        acceptance = (rng.uniform(size=40) < 0.7).astype(float)
        lengths = np.minimum(rng.integers(0, 4, size=40), 39 - np.arange(40))  # no round past the trace's end
        assert catch_up(draw_rounds(acceptance, lengths, rng)) == expected_counts(acceptance, lengths).catch_up
    assert catch_up([(0, 0), (0, 0), (2, 2), (1, 0), (0, 0), (3, 3), (2, 1)]) == 2 + 1 + 1 + 1


def test_the_gpu_checks_timing_file_prices_the_drafts_catch_up():
    """The GPU check's timing file (``scripts.gpu_check.timing_layout``) carries the draft's two-token read, so a
    fit from it charges each catch-up token the read less the step."""
    from decoding.costs import CostModel
    from scripts.gpu_check import timing_layout

    target = {1: 0.004, 2: 0.0045, 3: 0.005, 8: 0.006}
    layout = timing_layout("H100", "graphs", {1: 0.002, 2: 0.0026}, target, {"draft": 0.01, "target": 0.02})
    fit = CostModel.from_timing(layout)
    assert fit.draft_catch_up == pytest.approx(0.0006) and fit.catch_up == pytest.approx(0.0006)

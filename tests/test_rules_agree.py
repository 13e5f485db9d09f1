"""Every loop that applies a rule of ``decoding.rules`` makes the same rounds: the decoder's policies, the
transformers runtime (``decoding.runtimes.hf``) and the trace replay (``decoding.replay``), on random head logits,
calibrations of the draft's confidence, thresholds and round caps.

The pair is a "counting" Llama: its attention and MLP write nothing, so its hidden state is the normalized embedding
of the token it read, and its output matrix is the embedding matrix shifted by one, so its greedy next token is
always the previous one plus one, with a confidence that varies from token to token. Draft and target are the same
model and decoding is greedy, so every candidate is kept: a round at position s drafts exactly the stop rule's n(s)
candidates and the next round starts after its target token. A stop head is a table of logits by token: every loop
reads the same logit for the same candidate, and the replay reads the same logits over the response. A calibration
is read the same way from the draft's probability of each response token, which the replay's trace holds.

Greedy decoding draws the argmax, where a rule reading the draft's top-1 probability reads the candidate's own: the
sampled cases at the end (a target unlike the draft, top-k and top-p) observe what the production decoder and runtime
calibrate for candidates off the argmax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from core.label_math import entropy, warp_logits
from core.sampling import Sampling
from decoding import replay, rules
from decoding.costs import CostModel
from decoding.estimates import CalibratedConfidence
from decoding.policies import POLICIES, build_policy
from decoding.policies.sprinter import HeadVerifier, Sprinter
from decoding.runtimes import hf as runtime
from decoding.state import Decoding, ModelPair
from decoding.traces import Trace
from heads.exported import ExportedHead

VOCAB = 48
TRIALS = 6


def counting_model(seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    embed = torch.nn.functional.normalize(torch.randn(VOCAB, 32, generator=g), dim=-1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed.roll(1, dims=0) * 1.2)  # row v is token v − 1's embedding
    return model


class TableHead(ExportedHead):
    """A head whose logit for a token is ``table[token]``, whatever the hidden state."""

    def __init__(self, table: np.ndarray, role: str, position: str):
        self.table, self.role, self.position = table, role, position
        self.path = Path(f"table-{role}-{position}")
        self._scores, self.vectors, self.draft_layers, self.needs_context = [], [], (), False

    def check(self, draft, target=None) -> None:
        pass

    def logit(self, hidden, logprobs=None, token=None, context=None) -> float:
        return float(self.table[token])


@pytest.fixture(scope="module")
def model():
    """(draft, target): two copies of one counting model."""
    return counting_model(), counting_model()


def decoder_run(model, policy, prompt: list[int], length: int):
    pair = ModelPair(draft=model[0], target=model[1], eos_token_ids=[], sampling=Sampling(temperature=0.0,
                                                                                    max_new_tokens=length))
    return policy.generate(pair, prompt, torch.Generator().manual_seed(0))


def rounds_from_starts(kept: list[int]) -> list[tuple[int, int]]:
    """(start, candidates) of each round when every candidate is kept and each round adds its target token."""
    out, s = [], 0
    for n in kept:
        out.append((s, n))
        s += n + 1
    return out


def response_signals(model, prompt: list[int], tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The draft's probability of each response token and the entropy of the distribution it was drawn from (at
    temperature 1, as the decoder reads them under greedy decoding)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logq = model[0](ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
    p = logq.gather(1, torch.tensor(tokens)[:, None])[:, 0].exp().double().numpy()
    return p, np.array([entropy(row).item() for row in logq])


def trials():
    rng = np.random.default_rng(29)
    for _ in range(TRIALS):
        yield (rng.normal(0.5, 2.0, VOCAB), [int(rng.integers(VOCAB))], int(rng.integers(6, 30)),
               int(rng.integers(1, 9)), rng)


@pytest.mark.parametrize("position", ["prev", "own"])
@pytest.mark.parametrize("h", [0.1, 0.4, 0.8])
def test_specdecpp_rounds_agree(model, position, h):
    for table, prompt, length, max_k, _ in trials():
        head = TableHead(table, "stop", position)
        result = decoder_run(model, build_policy("specdecpp", head=head, h=h, max_k=max_k), prompt, length)
        expected = replay.head_round_lengths(rules.log_accept(table[result.tokens]), h, position == "own", max_k)
        decoded = rounds_from_starts(result.stats.accepted_lengths)
        assert decoded == [(s, int(expected[s])) for s, _ in decoded]
        assert runtime_rounds(model, head, h, prompt, length, max_k) == decoded


def runtime_rounds(model, head: TableHead | None, threshold: float | None, prompt: list[int], length: int,
                   max_k: int, **goodput):
    """(start, candidates) of each round of the transformers runtime (a verifier's: the tokens it accepted and
    whether it rejected one); ``goodput``: the goodput stop's ``costs`` and ``rate`` in place of h (and its
    ``calibration`` in place of a head)."""
    seen = []
    original = runtime.HeadCandidateGenerator.get_candidates

    def recording(self, input_ids, **kwargs):
        ids, scores = original(self, input_ids, **kwargs)
        start, new = input_ids.shape[1] - len(prompt), ids.shape[1] - input_ids.shape[1]
        seen.append((start, new - 1 if self.rule.rejected else new, self.rule.rejected))
        return ids, scores

    runtime.HeadCandidateGenerator.get_candidates = recording
    try:
        decoding = runtime.HeadDecoding(head, model[0], threshold=threshold, max_k=max_k, **goodput)
        out = model[1].generate(torch.tensor([prompt]), custom_generate=decoding, do_sample=False,
                                max_new_tokens=length)
    finally:
        runtime.HeadCandidateGenerator.get_candidates = original
    assert out.shape[1] == len(prompt) + length
    return [(s, n) for s, n, _ in seen] if head is None or head.role == "stop" else seen


@pytest.mark.parametrize("position", ["prev", "own"])
def test_goodput_rounds_agree(model, position):
    """The goodput stop under a random verification table that is not monotone in the length (a longer round can
    verify cheaper), at a random λ: the decoder, the runtime and the replay make the same rounds."""
    lengths = set()
    for table, prompt, length, max_k, rng in trials():
        costs, lam = random_goodput(rng, max_k)
        assert np.any(np.diff(costs.verify_table(max_k + 1)[1:]) < 0)
        head = TableHead(table, "stop", position)
        result = decoder_run(model, build_policy("goodput", head=head, costs=costs, lam=lam, max_k=max_k), prompt,
                             length)
        expected = replay.goodput_round_lengths(rules.log_accept(table[result.tokens]), costs, lam,
                                                position == "own", max_k)
        decoded = rounds_from_starts(result.stats.accepted_lengths)
        assert decoded == [(s, int(expected[s])) for s, _ in decoded]
        assert runtime_rounds(model, head, None, prompt, length, max_k, costs=costs, rate=lam) == decoded
        lengths |= {(n, max_k) for _, n in decoded}
    assert any(n < max_k for n, max_k in lengths) and any(1 < n for n, _ in lengths)  # stops early and goes on


def random_goodput(rng: np.random.Generator, max_k: int) -> tuple[CostModel, float]:
    """Costs of a random verification table that is not monotone in the length, and a random λ."""
    verify = np.concatenate(([0.0], 0.5 + np.cumsum(rng.uniform(-0.15, 0.3, max_k + 1))))
    return (CostModel.by_length(draft=float(rng.uniform(0.02, 0.2)), verify=verify, name="random"),
            float(rng.uniform(0.5, 4.0)) / verify[1])


def test_calibrated_goodput_rounds_agree(model):
    """The goodput stop on the draft's confidence through a random monotone calibration, no head: the decoder, the
    runtime and the simulator's replay of the response's trace (its ``logp_draft``) make the same rounds."""
    lengths = set()
    for _, prompt, length, max_k, rng in trials():
        costs, lam = random_goodput(rng, max_k)
        greedy = [(prompt[-1] + 1 + i) % VOCAB for i in range(length)]  # the counting model's response
        p, h = response_signals(model, prompt, greedy)
        knots = np.sort(rng.uniform(p.min(), p.max(), 6))
        calibration = CalibratedConfidence(q=knots, acceptance=np.sort(rng.uniform(0.75, 0.999, 6)))  # mostly kept
        result = decoder_run(model, build_policy("goodput", calibration=calibration, costs=costs, lam=lam,
                                                 max_k=max_k), prompt, length)
        assert result.tokens == greedy
        trace = Trace(prompt_id=0, acceptance=np.ones(length), logp_draft=np.log(p), entropy_draft=h,
                      hidden=torch.zeros(length, 1), hidden_prev=torch.zeros(length, 1))
        expected = POLICIES["goodput"].replay_lengths(trace, max_k, calibration=calibration, costs=costs, lam=lam)
        decoded = rounds_from_starts(result.stats.accepted_lengths)
        assert decoded == [(s, int(expected[s])) for s, _ in decoded]
        assert runtime_rounds(model, None, None, prompt, length, max_k, calibration=calibration, costs=costs,
                              rate=lam) == decoded
        lengths |= {(n, max_k) for _, n in decoded}
    assert any(n < max_k for n, max_k in lengths) and any(1 < n for n, _ in lengths)  # stops early and goes on


@pytest.mark.parametrize("rule", ["confidence", "svip"])
def test_training_free_rounds_agree(model, rule):
    for _, prompt, length, max_k, rng in trials():
        greedy = [(prompt[-1] + 1 + i) % VOCAB for i in range(length)]  # the counting model's response
        p, h = response_signals(model, prompt, greedy)
        signal = np.unique(p if rule == "confidence" else np.sqrt(h))
        i = int(rng.integers(len(signal) - 1))
        threshold = float(signal[i] + signal[i + 1]) / 2  # between two of the response's values, never on one
        setting = {"threshold": threshold} if rule == "confidence" else {"h": threshold}
        result = decoder_run(model, build_policy(rule, max_k=max_k, **setting), prompt, length)
        assert result.tokens == greedy
        stops = rules.confidence_stops(p, threshold) if rule == "confidence" else rules.entropy_stops(h, threshold)
        expected = replay.round_lengths(stops, False, max_k)
        decoded = rounds_from_starts(result.stats.accepted_lengths)
        assert decoded == [(s, int(expected[s])) for s, _ in decoded]
        assert 0 < stops.sum() < len(stops)  # the rule both stops and goes on somewhere


@pytest.mark.parametrize("position", ["prev", "own"])
def test_sprinter_acceptance_agrees(model, position):
    for table, prompt, length, _, rng in trials():
        tau = float(rng.uniform(0.2, 0.8))
        head = TableHead(table, "verifier", position)
        result = decoder_run(model, Sprinter(verifier=HeadVerifier(head, tau)), prompt, length)
        accepts = rules.verifier_accepts(table[result.tokens], tau)
        counts = replay.sprinter_counts(accepts)
        assert result.stats.target_calls == counts.target  # one call per rejected token, the first with the prompt
        rejected_at = np.cumsum(result.stats.accepted_lengths) - 1  # each round but a last accepted one ends there
        assert set(rejected_at[: int(counts.target)].tolist()) == set(np.flatnonzero(~accepts).tolist())
        if position == "prev":  # the runtime runs SPRINTER on the paper's feature only
            seen = runtime_rounds(model, head, tau, prompt, length, 20)
            assert [s + n for s, n, rejected in seen if rejected] == np.flatnonzero(~accepts).tolist()


SAMPLED_T = 3.0
"""The temperature of the sampled cases: the counting draft is sure of its next token at 1 (its norm scales the
logits), so few candidates would leave the argmax."""

SAMPLED = {"t3": {}, "t3-top6": {"top_k": 6}, "t3-topp0.5": {"top_p": 0.5}}
"""The sampled cases' top-k and top-p: q, the distribution a candidate is drawn from and the labels hold (so the one
a calibration is fitted on), is renormalized over the tokens they keep."""


def draft_table(model, warp: dict) -> torch.Tensor:
    """q(· | x) of the counting draft at ``SAMPLED_T`` and ``warp``, by previous token x: its distribution depends on
    x alone."""
    with torch.no_grad():
        logits = model[0](torch.arange(VOCAB)[:, None]).logits[:, -1]
    return warp_logits(logits, SAMPLED_T, warp.get("top_k", 0), warp.get("top_p", 1.0))


class RecordingCalibration(CalibratedConfidence):
    """A calibration that notes each log q(Y_i) it is asked to calibrate, in order: what the loop under test read."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.reads: list[float] = []

    def log_accept(self, logp_draft, entropy_draft=None, head_logit=None) -> np.ndarray:
        self.reads.append(float(logp_draft))
        return super().log_accept(logp_draft)


def sampled_goodput_rounds(model, monkeypatch, loop: str, warp: dict) -> list[tuple[int, list[int], list[float]]]:
    """(the token before the round, its candidates, the log q(Y_i) the goodput stop calibrated during it) of every
    round of a few sampled generations with a target unlike the draft (candidates off the argmax, some rejected), by
    the production decoder or runtime: only observed, the rounds as ``draft_round`` and ``get_candidates`` return
    them and the reads as the calibration is asked."""
    calibration = RecordingCalibration(q=np.array([0.0, 0.03, 0.06, 0.2]), acceptance=np.array([0.1, 0.5, 0.8, 0.95]))
    rounds = []
    if loop == "decoder":
        original = Decoding.draft_round

        def observed(dec, max_k, stop=None):
            before = len(calibration.reads)
            candidates, logqs = original(dec, max_k, stop)
            rounds.append((dec.seq[-1], list(candidates), calibration.reads[before:]))
            return candidates, logqs

        monkeypatch.setattr(Decoding, "draft_round", observed)
    else:
        original = runtime.HeadCandidateGenerator.get_candidates

        def observed(self, input_ids, **kwargs):
            before = len(calibration.reads)
            ids, scores = original(self, input_ids, **kwargs)
            rounds.append((int(input_ids[0, -1]), ids[0, input_ids.shape[1]:].tolist(), calibration.reads[before:]))
            return ids, scores

        monkeypatch.setattr(runtime.HeadCandidateGenerator, "get_candidates", observed)
    costs = CostModel.by_length(draft=0.05, verify=lambda m: 1.0 + 0.05 * m, name="test")
    target = counting_model(seed=1)
    sampling = {"temperature": SAMPLED_T, "top_k": 0, "top_p": 1.0, **warp}
    for seed, prompt in enumerate([[3], [17], [40]]):
        if loop == "decoder":
            pair = ModelPair(draft=model[0], target=target, eos_token_ids=[],
                             sampling=Sampling(max_new_tokens=24, **sampling))
            build_policy("goodput", calibration=calibration, costs=costs, max_k=6).generate(
                pair, prompt, torch.Generator().manual_seed(seed))
        else:
            torch.manual_seed(seed)
            decoding = runtime.HeadDecoding(None, model[0], max_k=6, calibration=calibration, costs=costs)
            target.generate(torch.tensor([prompt]), custom_generate=decoding, do_sample=True, max_new_tokens=24,
                            **sampling)
    return rounds


@pytest.mark.parametrize("warp", SAMPLED)
@pytest.mark.parametrize("loop", ["decoder", "runtime"])
def test_sampled_candidates_are_calibrated_on_their_own_probability(model, monkeypatch, loop, warp):
    """Sampling with a target unlike the draft, candidates off the draft's argmax and rejections: in the production
    decoder and runtime, every estimate the goodput stop reads is the calibration of the candidate's own q(Y_i), under
    the top-k or top-p its q was drawn with; a loop that calibrates the draft's top-1 probability, or q before
    top-k/top-p, reads another number for most candidates and fails."""
    table = draft_table(model, SAMPLED[warp]).double().numpy()
    rounds = sampled_goodput_rounds(model, monkeypatch, loop, SAMPLED[warp])
    decided = [(x, y, read) for before, candidates, reads in rounds
               for x, y, read in zip([before, *candidates], candidates, reads)]
    assert all(len(reads) <= len(candidates) for _, candidates, reads in rounds)
    assert len(decided) > 20 and sum(y != table[x].argmax() for x, y, _ in decided) > len(decided) // 2
    assert len({len(candidates) for _, candidates, _ in rounds}) > 1  # the reads move the stop
    assert [read for _, _, read in decided] == pytest.approx([table[x, y] for x, y, _ in decided], abs=1e-5)

"""The decoder's math on stub models with hand-written tables, where every expected distribution is known.

A stub's next-token distribution depends only on the previous token (``table[prev]``), so generated tokens form a
Markov chain: the target's first three are distributed as P(t1, t2, t3) = M[prompt[-1], t1]·M[t1, t2]·M[t2, t3],
M the target's warped transition matrix. M is computed here by hand (``hand_warp``: temperature, top-k, top-p in
plain Python), independently of the decoder's ``warp_logits``. A stub's hidden state is the one-hot of the token
it reads, so a head sees which token it scores.

- exact policies (SD, SpecDec++ with a head, the confidence and SVIP stop rules, HF's schedule): the joint
  distribution of the first three tokens is the target's (χ² test), under top-k and under top-p sampling;
- the test has the power to see subtle bugs: a decoder that reuses one uniform for every acceptance test of a
  round, or resamples the argmax of norm((p − q)+) after a rejection, fails the same χ² test;
- SPRINTER with a verifier of known error rates: tokens follow (1 − η_FP)·p + η_FP·q (Theorem 1; joint test,
  with a residual of two tokens, where an argmax resampler fails) and a draft token is kept with probability
  1 − (1 − η_FP)·TV(p, q) (Theorem 7).
"""

from __future__ import annotations

import math
from functools import partialmethod
from types import SimpleNamespace

import pytest
import torch
from scipy import stats
from torch import nn

from core import sampling
from core.label_math import acceptance_probability, residual_distribution, sample_from_logprobs, tv_distance
from core.sampling import Sampling
from evaluation.decoder import DecodeStats, Decoding, ModelPair
from evaluation.policies import build_policy
import evaluation.policies.sprinter as sprinter_module
from evaluation.policies.sprinter import Sprinter
from heads import runtime
from heads.export import export_head
from heads.resnet import ResNetHead
from heads.sprinter import SprinterHead

P_CRIT = 1e-3

# Hand-written next-token probabilities after each token, the target's beside the draft's (the stubs' logits are
# their log). The draft is overconfident: its favourite token has 1.2-4x the target's probability, so a round's
# candidates are often rejected, and the acceptance tests of one round must be independent for the output to be
# right.
TABLES = [([0.04, 0.46, 0.27, 0.12, 0.08, 0.03], [0.02, 0.78, 0.12, 0.04, 0.03, 0.01]),
          ([0.06, 0.02, 0.62, 0.21, 0.05, 0.04], [0.05, 0.015, 0.40, 0.45, 0.06, 0.025]),
          ([0.28, 0.07, 0.03, 0.33, 0.17, 0.12], [0.10, 0.02, 0.01, 0.12, 0.70, 0.05]),
          ([0.09, 0.17, 0.07, 0.02, 0.40, 0.25], [0.05, 0.06, 0.03, 0.02, 0.80, 0.04]),
          ([0.23, 0.09, 0.11, 0.05, 0.01, 0.51], [0.10, 0.03, 0.06, 0.02, 0.09, 0.70]),
          ([0.70, 0.15, 0.05, 0.04, 0.035, 0.025], [0.85, 0.07, 0.03, 0.025, 0.015, 0.01])]
TARGET, DRAFT = (torch.tensor([rows[i] for rows in TABLES]).log() for i in (0, 1))
# top-k cuts 3 of 6 tokens; top-p keeps 3-4 of the target's and 2-3 of the draft's (no row's mass within 0.01
# of top_p, so float round-off cannot move a cut)
SAMPLINGS = {"t0.8-top3": Sampling(temperature=0.8, top_k=3, max_new_tokens=4),
             "t1.1-topp0.85": Sampling(temperature=1.1, top_p=0.85, max_new_tokens=4)}
PROMPT = [2, 3]


class MarkovLM(nn.Module):
    """A causal LM whose logits after token t are ``table[t]`` (the HF surface the decoder uses, no cache)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        vocab = table.shape[0]
        self.lm_head = nn.Linear(vocab, vocab, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(table.T)
        self.vocab = vocab

    def _base(self, input_ids, past_key_values=None, **_):
        hidden = nn.functional.one_hot(input_ids, self.vocab).float()
        return SimpleNamespace(last_hidden_state=hidden, past_key_values=past_key_values)

    def get_decoder(self):
        return self._base

    def get_output_embeddings(self):
        return self.lm_head


def markov_pair(draft_table: torch.Tensor, target_table: torch.Tensor, sampling: Sampling,
                eos: tuple[int, ...] = ()) -> ModelPair:
    return ModelPair(MarkovLM(draft_table), MarkovLM(target_table), eos_token_ids=list(eos), sampling=sampling)


def random_table(vocab: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    return scale * torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))


def shift_table(vocab: int, probs: list[float]) -> torch.Tensor:
    """table[prev, (prev + k) % vocab] = log probs[k]: the same distribution of increments after every token."""
    t = torch.empty(vocab, vocab)
    for prev in range(vocab):
        for k, p in enumerate(probs):
            t[prev, (prev + k) % vocab] = math.log(p) if p > 0 else -1e4
    return t


def hand_warp(table: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The sampling distribution after every token, (V, V) float64, by hand: weights exp(logit / T); top-k keeps
    the k heaviest tokens; top-p then keeps the heaviest while the (renormalized) mass before them is < top_p."""
    rows = []
    for logits in table.tolist():
        w = [math.exp(x / s.temperature) for x in logits]
        order = sorted(range(len(w)), key=lambda i: -w[i])[:s.top_k or None]
        kept, mass, total = [], 0.0, sum(w[i] for i in order)
        for i in order:
            if mass >= s.top_p:
                break
            kept.append(i)
            mass += w[i] / total
        z = sum(w[i] for i in kept)
        rows.append([w[i] / z if i in kept else 0.0 for i in range(len(w))])
    return torch.tensor(rows, dtype=torch.float64)


def chain_joint(m: torch.Tensor, last: int, n: int) -> torch.Tensor:
    """P(t1, …, tn) of the Markov chain with transition matrix ``m`` after token ``last``, shape (V,) * n."""
    joint = m[last]
    for _ in range(n - 1):
        joint = joint.unsqueeze(-1) * m
    return joint


def chi2_pvalue(samples: list[int], probs: torch.Tensor) -> float:
    """χ² goodness of fit; cells expected below 5 are pooled into one."""
    n = len(samples)
    observed = torch.bincount(torch.tensor(samples), minlength=len(probs)).double()
    expected = probs.double() * n
    assert observed[expected == 0].sum() == 0, "a token of probability 0 was generated"
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def joint_pvalue(results, joint: torch.Tensor) -> float:
    """χ² p-value of the first ``joint.ndim`` generated tokens of every result against their joint distribution."""
    n, vocab = joint.ndim, joint.shape[0]
    cells = [sum(t * vocab ** (n - 1 - i) for i, t in enumerate(r.tokens[:n])) for r in results]
    return chi2_pvalue(cells, joint.flatten())


def run_many(policy, pair: ModelPair, prompt: list[int], n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [policy.generate(pair, prompt, g) for _ in range(n)]


def export_stub_head(path, head: nn.Module, vocab: int, role: str, value: float):
    return export_head(
        head, path, draft={"name": "stub", "source": "stub"}, vocab_size=vocab,
        label={"kind": "sprinter", "lam": 1.0} if role == "verifier" else {"kind": "soft", "w_acc": 1.0, "w_rej": 6.0},
        role=role, threshold={"name": "tau" if role == "verifier" else "h", "value": value, "rule": "test"},
        metrics={},
    )


@pytest.fixture(scope="module")
def stop_head(tmp_path_factory):
    """A SpecDec++ stop head with a hand-written acceptance logit per token (it reads a one-hot): with h = 0.5 a
    round stops once the product of its candidates' sigmoid(logit) is below 0.5, at once after a 1 or a 3."""
    head = ResNetHead(hidden_size=6, depth=0)
    with torch.no_grad():
        head.out.weight.copy_(torch.tensor([[1.0, -1.0, 1.5, -2.0, 2.0, 0.5]]))
        head.out.bias.zero_()
    return export_stub_head(tmp_path_factory.mktemp("heads") / "stop.safetensors", head, 6, "stop", 0.5)


# ---------------------------------------------------------------------------------------------------------------


def test_residual_distribution():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0]).log()
    q = torch.tensor([0.2, 0.3, 0.3, 0.2]).log()
    assert torch.allclose(residual_distribution(p, q).exp(), torch.tensor([1.0, 0, 0, 0]))
    # no residual mass (p == q): falls back to p
    assert torch.allclose(residual_distribution(p, p).exp(), p.exp())


def exact_run(name: str, kwargs: dict, sampling: str, stop_head, n: int = 800):
    """``n`` generations of an exact policy on the hand-written pair, and the p-value of their first 3 tokens."""
    if name == "specdecpp":
        kwargs = {**kwargs, "head": str(stop_head)}
    results = run_many(build_policy(name, **kwargs), markov_pair(DRAFT, TARGET, SAMPLINGS[sampling]), PROMPT, n)
    return results, joint_pvalue(results, chain_joint(hand_warp(TARGET, SAMPLINGS[sampling]), PROMPT[-1], 3))


@pytest.mark.parametrize("name, kwargs, sampling", [
    ("sd", {"k": 3}, "t0.8-top3"), ("sd", {"k": 3}, "t1.1-topp0.85"), ("specdecpp", {"max_k": 4}, "t1.1-topp0.85"),
    ("confidence", {"threshold": 0.5}, "t0.8-top3"), ("svip", {"h": 0.8}, "t0.8-top3"),
    ("hf_heuristic", {"k0": 2}, "t1.1-topp0.85"),
])
def test_exact_policies_match_the_target(name, kwargs, sampling, stop_head):
    results, p = exact_run(name, kwargs, sampling, stop_head)
    assert p > P_CRIT, f"{name}: χ² p = {p:.2g} for the first three tokens"
    assert all(len(r.tokens) == 4 for r in results)
    # rejections did happen, and rounds that kept several candidates (the test is not vacuous)
    assert sum(r.stats.discarded for r in results) > len(results) / 2
    assert sum(max(r.stats.accepted_lengths) >= 2 for r in results) > len(results) / 5


def shared_uniform(dec: Decoding) -> float:
    """Mutant: one uniform for every acceptance test of a round (the sequence grows after each round)."""
    if getattr(dec, "_mutant_at", None) != len(dec.seq):
        dec._mutant_at, dec._mutant_u = len(dec.seq), torch.rand((), generator=dec.generator).item()
    return dec._mutant_u


def argmax_residual(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Mutant: the resample after a rejection is the most likely token of norm((p − q)+), not a draw from it."""
    residual = residual_distribution(logp, logq)
    return torch.full_like(residual, -math.inf).scatter(-1, residual.argmax(-1, keepdim=True), 0.0)


@pytest.mark.parametrize("mutant", ["shared_uniform", "argmax_residual"])
def test_the_joint_test_rejects_a_wrong_decoder(mutant, monkeypatch):
    if mutant == "shared_uniform":
        monkeypatch.setattr(Decoding, "uniform", shared_uniform)
    else:
        monkeypatch.setattr(Decoding, "verify", partialmethod(Decoding.verify, on_reject=argmax_residual))
    _, p = exact_run("sd", {"k": 3}, "t1.1-topp0.85", stop_head=None)
    assert p < P_CRIT, f"the {mutant} mutant passed: χ² p = {p:.2g}"


class RateVerifier:
    """Accepts an acceptable token (q ≤ p) with probability η_TP and an unacceptable one with probability η_FP."""

    def __init__(self, draft_table: torch.Tensor, target_table: torch.Tensor, eta_tp: float, eta_fp: float):
        self.q, self.p = draft_table.softmax(-1), target_table.softmax(-1)
        self.eta_tp, self.eta_fp = eta_tp, eta_fp

    def __call__(self, hidden, ids, generator, scores) -> bool:
        prev, token = ids[-2], ids[-1]
        rate = self.eta_tp if self.q[prev, token] <= self.p[prev, token] else self.eta_fp
        return torch.rand((), generator=generator).item() < rate


# increments of the shift tables: (p − q)+ = (0.3, 0.2, 0, 0, 0), a residual of two tokens, TV(p, q) = 0.5
P_INC, Q_INC = [0.5, 0.3, 0.2, 0.0, 0.0], [0.2, 0.1, 0.3, 0.2, 0.2]


def sprinter_run(eta_tp: float, eta_fp: float, n: int = 1500):
    """SPRINTER with a ``RateVerifier`` on shift tables; the p-value of the first 3 tokens against Theorem 1."""
    vocab, prompt = 5, [2]
    draft_table, target_table = shift_table(vocab, Q_INC), shift_table(vocab, P_INC)
    sampling = Sampling(temperature=1.0, max_new_tokens=3)
    mixture = (1 - eta_fp) * hand_warp(target_table, sampling) + eta_fp * hand_warp(draft_table, sampling)
    policy = Sprinter(verifier=RateVerifier(draft_table, target_table, eta_tp, eta_fp))
    results = run_many(policy, markov_pair(draft_table, target_table, sampling), prompt, n)
    return results, joint_pvalue(results, chain_joint(mixture, prompt[-1], 3))


@pytest.mark.parametrize("eta_tp, eta_fp", [(0.7, 0.4), (0.9, 0.0), (0.5, 0.8)])
def test_sprinter_theorems_1_and_7(eta_tp, eta_fp):
    results, pv = sprinter_run(eta_tp, eta_fp)
    assert pv > P_CRIT, f"χ² p = {pv:.2g} for the first three tokens"
    p, q = torch.tensor(P_INC, dtype=torch.float64), torch.tensor(Q_INC, dtype=torch.float64)
    beta = 1 - (1 - eta_fp) * tv_distance(p.log(), q.log()).item()  # Theorem 7
    # Theorem 7 on the first draft token of every run (unbiased: one Bernoulli(β) trial per run)
    kept = sum(r.stats.accepted_lengths[0] >= 1 for r in results)
    assert stats.binomtest(kept, len(results), beta).pvalue > P_CRIT, (kept / len(results), beta)
    # and over all draft tokens (a ratio estimator, within a loose tolerance)
    proposed = sum(sum(r.stats.accepted_lengths) + r.stats.discarded for r in results)
    kept_all = sum(sum(r.stats.accepted_lengths) for r in results)
    assert abs(kept_all / proposed - beta) < 0.03


def test_sprinter_theorem_1_test_rejects_an_argmax_resampler(monkeypatch):
    monkeypatch.setattr(sprinter_module, "residual_distribution", argmax_residual)
    _, pv = sprinter_run(0.7, 0.4)
    assert pv < P_CRIT, f"the argmax resampler passed: χ² p = {pv:.2g}"


def test_sprinter_head_thresholds(tmp_path):
    """An exported verifier head: τ = 0 accepts every token (the draft alone, no target call); a head that always
    says 0.5 with τ = 0.6 rejects every token (η_FP = 0: exact, one target call per token)."""
    vocab = 6
    head = SprinterHead(hidden_size=vocab)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.zero_()
    path = export_stub_head(tmp_path / "verifier.safetensors", head, vocab, "verifier", 0.6)
    draft_table, target_table = random_table(vocab, 1), random_table(vocab, 2)
    sampling = Sampling(temperature=1.0, max_new_tokens=5)
    pair = markov_pair(draft_table, target_table, sampling)
    prompt = [1]

    accept_all = run_many(build_policy("sprinter", head=str(path), tau=0.0), pair, prompt, 3, seed=5)
    draft_only = run_many(build_policy("draft_only"), pair, prompt, 3, seed=5)
    assert [r.tokens for r in accept_all] == [r.tokens for r in draft_only]
    assert all(r.stats.target_calls == 0 and r.stats.discarded == 0 for r in accept_all)

    reject_all = run_many(build_policy("sprinter", head=str(path)), pair, prompt, 1000)  # τ from the file: 0.6
    assert all(r.stats.target_calls == r.stats.new_tokens == 5 for r in reject_all)
    assert joint_pvalue(reject_all, chain_joint(hand_warp(target_table, sampling), prompt[-1], 2)) > P_CRIT


def test_stats_rates():
    s = DecodeStats(wall_s=2.0, new_tokens=10, target_calls=4, draft_calls=12, discarded=6, accepted_lengths=[3, 3])
    assert (s.verification_rate, s.discard_rate, s.tokens_per_s) == (0.4, 0.6, 5.0)
    assert DecodeStats(0.0, 0, 0, 0, 0, []).verification_rate == 0.0


@pytest.mark.parametrize("name, kwargs", [("target_only", {}), ("draft_only", {}), ("sd", {"k": 3}),
                                          ("specdecpp", {}), ("hf_heuristic", {}), ("confidence", {}),
                                          ("svip", {"h": 1.0}), ("fuzzy", {"T": 0.2}), ("sprinter", {})])
def test_generation_ends_after_eos(name, kwargs, stop_head):
    vocab, eos = 6, 4
    draft_table, target_table = random_table(vocab, 1), random_table(vocab, 2)
    pair = markov_pair(draft_table, target_table, Sampling(temperature=1.0, max_new_tokens=8), eos=(eos,))
    if name == "specdecpp":
        kwargs = {"head": str(stop_head)}
    if name == "sprinter":
        kwargs = {"verifier": RateVerifier(draft_table, target_table, 0.8, 0.3)}
    results = run_many(build_policy(name, **kwargs), pair, [0], 40)
    for r in results:
        assert 1 <= len(r.tokens) <= 8
        assert eos not in r.tokens[:-1]
        assert r.tokens[-1] == eos or len(r.tokens) == 8
    assert sum(r.tokens[-1] == eos for r in results) > 5


# ---------------------------------------------------------------------------------------------------------------
# float64 draws (core.sampling)


def long_tail(bits: int = 18) -> torch.Tensor:
    """Log-probs (float64) over 2^bits + 2 tokens: one head token, then 2^bits tail tokens of 2^-26 each (below a
    float32 uniform's 2^-24 grid, like the tail of a 151,936-token vocabulary), then a token of half that mass which
    shifts every 2^-24 grid point into the middle of a tail token: inverse-CDF sampling from a float32 uniform reaches
    only the tail tokens 0, 4, 8, … (with four times their probability), whatever the float round-off."""
    w = torch.full((2**bits + 2,), 2.0**-26, dtype=torch.float64)
    w[0] = 1 - 2**bits * 2.0**-26 - 2.0**-27
    w[-1] = 2.0**-27
    return w.log()


def float32_uniform(generator=None, shape=()):
    """Mutant: the float32 uniform (24 random bits) the decoder drew before."""
    return torch.rand(shape, generator=generator).double()


@pytest.mark.parametrize("source", ["float64", "float32 mutant"])
def test_sampling_reaches_every_token_of_a_long_tail(source, monkeypatch):
    """2^20 draws of the shared sampler (``core.sampling``: ``sample_token`` is ``sample_from_logprobs`` on one
    ``uniform``; drawn here in one batch) land ~4,096 times in the tail; with float64 uniforms the tail tokens are
    drawn evenly whatever their index mod 4. The float32 mutant draws only indices ≡ 0 mod 4 and fails."""
    if source != "float64":
        monkeypatch.setattr(sampling, "uniform", float32_uniform)
    lp = long_tail()
    tokens = sample_from_logprobs(lp, sampling.uniform(torch.Generator().manual_seed(0), (2**20,)))
    tail = tokens[(tokens >= 1) & (tokens <= len(lp) - 2)] - 1
    residues = torch.bincount(tail % 4, minlength=4)
    pvalue = stats.chisquare(residues.numpy()).pvalue
    assert (pvalue > P_CRIT) == (source == "float64"), (residues.tolist(), pvalue)


def test_every_draw_is_the_shared_float64_draw():
    """The decoder's token draws and accept/reject uniforms, and the runtime's check of SPRINTER's rejected token, are
    ``core.sampling``'s (the same values from the same seed): the long-tail test above covers them all."""
    lp = torch.randn(1000, dtype=torch.float64).log_softmax(-1)
    for seed in range(20):
        dec = SimpleNamespace(generator=torch.Generator().manual_seed(seed))
        drawn = Decoding.sample(dec, lp), Decoding.uniform(dec)
        g = torch.Generator().manual_seed(seed)
        assert drawn == (sampling.sample_token(lp, g), sampling.uniform(g).item())
    p, q = torch.randn(2, 50).log_softmax(-1)
    token = int(q.argmax())
    a = acceptance_probability(q[token], p[token]).item()
    for seed in range(20):
        torch.manual_seed(seed)
        got = runtime._check_last(token, p, q, do_sample=True)
        torch.manual_seed(seed)
        kept = sampling.uniform().item() < a
        assert got == (token if kept else sampling.sample_token(residual_distribution(p, q)))

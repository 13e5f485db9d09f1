"""The decoder's math on stub models with hand-written tables, where every expected distribution is known.

A stub's next-token distribution depends only on the previous token (``table[prev]``), so the target's marginal
at generated position t is row ``prompt[-1]`` of M^(t+1), M the target's (warped) transition matrix. Its hidden
state is the one-hot of the token it reads, so a head sees which token it scores.

- exact policies (SD, SpecDec++, the adaptive schedules): marginals match the target's (χ² test);
- SPRINTER with a verifier of known error rates: tokens follow (1 − η_FP)·p + η_FP·q (Theorem 1) and a draft
  token is kept with probability 1 − (1 − η_FP)·TV(p, q) (Theorem 7).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from scipy import stats
from torch import nn

from data_gen.label_math import residual_distribution, tv_distance, warp_logits
from data_gen.labeler import Sampling
from evaluation.decoder import DecodeStats, ModelPair, build_policy
from evaluation.policies.sprinter import Sprinter
from heads.export import export_head
from heads.resnet import ResNetHead
from heads.sprinter import SprinterHead

P_CRIT = 1e-3


class MarkovLM(nn.Module):
    """A causal LM whose logits after token t are ``table[t]`` (the HF surface the decoder uses, no cache)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        vocab = table.shape[0]
        self.lm_head = nn.Linear(vocab, vocab, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(table.T)
        self.vocab = vocab

    def _base(self, input_ids, **_):
        return SimpleNamespace(last_hidden_state=nn.functional.one_hot(input_ids, self.vocab).float())

    def get_decoder(self):
        return self._base

    def get_output_embeddings(self):
        return self.lm_head


def random_table(vocab: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    return scale * torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))


def shift_table(vocab: int, probs: list[float]) -> torch.Tensor:
    """table[prev, (prev + k) % vocab] = log probs[k]: the same distribution of increments after every token."""
    t = torch.empty(vocab, vocab)
    for prev in range(vocab):
        for k, p in enumerate(probs):
            t[prev, (prev + k) % vocab] = math.log(p) if p > 0 else -1e4
    return t


def target_marginals(table: torch.Tensor, sampling: Sampling, last: int, n_pos: int) -> list[torch.Tensor]:
    m = warp_logits(table, sampling.temperature, sampling.top_k, sampling.top_p).double().exp()
    row = nn.functional.one_hot(torch.tensor(last), table.shape[0]).double()
    out = []
    for _ in range(n_pos):
        row = row @ m
        out.append(row)
    return out


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
    """A SpecDec++ stop head whose predicted acceptance differs between tokens (random, not trained)."""
    torch.manual_seed(0)
    head = ResNetHead(hidden_size=6, depth=1)
    with torch.no_grad():
        head.blocks[0].linear.weight.normal_(0, 1)
        head.out.weight.normal_(0, 2)
    return export_stub_head(tmp_path_factory.mktemp("heads") / "stop.safetensors", head, 6, "stop", 0.5)


# ---------------------------------------------------------------------------------------------------------------


def test_residual_distribution():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0]).log()
    q = torch.tensor([0.2, 0.3, 0.3, 0.2]).log()
    assert torch.allclose(residual_distribution(p, q).exp(), torch.tensor([1.0, 0, 0, 0]))
    # no residual mass (p == q): falls back to p
    assert torch.allclose(residual_distribution(p, p).exp(), p.exp())


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0, max_new_tokens=3),
                                      Sampling(temperature=0.8, top_k=4, max_new_tokens=3)], ids=["t1", "t0.8-top4"])
@pytest.mark.parametrize("name, kwargs", [("sd", {"k": 2}), ("specdecpp", {"max_k": 4}), ("hf_heuristic", {"k0": 1})])
def test_exact_policies_match_the_target(name, kwargs, sampling, stop_head):
    vocab = 6
    draft_table, target_table = random_table(vocab, 1), random_table(vocab, 2)
    pair = ModelPair(MarkovLM(draft_table), MarkovLM(target_table), eos_token_ids=[], sampling=sampling)
    if name == "specdecpp":
        kwargs = {**kwargs, "head": str(stop_head)}
    policy = build_policy(name, **kwargs)
    prompt = [3, 0]
    results = run_many(policy, pair, prompt, 2000)
    assert all(len(r.tokens) == 3 for r in results)
    for pos, probs in enumerate(target_marginals(target_table, sampling, prompt[-1], 3)):
        p = chi2_pvalue([r.tokens[pos] for r in results], probs)
        assert p > P_CRIT, f"{name} position {pos}: χ² p = {p:.2g}"
    # rejections did happen (the test is not vacuous)
    assert sum(r.stats.discarded for r in results) > 100


class RateVerifier:
    """Accepts an acceptable token (q ≤ p) with probability η_TP and an unacceptable one with probability η_FP."""

    def __init__(self, draft_table: torch.Tensor, target_table: torch.Tensor, eta_tp: float, eta_fp: float):
        self.q, self.p = draft_table.softmax(-1), target_table.softmax(-1)
        self.eta_tp, self.eta_fp = eta_tp, eta_fp

    def __call__(self, hidden, ids, generator, scores) -> bool:
        prev, token = ids[-2], ids[-1]
        rate = self.eta_tp if self.q[prev, token] <= self.p[prev, token] else self.eta_fp
        return torch.rand((), generator=generator).item() < rate


@pytest.mark.parametrize("eta_tp, eta_fp", [(0.7, 0.4), (0.9, 0.0), (0.5, 0.8)])
def test_sprinter_theorems_1_and_7(eta_tp, eta_fp):
    vocab = 5
    p_inc, q_inc = [0.5, 0.3, 0.2, 0.0, 0.0], [0.2, 0.3, 0.3, 0.2, 0.0]
    draft_table, target_table = shift_table(vocab, q_inc), shift_table(vocab, p_inc)
    p, q = torch.tensor(p_inc, dtype=torch.float64), torch.tensor(q_inc, dtype=torch.float64)
    mixture = (1 - eta_fp) * p + eta_fp * q  # Theorem 1, increments of the shift
    beta = 1 - (1 - eta_fp) * tv_distance(p.log(), q.log()).item()  # Theorem 7
    policy = Sprinter(verifier=RateVerifier(draft_table, target_table, eta_tp, eta_fp))
    prompt, n_pos = [2], 4
    pair = ModelPair(MarkovLM(draft_table), MarkovLM(target_table), eos_token_ids=[],
                     sampling=Sampling(temperature=1.0, max_new_tokens=n_pos))
    results = run_many(policy, pair, prompt, 2500)
    for pos in range(n_pos):
        # token at position pos = prompt[-1] + (pos + 1) i.i.d. increments, each distributed as the mixture
        probs = torch.zeros(vocab, dtype=torch.float64)
        probs[prompt[-1]] = 1.0
        for _ in range(pos + 1):
            probs = torch.stack([sum(probs[(v - k) % vocab] * mixture[k] for k in range(vocab)) for v in range(vocab)])
        pv = chi2_pvalue([r.tokens[pos] for r in results], probs)
        assert pv > P_CRIT, f"position {pos}: χ² p = {pv:.2g}"
    # Theorem 7 on the first draft token of every run (unbiased: one Bernoulli(β) trial per run)
    kept = sum(r.stats.accepted_lengths[0] >= 1 for r in results)
    assert stats.binomtest(kept, len(results), beta).pvalue > P_CRIT, (kept / len(results), beta)
    # and over all draft tokens (a ratio estimator, within a loose tolerance)
    proposed = sum(sum(r.stats.accepted_lengths) + r.stats.discarded for r in results)
    kept_all = sum(sum(r.stats.accepted_lengths) for r in results)
    assert abs(kept_all / proposed - beta) < 0.03


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
    pair = ModelPair(MarkovLM(draft_table), MarkovLM(target_table), eos_token_ids=[], sampling=sampling)
    prompt = [1]

    accept_all = run_many(build_policy("sprinter", head=str(path), tau=0.0), pair, prompt, 3, seed=5)
    draft_only = run_many(build_policy("draft_only"), pair, prompt, 3, seed=5)
    assert [r.tokens for r in accept_all] == [r.tokens for r in draft_only]
    assert all(r.stats.target_calls == 0 and r.stats.discarded == 0 for r in accept_all)

    reject_all = run_many(build_policy("sprinter", head=str(path)), pair, prompt, 1500)  # τ from the file: 0.6
    assert all(r.stats.target_calls == r.stats.new_tokens == 5 for r in reject_all)
    for pos, probs in enumerate(target_marginals(target_table, sampling, prompt[-1], 2)):
        assert chi2_pvalue([r.tokens[pos] for r in reject_all], probs) > P_CRIT


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
    pair = ModelPair(MarkovLM(draft_table), MarkovLM(target_table), eos_token_ids=[eos],
                     sampling=Sampling(temperature=1.0, max_new_tokens=8))
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

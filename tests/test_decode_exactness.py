"""The decoder's math on stub models with hand-written tables, where every expected distribution is known.

A stub's next-token distribution depends only on the previous token (``table[prev]``), so generated tokens form a
Markov chain: the target's response is distributed as P(t1, …, tn) = M[prompt[-1], t1]·M[t1, t2]·…, M the target's
warped transition matrix, computed here by hand (``hand_warp``: temperature, top-k, top-p in plain Python),
independently of the decoder's ``warp_logits``. A stub's hidden state is the one-hot of the token it reads, so a
head sees which token it scores.

- exact output distributions (``Paths``): on a three-token vocabulary every random draw of a generation is
  enumerated (token draws over their support, uniforms symbolically), which gives the exact distribution of the
  whole response, every token a round can emit included (kept candidates, resamples, bonus tokens before the end).
  Every exact policy (SD, SpecDec++ with a head, the confidence and SVIP stop rules, HF's schedule, the goodput stop
  on a calibration and on a head, at costs where its rounds vary in length), under top-k and top-p, with and without
  EOS, matches the target's to 1e-6 in TV: a test with no sampling error, which rejects every decoder further than
  that, and rejects each subtle mutant under SD and under the goodput stop (a bonus drawn from q, one position early
  or from unwarped logits, a uniform shared by two positions, acceptance scaled by 0.95, an argmax resample);
- SPRINTER with a verifier of known error rates, enumerated the same way: tokens follow (1 − η_FP)·p + η_FP·q
  (Theorem 1, with a residual of two tokens, where an argmax resampler fails) and the first draft token is kept with
  probability 1 − (1 − η_FP)·TV(p, q) (Theorem 7);
- the real random draws: SD sampled through ``core.sampling`` matches the target (χ²), the sampler reaches every
  token of a long tail below float32's 2^-24 grid (a float32 uniform fails), and every draw of the decoder and the
  runtime is the shared float64 one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable
from functools import partialmethod
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from core import sampling
from core.label_math import acceptance_probability, residual_distribution, sample_from_logprobs, tv_distance
from core.sampling import Sampling
from decoding import rules
from decoding.costs import CostModel
from decoding.estimates import CalibratedConfidence
from decoding.lookup_stop import LookupCalibration
from decoding.policies import build_policy
from decoding.policies.sprinter import Sprinter
from decoding.runtimes import hf as runtime
from decoding.state import DecodeStats, Decoding, ModelPair
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
    assert torch.allclose(residual_distribution(q, p).exp(), torch.tensor([1.0, 0, 0, 0]))
    # no residual mass (p == q): falls back to p
    assert torch.allclose(residual_distribution(p, p).exp(), p.exp())


# ---------------------------------------------------------------------------------------------------------------
# exact output distributions: every random draw of a generation enumerated


class SymbolicUniform:
    """A uniform in [0, 1) that is never drawn: each comparison ``u < x`` is a branch of ``Paths``, taken with the
    probability that u < x given the comparisons it has already answered (u then lies in [lo, hi)), so a uniform
    compared more than once (a decoder reusing it) is enumerated exactly too."""

    def __init__(self, paths: Paths):
        self.paths, self.lo, self.hi = paths, 0.0, 1.0

    def __lt__(self, x: float) -> bool:
        x = float(x)
        if x <= self.lo or x >= self.hi:
            return x >= self.hi
        below = (x - self.lo) / (self.hi - self.lo)
        if self.paths.choose([below, 1 - below]) == 0:
            self.hi = x
            return True
        self.lo = x
        return False


class Paths:
    """The exact distribution of what a generation returns, over all outcomes of its random draws.

    ``distribution(run)`` replays ``run`` once per path through the tree of draws, depth first: a replay follows
    the branches its script names, takes the first branch at every draw beyond it and queues the others. A token
    draw branches over the tokens of positive probability, each with its float64 probability (as the inverse CDF
    of ``core.sampling`` draws them); a uniform is a ``SymbolicUniform``. A path's probability is the product of
    its branches' probabilities; the result is exact up to float round-off (the policies' float32 warping)."""

    def choose(self, probs: list[float]) -> int:
        depth = len(self.taken)
        if depth < len(self.script):
            i = self.script[depth]
        else:
            branches = [j for j, p in enumerate(probs) if p > 0]
            i = branches[0]
            self.todo.extend(self.taken + [j] for j in branches[1:])
        self.taken.append(i)
        self.prob *= probs[i]
        return i

    def sample(self, logprobs: torch.Tensor) -> int:
        w = logprobs.double().exp()
        return self.choose((w / w.sum()).tolist())

    def uniform(self) -> SymbolicUniform:
        return SymbolicUniform(self)

    def distribution(self, run: Callable[[], Hashable]) -> dict:
        """{outcome: probability} of ``run()``, whose draws go through ``sample`` and ``uniform``."""
        out: dict = defaultdict(float)
        self.todo: list[list[int]] = [[]]
        while self.todo:
            self.script, self.taken, self.prob = self.todo.pop(), [], 1.0
            out[run()] += self.prob
        return dict(out)


@pytest.fixture
def paths(monkeypatch) -> Paths:
    """Every ``Decoding`` draw enumerated (``Paths``) instead of drawn."""
    paths = Paths()
    monkeypatch.setattr(Decoding, "sample", lambda dec, logprobs: paths.sample(logprobs))
    monkeypatch.setattr(Decoding, "uniform", lambda dec: paths.uniform())
    return paths


def target_sequences(m: torch.Tensor, last: int, n: int, eos: tuple[int, ...] = ()) -> dict[tuple[int, ...], float]:
    """P(response) of the Markov chain with transition matrix ``m`` after token ``last``: ``n`` tokens, or fewer
    ending with an EOS id."""
    out = {(): 1.0}
    for _ in range(n):
        grown: dict = defaultdict(float)
        for seq, prob in out.items():
            if seq and seq[-1] in eos:
                grown[seq] += prob
                continue
            for t, pt in enumerate(m[seq[-1] if seq else last].tolist()):
                if pt > 0:
                    grown[seq + (t,)] += prob * pt
        out = dict(grown)
    return out


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in a.keys() | b.keys())


# Three tokens, and tables where the draft is overconfident (its favourite has 1.5-3x the target's probability):
# rounds see rejections, resamples from residuals of one and two tokens, and rounds whose candidates are all kept.
# Both warps cut a token of most rows, and the cut tokens differ between the models (top-p 0.7: no row's mass
# within 0.03 of the cut).
TARGET3 = torch.tensor([[0.15, 0.55, 0.30], [0.45, 0.10, 0.45], [0.30, 0.45, 0.25]]).log()
DRAFT3 = torch.tensor([[0.05, 0.85, 0.10], [0.70, 0.05, 0.25], [0.15, 0.20, 0.65]]).log()
SAMPLINGS3 = {"t0.8-top2": Sampling(temperature=0.8, top_k=2, max_new_tokens=4),
              "t1.2-topp0.7": Sampling(temperature=1.2, top_p=0.7, max_new_tokens=4)}
PROMPT3 = [2, 0]
TOL = 1e-6
"""Largest TV between two computations of one exact distribution (float32 warping round-off is ~1e-7 a row): an
exact enumeration rejects every decoder whose output is further than this from the target's."""


@pytest.fixture(scope="module")
def stop_head3(tmp_path_factory):
    """A SpecDec++ stop head for the three-token stubs: with h = 0.5 a round stops after a 2 and, when the product
    of sigmoid(logit) falls below 0.5, after a 0 following a 1 or 0."""
    head = ResNetHead(hidden_size=3, depth=0)
    with torch.no_grad():
        head.out.weight.copy_(torch.tensor([[0.6, 1.5, -1.0]]))
        head.out.bias.zero_()
    return export_stub_head(tmp_path_factory.mktemp("heads") / "stop3.safetensors", head, 3, "stop", 0.5)


GOODPUT_COSTS = CostModel.by_length(draft=0.1, verify=lambda m: 1.0 + 0.1 * m, name="test")
"""Costs where the goodput stop drafts (a round of n candidates all kept adds n tokens for 0.2·n more seconds, at a
λ of target-only's 1/1.1 tokens a second) and stops where its estimate falls below about 0.2."""
GOODPUT_CALIBRATION = CalibratedConfidence(q=np.array([0.3, 0.9]), acceptance=np.array([0.05, 0.95]))
"""A calibration of the three-token draft's q(Y_i): its likelier candidates continue a round, its unlikely ones stop
it."""


def enumerate_policy(paths: Paths, name: str, kwargs: dict, sampling: str, eos: tuple[int, ...] = (),
                     prompt: list[int] = PROMPT3) -> dict:
    """{(tokens, accepted_lengths, discarded, draft forwards): probability} of a policy on the three-token stubs."""
    policy = build_policy(name, **kwargs)
    pair = markov_pair(DRAFT3, TARGET3, SAMPLINGS3[sampling], eos=eos)

    def run():
        r = policy.generate(pair, prompt, None)
        return tuple(r.tokens), tuple(r.stats.accepted_lengths), r.stats.discarded, r.stats.draft_calls

    return paths.distribution(run)


def marginal(dist: dict, index: int = 0) -> dict:
    out: dict = defaultdict(float)
    for key, prob in dist.items():
        out[key[index]] += prob
    return dict(out)


def target_output(sampling: str, eos: tuple[int, ...] = ()) -> dict:
    s = SAMPLINGS3[sampling]
    return target_sequences(hand_warp(TARGET3, s), PROMPT3[-1], s.max_new_tokens, eos)


@pytest.mark.parametrize("name, kwargs, sampling, eos", [
    ("target_only", {}, "t0.8-top2", ()), ("sd", {"k": 2}, "t0.8-top2", ()), ("sd", {"k": 2}, "t1.2-topp0.7", ()),
    ("sd", {"k": 3}, "t0.8-top2", ()), ("sd", {"k": 2}, "t0.8-top2", (0,)),
    ("specdecpp", {"max_k": 3}, "t1.2-topp0.7", ()), ("confidence", {"threshold": 0.6}, "t0.8-top2", ()),
    ("svip", {"h": 0.75}, "t0.8-top2", ()), ("hf_heuristic", {"k0": 2}, "t0.8-top2", ()),
    ("goodput", {"calibration": GOODPUT_CALIBRATION, "max_k": 3}, "t0.8-top2", ()),
    ("goodput", {"calibration": GOODPUT_CALIBRATION, "max_k": 3}, "t1.2-topp0.7", (0,)),
    ("goodput", {"head": "stop_head3", "max_k": 3}, "t0.8-top2", ()),
])
def test_exact_policies_output_the_targets_distribution(paths, stop_head3, name, kwargs, sampling, eos):
    """The exact distribution of the whole response (every token a round emits: kept candidates, the resample at a
    rejection, the bonus after a round that kept all) equals the target's, within float round-off."""
    if name == "specdecpp" or kwargs.get("head") == "stop_head3":
        kwargs = {**kwargs, "head": str(stop_head3)}
    if name == "goodput":
        kwargs = {**kwargs, "costs": GOODPUT_COSTS}
    dist = enumerate_policy(paths, name, kwargs, sampling, eos)
    assert tv(marginal(dist), target_output(sampling, eos)) < TOL
    if name != "target_only":  # not vacuous: rejections, and bonus tokens before the end (a round kept 2 and more)
        assert sum(p for d, p in marginal(dist, 2).items() if d) > 0.2
        assert sum(p for r, p in marginal(dist, 1).items() if any(k >= 2 for k in r[:-1])) > 0.05
    if name == "goodput":  # its stop both ends rounds early and lets them run: not one fixed K
        drafts = marginal(dist, 3)
        for k in range(1, kwargs["max_k"] + 1):
            assert tv(drafts, marginal(enumerate_policy(paths, "sd", {"k": k}, sampling, eos), 3)) > 0.03


LOOKUP_PROMPT = [1, 2, 0, 2, 1, 0]
"""Ends in PROMPT3's last token, so the target's chain starts where ``target_output``'s does; long enough that
prompt lookup (n = 1, m = 2) proposes from the first round."""
LOOKUP_PROMPT_WITH_END = [1, 2, 0, 1, 1, 2]
"""With 0 the end token: the first round proposes [0, 1], an end and a token past it."""


LOOKUP_STOP = {"calibration": LookupCalibration(length=[1.0, 3.0], keep=[0.5, 1.0], n=1),
               "costs": CostModel.by_length(draft=0.0, verify=[0.0, 1.0, 1.3, 1.9]), "lam": 1.0}
"""Prompt lookup's goodput stop on the enumeration's proposals: one candidate of a match of 1, two of a longer."""


def lookup_head_stop() -> dict:
    """Prompt lookup's goodput stop on a head that reads the target's state (the stubs' one-hot of the token the round
    starts after) and its top-1 probability: a chance that differs by the state, so the stop's cuts do too."""
    from decoding.lookup_stop import LookupHead
    from heads.resnet import ResNetHead

    module = ResNetHead(hidden_size=3, depth=0, scores=["log_match_length", "round_index", "target_top1"])
    with torch.no_grad():
        module.out.weight.copy_(torch.tensor([[3.0, -3.0, 0.5]]))
        module.out.bias.fill_(0.0)
        module.score_term.linear.weight.copy_(torch.tensor([[1.0, -0.5, 1.0]]))
    return {"costs": LOOKUP_STOP["costs"], "lam": LOOKUP_STOP["lam"],
            "head": LookupHead(module, hidden_size=3, n=1, m=2)}


@pytest.mark.parametrize("sampling, eos, stop", [("t0.8-top2", (), False), ("t1.2-topp0.7", (), False),
                                                 ("t0.8-top2", (0,), False), ("t0.8-top2", (), True),
                                                 ("t1.2-topp0.7", (), "head")])
@pytest.mark.parametrize("broken", [False, True])
def test_prompt_lookup_outputs_the_targets_distribution(paths, monkeypatch, sampling, eos, stop, broken):
    """Proposals copied from the prompt and the text so far, each a point mass q = 1[y], verified exactly: the
    response is the target's, with proposals rejected and rounds that keep two, and no draft forward; with an end
    token the prompt holds mid-way (as a chat template's end of turn), nothing is proposed past it; with the goodput
    stop cutting proposals short, still the target's. A decoder that keeps every proposal is rejected."""
    if broken:
        monkeypatch.setattr(Decoding, "verify", partialmethod(Decoding.verify, accept=lambda *args: True))
    prompt = LOOKUP_PROMPT_WITH_END if eos else LOOKUP_PROMPT
    settings = lookup_head_stop() if stop == "head" else LOOKUP_STOP if stop else {}
    family = "prompt_lookup_head" if stop == "head" else "prompt_lookup_goodput" if stop else "prompt_lookup"
    dist = enumerate_policy(paths, family,
                            {"n": 1, "m": 2, **settings}, sampling, eos, prompt=prompt)
    s = SAMPLINGS3[sampling]
    distance = tv(marginal(dist), target_sequences(hand_warp(TARGET3, s), prompt[-1], s.max_new_tokens, eos))
    if broken:
        assert distance > 0.01
        return
    assert distance < TOL
    assert sum(p for d, p in marginal(dist, 2).items() if d) > 0.1
    if stop:  # it cut the first proposal to one candidate, so its rounds are not the fixed length's
        fixed = enumerate_policy(paths, "prompt_lookup", {"n": 1, "m": 2}, sampling, eos, prompt=prompt)
        assert marginal(dist, 1) != marginal(fixed, 1)
    elif not eos:  # (with it, the proposals stop at the end token)
        assert sum(p for r, p in marginal(dist, 1).items() if any(k >= 2 for k in r)) > 0.05
    assert set(marginal(dist, 3)) == {0}


# Subtle decoders, each a few lines from the real one. The bonus mutants replace the last row of the target's
# verification call, which only the bonus token reads.
def last_target_row(replace: Callable[[Decoding, list[int], torch.Tensor], torch.Tensor]):
    target_dist = Decoding.target_dist

    def mutant(dec: Decoding, candidates=(), rows: int = 1) -> torch.Tensor:
        logps = target_dist(dec, candidates, rows)
        return logps if rows < 2 else torch.cat([logps[:-1], replace(dec, list(candidates), logps)[None]])

    return mutant


def shared_uniform(uniform):
    """One uniform for every two acceptance tests of a round (the sequence grows after each round)."""

    def mutant(dec: Decoding):
        at = len(dec.seq)
        n = dec.__dict__.get("_mutant_n", 0) if dec.__dict__.get("_mutant_at") == at else 0
        if n % 2 == 0:
            dec._mutant_u = uniform(dec)
        dec._mutant_at, dec._mutant_n = at, n + 1
        return dec._mutant_u

    return mutant


def scaled_accept(dec: Decoding, logq: torch.Tensor, logp: torch.Tensor, token: int) -> bool:
    return dec.uniform() < 0.95 * acceptance_probability(logq[token], logp[token]).item()


def argmax_residual(logq: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """The resample after a rejection is the most likely token of norm((p − q)+), not a draw from it."""
    residual = residual_distribution(logq, logp)
    return torch.full_like(residual, -math.inf).scatter(-1, residual.argmax(-1, keepdim=True), 0.0)


MUTANTS = {
    "bonus from q": ("target_dist", last_target_row(lambda dec, cands, logps: dec.draft_dist(cands))),
    "bonus one position early": ("target_dist", last_target_row(lambda dec, cands, logps: logps[-2])),
    "bonus from unwarped logits": ("target_dist",
                                   last_target_row(lambda dec, cands, logps: dec.target.last_logits.log_softmax(-1))),
    "one uniform for two positions": ("uniform", shared_uniform),
    "acceptance x 0.95": ("verify", partialmethod(Decoding.verify, accept=scaled_accept)),
    "argmax resample": ("verify", partialmethod(Decoding.verify, on_reject=argmax_residual)),
}


@pytest.mark.parametrize("name, kwargs", [
    ("sd", {"k": 2}), ("goodput", {"calibration": GOODPUT_CALIBRATION, "costs": GOODPUT_COSTS, "max_k": 3}),
])
@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_exact_test_rejects_subtle_decoders(paths, monkeypatch, mutant, name, kwargs):
    """Each mutant's output is at a TV of 0.035 (acceptance x 0.95) to 0.5 from the target's, 10^4 times and more
    ``TOL``: the exact test above rejects every one, every time, under SD and under the goodput stop."""
    attr, patch = MUTANTS[mutant]
    monkeypatch.setattr(Decoding, attr, patch(Decoding.uniform) if attr == "uniform" else patch)
    distance = tv(marginal(enumerate_policy(paths, name, kwargs, "t0.8-top2")), target_output("t0.8-top2"))
    assert distance > 0.01, f"{mutant}: TV {distance:.3g}"


def exact_run(name: str, kwargs: dict, sampling: str, stop_head, n: int = 800):
    """``n`` generations of an exact policy on the hand-written pair, and the p-value of their first 3 tokens."""
    if name == "specdecpp":
        kwargs = {**kwargs, "head": str(stop_head)}
    results = run_many(build_policy(name, **kwargs), markov_pair(DRAFT, TARGET, SAMPLINGS[sampling]), PROMPT, n)
    return results, joint_pvalue(results, chain_joint(hand_warp(TARGET, SAMPLINGS[sampling]), PROMPT[-1], 3))


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_sd_with_real_draws_matches_the_target(sampling):
    """The enumerations above replace the draws; this runs the real ones (``core.sampling``) through SD (χ² of the
    first three tokens; with K = 2 the first round's bonus is the third)."""
    results, p = exact_run("sd", {"k": 2}, sampling, stop_head=None)
    assert p > P_CRIT, f"χ² p = {p:.2g} for the first three tokens"
    assert all(len(r.tokens) == 4 for r in results)
    assert sum(r.stats.discarded for r in results) > len(results) / 2


class RateVerifier:
    """Accepts an acceptable token (q ≤ p) with probability η_TP and an unacceptable one with probability η_FP;
    ``draw(generator)`` gives its uniform."""

    def __init__(self, draft_table: torch.Tensor, target_table: torch.Tensor, eta_tp: float, eta_fp: float,
                 draw: Callable[[torch.Generator], float] = lambda g: sampling.uniform(g).item()):
        self.q, self.p = draft_table.softmax(-1), target_table.softmax(-1)
        self.eta_tp, self.eta_fp, self.draw = eta_tp, eta_fp, draw

    def __call__(self, hidden, ids, generator, scores) -> bool:
        prev, token = ids[-2], ids[-1]
        rate = self.eta_tp if self.q[prev, token] <= self.p[prev, token] else self.eta_fp
        return self.draw(generator) < rate


# increments of the shift tables: (p − q)+ = (0.3, 0.2, 0, 0), a residual of two tokens, TV(p, q) = 0.5
P_INC, Q_INC = [0.5, 0.3, 0.2, 0.0], [0.2, 0.1, 0.3, 0.4]


def sprinter_distribution(paths: Paths, eta_tp: float, eta_fp: float) -> tuple[dict, dict]:
    """SPRINTER with a ``RateVerifier`` on shift tables, enumerated: {(tokens, first token kept): probability},
    and the response distribution Theorem 1 gives, the chain of (1 − η_FP)·p + η_FP·q."""
    vocab, prompt = 4, [2]
    draft_table, target_table = shift_table(vocab, Q_INC), shift_table(vocab, P_INC)
    s = Sampling(temperature=1.0, max_new_tokens=3)
    mixture = (1 - eta_fp) * hand_warp(target_table, s) + eta_fp * hand_warp(draft_table, s)
    policy = Sprinter(verifier=RateVerifier(draft_table, target_table, eta_tp, eta_fp, lambda g: paths.uniform()))
    pair = markov_pair(draft_table, target_table, s)

    def run():
        r = policy.generate(pair, prompt, None)
        return tuple(r.tokens), r.stats.accepted_lengths[0] >= 1

    return paths.distribution(run), target_sequences(mixture, prompt[-1], s.max_new_tokens)


@pytest.mark.parametrize("eta_tp, eta_fp", [(0.7, 0.4), (0.9, 0.0), (0.5, 0.8)])
def test_sprinter_theorems_1_and_7(paths, eta_tp, eta_fp):
    dist, theorem_1 = sprinter_distribution(paths, eta_tp, eta_fp)
    assert tv(marginal(dist), theorem_1) < TOL
    p, q = torch.tensor(P_INC, dtype=torch.float64), torch.tensor(Q_INC, dtype=torch.float64)
    beta = 1 - (1 - eta_fp) * tv_distance(p.log(), q.log()).item()  # Theorem 7, for the first draft token
    assert marginal(dist, 1)[True] == pytest.approx(beta, abs=TOL)


def test_sprinter_theorem_1_test_rejects_an_argmax_resampler(paths, monkeypatch):
    monkeypatch.setattr(rules, "residual_distribution", argmax_residual)
    dist, theorem_1 = sprinter_distribution(paths, 0.7, 0.4)
    assert tv(marginal(dist), theorem_1) > 0.01


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
        assert got == (token if kept else sampling.sample_token(residual_distribution(q, p)))

"""The label math, in one place: imported by labeling, training and the decoder.

Convention throughout the code: ``draft`` and ``target`` name the two models. Where a paper letter is needed,
q is the draft's distribution and p the target's (SpecDec++'s letters; SPRINTER swaps them).

- acceptance probability of a draft token y (SpecDec++ training target):  min(1, p(y) / q(y))
- SPRINTER ratio of a draft token y:                                        q(y) / p(y)
- SPRINTER binary label at threshold λ:                                    1[q(y) / p(y) <= λ]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CATEGORIES = ("original", "draft", "target", "interleaved")
"""SPRINTER §3.2 prefix categories, in equal shares of prompts: what the context in front of a candidate is.

- ``original``: a prefix of the prompt's own text;
- ``draft``: prompt + a completion the draft sampled on its own (autoregressively);
- ``target``: prompt + the target's own response X<i (also SpecDec++'s clean prefix);
- ``interleaved``: prompt + tokens of both models (SpecDec++ token mixing of X with the draft's tokens).

In every category the candidate is drawn from q at that prefix and both models score it at that same prefix.
"""

TOKEN_MIXED = "token_mixed"
"""Rows for the SpecDec++ stop head (§4.4): the token-mixed response Z, each draft token Z_i read in context Z<i,
labeled on the clean target prefix X<i. Every prompt with a target response (``target``, ``interleaved``) has them."""

ROW_CATEGORIES = (*CATEGORIES, TOKEN_MIXED)
"""Every value of the label shards' ``category`` column."""

ROWS_FOR_LABEL = {"sprinter": CATEGORIES, "soft": ("target", TOKEN_MIXED)}
"""Which rows each head trains on: the SPRINTER verifier on the four §3.2 prefix categories (label and feature at
the same prefix); the SpecDec++ head (soft label min(1, p/q)) on rows labeled on the clean prefix X<i: the
token-mixed ones and the ``target`` ones, whose input (prompt, X<i, Y_i) is §4.4's ideal one."""


@dataclass(frozen=True)
class FeaturePosition:
    column: str
    """The label column that holds the hidden state."""
    description: str
    """What the hidden state is (recorded in exported heads)."""


FEATURE_POSITIONS = {
    "own": FeaturePosition(
        "hidden", "draft last-layer hidden state (after the final norm) at the token's own position, after reading it"),
    "prev": FeaturePosition(
        "hidden_prev",
        "draft last-layer hidden state (after the final norm) at the previous position: the one that produced q"),
}
"""Which of the draft's hidden states a head reads for a token Y_i: at its own position (SpecDec++ Eq. 4.1) or at
the previous one, which produced q for it (SPRINTER §3.2)."""


def confidence_top1(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The top-1 probability of a model's confidence distribution, softmax(logits / T) with T the sampling
    temperature (1 under greedy decoding, where the sampling distribution is a point mass), top-k and top-p aside:
    what a stop rule reads of the target's own certainty (prompt lookup's, ``data_gen/SCHEMA.md``)."""
    return (logits.float() / (temperature or 1.0)).softmax(-1).max(-1).values


def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities of the sampling distribution: temperature, then top-k, then top-p (nucleus).

    Tokens cut by top-k/top-p get log-probability -inf. ``temperature == 0`` means greedy: a one-hot.
    """
    logits = logits.float()
    if temperature == 0:
        out = torch.full_like(logits, -math.inf)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 0.0)
    if temperature != 1.0:  # (x / 1.0 is x: the division would only cost a vocabulary-wide pass)
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass strictly before it already reaches top_p (the top token always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits.log_softmax(-1)


def sample_from_logprobs(logprobs: torch.Tensor, uniforms: torch.Tensor | float) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row of ``logprobs`` (..., V) from ``uniforms`` (...) in [0, 1), or one
    Python float for a single row (the same float64 product, with no host-to-device copy when the log-probs are on
    a GPU).

    Taking the uniforms from per-prompt generators makes a prompt's samples independent of which other
    prompts share its batch (the padding-invariance guarantee).
    """
    cdf = logprobs.double().exp().cumsum(-1)
    u = (uniforms.double().unsqueeze(-1) if torch.is_tensor(uniforms) else float(uniforms)) * cdf[..., -1:]
    idx = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    return idx.clamp_(max=logprobs.shape[-1] - 1)


def entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last axis (0·log 0 = 0)."""
    return _entropy(logprobs.exp(), logprobs)


def tv_distance(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Total-variation distance ½·Σ|a − b|; 1 − TV is the expected acceptance rate of speculative sampling."""
    return _tv(logp_a.exp(), logp_b.exp())


def js_divergence(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence in nats: ½·KL(a‖m) + ½·KL(b‖m), m = (a + b)/2."""
    return _js(logp_a.exp(), logp_a, logp_b.exp(), logp_b)


def _entropy(p: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    return -(torch.where(p > 0, p * logp, torch.zeros_like(p))).sum(-1)


def _tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a - b).abs().sum(-1)


def _js(a: torch.Tensor, logp_a: torch.Tensor, b: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    log_m = torch.log((a + b) / 2)

    def kl_to_m(p: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        return torch.where(p > 0, p * (logp - log_m), torch.zeros_like(p)).sum(-1)

    return (0.5 * kl_to_m(a, logp_a) + 0.5 * kl_to_m(b, logp_b)).clamp_(min=0)


def distribution_stats(logp_draft_dist: torch.Tensor, logp_target_dist: torch.Tensor) -> dict:
    """The numbers of ``token_stats`` that depend on the two distributions (..., V) only, not on the token: each
    distribution is exponentiated once for all of them (the vocabulary-wide passes are most of the labeling's
    scoring time), with the same arithmetic as ``entropy``, ``tv_distance`` and ``js_divergence``."""
    q, p = logp_draft_dist.exp(), logp_target_dist.exp()
    return {
        "entropy_draft": _entropy(q, logp_draft_dist),
        "entropy_target": _entropy(p, logp_target_dist),
        "tv": _tv(q, p),
        "js": _js(q, logp_draft_dist, p, logp_target_dist),
        "greedy_match": logp_draft_dist.argmax(-1) == logp_target_dist.argmax(-1),
    }


def acceptance_probability(logp_draft: torch.Tensor, logp_target: torch.Tensor) -> torch.Tensor:
    """min(1, p(y)/q(y)) from the two models' log-probabilities of the draft token y, (...) each: speculative
    sampling's chance of keeping y. Like every accept/resample function of the project, draft first, then target."""
    return torch.exp((logp_target - logp_draft).clamp(max=0))


def draft_target_ratio(logp_draft: torch.Tensor, logp_target: torch.Tensor) -> torch.Tensor:
    """SPRINTER's q(y)/p(y) (inf where the target gives y no mass)."""
    return torch.exp(logp_draft - logp_target)


def sprinter_label(ratio: torch.Tensor, lam: float) -> torch.Tensor:
    """SPRINTER's binary label 1[q/p <= λ] (1 = accept the draft token)."""
    return ratio <= lam


def top2_margin(logprobs: torch.Tensor) -> torch.Tensor:
    """A distribution's largest probability minus its second largest, (...) from log-probs (..., V)."""
    top = logprobs.topk(2, dim=-1).values.exp()
    return top[..., 0] - top[..., 1]


def token_stats(logp_draft_dist: torch.Tensor, logp_target_dist: torch.Tensor, token: torch.Tensor,
                dists: dict | None = None) -> dict:
    """Every per-token number the label shards store, for ``token`` (...) under the two distributions (..., V);
    ``dists``: their ``distribution_stats``, when already computed for another token at the same positions."""
    lp_d = logp_draft_dist.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    lp_t = logp_target_dist.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    return {
        "logp_draft": lp_d,
        "logp_target": lp_t,
        "acceptance": acceptance_probability(lp_d, lp_t),
        "ratio": draft_target_ratio(lp_d, lp_t),
        **(distribution_stats(logp_draft_dist, logp_target_dist) if dists is None else dists),
    }


def mixing_mask(uniforms: torch.Tensor, target_share: float) -> torch.Tensor:
    """SpecDec++ token mixing: True where Z_i is taken from the target (share r), False where from the draft;
    one uniform in [0, 1) per token."""
    return uniforms < target_share


def assign_categories(n_prompts: int, categories: tuple[str, ...], generator: torch.Generator) -> list[str]:
    """Equal shares of prompts per category (round robin over a seeded permutation)."""
    order = torch.randperm(n_prompts, generator=generator).tolist()
    out = [""] * n_prompts
    for rank, idx in enumerate(order):
        out[idx] = categories[rank % len(categories)]
    return out


def residual_distribution(logp_draft: torch.Tensor, logp_target: torch.Tensor) -> torch.Tensor:
    """Log-probabilities (..., V) of norm((p − q)+), where speculative sampling resamples after a rejection, from the
    draft's q and the target's p (..., V).

    Where p ≤ q everywhere (no residual mass, which exact arithmetic never rejects into) it falls back to p.
    """
    p, q = logp_target.double().exp(), logp_draft.double().exp()
    residual = (p - q).clamp_(min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(torch.float64).tiny), p)
    return residual.log().to(logp_target.dtype)

"""Draft-side scores a head may read beside the hidden state.

The hidden state after reading a token Y_i does not carry q(Y_i), the probability the draft gave that token (it
was computed one position earlier). Probes on the real pair put a hidden-state-only head 0.15 AUROC below the
plain confidence rule for exactly this reason (``pipeline/DESIGN.md``), so a head can also take a few scalars
the draft has anyway when it samples Y_i. Each is defined here once, from the two quantities both the labeling
stage (columns ``logp_draft``, ``entropy_draft``) and the decoder (the draft's distribution at Y_i's position,
``softmax(logits / temperature)`` before top-k/top-p) know:

    p_draft        q(Y_i)
    logp_draft     log q(Y_i), clamped at −20
    entropy_draft  H(q) in nats

A head records the names it reads (``scores`` in its init args, so in the exported file) and adds w · scores,
in that order, to the logit it computes from the hidden state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from core.errors import SettingError
from core.label_math import entropy

LOGP_FLOOR = -20.0

SCORES = {
    "p_draft": "q(Y_i), the draft's probability of its own token",
    "logp_draft": f"log q(Y_i), natural log, clamped at {LOGP_FLOOR:g}",
    "entropy_draft": "H(q) at Y_i's position, nats",
}


def check_scores(names: Sequence[str]) -> list[str]:
    """The names as a list; an unknown or repeated name raises ``ValueError`` listing the known ones."""
    names = list(names)
    unknown = [n for n in names if n not in SCORES]
    if unknown:
        raise SettingError(f"unknown draft scores {unknown}; known: {', '.join(SCORES)}")
    if len(set(names)) != len(names):
        raise SettingError(f"draft scores repeat a name: {names}")
    return names


def draft_scores(names: Sequence[str], logp_draft: torch.Tensor, entropy_draft: torch.Tensor) -> torch.Tensor:
    """(..., len(names)) float32 features from log q(Y_i) and H(q), both shaped (...)."""
    logp = logp_draft.float().clamp(min=LOGP_FLOOR)
    columns = {"p_draft": lambda: logp.exp(), "logp_draft": lambda: logp, "entropy_draft": lambda: entropy_draft.float()}
    if not names:
        return logp.new_zeros((*logp.shape, 0))
    return torch.stack([columns[n]() for n in names], dim=-1)


def scores_from_logprobs(names: Sequence[str], logprobs: torch.Tensor, token: int) -> torch.Tensor:
    """The features of one token from the draft's log-probs (V,) at its position: what a runtime computes."""
    logprobs = logprobs.float()
    return draft_scores(names, logprobs[token], entropy(logprobs))


class ScoreTerm(nn.Module):
    """The scores' part of a head's logit: w · scores, one weight per named score (no bias: the head has one).

    It is its own module, so training can give it its own learning rate and no weight decay (``HeadModule``):
    on the real pair the hidden state adds nothing beyond q(Y_i), and a hidden part free to fit would bury it.
    """

    def __init__(self, names: Sequence[str]):
        super().__init__()
        self.names = check_scores(names)
        self.linear = nn.Linear(len(self.names), 1, bias=False)
        nn.init.zeros_(self.linear.weight)

    def forward(self, scores: torch.Tensor | None) -> torch.Tensor:
        """(..., k) scores → (...) logit contribution."""
        if scores is None or scores.shape[-1] != len(self.names):
            got = None if scores is None else tuple(scores.shape)
            raise ValueError(f"this head reads the draft scores {self.names} beside the hidden state, got {got}")
        return self.linear(scores.float()).squeeze(-1)


def score_term(names: Sequence[str]) -> ScoreTerm | None:
    """A ``ScoreTerm`` for these names, or None when there are none (the head's state dict then has no such key)."""
    names = check_scores(names)
    return ScoreTerm(names) if names else None


def add_scores(logits: torch.Tensor, term: ScoreTerm | None, scores: torch.Tensor | None) -> torch.Tensor:
    """``logits`` plus the score term (unchanged without one)."""
    return logits if term is None else logits + term(scores).to(logits.dtype)

"""Draft-side scores a head may read beside the hidden state.

The hidden state after reading a token Y_i does not carry q(Y_i), the probability the draft gave that token (it
was computed one position earlier; ``pipeline/DESIGN.md`` has what that costs a head), so a head can also take a
few scalars the draft has anyway when it samples Y_i. Each is defined here once, from the two quantities both the labeling
stage (columns ``logp_draft``, ``entropy_draft``) and the decoder (the draft's distribution at Y_i's position,
q as the candidate was drawn from it, top-k and top-p applied; softmax of the raw logits under greedy decoding) know:

    p_draft        q(Y_i)
    logp_draft     log q(Y_i), clamped at −20
    entropy_draft  H(q) in nats

Beyond the draft's confidence, a head may read the scalars of the other feature families a decoder holds for free
when it decides (``data_gen/SCHEMA.md``, ``pipeline/DESIGN.md``): the draft's top-2 margin, the candidate's index
in its round and in the response, the target's entropy and top-1 probability at its last call, and, for prompt
lookup's stop (``pipeline.lookup_data``), the candidate's match length. Each score names
the label column it is read from (``SCORES``); a runtime that does not compute a column cannot feed a head that
reads it (``score_columns`` says which).

A head records the names it reads (``scores`` in its init args, so in the exported file) and adds w · scores,
in that order, to the logit it computes from the hidden state. Vector features (``VECTORS``: more draft layers,
the target's stale hidden state) are appended to the hidden state instead (``hidden_input``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from core.columns import FEATURE_COLUMNS
from core.errors import SettingError
from core.label_math import entropy, top2_margin

LOGP_FLOOR = -20.0

SCORES = {
    "p_draft": "q(Y_i), the draft's probability of its own token",
    "logp_draft": f"log q(Y_i), natural log, clamped at {LOGP_FLOOR:g}",
    "entropy_draft": "H(q) at Y_i's position, nats",
    "margin_draft": "q's top-1 minus its top-2 probability at Y_i's position",
    "round_index": "the candidate's index k ≥ 1 in its drafting round (0: no earlier target call)",
    "response_index": "the candidate's index in the response (negative inside the prompt)",
    "stale_entropy_target": "H(p) where the target's last call sampled, k positions back, nats",
    "stale_top1_target": "the target's top-1 probability there",
    "log_match_length": "log of a prompt-lookup candidate's match length (decoding.rules.match_length, plus its "
                        "place in the round)",
    "target_top1": "the top-1 probability of softmax(logits / T) of the target's state a prompt-lookup round starts "
                   "from (T 1 under greedy decoding)",
}
SCORE_COLUMNS = {"p_draft": "read_logp_draft", "logp_draft": "read_logp_draft", "entropy_draft": "read_entropy_draft",
                 "margin_draft": "read_margin_draft", "round_index": "round_index",
                 "response_index": "response_index", "stale_entropy_target": "stale_entropy_target",
                 "stale_top1_target": "stale_top1_target", "log_match_length": "match_length",
                 "target_top1": "target_top1"}
"""The label column each score is read from."""

LOOKUP_SCORES = ("log_match_length", "target_top1")
"""Scores of prompt lookup's stop rows alone (``pipeline.lookup_data``): no draft token has them."""
DRAFT_SCORES = tuple(n for n in SCORES if n not in LOOKUP_SCORES)
"""The scores a draft's head may read."""
SHARD_SCORE_COLUMNS = tuple(dict.fromkeys(SCORE_COLUMNS[n] for n in DRAFT_SCORES))
"""The score columns the label shards hold; a prompt-lookup row's match length is read along its response."""

VECTOR_COLUMNS = {
    "layers": {"own": "hidden_layers", "prev": "hidden_layers_prev"},
    "stale_target": {"own": "stale_hidden_target", "prev": "stale_hidden_target"},  # one state per round
}
"""Each vector feature's label column at each feature position."""

VECTORS = {name: FEATURE_COLUMNS[columns["own"]] for name, columns in VECTOR_COLUMNS.items()}
"""Vector features and what they hold (the label columns' descriptions, ``core.columns``)."""


def vector_column(name: str, position: str) -> str:
    """The label column of a vector feature at a feature position (``own`` or ``prev``)."""
    if name not in VECTORS:
        raise SettingError(f"unknown vector feature {name!r}; known: {', '.join(VECTORS)}")
    return VECTOR_COLUMNS[name][position]


def score_columns(names: Sequence[str]) -> list[str]:
    """The label columns these scores read, each once."""
    return list(dict.fromkeys(SCORE_COLUMNS[n] for n in check_scores(names)))


def check_scores(names: Sequence[str]) -> list[str]:
    """The names as a list; an unknown or repeated name raises ``ValueError`` listing the known ones."""
    names = list(names)
    unknown = [n for n in names if n not in SCORES]
    if unknown:
        raise SettingError(f"unknown draft scores {unknown}; known: {', '.join(SCORES)}")
    if len(set(names)) != len(names):
        raise SettingError(f"draft scores repeat a name: {names}")
    return names


def scores_from_columns(names: Sequence[str], columns: dict[str, torch.Tensor]) -> torch.Tensor:
    """(..., len(names)) float32 features from label columns (``SCORE_COLUMNS``), each shaped (...)."""
    missing = [c for c in score_columns(names) if c not in columns]
    if missing:
        raise SettingError(f"the scores {list(names)} read the columns {missing}, which were not given")

    def value(name: str) -> torch.Tensor:
        x = columns[SCORE_COLUMNS[name]].float()
        if name == "p_draft":
            return x.clamp(min=LOGP_FLOOR).exp()
        if name == "log_match_length":
            return x.clamp(min=1).log()
        return x.clamp(min=LOGP_FLOOR) if name == "logp_draft" else x

    if not names:
        return next(iter(columns.values())).float().new_zeros((*next(iter(columns.values())).shape, 0))
    return torch.stack([value(n) for n in names], dim=-1)


def draft_scores(names: Sequence[str], logp_draft: torch.Tensor, entropy_draft: torch.Tensor) -> torch.Tensor:
    """(..., len(names)) float32 features from log q(Y_i) and H(q), both shaped (...): the confidence scores."""
    return scores_from_columns(names, {"read_logp_draft": logp_draft, "read_entropy_draft": entropy_draft})


FROM_LOGPROBS = ("p_draft", "logp_draft", "entropy_draft", "margin_draft")
"""The scores a runtime computes from the draft's log-probs at the token's position alone (``scores_from_logprobs``)."""


def scores_from_logprobs(names: Sequence[str], logprobs: torch.Tensor, token: int,
                         context: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The features of one token from the draft's log-probs (V,) at its position: what a runtime computes; the
    other columns (``SCORE_COLUMNS``) come from ``context`` (a decoder's, ``Decoding.head_context``)."""
    logprobs = logprobs.float()
    columns = {**{k: v.to(logprobs.device) for k, v in (context or {}).items()},
               "read_logp_draft": logprobs[token], "read_entropy_draft": entropy(logprobs)}
    if "margin_draft" in names:
        columns["read_margin_draft"] = top2_margin(logprobs)
    return scores_from_columns(names, columns)


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


class ExtraProjection(nn.Module):
    """Keeps the hidden state (the first ``hidden_size`` inputs) and projects the vector features after it to
    ``rank`` dimensions: (..., d + extra) → (..., d + rank)."""

    def __init__(self, hidden_size: int, extra_size: int, rank: int):
        super().__init__()
        if rank < 1:
            raise SettingError(f"extra_rank must be positive, got {rank}")
        self.hidden_size = hidden_size
        self.linear = nn.Linear(extra_size, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden_size + self.linear.in_features:
            raise ValueError(f"this head reads {self.hidden_size} hidden + {self.linear.in_features} vector-feature "
                             f"inputs, got {x.shape[-1]}")
        return torch.cat([x[..., : self.hidden_size], self.linear(x[..., self.hidden_size :])], dim=-1)


def extra_projection(hidden_size: int, extra_size: int, rank: int) -> ExtraProjection | None:
    """An ``ExtraProjection``, or None without vector features (the head's state dict then has no such key)."""
    if extra_size < 0:
        raise SettingError(f"extra_size must be ≥ 0, got {extra_size}")
    return ExtraProjection(hidden_size, extra_size, rank) if extra_size else None

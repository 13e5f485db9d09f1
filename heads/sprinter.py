"""SPRINTER verifier: one linear layer on the draft's last hidden state (d + 1 parameters)."""

from __future__ import annotations

import torch
from torch import nn

from core.errors import SettingError
from heads.features import add_scores, score_term
from heads.registry import register


@register("sprinter")
class SprinterHead(nn.Module):
    """Logit of "accept the draft token" from its hidden state; the verifier is sigmoid(logit) ≥ τ."""

    def __init__(self, hidden_size: int, scores: list[str] = (), extra_size: int = 0):
        """
        Args:
            hidden_size: size d of the draft's last hidden state.
            scores: draft scores whose weighted sum is added to the logit (``heads.features``); none: the paper's
                verifier.
            extra_size: size of the vector features appended to the hidden state (``heads.features.VECTORS``);
                linked from the data. The layer is linear in all of them.
        """
        super().__init__()
        if hidden_size < 1 or extra_size < 0:
            raise SettingError(f"hidden_size must be positive and extra_size ≥ 0, got {hidden_size}, {extra_size}")
        self.linear = nn.Linear(hidden_size + extra_size, 1)
        self.score_term = score_term(scores)
        self.scores = self.score_term.names if self.score_term else []
        self.config = {"hidden_size": hidden_size, "scores": self.scores,
                       **({"extra_size": extra_size} if extra_size else {})}

    def forward(self, hidden: torch.Tensor, scores: torch.Tensor | None = None) -> torch.Tensor:
        """(..., d [+ extra_size]) hidden states [and (..., k) draft scores] → (...) logits."""
        return add_scores(self.linear(hidden).squeeze(-1), self.score_term, scores)

    @torch.no_grad()
    def predict_proba(self, hidden: torch.Tensor, scores: torch.Tensor | None = None) -> torch.Tensor:
        return torch.sigmoid(self.forward(hidden, scores))

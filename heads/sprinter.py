"""SPRINTER verifier: one linear layer on the draft's last hidden state (d + 1 parameters)."""

from __future__ import annotations

import torch
from torch import nn

from heads.registry import register


@register("sprinter")
class SprinterHead(nn.Module):
    """Logit of "accept the draft token" from its hidden state; the verifier is sigmoid(logit) ≥ τ."""

    def __init__(self, hidden_size: int):
        """
        Args:
            hidden_size: size d of the draft's last hidden state.
        """
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be positive, got {hidden_size}")
        self.config = {"hidden_size": hidden_size}
        self.linear = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) hidden states → (...) logits."""
        return self.linear(hidden).squeeze(-1)

    @torch.no_grad()
    def predict_proba(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.forward(hidden))

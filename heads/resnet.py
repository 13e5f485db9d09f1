"""SpecDec++ acceptance head: D residual blocks x + SiLU(Linear(x)), then Linear(d, 1)."""

from __future__ import annotations

import torch
from torch import nn

from core.errors import SettingError
from heads.features import add_scores, extra_projection, score_term
from heads.registry import register


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b); W and b start at zero, so a fresh block is the identity (as Medusa's ResBlock)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


@register("resnet")
class ResNetHead(nn.Module):
    """(D+1)-layer ResNet with SiLU (SpecDec++ §4.3); every block has its own weights."""

    def __init__(self, hidden_size: int, depth: int = 3, scores: list[str] = (), extra_size: int = 0,
                 extra_rank: int = 16):
        """
        Args:
            hidden_size: size d of the draft's last hidden state.
            depth: number D of residual blocks, 0 to 4 (D = 0 is a linear head).
            scores: draft scores whose weighted sum is added to the logit (``heads.features``); none: the paper's
                head.
            extra_size: size of the vector features appended to the hidden state (``heads.features.VECTORS``);
                linked from the data.
            extra_rank: the vector features are projected to this many dimensions before the blocks (they are
                wide: a block over d + extra_size would hold millions of weights for a few thousand rows).
        """
        super().__init__()
        if hidden_size < 1:
            raise SettingError(f"hidden_size must be positive, got {hidden_size}")
        if not 0 <= depth <= 4:
            raise SettingError(f"depth must be in 0..4, got {depth}")
        self.score_term = score_term(scores)
        self.scores = self.score_term.names if self.score_term else []
        self.extra = extra_projection(hidden_size, extra_size, extra_rank)
        self.config = {"hidden_size": hidden_size, "depth": depth, "scores": self.scores,
                       **({"extra_size": extra_size, "extra_rank": extra_rank} if extra_size else {})}
        width = hidden_size + (extra_rank if extra_size else 0)
        # one block object per layer (never [block] * depth, which would share the weights)
        self.blocks = nn.ModuleList([ResidualBlock(width) for _ in range(depth)])
        self.out = nn.Linear(width, 1)

    def forward(self, hidden: torch.Tensor, scores: torch.Tensor | None = None) -> torch.Tensor:
        """(..., d [+ extra_size]) hidden states [and (..., k) draft scores] → (...) logits of acceptance."""
        x = hidden if self.extra is None else self.extra(hidden)
        for block in self.blocks:
            x = block(x)
        return add_scores(self.out(x).squeeze(-1), self.score_term, scores)

    @torch.no_grad()
    def predict_proba(self, hidden: torch.Tensor, scores: torch.Tensor | None = None) -> torch.Tensor:
        return torch.sigmoid(self.forward(hidden, scores))

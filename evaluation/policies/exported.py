"""An exported head (``heads.export``) as the decoder uses it: loaded from its file alone, like a runtime."""

from __future__ import annotations

from pathlib import Path

import torch

from heads.export import HeadFileError, feature_position, load_head
from heads.features import scores_from_logprobs


class ExportedHead:
    """The head module and its metadata; ``logit(hidden, …)`` scores one draft token on the hidden state's device."""

    def __init__(self, path: str | Path, role: str):
        self.path = Path(path)
        self.module, self.meta = load_head(self.path)
        if self.meta["role"] != role:
            raise HeadFileError(f"{self.path}: a {self.meta['role']!r} head, this policy needs a {role!r} head")
        self._device: torch.device | None = None
        self._scores = list(getattr(self.module, "scores", []))  # read once: ``logit`` runs per draft token
        self.position = feature_position(self.meta)
        """Which draft hidden state the head reads for a token: ``own`` (after reading it) or ``prev`` (the one
        that produced q for it)."""

    @property
    def threshold(self) -> float:
        """The threshold chosen at export (τ of a verifier, h of a stop head)."""
        return float(self.meta["threshold"]["value"])

    def check(self, draft) -> None:
        """Refuse a draft whose hidden size differs from the head's."""
        config = getattr(draft, "config", None)
        size = getattr(config, "hidden_size", None)
        if size is not None and int(size) != self.meta["hidden_size"]:
            raise HeadFileError(f"{self.path}: head expects hidden size {self.meta['hidden_size']}, the draft has {size}")

    @property
    def scores(self) -> list[str]:
        """The draft scores the head reads beside the hidden state (``heads.features``); often none."""
        return list(self._scores)

    @torch.no_grad()
    def logit(self, hidden: torch.Tensor, logprobs: torch.Tensor | None = None, token: int | None = None) -> float:
        """The head's logit for one token: its hidden state (d,) and, when the head reads draft scores, the
        draft's confidence log-probs (V,) at the token's position and the token id."""
        if self._device != hidden.device:
            self.module.to(hidden.device)
            self._device = hidden.device
        if not self._scores:
            return self.module(hidden.float()).item()
        if logprobs is None or token is None:
            raise ValueError(f"{self.path}: this head reads the draft scores {self._scores}; pass logprobs and token")
        return self.module(hidden.float(), scores_from_logprobs(self._scores, logprobs, token).to(hidden.device)).item()

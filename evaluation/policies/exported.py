"""An exported head (``heads.export``) as the decoder uses it: loaded from its file alone, like a runtime."""

from __future__ import annotations

from pathlib import Path

import torch

from heads.export import HeadFileError, load_head


class ExportedHead:
    """The head module and its metadata; ``logit(hidden)`` scores one draft hidden state on its device."""

    def __init__(self, path: str | Path, role: str):
        self.path = Path(path)
        self.module, self.meta = load_head(self.path)
        if self.meta["role"] != role:
            raise HeadFileError(f"{self.path}: a {self.meta['role']!r} head, this policy needs a {role!r} head")
        self._device: torch.device | None = None

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

    @torch.no_grad()
    def logit(self, hidden: torch.Tensor) -> float:
        if self._device != hidden.device:
            self.module.to(hidden.device)
            self._device = hidden.device
        return self.module(hidden.float()).item()

"""Sampling settings, and the per-prompt seed that makes a prompt's random draws independent of its batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.errors import SettingError


@dataclass
class Sampling:
    """How the target samples its responses; the same warping defines both models' label distributions."""

    temperature: float = 1.0
    """Softmax temperature (0 = greedy)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    max_new_tokens: int = 128
    """Response length cap; also the number of rows taken from an ``original`` prompt."""

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.max_new_tokens < 1:
            raise SettingError(f"bad sampling settings: {self} (need temperature >= 0, 0 < top_p <= 1, top_k >= 0, "
                               "max_new_tokens >= 1)")


def prompt_seed(seed: int, prompt_id: int) -> int:
    """The seed of one prompt's random draws, from the run's ``seed`` and the prompt's id."""
    return (seed * 1_000_003 + prompt_id) % (2**63)


def prompt_generator(seed: int, prompt_id: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded with ``prompt_seed(seed, prompt_id)``."""
    return torch.Generator(device=device).manual_seed(prompt_seed(seed, prompt_id))

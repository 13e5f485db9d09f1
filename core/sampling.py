"""Sampling settings, the per-prompt seed that makes a prompt's random draws independent of its batch, and the one
way a decoder draws: float64 uniforms.

Every token a decoder or runtime draws, and every accept/reject test, goes through ``uniform`` and
``sample_token``. A float32 uniform has 24 random bits: inverse-CDF sampling from it can only land on the tokens
whose CDF interval holds a multiple of 2^-24, so over a 151,936-token vocabulary a long tail of tokens below that
mass is partly unreachable and the rest over-drawn (computed exactly: 1.5e-3 total variation per token on Zipf
distributions of exponent 1 to 1.2). A float64 uniform has 53 bits: 2e-12 on the same distributions, the float64
round-off of the CDF. The labeler draws its uniforms in float64 too (``data_gen/labeler.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.errors import SettingError
from core.label_math import sample_from_logprobs


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
        # written so that a NaN fails each test (every comparison with NaN is false)
        if not (0 <= self.temperature < math.inf) or not 0 < self.top_p <= 1 or self.top_k < 0 \
                or self.max_new_tokens < 1:
            raise SettingError(f"bad sampling settings: {self} (need temperature >= 0, 0 < top_p <= 1, top_k >= 0, "
                               "max_new_tokens >= 1)")


def prompt_seed(seed: int, prompt_id: int) -> int:
    """The seed of one prompt's random draws, from the run's ``seed`` and the prompt's id."""
    return (seed * 1_000_003 + prompt_id) % (2**63)


def prompt_generator(seed: int, prompt_id: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded with ``prompt_seed(seed, prompt_id)``."""
    return torch.Generator(device=device).manual_seed(prompt_seed(seed, prompt_id))


def uniform(generator: torch.Generator | None = None, shape: tuple[int, ...] = ()) -> torch.Tensor:
    """Float64 uniforms in [0, 1) (one, a 0-d tensor, by default) on ``generator``'s device (None: torch's default
    CPU generator, the one ``torch.manual_seed`` seeds, as transformers' own sampling uses)."""
    device = generator.device if generator is not None else "cpu"
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float64)


def sample_token(logprobs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token drawn from ``logprobs`` (V,) by inverse-CDF sampling on a float64 ``uniform``; a uniform drawn on
    another device than the log-probs' crosses as a Python float (a kernel argument), not as a copy that would
    wait for the device."""
    u = uniform(generator)
    return int(sample_from_logprobs(logprobs, u if u.device == logprobs.device else u.item()))

"""One model alone: the target (the quality and latency reference) and the draft (the speed bound)."""

from __future__ import annotations

import torch

from decoding.policies.registry import register
from decoding.state import DecodeResult, Decoding, ModelPair


@register("target_only", reference=True)
class TargetOnly:
    """Autoregressive sampling from the target: one target call per token (target_calls == new_tokens)."""

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult:
        dec = Decoding(pair, prompt_ids, generator, reads=("target",))
        while not dec.done:
            dec.extend([dec.sample(dec.target_dist()[-1])])
        return dec.result()


@register("draft_only", exact=False, reference=True)
class DraftOnly:
    """Autoregressive sampling from the draft: one draft call per token, no target call."""

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult:
        dec = Decoding(pair, prompt_ids, generator, reads=("draft",))
        while not dec.done:
            dec.extend([dec.sample(dec.draft_dist())])
        return dec.result()

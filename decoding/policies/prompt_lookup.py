"""Prompt lookup: speculative decoding with no draft model (llama.cpp's ``--spec-type ngram-simple``).

A round's candidates are the continuation of the last n tokens' most recent earlier occurrence in the prompt and the
text so far (``decoding.rules.ngram_simple_draft``, llama.cpp's ``common_ngram_simple_draft`` rule, with its size n
of the n-gram looked up and m of the continuation copied), never past an end token; where nothing matches, the
target decodes one token alone. The target verifies the candidates in one forward, exactly: a proposal is a point
mass q = 1[y], so speculative sampling keeps y with probability min(1, p(y)/1) = p(y) and at a rejection draws from
norm((p − q)+), p without y (greedy: y is kept iff it is the target's argmax). The draft model is never read, so a
round costs the verification alone. As llama.cpp's rule, not its driver: its server drafts only after the target's
first token and trims a draft to ``--spec-draft-n-max``; here the first round may draft from the prompt alone, and
``m`` is the one cap.
"""

from __future__ import annotations

import torch

from core.models import vocab_size
from decoding.policies.registry import register
from decoding.rules import prompt_lookup_proposal
from decoding.state import DecodeResult, Decoding, ModelPair


@register("prompt_lookup", setting="m", lemma31=False)  # no draft forward: no count of unused ones
class PromptLookup:
    """Prompt lookup drafting (``decoding.rules.prompt_lookup_proposal``) verified exactly by the target; ``n``: the
    n-gram looked up, ``m``: the longest continuation proposed (llama.cpp's defaults,
    ``--spec-ngram-simple-size-n 12`` and ``--spec-ngram-simple-size-m 48``)."""

    def __init__(self, n: int = 12, m: int = 48):
        if n < 1 or m < 1:
            raise ValueError(f"n and m must be at least 1, got n={n}, m={m}")
        self.n, self.m = int(n), int(m)

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult:
        dec = Decoding(pair, prompt_ids, generator, reads=("target",))
        point = torch.full((vocab_size(pair.target),), float("-inf"), device=pair.device)
        while not dec.done:
            candidates = prompt_lookup_proposal(dec.seq, self.n, self.m, dec.remaining - 1, dec.eos)
            if not candidates:
                dec.extend([dec.sample(dec.target_dist()[-1])])
                continue
            logqs = [point.index_fill(0, torch.tensor([y], device=pair.device), 0.0) for y in candidates]
            dec.verify(candidates, logqs)
        return dec.result()

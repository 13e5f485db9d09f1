"""Fuzzy Speculative Decoding (Holsman et al., §4): approximate, training-free.

A candidate is kept while the divergence between the target's and the draft's distributions at its position is
below T (JS divergence, the paper's best); at the first position where it is not, the token is drawn from the
target's own distribution p there (not the residual). A round of k candidates ends as in SD: with that target
token, or a bonus token from p when all k are kept.

T is in bits. The paper names no log base, but its grid T = 0.1, 0.2, …, 1.0 (Appendix D) spans the range of JS
in bits, [0, 1]; in nats JS ≤ ln 2 ≈ 0.69 and T = 0.7 … 1.0 would all accept everything. (The authors' released
code computes a natural-log divergence; bits is this project's reading of the paper's grid.)
``label_math.js_divergence`` is in nats, like every divergence in the label shards, so the policy compares it with
T·ln 2.
"""

from __future__ import annotations

import torch

from core.label_math import js_divergence
from decoding import rules
from decoding.policies.registry import register
from decoding.state import DecodeResult, Decoding, ModelPair


@register("fuzzy", exact=False, setting="T")
class FuzzySD:
    def __init__(self, T: float, k: int = 5):
        """
        Args:
            T: JS divergence threshold in bits (0 … 1): keep a candidate while JS(p, q) < T.
            k: candidates drafted per round.
        """
        if T < 0 or k < 1:
            raise ValueError(f"need T >= 0 and k >= 1, got {T}, {k}")
        self.T, self.k = T, k

    def accept(self, dec: Decoding, logq: torch.Tensor, logp: torch.Tensor, token: int) -> bool:
        return rules.divergence_keeps(js_divergence(logp, logq).item(), self.T)

    @staticmethod
    def target_sample(logq: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        return logp

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult:
        dec = Decoding(pair, prompt_ids, generator)
        while not dec.done:
            candidates, logqs = dec.draft_round(self.k)
            dec.verify(candidates, logqs, accept=self.accept, on_reject=self.target_sample)
        return dec.result()

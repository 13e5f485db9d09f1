"""SpecDec++ (Huang et al., §4, Eq. 4.1, Algorithm 1): a trained acceptance head decides when a round stops
drafting; exact.

After each candidate Y_i the draft reads it (its hidden state e_i at Y_i's own position; the same forward gives
q for Y_{i+1}), and the round stops when the predicted probability that some candidate is rejected,
1 − ∏_{i ≤ k} sigmoid(f(e_i)), exceeds h, or at max_k candidates. As in Algorithm 1, Y_{k+1} is then drawn from
the q that forward gave and submitted too, so the stop costs no draft forward. A head trained on the previous
position's state (``prev``) decides on Y_k from the forward Y_k was sampled from, like the training-free rules,
and needs no forward of its own. Verification is exact speculative sampling.
"""

from __future__ import annotations

from pathlib import Path

import torch

from decoding import rules
from decoding.policies.registry import register
from decoding.policies.speculative import SpeculativePolicy
from decoding.state import HEAD_FEATURES, Decoding, DraftStep, ModelPair
from heads.exported import ExportedHead


class HeadStop:
    """SpecDec++'s stop rule (``decoding.rules.HeadStop``) on the decoder's candidates: the head's logit for each."""

    def __init__(self, head: ExportedHead, h: float):
        self.head, self.h = head, h
        self.reads_candidate = head.position == "own"
        self.rule = rules.HeadStop(h)

    def reset(self) -> None:
        self.rule.reset()

    def __call__(self, dec: Decoding, candidates: list[int], step: DraftStep, confidence: torch.Tensor) -> bool:
        hidden = dec.draft_feature(candidates) if self.reads_candidate else step.hidden
        context = None
        if self.head.needs_context:
            layers = (dec.draft.last_taps[-1] if self.reads_candidate else step.layers) if dec.draft.layers else None
            context = dec.head_context(candidates, layers)
        logit = self.head.logit(hidden, confidence, candidates[-1], context)
        return self.rule(rules.log_accept(logit))


@register("specdecpp", setting="h", head_role="stop", simulable=True)
class SpecDecPP(SpeculativePolicy):
    def __init__(self, head: str | Path | ExportedHead, h: float | None = None, max_k: int = 20):
        """
        Args:
            head: an exported stop head file, or one already loaded.
            h: the stop threshold; None takes the one chosen at export.
            max_k: most candidates per round.
        """
        self.head = head if isinstance(head, ExportedHead) else ExportedHead(head, role="stop",
                                                                            computes=HEAD_FEATURES)
        self.h = self.head.threshold if h is None else float(h)
        if not 0 <= self.h <= 1 or max_k < 1:
            raise ValueError(f"need 0 <= h <= 1 and max_k >= 1, got {self.h}, {max_k}")
        self.max_k = max_k

    def round_length(self) -> int:
        return self.max_k

    def draft_layers(self) -> tuple[int, ...]:
        return self.head.draft_layers

    def stop_rule(self, pair: ModelPair) -> HeadStop:
        self.head.check(pair.draft, pair.target)
        return HeadStop(self.head, self.h)

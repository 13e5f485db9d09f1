"""Training-free stop rules on the draft's own distribution; verification is exact speculative sampling."""

from __future__ import annotations

import numpy as np

from core.label_math import entropy
from decoding import rules
from decoding.policies.registry import register
from decoding.replay import round_lengths
from decoding.traces import Trace
from decoding.policies.speculative import SpeculativePolicy
from decoding.state import Decoding, DraftStep, ModelPair


class StatelessStop:
    """A stop rule that looks at the current candidate only: nothing to reset between rounds.

    It reads the draft distribution the candidate was sampled from, which costs no forward: the round ends with
    that candidate (no draft forward is left unused, as with SpecDec++'s Algorithm 1)."""

    reads_candidate = False

    def reset(self) -> None:
        pass


class ConfidenceStop(StatelessStop):
    """``decoding.rules.confidence_stops`` on the candidate's own draft probability (``confidence``)."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def __call__(self, dec: Decoding, candidates: list[int], step: DraftStep) -> bool:
        confidence = dec.draft_confidence(step)
        return bool(rules.confidence_stops(confidence[candidates[-1]].exp().item(), self.threshold))


class EntropyStop(StatelessStop):
    """SVIP's ``decoding.rules.entropy_stops`` on the entropy of the candidate's draft ``confidence``."""

    def __init__(self, h: float):
        self.h = h

    def __call__(self, dec: Decoding, candidates: list[int], step: DraftStep) -> bool:
        return bool(rules.entropy_stops(entropy(dec.draft_confidence(step)).item(), self.h))


@register("confidence", setting="threshold", simulable=True)
class Confidence(SpeculativePolicy):
    """Stop drafting on low draft confidence (as transformers' ``assistant_confidence_threshold``), ≤ max_k."""

    def __init__(self, threshold: float = 0.4, max_k: int = 20):
        if not 0 <= threshold <= 1 or max_k < 1:
            raise ValueError(f"need 0 <= threshold <= 1 and max_k >= 1, got {threshold}, {max_k}")
        self.threshold, self.max_k = threshold, max_k

    def round_length(self) -> int:
        return self.max_k

    def stop_rule(self, pair: ModelPair) -> ConfidenceStop:
        return ConfidenceStop(self.threshold)

    @staticmethod
    def replay_lengths(trace: Trace, max_k: int, threshold: float) -> np.ndarray:
        """The rule's round length at every position of an acceptance trace (``decoding.simulate``)."""
        return round_lengths(rules.confidence_stops(np.exp(trace.logp_draft), threshold), False, max_k)


@register("svip", setting="h", simulable=True)
class SVIP(SpeculativePolicy):
    """SVIP's entropy stop rule (Zhang et al.), at most max_k candidates per round."""

    def __init__(self, h: float, max_k: int = 20):
        if h < 0 or max_k < 1:
            raise ValueError(f"need h >= 0 and max_k >= 1, got {h}, {max_k}")
        self.h, self.max_k = h, max_k

    def round_length(self) -> int:
        return self.max_k

    def stop_rule(self, pair: ModelPair) -> EntropyStop:
        return EntropyStop(self.h)

    @staticmethod
    def replay_lengths(trace: Trace, max_k: int, h: float) -> np.ndarray:
        """The rule's round length at every position of an acceptance trace (``decoding.simulate``)."""
        return round_lengths(rules.entropy_stops(trace.entropy_draft, h), False, max_k)

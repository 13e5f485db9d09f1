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

import numpy as np

from decoding import rules
from decoding.policies.registry import register
from decoding.policies.speculative import SpeculativePolicy
from decoding.replay import head_round_lengths
from decoding.state import HEAD_FEATURES, Decoding, DraftStep, ModelPair
from decoding.traces import Trace
from heads.exported import ExportedHead


def load_stop_head(head: str | Path | ExportedHead) -> ExportedHead:
    """An exported stop head file, loaded for the decoder's features; one already loaded as it is."""
    return head if isinstance(head, ExportedHead) else ExportedHead(head, role="stop", computes=HEAD_FEATURES)


class HeadStop:
    """A stop rule of ``decoding.rules`` that reads a head's acceptance estimate (SpecDec++'s ``rules.HeadStop``,
    the goodput ``rules.GoodputStop``) on the decoder's candidates: the head's logit for each."""

    def __init__(self, head: ExportedHead, rule: rules.HeadStop | rules.GoodputStop):
        self.head, self.rule = head, rule
        self.reads_candidate = head.position == "own"

    def reset(self) -> None:
        self.rule.reset()

    def __call__(self, dec: Decoding, candidates: list[int], step: DraftStep) -> bool:
        confidence = dec.draft_confidence(step)
        hidden = dec.draft_feature(candidates) if self.reads_candidate else step.hidden
        context = None
        if self.head.needs_context:
            layers = (dec.draft.last_taps[-1] if self.reads_candidate else step.layers) if dec.draft.layers else None
            context = dec.head_context(candidates, layers)
        logit = self.head.logit(hidden, confidence, candidates[-1], context)
        return self.rule(rules.log_accept(logit))


class HeadStopPolicy(SpeculativePolicy):
    """Drafting stopped by a rule on a stop head's estimates (``HeadStop``), at most ``max_k`` candidates a round;
    a subclass gives the rule (``head_rule``) and sets ``head`` and ``max_k``."""

    head: ExportedHead
    max_k: int

    def head_rule(self) -> rules.HeadStop | rules.GoodputStop:
        raise NotImplementedError

    def round_length(self) -> int:
        return self.max_k

    def draft_layers(self) -> tuple[int, ...]:
        return self.head.draft_layers

    def stop_rule(self, pair: ModelPair) -> HeadStop:
        self.head.check(pair.draft, pair.target)
        self.stop = HeadStop(self.head, self.head_rule())
        return self.stop


@register("specdecpp", setting="h", head_role="stop", simulable=True)
class SpecDecPP(HeadStopPolicy):
    def __init__(self, head: str | Path | ExportedHead, h: float | None = None, max_k: int = 20):
        """
        Args:
            head: an exported stop head file, or one already loaded.
            h: the stop threshold; None takes the one chosen at export.
            max_k: most candidates per round.
        """
        self.head = load_stop_head(head)
        self.h = self.head.threshold if h is None else float(h)
        if not 0 <= self.h <= 1 or max_k < 1:
            raise ValueError(f"need 0 <= h <= 1 and max_k >= 1, got {self.h}, {max_k}")
        self.max_k = max_k

    def head_rule(self) -> rules.HeadStop:
        return rules.HeadStop(self.h)

    @staticmethod
    def replay_lengths(trace: Trace, max_k: int, head: ExportedHead, log_accept: np.ndarray,
                       h: float | None = None) -> np.ndarray:
        """The rule's round length at every position of an acceptance trace (``decoding.simulate``) from the head's
        log â there; h None: the head file's own."""
        h = head.threshold if h is None else h
        return head_round_lengths(log_accept, h, head.position == "own", max_k)

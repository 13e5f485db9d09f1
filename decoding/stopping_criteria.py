"""The decisions transformers' assisted ``generate()`` runs on the draft after each token it samples
(``decoding.runtimes.hf``, whose exported folder carries this module): a stopping criterion on an exported head's logit (``HeadRule``) or on the draft's
calibrated confidence (``CalibratedRule``), fed by a hook on the draft's LM head (``DraftTap``).
"""

from __future__ import annotations

import torch
from transformers.generation import StoppingCriteria

from core.label_math import warp_logits
from decoding.estimates import CalibratedConfidence
from decoding.rules import GoodputStop, HeadStop, log_accept, verifier_accepts
from heads.exported import ExportedHead


class DraftTap:
    """A forward hook on the draft's LM head: the input (the last layer's hidden state after the final norm) and the
    raw logits of the last position of the draft's latest forward."""

    def __init__(self, draft):
        self.hidden: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None
        self._handle = draft.get_output_embeddings().register_forward_hook(self._read)

    def _read(self, module, args, output) -> None:
        self.hidden, self.logits = args[0][0, -1], output[0, -1]

    def remove(self) -> None:
        self._handle.remove()


class DraftRule(StoppingCriteria):
    """A decision after each token the draft's ``generate()`` samples, as a stopping criterion: ``HeadRule`` on an
    exported head's logit, ``CalibratedRule`` on the draft's calibrated confidence.

    The draft scores a rule reads are those of a token under q as the labels hold it, so as a calibration and a
    head's draft scores were fitted on: the tap's raw logits of the forward that drew the token, warped at
    ``generate()``'s temperature, top-k and top-p (``warp``, ``core.label_math.warp_logits``; under greedy decoding
    none: temperature 1), as the decoder's ``draft_confidence`` reads them. Not transformers' processed scores: its
    assisted decoding hands the draft's ``generate()`` the target's warpers, and that ``generate()`` adds its own
    from the same config (transformers 5.24), so the draft's candidates are drawn with temperature, top-k and top-p
    applied twice (at T²); verification reads those scores, so it stays exact, but they are not the labels' q."""

    def __init__(self, tap: DraftTap, warp: dict, stop: HeadStop | GoodputStop):
        self.tap, self.warp, self.stop = tap, warp, stop
        self.reset()

    def reset(self) -> None:
        """Start a round."""
        self.stop.reset()
        self.rejected = False

    def confidence(self, logits: torch.Tensor) -> torch.Tensor:
        return warp_logits(logits, **self.warp)

    def decides(self, token: int) -> bool:
        """Stop after the draft sampled ``token`` (the tap holding the forward that drew it)?"""
        raise NotImplementedError

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        stop = self.decides(int(input_ids[0, -1]))
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class HeadRule(DraftRule):
    """The head's decision.

    When it is called, the tap holds the forward that produced q for the newest token y_j: its hidden state is y_j's
    ``prev`` feature and y_{j-1}'s ``own`` one (SpecDec++'s e_{j-1}, read at y_{j-1}'s position). So a head on
    ``prev`` decides on y_j; a head on ``own`` decides on y_{j-1}, after y_j was drawn from the same forward.

    - role ``stop`` (SpecDec++ Eq. 4.1): stop when 1 − ∏ sigmoid(f) over the round's decided candidates exceeds h
      (or when ``stop``, another rule on those sigmoids such as the goodput stop, says so); an ``own`` head thereby
      submits y_j, drawn from the forward that read y_{j-1} (Algorithm 1), a ``prev`` head stops with y_j;
    - role ``verifier`` (SPRINTER): stop at the first token with sigmoid(f) < τ (``rejected`` is then set).
    """

    def __init__(self, head: ExportedHead, threshold: float | None, tap: DraftTap, warp: dict,
                 stop: HeadStop | GoodputStop | None = None):
        self.head, self.threshold = head, threshold
        super().__init__(tap, warp, HeadStop(threshold) if stop is None else stop)

    def reset(self) -> None:
        super().reset()
        self._previous: tuple[int, torch.Tensor] | None = None  # (y_{j-1}, the logits it was drawn from)

    def _logit(self, token: int, logits: torch.Tensor) -> float:
        return self.head.logit(self.tap.hidden, self.confidence(logits) if self.head.scores else None, token)

    def decides(self, token: int) -> bool:
        newest = (token, self.tap.logits)
        decided = newest if self.head.position == "prev" else self._previous
        self._previous = newest
        if decided is None:
            return False
        logit = self._logit(*decided)
        if self.head.role == "stop":
            return self.stop(log_accept(logit))
        self.rejected = not bool(verifier_accepts(logit, self.threshold))
        return self.rejected


class CalibratedRule(DraftRule):
    """The goodput stop on the newest token's calibrated confidence: log â = ``calibration.log_accept`` of its own
    draft log-probability, read from the forward that drew it (the decoder's ``CalibratedStop``)."""

    def __init__(self, calibration: CalibratedConfidence, tap: DraftTap, warp: dict, stop: GoodputStop):
        self.calibration = calibration
        super().__init__(tap, warp, stop)

    def decides(self, token: int) -> bool:
        return self.stop(float(self.calibration.log_accept(self.confidence(self.tap.logits)[token].item())))

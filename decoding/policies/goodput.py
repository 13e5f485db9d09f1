"""The goodput stop (``decoding/DESIGN.md``, "A stop rule for length-dependent verification cost"): a round stops
when no longer round up to ``max_k`` gains more expected tokens than λ × its extra seconds under the device's
per-length verification costs (``decoding.rules.GoodputStop``). Exact: only the round's length differs from SD.

Its acceptance estimates come from one of two sources (``decoding.estimates``): a stop head's sigmoid, drafting as
SpecDec++ does (``decoding.policies.specdecpp``), or, with no head, the draft's own confidence q(Y_i) calibrated on
label rows (``CalibratedConfidence``), which the stop reads from the distribution the candidate was drawn from, as
the confidence stop does: no forward of its own. Both sources are one family, so one run name, one setting (λ) and
one replay serve both; its registry entry keeps ``head_role="stop"`` for the head source, and the simulator and the
evaluation tell the two apart by whether the settings name a ``head``.

λ is the long-run tokens per second the decoding achieves: given (``lam``, e.g. ``decoding.replay.goodput_rate``
over traces), or followed online, the tokens this generation produced over the seconds it has taken so far.

Where no round beats λ even with every candidate accepted, the policy drafts nothing: each round is one target step,
and it decodes as target-only does. What the stop assumes (certainty-equivalent estimates, one λ, calibrated
independent estimates, costs timed at one cache length) is ``GoodputStop``'s docstring and ``decoding/DESIGN.md``,
"Assumptions and departures from the paper".
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from decoding.costs import CostModel, read_timing
from decoding.estimates import CalibratedConfidence, EstimateFileError, load_calibration
from decoding.policies.registry import register
from decoding.policies.specdecpp import HeadStop, HeadStopPolicy, load_stop_head
from decoding.replay import goodput_round_lengths, goodput_rule
from decoding.rules import GoodputStop
from decoding.state import Decoding, DraftStep, ModelPair
from decoding.traces import Trace
from heads.exported import ExportedHead


class CalibratedStop:
    """The goodput rule on the calibrated confidence of each candidate: log â = ``calibration.log_accept`` of the
    candidate's own draft log-probability in ``confidence`` (as ``training_free.ConfidenceStop`` reads it), which
    the forward that drew the candidate already gave."""

    reads_candidate = False

    def __init__(self, calibration: CalibratedConfidence, rule: GoodputStop):
        self.calibration, self.rule = calibration, rule

    def reset(self) -> None:
        self.rule.reset()

    def __call__(self, dec: Decoding, candidates: list[int], step: DraftStep) -> bool:
        confidence = dec.draft_confidence(step)
        return self.rule(float(self.calibration.log_accept(confidence[candidates[-1]].item())))


SAMPLING_KEYS = ("temperature", "top_k", "top_p")


def check_calibration(calibration: CalibratedConfidence, pair: ModelPair, read: bool = True) -> None:
    """Refuse, in one line, a calibration fitted on rows of another draft (or backend) than ``pair``'s, or, where its
    knots are ``read``, at another sampling: they map the draft's q to acceptance as those rows measured it (under
    greedy decoding acceptance is an argmax match, not min(1, p/q); top-k and top-p change q). A policy that never
    drafts reads no knot, so it decodes at any sampling. A file that records neither (made before they were
    recorded) is used as it is, with a warning."""
    import warnings

    from core.identity import check_same_model, model_identity

    fitted = calibration.fitted
    if not fitted:
        warnings.warn("the calibration records neither the draft nor the sampling it was fitted at; fit it again "
                      "with `make calibrate` to have them checked", stacklevel=3)
        return
    check_same_model(fitted["draft"], model_identity(pair.draft),
                     f"the calibration was fitted on rows of draft {fitted['draft'].get('name')!r}, this decoding "
                     "drafts with another")
    mine = {k: fitted["sampling"].get(k) for k in SAMPLING_KEYS}
    theirs = {k: getattr(pair.sampling, k) for k in SAMPLING_KEYS}
    if read and mine != theirs:
        raise EstimateFileError(f"the calibration was fitted on rows labeled at {mine}, this decoding samples at "
                                f"{theirs}: fit one on labels of this sampling (`make calibrate`)")


@register("goodput", setting="lam", head_role="stop", simulable=True)
class Goodput(HeadStopPolicy):
    def __init__(self, head: str | Path | ExportedHead | None = None,
                 calibration: str | Path | CalibratedConfidence | None = None, timing: str | Path | None = None,
                 costs: CostModel | None = None, lam: float | None = None, online: bool = False,
                 future: float | None = None, max_k: int = 20):
        """
        Args:
            head: an exported stop head file, or one already loaded: its sigmoid is each candidate's acceptance
                estimate; or
            calibration: a saved ``CalibratedConfidence`` (``make calibrate``), or one already loaded: the draft's
                calibrated confidence q(Y_i) is the estimate. Exactly one of the two.
            timing: a ``make bench-timing`` JSON of the device (its ``draft`` and ``target`` entries); or
            costs: the costs themselves (seconds of a draft step, of a verification of m tokens).
            lam: λ in tokens per second; None: target-only's rate 1 / verify(1), where ``goodput_rate`` starts.
            online: after each round, λ = the tokens generated so far / the seconds taken so far (wall clock).
            future: the acceptance predicted for candidates not yet drafted; None: the last candidate's estimate.
            max_k: most candidates per round (the rule's horizon).
        """
        if (head is None) == (calibration is None):
            raise ValueError("give exactly one acceptance estimate: head (an exported stop head) or calibration "
                             "(a calibrated confidence file)")
        if (timing is None) == (costs is None):
            raise ValueError("give exactly one of timing (a bench_timing file) and costs")
        self.head = None if head is None else load_stop_head(head)
        self.calibration = None if calibration is None else load_calibration(calibration)
        self.costs = read_timing(timing) if costs is None else costs
        self.lam = self.costs.target_only_rate() if lam is None else float(lam)
        if not self.lam > 0 or max_k < 1 or future is not None and not 0 < future <= 1:
            raise ValueError(f"need lam > 0, max_k >= 1 and 0 < future <= 1, got {self.lam}, {max_k}, {future}")
        self.online, self.future, self.max_k = online, future, max_k
        self.drafts = goodput_rule(self.costs, self.lam, max_k).drafting_pays

    def round_length(self) -> int:
        """``max_k``, or 0 (a target-only round) where no round can beat λ (``GoodputStop.drafting_pays``)."""
        return self.max_k if self.drafts else 0

    def reads(self) -> tuple[str, ...]:
        """Where no round can pay, the draft is never run: not even to read the prompt."""
        return ("draft", "target") if self.drafts else ("target",)

    def head_rule(self) -> GoodputStop:
        reads_candidate = self.head is not None and self.head.position == "own"
        return goodput_rule(self.costs, self.lam, self.max_k, self.future, reads_candidate)

    def draft_layers(self) -> tuple[int, ...]:
        return () if self.head is None else super().draft_layers()

    def stop_rule(self, pair: ModelPair) -> HeadStop | CalibratedStop:
        if self.head is not None:
            return super().stop_rule(pair)
        check_calibration(self.calibration, pair, read=self.drafts)
        self.stop = CalibratedStop(self.calibration, self.head_rule())
        return self.stop

    def start(self) -> None:
        self.tokens, self.started = 0, time.perf_counter()

    def observe(self, kept: int, drafted: int) -> None:
        if self.online:  # a running ratio over this generation: the round's kept candidates and its target token
            self.tokens += kept + 1
            self.stop.rule.rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)

    @staticmethod
    def replay_lengths(trace: Trace, max_k: int, head: ExportedHead | None = None, log_accept: np.ndarray | None = None,
                       calibration: str | Path | CalibratedConfidence | None = None, costs: CostModel | None = None,
                       lam: float | None = None, future: float | None = None, timing: str | None = None,
                       online: bool = False) -> np.ndarray:
        """The rule's round length at every position of an acceptance trace (``decoding.simulate``) from the head's
        log â there, or from the calibration of the trace's ``logp_draft``, at a fixed λ (None: 1 / verify(1), as
        decoding starts; an online λ enters a replay as the rate it settles at, ``decoding.replay.goodput_rate``)."""
        costs = read_timing(timing) if costs is None else costs  # as an eval config names them
        lam = costs.target_only_rate() if lam is None else lam
        if head is None:
            log_accept = load_calibration(calibration).log_accept(trace.logp_draft)
        return goodput_round_lengths(log_accept, costs, lam, head is not None and head.position == "own", max_k,
                                     future)

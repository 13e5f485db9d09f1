"""Prompt lookup: speculative decoding with no draft model (llama.cpp's ``--spec-type ngram-simple``).

A round's candidates are the continuation of the last n tokens' most recent earlier occurrence in the prompt and the
text so far (``decoding.rules.ngram_simple_match``, llama.cpp's ``common_ngram_simple_draft`` rule, with its size n
of the n-gram looked up and m of the continuation copied), never past an end token; where nothing matches, the
target decodes one token alone. The target verifies the candidates in one forward, exactly: a proposal is a point
mass q = 1[y], so speculative sampling keeps y with probability min(1, p(y)/1) = p(y) and at a rejection draws from
norm((p − q)+), p without y (greedy: y is kept iff it is the target's argmax). The draft model is never read, so a
round costs the verification alone. As llama.cpp's rule, not its driver: its server drafts only after the target's
first token and trims a draft to ``--spec-draft-n-max``; here the first round may draft from the prompt alone, and
``m`` is the one cap.

``prompt_lookup_goodput`` submits only as many of a proposal's candidates as the goodput stop finds worth their
verification (``decoding.lookup_stop``); the candidates it submits are verified as above, so it stays exact.
"""

from __future__ import annotations

from pathlib import Path

import torch

from core.label_math import confidence_top1
from core.models import vocab_size
from decoding.costs import CostModel, read_timing
from decoding.lookup_stop import LookupCalibration, LookupGoodput, LookupHead, RoundState
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
        self.length: LookupGoodput | None = None
        self.reads_state = False
        """Whether the stop reads the target's state at a round's start (``round_state``, a softmax over the
        vocabulary a round): only a head does."""

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult:
        dec = Decoding(pair, prompt_ids, generator, reads=("target",))
        point = torch.full((vocab_size(pair.target),), float("-inf"), device=pair.device)
        while not dec.done:
            source, candidates = prompt_lookup_proposal(dec.seq, self.n, self.m, dec.remaining - 1, dec.eos)
            if candidates and self.length is not None:
                state = round_state(dec) if self.reads_state else None
                candidates = candidates[:self.length(dec.seq, source, candidates, state)]
            if not candidates:
                token = dec.sample(dec.target_dist()[-1])
                dec.target_sampled(-1)  # the state the next round starts from
                dec.extend([token])
                continue
            logqs = [point.index_fill(0, torch.tensor([y], device=pair.device), 0.0) for y in candidates]
            dec.verify(candidates, logqs)
        return dec.result()


def round_state(dec: Decoding) -> RoundState | None:
    """The target's state that produced the last token of ``dec.seq`` and its confidence's top-1 probability
    (``core.label_math.confidence_top1``, as the labels store it), where the target sampled that token (none before
    its first call)."""
    if dec.stale is None or dec.stale[0] != len(dec.seq) - 1:
        return None
    return RoundState(dec.stale[1], float(confidence_top1(dec.stale_logits, dec.pair.sampling.temperature)))


@register("prompt_lookup_goodput", setting="lam", lemma31=False)
class PromptLookupGoodput(PromptLookup):
    """Prompt lookup whose rounds submit only as many of a proposal's candidates as the goodput stop finds worth
    their verification (``decoding.lookup_stop``): the keep chances from ``calibration`` (``specheads calibrate
    --prompt_lookup``, a file or one loaded) or from a ``head`` (an exported prompt-lookup stop head, ``make
    train``, reading the target's state where the round starts), the device's costs (``timing``, a
    ``bench-timing`` JSON, or ``costs``) and λ (``lam``, tokens per second; None: the estimate's own, found over its
    responses, else target-only's 1 / verify(1))."""

    def __init__(self, n: int = 12, m: int = 48, calibration: str | Path | LookupCalibration | None = None,
                 timing: str | Path | None = None, costs: CostModel | None = None, lam: float | None = None,
                 head: str | Path | LookupHead | None = None):
        super().__init__(n, m)
        if (calibration is None) == (head is None):
            raise ValueError("prompt lookup's goodput stop reads one estimate: a calibration (`specheads calibrate "
                             "--prompt_lookup`) or a head (`make train`)")
        if (timing is None) == (costs is None):
            raise ValueError("the goodput stop prices rounds: give exactly one of timing (a bench-timing file) and "
                             "costs")
        if head is not None:
            estimate = head if isinstance(head, LookupHead) else LookupHead.load(head)
        elif isinstance(calibration, LookupCalibration):
            estimate = calibration
        else:
            estimate = LookupCalibration.load(calibration)
        estimate.check_n(self.n)
        costs = read_timing(timing) if costs is None else costs
        self.length = estimate.stop(costs, lam, self.m)
        self.estimate, self.checked = estimate, None
        self.reads_state = isinstance(estimate, LookupHead)

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult:
        if self.checked is not pair.target:  # an estimate of another target's responses predicts nothing here
            self.estimate.check_target_model(pair.target)
            self.checked = pair.target
        return super().generate(pair, prompt_ids, generator)


@register("prompt_lookup_head", setting="lam", lemma31=False)
class PromptLookupHead(PromptLookupGoodput):
    """Prompt lookup's goodput stop on a learned estimate: ``head``, an exported prompt-lookup stop head
    (``specheads train --configs configs/train/lookup_stop_d0.yaml`` on labels of ``target_states: true``) that reads
    the target's state where each round starts; a family of its own, so that an eval runs it beside the calibrated
    stop. λ: ``lam``, else the one chosen at the head's export, else target-only's rate."""

    def __init__(self, n: int = 12, m: int = 48, head: str | Path | LookupHead | None = None,
                 timing: str | Path | None = None, costs: CostModel | None = None, lam: float | None = None):
        if head is None:
            raise ValueError("prompt_lookup_head reads a head: an exported prompt-lookup stop head (`specheads train "
                             "--configs configs/train/lookup_stop_d0.yaml`)")
        super().__init__(n, m, timing=timing, costs=costs, lam=lam, head=head)

"""Exact speculative sampling with a candidate length chosen per round (Leviathan et al. 2023; Chen et al. 2023).

Every policy here is exact: only how many candidates a round drafts differs, and the target's verification
(``Decoding.verify``: keep y with probability min(1, p(y)/q(y)), resample from norm((p − q)+) at the first
rejection, a bonus token from p when all are kept) makes the output distributed as the target's.
"""

from __future__ import annotations

import numpy as np
import torch

from decoding.policies.registry import register
from decoding.replay import sd_round_lengths
from decoding.state import DecodeResult, Decoding, ModelPair, StopRule
from decoding.traces import Trace


class SpeculativePolicy:
    """Rounds of ``draft_round`` + exact ``verify``; subclasses choose the round's length and stop rule."""

    def round_length(self) -> int:
        raise NotImplementedError

    def stop_rule(self, pair: ModelPair) -> StopRule | None:
        return None

    def observe(self, kept: int, drafted: int) -> None:
        """Called after each round (adaptive schedules update here)."""

    def start(self) -> None:
        """Called at the start of a generation (adaptive schedules reset here)."""

    def draft_layers(self) -> tuple[int, ...]:
        """Draft layers whose outputs the stop rule reads (the decoding then taps them)."""
        return ()

    def reads(self) -> tuple[str, ...]:
        """The models a generation runs (``Decoding``'s ``reads``: an untimed prefill reads the prompt into those)."""
        return ("draft", "target")

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult:
        stop = self.stop_rule(pair)
        dec = Decoding(pair, prompt_ids, generator, self.draft_layers(), self.reads())
        self.start()  # after the decoding is set up (a static cache and its graphs made), as its own clock starts
        while not dec.done:
            candidates, logqs = dec.draft_round(self.round_length(), stop)
            kept = dec.verify(candidates, logqs)
            self.observe(kept, len(candidates))
        return dec.result()


@register("sd", setting="k", reference=True, simulable=True)
class FixedK(SpeculativePolicy):
    """Speculative sampling with K candidates per round (SpecDec++ sweeps K = 2, 4, …, 14)."""

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.k = k

    def round_length(self) -> int:
        return self.k

    @staticmethod
    def replay_lengths(trace: Trace, max_k: int, k: int) -> np.ndarray:
        """The rule's round length at every position of an acceptance trace (``decoding.simulate``)."""
        return sd_round_lengths(len(trace), k)


@register("hf_heuristic")
class HFHeuristic(SpeculativePolicy):
    """Hugging Face's "heuristic" schedule (transformers ``AssistedCandidateGenerator``): start at K0, then
    K += 2 after a round whose candidates were all kept, K = max(1, K − 1) otherwise."""

    def __init__(self, k0: int = 5):
        if k0 < 1:
            raise ValueError(f"k0 must be at least 1, got {k0}")
        self.k0 = k0
        self.k = k0

    def start(self) -> None:
        self.k = self.k0

    def round_length(self) -> int:
        return self.k

    def observe(self, kept: int, drafted: int) -> None:
        self.k = self.k + 2 if kept == drafted else max(1, self.k - 1)

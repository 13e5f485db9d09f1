"""Each decision a decoding policy makes, written once: the decoder's policies (``decoding.policies``), the
transformers runtime (``decoding.runtimes.hf``) and the trace replay (``decoding.replay``) all call these, and
``tests/test_rules_agree.py`` checks that their rounds agree.

The decisions read plain numbers (a probability, an entropy, a head's logit) or numpy arrays of them, so one
function serves a loop that decides token by token and a replay that decides over a whole trace at once. Drawing
a token (SPRINTER's check of the token it rejected) reads torch log-probs, with the caller's random source.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from core.label_math import acceptance_probability, residual_distribution

# ---------------------------------------------------------------------------------------------------------------
# stop rules: after each drafted candidate, does the round stop drafting?


def confidence_stops(p_candidate, threshold: float):
    """The confidence stop (transformers' ``assistant_confidence_threshold``): stop after a candidate whose own
    draft probability is below the threshold."""
    return p_candidate < threshold


def entropy_stops(entropy, h: float):
    """SVIP's stop (Zhang et al., Algorithm 1 line 8): stop after a candidate when sqrt(H) of the draft's
    distribution it was drawn from exceeds h."""
    return np.sqrt(np.maximum(entropy, 0.0)) > h


def log_accept(logit):
    """log sigmoid(logit): a stop head's log-probability that its candidate is accepted."""
    return -np.logaddexp(0.0, -np.asarray(logit, float))


class HeadStop:
    """SpecDec++'s stop (Eq. 4.1) over one round: stop once the predicted probability that some candidate is
    rejected, 1 − ∏ sigmoid(f) over the round's candidates so far, exceeds h."""

    def __init__(self, h: float):
        self.h = h
        self.reset()

    def reset(self) -> None:
        """Start a round."""
        self.log_all_accepted = 0.0

    def __call__(self, log_accepted: float) -> bool:
        """Add one candidate, given as ``log_accept`` of the head's logit for it; stop the round?"""
        self.log_all_accepted += log_accepted
        return 1.0 - math.exp(self.log_all_accepted) > self.h


def round_length(stops: Callable[[int], bool], cap: int, reads_candidate: bool) -> int:
    """How many candidates a round drafts when ``stops(j)`` says whether it stops after its j-th (0-based)
    candidate: at most ``cap``; a rule that read the candidate's own forward (``reads_candidate``) has q for the
    next candidate from that forward, which Algorithm 1 (SpecDec++) samples and submits too."""
    n = 0
    while n < cap:
        n += 1
        if stops(n - 1):
            return min(n + 1, cap) if reads_candidate else n
    return n


# ---------------------------------------------------------------------------------------------------------------
# acceptance rules: is a drafted token kept?


def verifier_accepts(logit, tau: float):
    """SPRINTER's verifier: accept the token when sigmoid(logit) ≥ τ."""
    return 1.0 / (1.0 + np.exp(-np.asarray(logit, float))) >= tau


def divergence_keeps(js_nats: float, T_bits: float) -> bool:
    """Fuzzy SD's test: keep a candidate while the JS divergence (nats) of the two models there is below T
    (bits, the paper's grid; JS ≤ 1 bit)."""
    return js_nats < T_bits * math.log(2)


def speculative_keeps(token: int, logp: torch.Tensor, logq: torch.Tensor, u: float) -> bool:
    """Speculative sampling's acceptance of a draft token at the uniform draw ``u``: keep it with probability
    min(1, p/q) (``logp``/``logq``: the target's and the draft's log-probs at its position)."""
    return u < acceptance_probability(logq[token], logp[token]).item()


def check_token(token: int, logp: torch.Tensor, logq: torch.Tensor, draw_uniform: Callable[[], float],
                sample: Callable[[torch.Tensor], int]) -> tuple[int, bool]:
    """Speculative sampling's check of one draft token (SPRINTER's check of the token its verifier rejected):
    ``speculative_keeps`` it, else ``sample`` a replacement from norm((p − q)+). The caller's random source draws
    (``draw_uniform``, ``sample``), so the decoder and a runtime each keep theirs. Returns the token that stands and
    whether it is the draft's."""
    if speculative_keeps(token, logp, logq, draw_uniform()):
        return token, True
    return sample(residual_distribution(logp, logq)), False

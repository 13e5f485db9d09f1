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


class GoodputStop:
    """A stop for rounds whose verification costs depend on their length (``decoding/DESIGN.md``, "A stop rule for
    length-dependent verification cost"): after the k-th candidate, with survival s_k = ∏ â_i over the round's
    estimates, stop iff no longer round n ≤ ``cap`` gains more expected tokens than ``rate`` × its extra seconds,
    the candidates beyond k predicted to be accepted with probability ``future`` each (None: the last candidate's
    â_k).

    It is a certainty-equivalent rule: it treats the estimates as the acceptance probabilities and the candidates
    not yet drafted as accepted at one fixed rate, and it prices the round's seconds at the long-run rate λ. It
    maximises expected tokens per second exactly when the verification cost is flat in the length and the predictor
    is constant (then it is Theorem 4.1's threshold); with costs that grow with the length, or estimates that move
    within a round, it is a heuristic, and the oracle of ``decoding.replay`` measures what it leaves.

    ``drafting_pays`` is False when no round, even one whose every candidate is accepted, beats λ: the policy then
    drafts nothing (target-only rounds), since every draft forward would cost more than it can return. A fully
    accepted round is charged ``catch_up`` too, the seconds the draft's next forward spends reading the round's last
    candidate (``decoding.replay.Counts.catch_up``); the per-candidate decision leaves it out.

    ``rate``: λ, the long-run tokens per second the decoding achieves; ``costs``: what a round costs
    (``decoding.costs.CostModel``); ``extra_candidate``: the caller adds one more candidate after the stop
    (Algorithm 1, ``round_length``'s ``reads_candidate``), so stopping after k verifies k + 1."""

    def __init__(self, costs, rate: float, cap: int, future: float | None = None, extra_candidate: bool = False):
        self.rate, self.cap, self.future, self.extra = rate, cap, future, int(extra_candidate)
        self.forward_rate = costs.forward_rate(rate)  # λ against the forwards, each token's sampler aside
        n = np.arange(cap + 1)
        self.round_seconds = costs.round_seconds(n)  # by candidates n
        # at full acceptance a round of n candidates adds n tokens over a round of none
        self.drafting_pays = bool(np.any(n[1:] > self.forward_rate * (self.round_seconds[1:] + costs.catch_up
                                                                      - self.round_seconds[0])))
        self.reset()

    def reset(self) -> None:
        """Start a round."""
        self.k = 0
        self.log_all_accepted = 0.0

    def __call__(self, log_accepted: float) -> bool:
        """Add one candidate, given as its log â (e.g. ``log_accept`` of a stop head's logit); stop the round?"""
        self.k += 1
        self.log_all_accepted += log_accepted
        now = min(self.k + self.extra, self.cap)  # the round's candidates if it stops here
        if now >= self.cap:
            return True
        a = math.exp(log_accepted) if self.future is None else self.future
        more = np.arange(now + 1, self.cap + 1)  # the longer rounds still open
        # expected tokens a round of n candidates adds beyond one of `now`: s_k (a^(now−k+1) + … + a^(n−k))
        gain = math.exp(self.log_all_accepted) * np.cumsum(a ** (more - self.k))
        return not np.any(gain > self.forward_rate * (self.round_seconds[more] - self.round_seconds[now]))


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


def speculative_keeps(token: int, logq: torch.Tensor, logp: torch.Tensor, u: float) -> bool:
    """Speculative sampling's acceptance of a draft token at the uniform draw ``u``: keep it with probability
    min(1, p/q) (``logq``/``logp`` (V,): the draft's and the target's log-probs at its position)."""
    return u < acceptance_probability(logq[token], logp[token]).item()


def acceptance_chances(candidates: list[int], logqs: list[torch.Tensor], logps: torch.Tensor) -> list[float]:
    """``speculative_keeps``'s probability min(1, p/q) of each candidate (``logqs``: the draft's log-probs (V,) at
    their positions, ``logps`` (≥ n, V): the target's), computed together and read in one device-to-host transfer:
    the same numbers as one ``speculative_keeps`` per candidate, at one synchronization per verification."""
    if not candidates:
        return []
    # indexing by Python ints makes views: no index tensor crosses to the device
    logq = torch.stack([q[t] for q, t in zip(logqs, candidates)])
    logp = torch.stack([logps[i, t] for i, t in enumerate(candidates)])
    return acceptance_probability(logq, logp).tolist()


def check_token(token: int, logq: torch.Tensor, logp: torch.Tensor, draw_uniform: Callable[[], float],
                sample: Callable[[torch.Tensor], int]) -> tuple[int, bool]:
    """Speculative sampling's check of one draft token (SPRINTER's check of the token its verifier rejected):
    ``speculative_keeps`` it, else ``sample`` a replacement from norm((p − q)+). The caller's random source draws
    (``draw_uniform``, ``sample``), so the decoder and a runtime each keep theirs. Returns the token that stands and
    whether it is the draft's."""
    if speculative_keeps(token, logq, logp, draw_uniform()):
        return token, True
    return sample(residual_distribution(logq, logp)), False


def prompt_lookup_proposal(seq: list[int], n: int, m: int, room: int, eos) -> tuple[int, list[int]]:
    """The candidates a prompt-lookup round submits after ``seq``, with the position in ``seq`` the first was copied
    from (``ngram_simple_match``): at most ``room`` of them (the response's tokens left, less the target's own), and
    none past an end token (``eos``)."""
    source, proposal = ngram_simple_match(seq, n, m)
    proposal = proposal[:max(room, 0)]
    ends = [i for i, y in enumerate(proposal) if y in eos]
    return source, proposal[:ends[0] + 1] if ends else proposal


def ngram_simple_match(seq: list[int], n: int, m: int) -> tuple[int, list[int]]:
    """The candidates llama.cpp's ``ngram-simple`` proposes after ``seq`` (the prompt and the tokens so far, its
    last token the one just sampled), with the position in ``seq`` they are copied from (-1 where none): the last
    ``n`` tokens are looked up at starts 1 … len(seq) − n − 2, latest first (one starting at position 0 is not
    looked at, nor one overlapping the last n by all but one token), and the at most ``m`` tokens that followed it
    are proposed; none where fewer than ``n`` follow it, or where ``seq`` holds at most n + m + 2 tokens."""
    history = len(seq) - 1  # llama.cpp's cur_len: the tokens before the one just sampled
    if history <= n + m + 1:
        return -1, []
    pattern = seq[-n:]
    for start in range(history - n - 1, 0, -1):
        if seq[start:start + n] == pattern:
            copied = min(m, history - (start + n))
            return (start + n, seq[start + n:start + n + copied]) if copied >= n else (-1, [])
    return -1, []


def kept_count(proposal: list[int], response: list[int], s: int) -> int:
    """How many of ``proposal``'s candidates, submitted at position ``s`` of ``response``, the response repeats
    before it differs: the ones the target keeps along its own response."""
    kept = 0
    while kept < len(proposal) and s + kept < len(response) and response[s + kept] == proposal[kept]:
        kept += 1
    return kept


MATCH_CAP = 128
"""The longest match ``match_length`` measures: agreement beyond it says nothing more about the next token."""


def match_length(seq: list[int], source: int) -> int:
    """How many tokens before ``source`` equal the last ones of ``seq`` (at most ``MATCH_CAP``): the length of the
    earlier text a prompt-lookup proposal copied from ``source`` on that the text so far repeats, at least the
    n-gram looked up. A candidate that follows j kept ones of its round has a match j longer."""
    length, end = 0, len(seq)
    while length < MATCH_CAP and length < source and seq[source - 1 - length] == seq[end - 1 - length]:
        length += 1
    return length

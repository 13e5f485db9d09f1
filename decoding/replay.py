"""Speculative sampling replayed over acceptance traces (``decoding.traces``): exact expected counts, the oracle,
and the stop threshold a trace replay picks.

SpecDec++ §5: the verification rate N_target/N and the discard rate N_discarded/N do not depend on the hardware;
the latency follows from them and the per-forward times (Eq. 5.1). Every stop rule here decides from the
candidate's features alone, so the round that starts at position s has a fixed length n(s), and the expected
counts follow exactly from a forward pass over the probability that a round starts at s: the round keeps
candidate j with probability a_{s+j} = min(1, p/q) until the first rejection. A round of n candidates is one
target call of n + 1 tokens; the last position of a trace is always the target's token (the round's bonus or its
resample), so a round at s drafts at most L − s − 1 candidates.

The oracle (SpecDec++ Theorem 4.1) knows the acceptance draws; here it also knows the cost model, so it is the
ceiling for that model (``oracle_counts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from core.errors import SettingError
from decoding import rules
from decoding.lookup_stop import LookupCalibration, LookupGoodput, LookupHead, RoundState
from decoding.traces import Trace
from heads.features import draft_scores

if TYPE_CHECKING:
    from decoding.costs import CostModel

MAX_K = 20
TRACE_SCORES = ("p_draft", "logp_draft", "entropy_draft")
"""The draft scores a trace holds (``Trace``): a head reading any other feature cannot be replayed."""
STOP_H_GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))
"""The thresholds h a stop head's exported default is chosen from (``choose_stop_threshold``)."""


# ---------------------------------------------------------------------------------------------------------------
# stop rules as round lengths


def replay_rounds(new_round: Callable[[], Callable[[int], bool]], length: int, reads_candidate: bool,
                  max_k: int) -> np.ndarray:
    """n(s) for every start s of one trace: ``new_round()`` gives the decision of a fresh round (does it stop after
    the candidate at a trace position?), and ``decoding.rules.round_length`` drafts the round that starts at s, at
    most ``max_k`` candidates and leaving room for the target token."""
    out = np.zeros(length, dtype=np.int64)
    for s in range(length):
        stops = new_round()
        out[s] = rules.round_length(lambda j: stops(s + j), min(max_k, length - s - 1), reads_candidate)
    return out


def round_lengths(stops: np.ndarray, reads_candidate: bool, max_k: int) -> np.ndarray:
    """n(s) of a rule that decides on each candidate alone, from its per-position stop signals."""
    return replay_rounds(lambda: stops.__getitem__, len(stops), reads_candidate, max_k)


def head_round_lengths(log_accept: np.ndarray, h: float, reads_candidate: bool, max_k: int) -> np.ndarray:
    """n(s) for SpecDec++'s rule (``decoding.rules.HeadStop``) from ``rules.log_accept`` of the stop head's logit at
    every position."""

    def new_round() -> Callable[[int], bool]:
        stop = rules.HeadStop(h)
        return lambda i: stop(log_accept[i])

    return replay_rounds(new_round, len(log_accept), reads_candidate, max_k)


def goodput_rule(costs: CostModel, rate: float, max_k: int, future: float | None = None,
                 reads_candidate: bool = False) -> rules.GoodputStop:
    """``decoding.rules.GoodputStop`` at long-run rate ``rate`` (tokens per unit of ``costs``) for rounds of at most
    ``max_k`` candidates under ``costs``."""
    return rules.GoodputStop(costs, rate, max_k, future, reads_candidate)


def goodput_round_lengths(log_accept: np.ndarray, costs: CostModel, rate: float, reads_candidate: bool,
                          max_k: int, future: float | None = None) -> np.ndarray:
    """n(s) for the goodput stop from the log acceptance estimate log â at every position (``rules.log_accept`` of
    a stop head's logit, or any source of ``decoding.estimates``)."""
    stop = goodput_rule(costs, rate, max_k, future, reads_candidate)
    if not stop.drafting_pays:  # no round can beat the rate: the policy drafts nothing
        return np.zeros(len(log_accept), dtype=int)

    def new_round() -> Callable[[int], bool]:
        stop.reset()
        return lambda i: stop(log_accept[i])

    return replay_rounds(new_round, len(log_accept), reads_candidate, max_k)


def sd_round_lengths(length: int, k: int) -> np.ndarray:
    """n(s) of fixed-K SD: K candidates, fewer where the round's target token would not fit."""
    return np.minimum(k, np.maximum(length - np.arange(length) - 1, 0))


# ---------------------------------------------------------------------------------------------------------------
# counts and costs


@dataclass
class Counts:
    """Expected counts over traces (N: tokens produced)."""

    n: float = 0.0
    draft: float = 0.0
    target: float = 0.0
    discarded: float = 0.0
    calls: np.ndarray | None = None
    """Expected target calls by the tokens each verifies (index m: m − 1 candidates and the target's token); None
    where the policy's calls have no round length (SPRINTER)."""
    catch_up: float = 0.0
    """Expected tokens the draft reads beyond one in a round's first forward (``expected_counts``): the last
    candidate of a fully accepted round and the bonus token after it, or the target's tokens of rounds that drafted
    nothing. On a GPU such a forward costs a step; on a CPU each token read costs nearly a step of its own."""
    draft_reads: np.ndarray | None = None
    """Expected draft forwards that read a batch, by its tokens (index m), beside ``draft``'s one-token steps: a
    runtime whose draft re-reads each verified batch (``decoding.runtime_replay``); None: none."""

    def __iadd__(self, other: "Counts") -> "Counts":
        if self.n == 0:  # nothing added yet: the calls are the other's
            self.calls = other.calls
        elif self.calls is not None and other.calls is not None:
            size = max(len(self.calls), len(other.calls))
            self.calls = np.pad(self.calls, (0, size - len(self.calls))) \
                + np.pad(other.calls, (0, size - len(other.calls)))
        else:
            self.calls = None
        if other.draft_reads is not None:
            mine = np.zeros(0) if self.draft_reads is None else self.draft_reads
            size = max(len(mine), len(other.draft_reads))
            self.draft_reads = np.pad(mine, (0, size - len(mine))) + np.pad(other.draft_reads,
                                                                           (0, size - len(other.draft_reads)))
        self.n += other.n
        self.draft += other.draft
        self.target += other.target
        self.discarded += other.discarded
        self.catch_up += other.catch_up
        return self


MAX_COST_RATIO = 10.0
"""The largest cost ratio c = t_draft / t_target a command takes: a draft step that costs ten target steps drafts
nothing worth verifying, and a c near float's limit overflows a round's cost (infinite costs, NaN shares)."""


def check_cost_ratios(values: Sequence[float], flag: str) -> None:
    """Each of ``values`` (the command's ``flag``) a cost ratio of Eq. 5.1, 0 < c < ``MAX_COST_RATIO``, or one
    ``SettingError`` naming the first that is not."""
    for c in values:
        if not 0 < c < MAX_COST_RATIO:
            raise SettingError(f"{flag} must be a positive cost ratio t_draft / t_target, got {c:g} (a draft step "
                               f"costs c target steps: 0 < c < {MAX_COST_RATIO:g})")


def expected_counts(acceptance: np.ndarray, lengths: np.ndarray) -> Counts:
    """Exact expected counts of speculative sampling over one trace with round lengths n(s): the probability that
    a round starts at each position, carried forward (the round at s keeps candidate j with probability
    a_{s+j} = min(1, p/q) until the first rejection, and the next round starts after the target's token), and each
    round's counts weighted by it.

    The draft's catch-up is carried the same way: a round's first draft forward reads every token the draft has not
    read. After a rejection that is the target's token alone; after a fully accepted round also the last candidate
    (drawn from the draft's last forward, never read by it); after a round that drafted nothing, the tokens the
    draft skipped. ``unread[s]``: the probability of a round at s times the tokens beyond one it would read."""
    length = len(acceptance)
    start = np.zeros(length + 1)  # start[length]: the response is complete
    start[0] = 1.0
    unread = np.zeros(length + 1)
    calls = np.zeros(int(lengths.max(initial=0)) + 2)
    draft = discarded = catch_up = 0.0
    for s in range(length):
        if start[s] == 0.0:
            continue
        n = int(lengths[s])
        draft += start[s] * n
        calls[n + 1] += start[s]
        if n == 0:  # the target's token alone: the draft reads it later, with what it had not read
            unread[min(s + 1, length)] += unread[s] + start[s]
        else:
            catch_up += unread[s]
        reach = start[s]  # probability that the round starts here and candidates s..s+j-1 were all accepted
        for j in range(n):
            p_reject = reach * (1.0 - acceptance[s + j])
            start[min(s + j + 1, length)] += p_reject
            discarded += p_reject * (n - j)
            reach *= acceptance[s + j]
        start[min(s + n + 1, length)] += reach
        if n > 0:
            unread[min(s + n + 1, length)] += reach  # the last candidate and the bonus token
    return Counts(n=length, draft=draft, target=float(calls.sum()), discarded=discarded, calls=calls,
                  catch_up=catch_up)


def first_rejection(acceptance: np.ndarray, s: int) -> np.ndarray:
    """P(the first rejected candidate from s is at s + j) for j = 0 … L − s − 1, the last entry standing for "none
    before the last position" (which is always the target's token)."""
    a = acceptance[s:]
    reach = np.concatenate(([1.0], np.cumprod(a[:-1])))
    return np.concatenate((reach[:-1] * (1.0 - a[:-1]), reach[-1:]))


def oracle_counts(acceptance: np.ndarray, costs: CostModel, max_k: int | None = None) -> Counts:
    """The oracle under ``costs``: at the start of each round it knows where the round's first rejection j falls
    (SpecDec++ Theorem 4.1: whether each candidate will be accepted) and drafts the n candidates (at most
    ``max_k``, None: no limit) that minimise the expected cost to the end of the trace.

    A dynamic program over (start s, first rejection j): a round of n costs draft·n + verify(n + 1); when j ≤ n it
    ends at s + j + 1 with nothing known beyond, when j > n it ends at s + n + 1 with the first rejection known to
    be j − n − 1 further on. Every stop rule chooses n(s) without knowing j, so its cost is one of the choices the
    program compares and the oracle's is never higher. Under Eq. 5.1 with c < 1 it drafts exactly the candidates
    that will be accepted (Theorem 4.1, with the final verification counted: |S| + 1 calls); under a non-monotone
    cost table it may pad a round with candidates it knows will be discarded. Expected counts (by call length)
    follow from a forward pass over the same states. Its draft reads are priced one token each (no
    ``Counts.catch_up``): a ceiling where the table prices the catch-up, never a rule's cost."""
    a = np.asarray(acceptance, float)
    length = len(a)
    if length == 0:
        return Counts(calls=np.zeros(2))
    k = length - 1 if max_k is None else min(max_k, length - 1)
    round_cost = costs.round_seconds(np.arange(k + 1))  # by candidates n
    value = np.zeros((length + 1, length + 1))  # value[s, j]: cost to the end from a round at s, first rejection j
    fresh_value = np.zeros(length + 1)  # its expectation over j
    choice = np.zeros((length, length), dtype=np.int64)
    for s in range(length - 1, -1, -1):
        rest = length - s
        n = np.arange(min(k, rest - 1) + 1)[:, None]
        j = np.arange(rest)[None, :]
        then = np.where(j <= n, fresh_value[s + j + 1],
                        value[np.minimum(s + n + 1, length), np.maximum(j - n - 1, 0)])
        total = round_cost[n] + then
        best = total.argmin(0)  # the fewest candidates among equal costs
        choice[s, :rest] = best
        value[s, :rest] = total[best, np.arange(rest)]
        fresh_value[s] = first_rejection(a, s) @ value[s, :rest]
    fresh = np.zeros(length + 1)
    fresh[0] = 1.0
    known = np.zeros((length + 1, length + 1))  # probability of a round at s with its first rejection known
    calls = np.zeros(k + 2)
    draft = discarded = 0.0
    for s in range(length):
        rest = length - s
        mass = fresh[s] * first_rejection(a, s) + known[s, :rest]
        n, j = choice[s, :rest], np.arange(rest)
        draft += float(mass @ n)
        discarded += float(mass @ np.maximum(n - j, 0))
        np.add.at(calls, n + 1, mass)
        ends = j <= n
        np.add.at(fresh, s + j[ends] + 1, mass[ends])
        np.add.at(known, (s + n[~ends] + 1, j[~ends] - n[~ends] - 1), mass[~ends])
    return Counts(n=length, draft=draft, target=float(calls.sum()), discarded=discarded, calls=calls)


class LookupTrace:
    """Prompt lookup's round at each position of a response, computed once where first asked for
    (``prompt_lookup_proposal`` with the room left and the end tokens): the text before it, the proposal's source,
    the proposal, and how many of it the response repeats. Replays of several rules over one response share it."""

    def __init__(self, prompt: list[int], response: list[int], n: int, m: int, max_new_tokens: int,
                 eos: Sequence[int] = ()):
        self.prompt, self.response, self.n, self.m = list(prompt), list(response), n, m
        self.max_new_tokens, self.eos = max_new_tokens, eos
        self._at: dict[int, tuple[list[int], int, list[int], int]] = {}

    def __len__(self) -> int:
        return len(self.response)

    def at(self, s: int) -> tuple[list[int], int, list[int], int]:
        if s not in self._at:
            seq = self.prompt + self.response[:s]
            source, proposal = rules.prompt_lookup_proposal(seq, self.n, self.m, self.max_new_tokens - s - 1, self.eos)
            self._at[s] = seq, source, proposal, rules.kept_count(proposal, self.response, s)
        return self._at[s]


def prompt_lookup_counts(prompt: list[int], response: list[int], n: int, m: int, max_new_tokens: int,
                         eos: Sequence[int] = (), length: Callable[[list[int], int, list[int]], int] | None = None,
                         trace: LookupTrace | None = None) -> Counts:
    """Prompt lookup (``decoding.policies.prompt_lookup``, n-gram ``n``, at most ``m`` tokens copied) replayed
    along a response of the target's: a proposal is a point mass, so the target keeps it exactly where its own token
    there is the proposed one. Along a response sampled from p that happens with probability p(y), as speculative
    sampling keeps it, and a rejection leaves the token the response holds; so these are the counts of the one
    generation that made ``response``, not expectations. No draft forward: rounds cost their verifications alone.
    ``length(seq, source, proposal)``: how many of a round's candidates a stop rule submits (None: all of them);
    ``trace``: the response's ``LookupTrace``, where several replays share it."""
    trace = LookupTrace(prompt, response, n, m, max_new_tokens, eos) if trace is None else trace
    calls = np.zeros(m + 2)
    discarded = s = 0
    while s < len(response):
        seq, source, proposal, kept = trace.at(s)
        if proposal and length is not None:
            proposal = proposal[:length(seq, source, proposal)]
            kept = min(kept, len(proposal))
        calls[len(proposal) + 1] += 1
        discarded += len(proposal) - kept
        s += kept + 1  # the kept tokens and the target's own (past the end where the last kept one ended it)
    return Counts(n=len(response), draft=0.0, target=float(calls.sum()), discarded=float(discarded), calls=calls)


def prompt_lookup_oracle_counts(prompt: list[int], response: list[int], n: int, m: int, max_new_tokens: int,
                                costs: CostModel, eos: Sequence[int] = (),
                                trace: LookupTrace | None = None) -> Counts:
    """The ceiling of any stop rule over prompt lookup's proposals along a response: at each round it knows how many
    of the proposal's candidates the target keeps (k) and submits the L ≤ len(proposal) that minimises the cost to
    the end, a round of L reaching min(L, k) + 1 tokens on at verify(L + 1). A dynamic program over positions:
    the proposal at a position depends on the response alone, whatever rounds led there."""
    trace = LookupTrace(prompt, response, n, m, max_new_tokens, eos) if trace is None else trace
    length = len(response)
    options = []  # by position: (candidates submitted, tokens reached) of each choice
    for s in range(length):
        _, _, proposal, kept = trace.at(s)
        options.append([(L, min(L, kept) + 1) for L in range(len(proposal) + 1)])
    verify = costs.verify_table(m + 1)
    cost_to_end = np.zeros(length + 1)
    choice = np.zeros(length, dtype=np.int64)
    for s in range(length - 1, -1, -1):
        totals = [verify[L + 1] + cost_to_end[min(s + step, length)] for L, step in options[s]]
        choice[s] = int(np.argmin(totals))
        cost_to_end[s] = totals[choice[s]]
    calls = np.zeros(m + 2)
    discarded = s = 0
    while s < length:
        L, step = options[s][choice[s]]
        calls[L + 1] += 1
        discarded += L - (step - 1)
        s += step
    return Counts(n=length, draft=0.0, target=float(calls.sum()), discarded=float(discarded), calls=calls)


LOOKUP_RATE_GRID = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
"""Multiples of target-only's rate at which ``lookup_goodput_rate`` also replays the stop."""


def lookup_goodput_rate(responses: Sequence[tuple[list[int], list[int]]], n: int, m: int, max_new_tokens: int,
                        calibration: LookupCalibration | LookupHead, costs: CostModel,
                        states: Sequence[Callable[[int], RoundState | None]] | None = None) -> dict:
    """The rate λ at which to run prompt lookup's goodput stop (``decoding.lookup_stop``) over the responses: the
    best of ``fixed_point_rate``'s search and of ``LOOKUP_RATE_GRID``. The rule is certainty-equivalent and myopic:
    a round cut short leaves the rest of its copy to the next round, which E(L) − λ·verify(L + 1) does not credit,
    so the fixed point can settle at a worse rate than another λ does (``tried`` and ``achieved`` list every λ
    replayed and the rate it achieved). ``states``: each response's ``RoundState`` by index, for a ``LookupHead``."""
    traces = [LookupTrace(prompt, response, n, m, max_new_tokens) for prompt, response in responses]

    def counts_at(rate: float) -> Counts:
        rule, total = LookupGoodput(calibration, costs, rate, m), Counts()
        for i, ((prompt, response), trace) in enumerate(zip(responses, traces)):
            length = rule.along(None if states is None else states[i], len(prompt))
            total += prompt_lookup_counts(prompt, response, n, m, max_new_tokens, length=length, trace=trace)
        return total

    found = fixed_point_rate(counts_at, costs)
    for multiple in LOOKUP_RATE_GRID:
        rate = multiple * costs.target_only_rate()
        if rate in found["tried"]:
            continue
        counts = counts_at(rate)
        found["tried"].append(rate)
        found["achieved"].append(counts.n / costs.price(counts))
        if found["achieved"][-1] > found["rate"]:
            found.update(at=rate, rate=found["achieved"][-1], counts=counts, stopped="grid")
    return found


def sprinter_counts(accepts: np.ndarray) -> Counts:
    """SPRINTER (Algorithm 2): one draft forward per token; the target runs at each token the verifier rejects."""
    return Counts(n=len(accepts), draft=float(len(accepts)), target=float((~accepts).sum()), discarded=0.0)


# ---------------------------------------------------------------------------------------------------------------
# heads over traces


def trace_head_logits(module: torch.nn.Module, position: str, trace: Trace) -> np.ndarray:
    """A head module's logit at every position of the trace (one batched forward): it reads the hidden state at
    ``position`` (``own`` or ``prev``) and the draft scores it names (``TRACE_SCORES``)."""
    device = next(module.parameters()).device
    hidden = (trace.hidden if position == "own" else trace.hidden_prev).to(device)
    names = list(getattr(module, "scores", []))
    with torch.no_grad():
        if names:
            scores = draft_scores(names, torch.from_numpy(trace.logp_draft), torch.from_numpy(trace.entropy_draft))
            out = module(hidden.float(), scores.to(device))
        else:
            out = module(hidden.float())
    return out.double().cpu().numpy()


def stop_head_counts(acceptance: Sequence[np.ndarray], logits: Sequence[np.ndarray], h: float,
                     reads_candidate: bool, max_k: int = MAX_K) -> Counts:
    """Expected counts of SpecDec++ at threshold h over traces (their acceptance and the head's logits)."""
    total = Counts()
    for a, f in zip(acceptance, logits):
        total += expected_counts(a, head_round_lengths(rules.log_accept(f), h, reads_candidate, max_k))
    return total


def goodput_counts(acceptance: Sequence[np.ndarray], log_accepts: Sequence[np.ndarray], costs: CostModel,
                   rate: float, reads_candidate: bool, max_k: int = MAX_K, future: float | None = None) -> Counts:
    """Expected counts of the goodput stop at rate λ over traces (their acceptance and the estimates log â)."""
    total = Counts()
    for a, log_a in zip(acceptance, log_accepts):
        total += expected_counts(a, goodput_round_lengths(log_a, costs, rate, reads_candidate, max_k, future))
    return total


def goodput_rate(acceptance: Sequence[np.ndarray], log_accepts: Sequence[np.ndarray], costs: CostModel,
                 reads_candidate: bool, max_k: int = MAX_K, future: float | None = None, tol: float = 1e-4,
                 max_iter: int = 50) -> dict:
    """The rate λ at which to run the goodput stop over the traces (``fixed_point_rate`` of its replay)."""
    return fixed_point_rate(lambda rate: goodput_counts(acceptance, log_accepts, costs, rate, reads_candidate, max_k,
                                                        future), costs, tol, max_iter)


def fixed_point_rate(counts_at: Callable[[float], Counts], costs: CostModel, tol: float = 1e-4,
                     max_iter: int = 50) -> dict:
    """The rate λ at which to run a goodput rule whose replay at λ is ``counts_at(λ)`` (``decoding/DESIGN.md``,
    "Finding λ"): from target-only's 1 / verify(1), λ ← the rate (tokens / cost) of the replay at λ, until λ moves
    by at most ``tol`` × λ (``"fixed point"``), the rate repeats one achieved before (``"cycle"``: round lengths
    change in steps, so the iteration can alternate between two rates) or ``max_iter`` replays. Returns the λ tried
    whose replay achieved the highest rate (``at``), that rate and its counts, why it stopped, and every λ tried
    with the rate each achieved."""
    tried, achieved, counts = [], [], []
    rate, stopped = costs.target_only_rate(), "max_iter"
    for _ in range(max_iter):
        tried.append(rate)
        counts.append(counts_at(rate))
        rate = counts[-1].n / costs.price(counts[-1])
        if abs(rate - tried[-1]) <= tol * tried[-1]:
            stopped = "fixed point"
        elif np.any(np.abs(np.array(achieved) - rate) <= tol * rate):
            stopped = "cycle"
        achieved.append(rate)
        if stopped != "max_iter":
            break
    best = int(np.argmax(achieved))
    return {"at": tried[best], "rate": achieved[best], "counts": counts[best], "stopped": stopped,
            "tried": tried, "achieved": achieved}


def choose_stop_threshold(acceptance: Sequence[np.ndarray], logits: Sequence[np.ndarray], reads_candidate: bool,
                          speedup: Callable[[Counts], float], grid: Sequence[float] = STOP_H_GRID,
                          max_k: int = MAX_K) -> dict:
    """The h of ``grid`` whose replay over the traces has the highest ``speedup`` (e.g. ``CostModel.speedup`` at a c,
    or ``CostModel.predicted_speedup`` with a device's costs; the smallest h among equals), with every setting's."""
    scored = [(speedup(stop_head_counts(acceptance, logits, h, reads_candidate, max_k)), h) for h in grid]
    best, h = max(scored, key=lambda x: (x[0], -x[1]))
    return {"h": h, "speedup": best, "grid": {f"{g:g}": s for s, g in scored}}

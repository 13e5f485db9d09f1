"""Trace-forced schedules: the rounds a policy drafts over acceptance traces, drawn once, so that a GPU can run
exactly those forwards (``ModelPair.forced``) with weights of the real shapes, and its wall time be set against
what the cost table predicts for the same rounds.

The simulator (``decoding.replay``) gives each policy's round length n(s) at every start s of a trace and prices
expected counts. A schedule draws one realisation: from s = 0, the round drafts n(s) candidates and keeps them up to
the first rejection, candidate j kept with the trace's probability min(1, p/q) at s + j; the next round starts after
the target's token. Its predicted seconds are Σ over rounds of n·t_draft + T(n + 1), with the draft's catch-up
reads, the price ``decoding.costs.CostModel`` puts on every round; target-only is one T(1) per token. A schedule
file is small (the rounds alone) and names the policies' settings, so the GPU side needs no traces.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from core.errors import UserError
from core.runfolder import write_json

SCHEDULE_KIND = "trace-forced schedule"


class ScheduleFileError(UserError):
    """A schedule file that cannot be read, or does not hold rounds that tile its traces."""


def draw_rounds(acceptance: np.ndarray, lengths: np.ndarray, rng: np.random.Generator) -> list[tuple[int, int]]:
    """One realisation of a policy's rounds over a trace: (candidates n(s), candidates kept) for each round, the
    rounds tiling the trace (each ends with the target's token)."""
    rounds, s = [], 0
    while s < len(acceptance):
        n = int(lengths[s])
        kept = 0
        while kept < n and rng.random() < acceptance[s + kept]:
            kept += 1
        rounds.append((n, kept))
        s += kept + 1
    return rounds


def target_only_rounds(length: int) -> list[tuple[int, int]]:
    """Target-only decoding as rounds: one target call of one token per token."""
    return [(0, 0)] * length


def catch_up(rounds: list[tuple[int, int]]) -> int:
    """Tokens beyond one that the first draft forward of each drafting round reads (``decoding.replay.expected_counts``
    counts the same in expectation): the last candidate after a round that kept them all, and every target token of
    the rounds that drafted nothing since the draft last read."""
    total = unread = 0
    for n, kept in rounds:
        if n == 0:
            unread += 1
            continue
        total += unread
        unread = int(kept == n)
    return total


def tokens(rounds: list[tuple[int, int]]) -> int:
    """Tokens the rounds produce: the kept candidates and the target's token of each."""
    return sum(kept + 1 for _, kept in rounds)


class ForcedRounds:
    """The rounds of a forced run (``ModelPair.forced``): each drafts and keeps exactly its schedule's counts,
    whatever the models draw, while every forward, draw, stop rule and acceptance test still runs where it would
    (their cost is what the run times). ``decoding.state.Decoding`` asks it, at each round, for the stop rule to
    draft under (``stop``) and for the candidates to keep (``keeps``)."""

    def __init__(self, rounds: list[tuple[int, int]]):
        self.left = [tuple(r) for r in rounds]

    def stop(self, rule) -> "ForcedStop":
        return ForcedStop(rule, self.left[0][0])

    def keeps(self, drafted: int) -> int:
        n, kept = self.left.pop(0)
        if n != drafted:
            raise RuntimeError(f"a forced round drafted {drafted} candidates, not its {n}")
        return kept

    def check_done(self) -> None:
        if self.left:
            raise RuntimeError(f"{len(self.left)} forced rounds were never run: this policy does not decode in "
                               "rounds of draft_round and verify")


class ForcedStop:
    """A round's stop ``rule`` asked where it would be (its cost is timed) and its answer replaced: the round stops
    at its ``n``-th candidate. As in a free round, the rule is not asked about the last candidate where it would
    read that candidate's own forward (nor where the round ends at its cap: ``draft_round`` asks no rule there)."""

    reads_candidate = False

    def __init__(self, rule, n: int):
        self.rule, self.n = rule, n

    def reset(self) -> None:
        if self.rule is not None:
            self.rule.reset()

    def __call__(self, dec, candidates: list[int], step) -> bool:
        last = len(candidates) == self.n
        if self.rule is not None and not (last and self.rule.reads_candidate):
            self.rule(dec, candidates, step)
        return last


class FreeRounds:
    """The rounds of a run that decodes: as the policy's stop rule and the draws make them."""

    def stop(self, rule):
        return rule

    def keeps(self, drafted: int) -> None:
        return None

    def check_done(self) -> None:
        pass


def write_schedule(path: str | Path, schedule: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(path), {"kind": SCHEDULE_KIND, **schedule})


def read_schedule(path: str | Path) -> dict:
    """A schedule file (``evaluation.schedule``), checked: every policy's rounds tile each trace's length."""
    try:
        schedule = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ScheduleFileError(f"schedule file {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ScheduleFileError(f"schedule file {path}: not JSON ({e})") from None
    if not isinstance(schedule, dict) or schedule.get("kind") != SCHEDULE_KIND:
        raise ScheduleFileError(f"{path} is not a trace-forced schedule (make it with specheads gpu-schedule)")
    try:
        lengths = [int(t["length"]) for t in schedule["traces"]]
        for policy in schedule["policies"]:
            rounds = policy["rounds"]
            if len(rounds) != len(lengths):
                raise ValueError(f"{policy['name']} has rounds for {len(rounds)} traces, not {len(lengths)}")
            for i, (trace_rounds, length) in enumerate(zip(rounds, lengths)):
                trace_rounds = [(int(n), int(k)) for n, k in trace_rounds]
                if any(n < 0 or not 0 <= k <= n for n, k in trace_rounds) or tokens(trace_rounds) != length:
                    raise ValueError(f"{policy['name']}'s rounds on trace {i} do not tile its {length} tokens")
    except (KeyError, TypeError, ValueError) as e:
        raise ScheduleFileError(f"schedule file {path}: {e}") from None
    return schedule

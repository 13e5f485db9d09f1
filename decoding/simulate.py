"""Expected counts of a policy replayed over acceptance traces, without decoding: each family's stop or acceptance
rule (``decoding.rules``) turned into round lengths over a trace (``decoding.replay``), and those into the exact
expected counts of its draws. ``evaluation.simulate`` runs it over every policy and setting and sets it against
finished evaluations; what it leaves out, and why it is used anyway, is in ``evaluation/DESIGN.md`` ("The trace
simulator")."""

from __future__ import annotations

import functools

import numpy as np

from decoding import rules
from decoding.estimates import load_calibration
from decoding.policies import POLICIES
from decoding.replay import (MAX_K, TRACE_SCORES, Counts, expected_counts, oracle_counts,
                             sprinter_counts, trace_head_logits)
from decoding.traces import Trace
from heads.export import read_metadata
from heads.exported import ExportedHead, features_beyond

cached_head = functools.lru_cache(maxsize=None)(lambda path: ExportedHead(path, computes=TRACE_SCORES))
"""An exported head by file, loaded once per process."""


def replayable(path: str) -> bool:
    """Whether the traces hold every feature the head at ``path`` reads (``TRACE_SCORES`` and the hidden states)."""
    return not features_beyond(read_metadata(path), TRACE_SCORES)


def head_logits(head: ExportedHead, trace: Trace) -> np.ndarray:
    """The head's logit at every position of the trace (one batched forward, remembered on the trace)."""
    key = str(head.path)
    if key not in trace.logits:
        trace.logits[key] = trace_head_logits(head.module, head.position, trace)
    return trace.logits[key]


def simulate(traces: list[Trace], family: str, max_k: int = MAX_K, **params) -> Counts:
    """Expected counts of one policy summed over the traces: a simulable family of ``POLICIES`` with its keyword
    arguments (``sd`` k, ``confidence`` threshold, ``svip`` h, a head family's ``head`` file and threshold: its
    ``setting``, None for the file's own; ``goodput``'s ``head`` or ``calibration`` (a ``CalibratedConfidence`` or its
    file), ``costs`` (a ``decoding.costs.CostModel``) and ``lam``), or
    ``oracle`` with ``costs`` (no limit on its rounds)."""
    if family != "oracle" and not POLICIES.get_class(family).simulable:
        raise ValueError(f"the simulator has no policy {family!r}")
    if params.get("calibration") is not None:  # read once: every trace replays the same fit
        params = {**params, "calibration": load_calibration(params["calibration"])}
    total = Counts()
    for tr in traces:
        if family == "oracle":
            total += oracle_counts(tr.acceptance, params["costs"])
            continue
        policy = POLICIES.get_class(family)
        if policy.head_role == "verifier":
            head = cached_head(params["head"])
            tau = params.get(policy.setting)
            total += sprinter_counts(rules.verifier_accepts(head_logits(head, tr), head.threshold if tau is None
                                                            else tau))
            continue
        total += expected_counts(tr.acceptance, round_lengths(tr, family, max_k, **params))
    return total


def round_lengths(trace: Trace, family: str, max_k: int = MAX_K, **params) -> np.ndarray:
    """n(s), the round a policy with a stop rule (``simulate``'s families but the oracle and the verifiers) drafts
    from every start s of the trace."""
    policy = POLICIES.get_class(family)
    if policy.head_role == "stop" and params.get("head") is not None:  # its rule over the head's estimates
        head = cached_head(params["head"])
        setting = {k: v for k, v in params.items() if k != "head"}
        return policy.replay_lengths(trace, max_k, head=head, log_accept=rules.log_accept(head_logits(head, trace)),
                                     **setting)
    # a rule on the draft's own scores (goodput's on a calibration of them): the policy replays it
    return policy.replay_lengths(trace, max_k, **params)

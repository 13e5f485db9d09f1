"""Runtimes' own drafting rules replayed along a trace of the target's response, as each runtime runs them (read
from its source), so that ``specheads advise`` can price every setting a user can type.

llama.cpp's ``draft-simple`` (``common/speculative.cpp``, ``examples/speculative-simple``), one round:
- the draft reads the last token and proposes its top token; it keeps proposing while that token's probability is at
  least ``p_min`` and until ``n_max`` tokens (or the tokens left to generate, less one) are drafted. The probability
  is the one its draft sampler computes: a top-k sampler of 10, then the softmax over those 10 logits, not over the
  whole vocabulary. A token that fails ``p_min`` was still computed: its forward is paid. (A draft shorter than
  ``n_min`` is dropped; the replay takes ``n_min`` at its default, 0.)
- the target reads the last token and the draft in one batch and keeps a drafted token where its own sample there
  (greedy: its argmax) equals it; along a trace of the target's own response that is where the response's token is
  the draft's top token, exactly, greedy or sampled (the response is the target's sample);
- the draft then re-reads the verified batch (one forward of the draft's length + 1 tokens, one row out) and drops
  what the target rejected.

Only the tokens drafted before the first rejection lie on the trace. After it the draft continues from its own
token, where the trace says nothing of its confidence: each further token is drafted with the chance
``continues`` that a token on the traces clears ``p_min`` (exact at ``p_min`` 0, where every round drafts
``n_max``). Those tokens are never kept: they change what a round costs, not what it keeps.

The replay is of a target whose cache can drop the rejected tail of a sequence (every transformer llama.cpp runs);
for a recurrent target, which llama.cpp restores from a checkpoint instead, each partly kept round costs one more
target batch and draft re-read, which is not priced here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from decoding.replay import Counts

DRAFT_TOP_K = 10
"""The draft sampler's top-k in llama.cpp's draft-simple: its probabilities are a softmax over these logits."""


def continue_chance(top_probs: Sequence[np.ndarray], p_min: float) -> float:
    """The share of trace positions where the draft's top token clears ``p_min``: the chance ``draft_simple_counts``
    gives a drafted token beyond the first rejection."""
    every = np.concatenate([np.asarray(p, float) for p in top_probs]) if len(top_probs) else np.zeros(0)
    return float((every >= p_min).mean()) if len(every) else 1.0


def draft_simple_counts(match: np.ndarray, top_prob: np.ndarray, n_max: int, p_min: float, continues: float = 1.0,
                        max_new_tokens: int | None = None) -> Counts:
    """llama.cpp's ``draft-simple`` at ``n_min`` 0 (module docstring) along one response of L tokens: ``match[i]``,
    whether the response's token i is the draft's top token at the text before it; ``top_prob[i]``, that token's
    probability under the draft sampler; ``max_new_tokens``: the generation's budget (None: L). Each round's start
    and kept tokens are the one generation's; its length past the first rejection is expected (``continues``)."""
    if n_max < 1:
        raise ValueError(f"n_max must be at least 1, got {n_max}")
    length = len(match)
    budget = length if max_new_tokens is None else max_new_tokens
    calls, reads = np.zeros(n_max + 2), np.zeros(n_max + 2)
    forwards = discarded = 0.0
    s = 0
    while s < length:
        room = max(budget - s - 1, 0)
        cap = n_max if room == 0 else min(n_max, room)  # llama.cpp: a request's cap of 0 means none
        drafted, steps, stopped = 0, 0, False
        while True:  # the draft's forwards on the trace: up to its first token off it
            steps += 1
            if top_prob[s + drafted] < p_min:
                stopped = True
                break
            drafted += 1
            if drafted == cap or not match[s + drafted - 1] or s + drafted == length:
                break
        kept = drafted if match[s:s + drafted].all() else int(np.argmin(match[s:s + drafted]))
        goes_on = not stopped and drafted < cap  # it reads its last token, off the trace, and drafts on
        for extra, chance, failed in continuation(cap - drafted, continues) if goes_on else [(0, 1.0, False)]:
            n = drafted + extra
            forwards += chance * (steps + extra + (1 if failed else 0))
            calls[n + 1] += chance
            reads[n + 1] += chance
            discarded += chance * (n - kept)
        s += kept + 1
    return Counts(n=length, draft=forwards, target=float(calls.sum()), discarded=discarded, calls=calls,
                  draft_reads=reads)


def continuation(room: int, continues: float) -> list[tuple[int, float, bool]]:
    """(tokens drafted beyond the first rejection, chance, whether a token failing ``p_min`` stopped it) for a draft
    that may draft ``room`` more tokens, each with chance ``continues``."""
    out = [(t, continues ** t * (1.0 - continues), True) for t in range(room)]
    return [o for o in out if o[1] > 0] + [(room, continues ** room, False)]


ASSISTED_DEFAULTS = {"schedule": "constant", "k": 20, "threshold": 0.4}
"""transformers' defaults for assisted generation (``GenerationConfig``: ``num_assistant_tokens_schedule``,
``num_assistant_tokens``, ``assistant_confidence_threshold``)."""
HEURISTIC_SCHEDULES = ("heuristic", "heuristic_transient")
"""The schedules that move K each round: + 2 after a round whose every candidate was kept, else − 1 (at least 1).
Within one ``generate()`` call the two agree (the candidate generator copies the draft's config per call)."""


def assisted_counts(match: np.ndarray, top_prob: np.ndarray, k: int, schedule: str = "constant",
                    threshold: float = 0.0, clears: Callable[[float], float] | None = None,
                    max_new_tokens: int | None = None) -> Counts:
    """transformers' assisted generation (``generation/candidate_generator.py``, ``AssistedCandidateGenerator``),
    greedy, along one response of L tokens: ``match[i]``, whether the response's token i is the draft's top token
    at the text before it; ``top_prob[i]``, that token's probability (softmax over the whole vocabulary: what its
    ``ConfidenceCriteria`` reads); ``k``, ``schedule``, ``threshold``: ``num_assistant_tokens``,
    ``num_assistant_tokens_schedule``, ``assistant_confidence_threshold``; ``max_new_tokens`` the call's budget
    (None: L). ``clears(t)``: the chance a drafted token off the trace has probability ≥ t (None: 1).

    One round: the draft generates up to K tokens (the tokens left less one), stopping after a token whose
    probability is below the threshold (that token is still a candidate); its first forward reads two tokens (its
    cache is cut one short of the text); the target reads the last token and the candidates in one forward and
    keeps them up to the first that is not its argmax. With a threshold, each round's probabilities of the drafted
    tokens up to the first rejected and whether each was kept are kept, and from six of them on (both outcomes
    seen) the threshold becomes the one minimising FPR + 3·FNR on their ROC curve (sklearn's ``roc_curve``, as
    transformers calls it). Both the schedule and the threshold move on what lies on the trace only; the tokens
    drafted past the first rejection are expected, as in ``draft_simple_counts``."""
    from sklearn.metrics import roc_curve

    if k < 1:
        raise ValueError(f"num_assistant_tokens must be at least 1, got {k}")
    clears = clears or (lambda t: 1.0)
    length = len(match)
    budget = length if max_new_tokens is None else max_new_tokens
    calls, probs, kept_flags = np.zeros(2), [], []
    forwards = discarded = catch_up = 0.0
    s, rounds = 0, 0
    while s < length:
        cap = min(int(k), budget - s - 1)
        if cap <= 0:  # nothing to draft: the target's own step
            calls = _add(calls, 1, 1.0)
            s += 1
            continue
        drafted, stopped = 0, False
        while True:  # on the trace: up to its first token off it
            drafted += 1
            stopped = threshold > 0 and top_prob[s + drafted - 1] < threshold
            if stopped or drafted == cap or not match[s + drafted - 1] or s + drafted == length:
                break
        kept = drafted if match[s:s + drafted].all() else int(np.argmin(match[s:s + drafted]))
        goes_on = kept < drafted and not stopped and drafted < cap
        tails = _assisted_tail(cap - drafted, clears(threshold)) if goes_on else [(0, 1.0)]
        for extra, chance in tails:
            n = drafted + extra
            forwards += chance * n
            calls = _add(calls, n + 1, chance)
            discarded += chance * (n - kept)
        catch_up += 1.0 if rounds else 0.0  # the first round's draft forward is its prefill
        rounds += 1
        if schedule in HEURISTIC_SCHEDULES:
            k = k + 2 if kept == drafted else max(1, k - 1)
        if threshold > 0:
            probs += list(top_prob[s:s + min(kept + 1, drafted)])
            kept_flags += [1] * kept + ([0] if kept < drafted else [])
            if len(probs) > 5 and 0 in kept_flags and 1 in kept_flags:
                fpr, tpr, cuts = roc_curve(kept_flags, probs)
                threshold = float(cuts[np.argmin(fpr + 3 * (1 - tpr))])
        s += kept + 1
    return Counts(n=length, draft=forwards, target=float(calls.sum()), discarded=discarded, calls=calls,
                  catch_up=catch_up)


def _assisted_tail(room: int, clears: float) -> list[tuple[int, float]]:
    """(tokens drafted past the first rejection, chance) for a draft that may draft ``room`` more: each is a
    candidate, and the one below the threshold is the last."""
    out = [(t, clears ** (t - 1) * (1.0 - clears)) for t in range(1, room)]
    return [o for o in out if o[1] > 0] + [(room, clears ** (room - 1))]


def _add(calls: np.ndarray, tokens: int, chance: float) -> np.ndarray:
    if tokens >= len(calls):
        calls = np.pad(calls, (0, tokens + 1 - len(calls)))
    calls[tokens] += chance
    return calls

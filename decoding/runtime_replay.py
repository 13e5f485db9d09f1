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

from collections.abc import Sequence

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

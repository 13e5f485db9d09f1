"""The traces ``specheads advise`` replays: each labeled response of the target, with what every drafter would
propose along it. A label folder's ``target`` rows give speculative sampling's acceptance chance at each position
(our rules); its stored sequences give the response (prompt lookup's proposals); one read of prompt + response by
the draft, on the backend the labels were made on, gives its top token at each position and the probability the
runtime's own rule reads of it: llama.cpp's draft sampler's, transformers' over the whole vocabulary
(``decoding.runtime_replay``).

The draft's tops are read here rather than stored as label columns: they need the draft's raw logits (the labels
hold the sampling-warped distributions, one-hot under greedy sampling), one read per response costs seconds, and
every label folder of today's schema serves the advice unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from core.errors import UserError
from core.backends import Context, backend_of
from core.identity import check_same_model
from core.models import recorded_model
from core.quantization import prompt_scales
from core.shards import SPLITS
from decoding.backends import open_reader
from decoding.runtime_replay import DRAFT_TOP_K
from decoding.traces import Trace, filled_splits, load_label_traces, responses_by_prompt


@dataclass
class AdviceTrace:
    """One response of the target, as every drafter sees it."""

    prompt: list[int]
    response: list[int]
    trace: Trace
    """Speculative sampling's acceptance along it (``decoding.traces``), for our rules."""
    match: np.ndarray
    """Whether the response's token at each position is the draft's top token at the text before it."""
    top_prob: np.ndarray
    """That top token's probability as the runtime's rule reads it: llama.cpp's draft sampler's (softmax over the top
    ``DRAFT_TOP_K`` logits), transformers' (softmax over the whole vocabulary)."""


def draft_tops(logits: torch.Tensor, response: list[int], top_k: int | None = DRAFT_TOP_K) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """(match, top_prob) of ``AdviceTrace`` from the draft's raw logits (L, V) at each position of ``response``,
    the probability a softmax over the ``top_k`` largest logits (None: over the whole vocabulary) gives."""
    top = logits.float().topk(min(top_k or logits.shape[-1], logits.shape[-1]), dim=-1)
    probs = torch.softmax(top.values, dim=-1)[:, 0]
    return (top.indices[:, 0] == torch.tensor(response)).numpy(), probs.double().numpy()


def load_draft(manifest: dict, run: dict, labels: str | Path, threads: int):
    """The draft of the labels (their ``manifest`` and ``run.json``) on the backend they were made on (llama.cpp on
    ``threads`` threads), checked to be the model they were made with. Each token is computed as a one-token step
    computes it (``step_numerics``): an int8 draft's batched read of a whole response would quantize its activations
    with one scale, and tops that a runtime's steps do not see."""
    made_on = backend_of(manifest["models"]["draft"])
    model, _, identity = made_on.load(recorded_model(run, "draft"), run.get("dtype", "float32"), threads, Context(),
                                      step_numerics=True)
    check_same_model(manifest["models"]["draft"], identity, f"the draft of {labels}")
    return model


def advice_traces(labels: str | Path, draft, top_k: int | None, quiet: bool = False) -> list[AdviceTrace]:
    """Every ``target`` response of the label folder (all its splits: the runtimes' rules train on none of them; a
    head's seen prompts are left out by ``evaluation.advise.unseen_traces``), read
    by ``draft`` (on the labels' backend) for its tops, their probabilities over its ``top_k`` largest logits (None:
    over the whole vocabulary)."""
    responses = responses_by_prompt(labels, SPLITS)
    if not responses:
        raise UserError(f"{labels}: stores no token sequences of `target` responses; label with categories: "
                        "[target]")
    traces = {t.prompt_id: t for t in load_label_traces(labels, tuple(filled_splits(labels, SPLITS)))}
    layers = draft if isinstance(draft, torch.nn.Module) else None  # llama.cpp's model computes alike in a batch
    out = []
    for pid, (prompt, response) in tqdm(sorted(responses.items()), desc="advise: the draft's tops", unit="response",
                                        disable=quiet):
        if pid not in traces or not response:
            continue
        seq = prompt + response
        # the prompt read in one batch, as the runtime's prefill reads it, and each token after it on its own
        with torch.no_grad(), prompt_scales(layers, torch.ones(1, len(seq) - 1), len(prompt)):
            _, logits, _ = open_reader(draft, owner=object()).read(seq[:-1], 0, rows=len(response))
        match, top_prob = draft_tops(logits, response, top_k)
        trace = traces[pid]
        n = min(len(trace), len(response))
        out.append(AdviceTrace(prompt, response[:n], trace, match[:n], top_prob[:n]))
    return out

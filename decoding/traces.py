"""Acceptance traces: what they hold, and the ones a label folder holds (its ``target`` rows).

A trace follows one target-sampled response: at every position i, a candidate Y_i drawn from q at the clean
prefix X<i, with min(1, p/q)(Y_i), the draft's scores of it (log q(Y_i), H(q)) and both draft hidden states a
head may read (the state that produced q, and the state after reading Y_i). The decoder's own traces
(``evaluation.traces``) have the same fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from core.errors import UserError
from core.shards import ShardError, load_split, prompt_digests, read_manifest

if TYPE_CHECKING:
    from decoding.lookup_stop import RoundState

TRACE_CATEGORY = "target"


class TraceError(UserError):
    """A label folder that holds no traces where they were asked for."""


@dataclass
class Trace:
    """One target-sampled response: per position, the candidate's acceptance probability and draft-side features."""

    prompt_id: int
    acceptance: np.ndarray
    """min(1, p/q) of the candidate at each position."""
    logp_draft: np.ndarray
    """log q of the candidate at its prefix."""
    entropy_draft: np.ndarray
    """H(q) at that prefix, nats."""
    hidden: torch.Tensor
    """(L, d) the draft's state after reading the candidate (feature position ``own``)."""
    hidden_prev: torch.Tensor
    """(L, d) the state that produced q for it (``prev``)."""
    candidate: np.ndarray | None = None
    """The candidate's token id at each position (decoder traces only)."""
    prompt_digest: str | None = None
    """``core.identity.prompt_digest`` of the prompt (label traces of a folder that stores its sequences), which a
    head's record of the prompts it has seen is compared with."""
    logits: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """Each replayed head's logits on this trace, by head file (computed once, whatever the threshold)."""

    def __len__(self) -> int:
        return len(self.acceptance)


def load_label_traces(folder: str | Path, splits: tuple[str, ...] = ("val", "test"),
                      prompts: set[int] | None = None) -> list[Trace]:
    """The ``target`` traces of ``splits`` (default the prompts no head trained on), one per prompt; only the
    prompts ``prompts`` when given."""
    columns = ["prompt_id", "position", "category", "loss_mask", "acceptance", "logp_draft", "entropy_draft",
               "hidden", "hidden_prev"]
    traces = []
    for split in filled_splits(folder, splits):
        ds = load_split(folder, split)
        rows = ds.select(trace_row_indices(ds, prompts)).select_columns(columns).with_format("numpy")[:]
        try:
            digests = prompt_digests(folder, split)
        except ShardError:  # labeled without its sequences: its traces cannot be matched to a head's prompts
            digests = {}
        for pid in np.unique(rows["prompt_id"]):
            idx = np.flatnonzero(rows["prompt_id"] == pid)
            idx = idx[np.argsort(rows["position"][idx])]
            traces.append(Trace(
                prompt_id=int(pid), acceptance=rows["acceptance"][idx].astype(np.float64),
                logp_draft=rows["logp_draft"][idx].astype(np.float64),
                entropy_draft=rows["entropy_draft"][idx].astype(np.float64),
                hidden=torch.from_numpy(np.stack(rows["hidden"][idx])),
                hidden_prev=torch.from_numpy(np.stack(rows["hidden_prev"][idx])), prompt_digest=digests.get(int(pid))))
    if not traces and prompts is None:
        raise TraceError(f"{folder} has no {TRACE_CATEGORY!r} rows in {', '.join(splits)}")
    return traces


def load_responses(folder: str | Path, splits: tuple[str, ...],
                   prompts: set[int] | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's response ids) of each of ``prompts`` (None: every prompt) in ``splits``, from the
    sequences a label folder stores (what prompt lookup copies from); none where it stores none."""
    return list(responses_by_prompt(folder, splits, prompts).values())


def round_states(folder: str | Path, splits: tuple[str, ...]) -> dict[int, Callable[[int], RoundState | None]]:
    """For each response a label folder of ``target_states: true`` stores in ``splits``, by prompt id: the target's
    state a prompt-lookup round at each response index starts from (``decoding.lookup_stop.RoundState``; none at
    the first); empty where the folder stores none (``data_gen/SCHEMA.md``)."""
    from core.shards import load_sequences
    from decoding.lookup_stop import RoundState

    width = read_manifest(folder, verify=False)["feature"].get("target_states")
    out = {}
    for split in filled_splits(folder, splits) if width else []:
        for row in load_sequences(folder, split).with_format("numpy"):
            if not len(row["target_top1"]):  # a prompt without a target response
                continue
            hidden = torch.from_numpy(row["target_hidden"].reshape(-1, width).astype(np.float32))
            top1 = row["target_top1"]

            def state(s: int, hidden=hidden, top1=top1) -> RoundState | None:
                return None if s < 1 else RoundState(hidden[s - 1], float(top1[s - 1]))
            out[int(row["prompt_id"])] = state
    return out


def responses_by_prompt(folder: str | Path, splits: tuple[str, ...],
                        prompts: set[int] | None = None) -> dict[int, tuple[list[int], list[int]]]:
    """``load_responses`` by prompt id, in the same order."""
    from core.shards import load_sequences

    out = {}
    for split in filled_splits(folder, splits):
        sequences = load_sequences(folder, split)
        if sequences is not None:  # (not the target states a folder may store: megabytes a response)
            sequences = sequences.select_columns(["prompt_id", "category", "prompt_ids", "response_ids"])
        for row in [] if sequences is None else sequences:
            if row["category"] == TRACE_CATEGORY and (prompts is None or row["prompt_id"] in prompts):
                out[int(row["prompt_id"])] = (list(row["prompt_ids"]), list(row["response_ids"]))
    return out


def unseen(traces: list[Trace], seen: set[str]) -> list[Trace]:
    """The traces of prompts outside ``seen`` (a head's ``heads.export.seen_prompts``); a trace without a digest
    (labels stored without their sequences) cannot be told apart and is kept."""
    return [t for t in traces if t.prompt_digest is None or t.prompt_digest not in seen]


def trace_row_indices(ds, prompts: set[int] | None = None) -> np.ndarray:
    """The indices of a split's rows that make up its traces: its ``target`` rows inside the response (of the
    prompts ``prompts`` when given)."""
    meta = ds.select_columns(["category", "loss_mask", "prompt_id"]).with_format("numpy")[:]
    keep = (meta["category"] == TRACE_CATEGORY) & meta["loss_mask"]
    if prompts is not None:
        keep &= np.isin(meta["prompt_id"], list(prompts))
    return np.flatnonzero(keep)


def trace_rows(folder: str | Path, splits: tuple[str, ...], columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``columns`` of the traces' rows of ``splits``, every prompt's concatenated, without the hidden states a
    ``Trace`` holds: what a fit on the draft's scores reads (``decoding.calibrate``)."""
    parts = []
    for split in filled_splits(folder, splits):
        ds = load_split(folder, split)
        parts.append(ds.select(trace_row_indices(ds)).select_columns(list(columns)).with_format("numpy")[:])
    if not sum(len(part[columns[0]]) for part in parts):
        raise TraceError(f"{folder} has no {TRACE_CATEGORY!r} rows in {', '.join(splits)}")
    return {c: np.concatenate([part[c] for part in parts]).astype(np.float64) for c in columns}


def filled_splits(folder: str | Path, splits: tuple[str, ...]) -> list[str]:
    """The splits of ``splits`` that hold shards in the finished dataset at ``folder`` (whose shards are checked
    against its manifest): a dataset may leave a split empty, as the held-out labels leave train and val."""
    manifest = read_manifest(folder)
    return [split for split in splits if manifest["splits"].get(split, {}).get("shards")]

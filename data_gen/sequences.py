"""A labeled batch's token sequences (``<split>/sequences/``, ``data_gen/SCHEMA.md``): what every row was read from,
and, in a run of ``target_states``, the target's state along each response."""

from __future__ import annotations

import numpy as np
import torch

SEQUENCES = "sequences"
"""The key of a labeled batch's token sequences (``sequences``) beside its row columns."""


def sequences(prompts: list, response: torch.Tensor | None = None, valid: torch.Tensor | None = None,
              mixed: torch.Tensor | None = None, states: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> dict[str, list]:
    """What every row of a batch was read from, one entry per prompt (``data_gen.labeler.Prompt``): the prompt's
    ids, its ``response`` (the target's X, a dataset answer, or the draft's own completion Z for ``draft`` prompts)
    and the token-mixed Z (``target`` and ``interleaved`` prompts), each cut to its ``valid`` tokens. A row at
    ``position`` of category ``original`` reads prompt[:position]; ``draft`` and ``target`` read
    (prompt + response)[:position];
    ``interleaved`` reads (prompt + mixed)[:position]; ``token_mixed`` is labeled at (prompt + response)[:position]
    and read at (prompt + mixed)[:position] (``data_gen/SCHEMA.md``). With ``states`` (a run of
    ``target_states``), the target's state that produced each response token (B, N, d) and its top-1 probability
    there (B, N), as ``target_state_columns`` stores them."""
    def cut(t):
        if t is None:
            return [[] for _ in prompts]
        return [t[b][valid[b]].tolist() for b in range(len(prompts))]

    out = {"prompt_id": [p.prompt_id for p in prompts], "category": [p.category for p in prompts],
           "prompt_ids": [list(p.input_ids) for p in prompts], "response_ids": cut(response),
           "mixed_ids": cut(mixed)}
    return out if states is None else {**out, **target_state_columns(states, valid)}


def target_state_columns(states: tuple[torch.Tensor, torch.Tensor], valid: torch.Tensor) -> dict[str, list]:
    """The sequences' columns of the target's own state along each response (``data_gen/SCHEMA.md``): the hidden
    state (B, N, d) that produced each valid response token, flattened (float16), and the top-1 probability (B, N)
    of the confidence distribution it produced (``label_math.confidence_top1``). Prompt lookup's stop rows read
    the state a round starts from there (``pipeline.lookup_data``)."""
    hidden, top1 = states
    return {"target_hidden": [hidden[b][valid[b]].half().cpu().numpy().reshape(-1) for b in range(len(valid))],
            "target_top1": [top1[b][valid[b]].float().cpu().numpy() for b in range(len(valid))]}


def with_target_states(cols: dict, wanted: bool) -> dict:
    """A labeled batch's columns with the target-state columns of its sequences where the run stores them
    (``target_states``): empty for prompts without a target response, so that every batch's sequences have one
    schema."""
    seqs = cols[SEQUENCES]
    if not wanted or "target_hidden" in seqs:
        return cols
    empty = {"target_hidden": np.zeros(0, np.float16), "target_top1": np.zeros(0, np.float32)}
    return {**cols, SEQUENCES: {**seqs, **{k: [v] * len(seqs["prompt_id"]) for k, v in empty.items()}}}

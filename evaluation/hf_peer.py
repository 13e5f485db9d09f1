"""The external peer: Hugging Face assisted generation, ``target.generate(input_ids, assistant_model=draft)``.

Settings go where transformers reads them, on ``draft.generation_config`` (``num_assistant_tokens``,
``num_assistant_tokens_schedule``, ``assistant_confidence_threshold``), and are restored afterwards. Forward
hooks count the draft's and the target's forward calls, so N_target and N_draft are known; how many drafted
tokens were discarded is not (HF does not expose it), so those columns stay blank.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager

import torch

from core.sampling import Sampling

DEFAULTS = "defaults"


@contextmanager
def _count_forwards(model):
    counter = {"n": 0}

    def hook(module, args, output):
        counter["n"] += 1

    handle = model.register_forward_hook(hook)
    try:
        yield counter
    finally:
        handle.remove()


@contextmanager
def assistant_settings(draft, **settings):
    """Temporarily set assisted-generation fields on the draft's generation config."""
    saved = copy.deepcopy(draft.generation_config)
    try:
        for k, v in settings.items():
            setattr(draft.generation_config, k, v)
        yield
    finally:
        draft.generation_config = saved


def peer_settings(variant: str | float | int, kind: str) -> dict:
    """Generation-config fields of one peer run: ``defaults``, a confidence threshold, or a constant K."""
    if kind == DEFAULTS:
        return {}
    if kind == "confidence":
        return {"assistant_confidence_threshold": float(variant)}
    if kind == "k":
        return {"num_assistant_tokens": int(variant), "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
    raise ValueError(f"unknown peer kind {kind!r}")


@torch.no_grad()
def hf_generate(draft, target, prompt_ids: list[int], sampling: Sampling, eos_token_ids: list[int], seed: int,
                settings: dict | None = None) -> tuple[list[int], dict]:
    """One assisted generation: (generated ids, stats with wall_s, new_tokens, target_calls, draft_calls)."""
    device = next(target.parameters()).device
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    greedy = sampling.temperature == 0
    kw = dict(max_new_tokens=sampling.max_new_tokens, do_sample=not greedy, eos_token_id=eos_token_ids,
              pad_token_id=eos_token_ids[0], attention_mask=torch.ones_like(ids))
    if not greedy:
        kw.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    else:
        kw.update(temperature=None, top_k=None, top_p=None)
    torch.manual_seed(seed)  # HF samples from the global generator
    with assistant_settings(draft, **(settings or {})), _count_forwards(target) as nt, _count_forwards(draft) as nd:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        out = target.generate(ids, assistant_model=draft, **kw)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t
    tokens = out[0, ids.shape[1]:].tolist()
    stats = {"wall_s": wall, "new_tokens": len(tokens), "target_calls": nt["n"], "draft_calls": nd["n"],
             "discarded": None, "accepted_lengths": None}
    return tokens, stats

"""The target's mean log-likelihood per token of each run's output: a quality metric with power.

An exact policy samples the target's distribution, so its outputs score, in expectation, what target-only's do.
An approximate one (SPRINTER, Fuzzy SD, draft-only) keeps draft tokens the target would not have produced as
often; SPRINTER Theorem 1 bounds how far its output distribution drifts from p (η_FP·TV(p, q)). The target's
log-likelihood of the tokens a policy produced, log p(y_i | prompt, y_<i) averaged over the response, measures
that drift on every token, where pass@1 gives one bit per prompt.

One target forward over prompt + response per record (temperature 1: the model's own distribution, whatever
the mode sampled with), untimed, after the runs. The scores live beside ``results.jsonl`` in ``loglik.jsonl``, a
``ResultStore`` of one line per (mode, run, prompt) with the sha256 of the tokens scored, so an interrupted
scoring resumes and a score never attaches to other tokens than its own.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Callable

import torch

from decoding.backends import keeps_own_cache
from evaluation.results import ResultStore, record_key
from evaluation.rundir import RunDir


@torch.no_grad()
def mean_loglik(model, prompt_ids: list[int], tokens: list[int]) -> float:
    """Mean over ``tokens`` of log p(token | prompt, earlier tokens) under ``model`` (one forward)."""
    if not tokens:
        raise ValueError("no tokens to score")
    if keeps_own_cache(model):  # its rows after each prefix of prompt + tokens[:-1]
        model.reset()
        logits = model.read(list(prompt_ids) + list(tokens[:-1]), rows=len(tokens))[1]
        return float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).mean())
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(tokens)], device=device)
    logits = model(ids, use_cache=False).logits[0, len(prompt_ids) - 1: -1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt_ids):, None])
    return float(logp.mean())


def tokens_sha256(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps([int(t) for t in tokens]).encode()).hexdigest()


def score_records(out: Path, records: list[dict], prompt_ids: dict[int, list[int]],
                  loglik: Callable[[list[int], list[int]], float], quiet: bool = False) -> int:
    """Score every record with tokens that ``loglik.jsonl`` lacks (or holds for other tokens); return how many."""
    from tqdm.auto import tqdm

    scores = ResultStore(RunDir(out).claim(RunDir(out).loglik))
    todo = [r for r in records if r["tokens"] and
            (scores.get(record_key(r)) or {}).get("tokens_sha256") != tokens_sha256(r["tokens"])]
    for r in tqdm(todo, desc="target log-likelihood", disable=quiet, file=sys.stderr):
        value = loglik(prompt_ids[int(r["prompt"])], r["tokens"])
        scores.add({"mode": r["mode"], "run": r["run"], "prompt": int(r["prompt"]),
                    "tokens_sha256": tokens_sha256(r["tokens"]), "loglik": value})
    return len(todo)


def attach_scores(out: Path, records: list[dict]) -> list[dict]:
    """The records, each with ``target_loglik`` from ``loglik.jsonl`` when it holds a score of its tokens."""
    scores = ResultStore(RunDir(out).loglik)
    attached = []
    for r in records:
        row = scores.get(record_key(r))
        ok = row is not None and r["tokens"] and row["tokens_sha256"] == tokens_sha256(r["tokens"])
        attached.append({**r, "target_loglik": row["loglik"] if ok else None})
    return attached

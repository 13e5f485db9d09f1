"""Acceptance traces for the trace simulator (``evaluation.simulate``): what they hold, where they come from.

What a trace holds is ``decoding.traces.Trace``. Two sources:

- **label traces** (``decoding.traces.load_label_traces``): the label shards' ``target`` rows (a quarter of the
  labeled prompts, every split). They cover the whole labeled set, so ``make eval`` chooses thresholds on them;
  their draft side was computed in batched, left-padded forwards with the decoder's int8 numerics
  (``core.quantization.decode_numerics``), equal to its one-token steps up to rounding (``core/DESIGN.md``).
- **decoder traces** (``record_trace``): the evaluation's own target-only responses replayed through the decoder's
  cached forwards, one token per draft forward as the decoder reads them, on the prompts the policies decoded.
  They check the simulator against the measured runs on the very forwards the decoder ran. ``make eval`` records
  them after its runs (untimed) under ``traces/<mode>/`` in its output folder, one safetensors file per prompt.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from core.errors import UserError
from core.label_math import acceptance_probability, entropy
from core.sampling import Sampling, sample_token
from decoding.traces import Trace
from evaluation.rundir import RunDir

UNWARPED = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
"""The sampling a decoder trace is recorded at: p and q as the models give them."""


@torch.no_grad()
def record_trace(draft, target, prompt_ids: list[int], tokens: list[int], generator: torch.Generator,
                 prompt_id: int) -> Trace:
    """The trace of ``tokens`` (a target-sampled response to ``prompt_ids``): one target forward gives p at every
    position; the draft reads the response one token per forward through the decoder's ``CachedLM``, draws a
    candidate from each q (temperature 1, as the labels), and reads the candidate too (its own state), then
    returns to the response token: 2 draft forwards per position."""
    from decoding.backends import CachedLM

    if not tokens:
        raise ValueError("no tokens to trace")
    unwarped = Sampling(**UNWARPED)
    d, t = CachedLM(draft, unwarped), CachedLM(target, unwarped)
    seq = list(prompt_ids)
    _, logp = t.advance(seq + list(tokens[:-1]), rows=len(tokens))
    hidden, logq = d.advance(seq)
    rows = {k: [] for k in ("candidate", "acceptance", "logp_draft", "entropy_draft", "hidden", "hidden_prev")}
    for i, token in enumerate(tokens):
        q = logq[-1]
        y = sample_token(q, generator)
        own, _ = d.advance(seq + [y])
        rows["candidate"].append(y)
        rows["acceptance"].append(float(acceptance_probability(q[y], logp[i, y])))
        rows["logp_draft"].append(float(q[y]))
        rows["entropy_draft"].append(float(entropy(q)))
        rows["hidden"].append(own[-1].float().cpu())
        rows["hidden_prev"].append(hidden[-1].float().cpu())
        seq.append(int(token))
        hidden, logq = d.advance(seq)
    return Trace(prompt_id=prompt_id, acceptance=np.array(rows["acceptance"]),
                 logp_draft=np.array(rows["logp_draft"]), entropy_draft=np.array(rows["entropy_draft"]),
                 hidden=torch.stack(rows["hidden"]), hidden_prev=torch.stack(rows["hidden_prev"]),
                 candidate=np.array(rows["candidate"], dtype=np.int64))


def write_trace(path: Path, trace: Trace, tokens_sha256: str) -> None:
    """One trace as safetensors (written under a temporary name, then renamed), tagged with its tokens' digest."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"acceptance": torch.from_numpy(trace.acceptance), "logp_draft": torch.from_numpy(trace.logp_draft),
               "entropy_draft": torch.from_numpy(trace.entropy_draft), "hidden": trace.hidden.contiguous(),
               "hidden_prev": trace.hidden_prev.contiguous()}
    if trace.candidate is not None:
        tensors["candidate"] = torch.from_numpy(trace.candidate)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"prompt_id": str(trace.prompt_id), "tokens_sha256": tokens_sha256})
    os.replace(tmp, path)


def trace_digest(path: Path) -> str | None:
    """The tokens digest a recorded trace was made from (None when the file is missing or unreadable, or cut short:
    a damaged trace is recorded again, as a missing one is)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return f.metadata().get("tokens_sha256")
    except (OSError, ValueError, RuntimeError, SafetensorError):
        return None


def read_recorded(out: str | Path, mode: str) -> list[Trace]:
    """The decoder traces an evaluation recorded in ``mode`` (``traces/<mode>/*.safetensors``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    traces = []
    for path in RunDir(out).recorded_traces(mode):
        try:
            x = load_file(str(path))
        except (OSError, SafetensorError) as e:
            raise UserError(f"{path}: not a whole decoder trace ({e}); run the evaluation again: it records a "
                            "damaged trace again") from None
        traces.append(Trace(prompt_id=int(path.stem), acceptance=x["acceptance"].numpy(),
                            logp_draft=x["logp_draft"].numpy(), entropy_draft=x["entropy_draft"].numpy(),
                            hidden=x["hidden"], hidden_prev=x["hidden_prev"], candidate=x["candidate"].numpy() if "candidate" in x else None))
    return traces


def record_traces(out: str | Path, mode: str, records: list[dict], prompt_ids: dict[int, list[int]], record,
                  generator_of, quiet: bool = False) -> int:
    """Record the decoder trace of every target-only response of ``mode`` in ``records`` that ``out`` lacks (or
    holds for other tokens); ``record(ids, tokens, generator, prompt)`` is ``record_trace`` bound to the pair.
    Returns how many were recorded."""
    from tqdm.auto import tqdm

    from evaluation.likelihood import tokens_sha256

    todo = [r for r in records if r["mode"] == mode and r["family"] == "target_only" and r["tokens"]
            and trace_digest(RunDir(out).trace(mode, int(r["prompt"]))) != tokens_sha256(r["tokens"])]
    for r in tqdm(todo, desc=f"decoder traces [{mode}]", disable=quiet or not todo):
        prompt = int(r["prompt"])
        trace = record(prompt_ids[prompt], r["tokens"], generator_of(prompt), prompt)
        write_trace(RunDir(out).claim(RunDir(out).trace(mode, prompt)), trace, tokens_sha256(r["tokens"]))
    return len(todo)

"""Recompute label rows from the dataset alone and compare every column.

    python -m data_gen.audit LABEL_DIR [--rows 200] [--seed 0] [--access plain|decoder]   (make audit LABELS=…)

The labeler reads many prompts at once: left padding, 4D masks that let candidates see only their own prefix, KV
caches cropped and reused. The audit reads each chosen row the plainest way there is, one unpadded sequence per
forward with no cache and no mask, from the token sequences stored beside the shards (``sequences/``), with the
models and settings of ``run.json``, and compares every column. It prints the worst difference of each column and
exits 1 when one is past its tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from core import label_math as lm
from core.adapter import tap
from core.errors import UserError
from core.models import ModelSpec, load_model
from core.quantization import decode_numerics, prompt_scales
from core.sampling import Sampling
from core.shards import FLOAT_COLUMNS, SPLITS, load_sequences, load_split, read_manifest, shard_paths, vector_sizes
from data_gen.labeler import MAX_ROUND_INDEX

VECTOR_COLUMNS = tuple(vector_sizes(1, 1))
"""The vector columns, compared relative to 1 + |value|."""

TOLERANCES = {
    **{c: 2e-3 for c in FLOAT_COLUMNS},
    "ratio": 2e-3,  # compared as log q/p: the ratio itself spans many orders of magnitude
    "hidden": 2e-3,
    "hidden_prev": 2e-3,
    "hidden_layers": 2e-3,
    "hidden_layers_prev": 2e-3,
    "stale_hidden_target": 2e-3,
    "greedy_match": 0.0,
    "response_index": 0.0,
    "round_index": 0.0,
}
"""Largest allowed difference per column between the labeled and the recomputed value: |a − b| for the scores
(float32 kernels on batched and unbatched inputs differ by ~1e-5 in log space), |a − b| / (1 + |b|) for the hidden
states, stored in float16 (a relative step of 2^-11 ≈ 5e-4)."""


@dataclass
class Contexts:
    """What one row reads: the label's prefix (both models' distributions), the features' prefix, the token."""

    label: list[int]
    features: list[int]
    token: int
    prompt_length: int


def contexts(row: dict, seq: dict) -> Contexts:
    """A row's prefixes from its prompt's stored sequences (``data_gen.labeler.sequences``)."""
    prompt, response, mixed = seq["prompt_ids"], seq["response_ids"], seq["mixed_ids"]
    pos, category = int(row["position"]), row["category"]
    if category == "original":
        label = features = prompt[:pos]
    elif category in ("draft", "target"):
        label = features = (prompt + response)[:pos]
    elif category == "interleaved":
        label = features = (prompt + mixed)[:pos]
    elif category == lm.TOKEN_MIXED:
        label, features = (prompt + response)[:pos], (prompt + mixed)[:pos]
    else:
        raise UserError(f"row of unknown category {category!r}")
    return Contexts(label, features, int(row["token_id"]), len(prompt))


ACCESS = ("plain", "decoder")
"""How the audit reads a sequence. Both read the row's whole prompt in one forward, as labeling and the decoder's
prefill read it, and the tokens after it (or after the part of it the sequence shares) from the KV cache: ``plain``
in one more forward, an int8 model with the labeler's numerics (``core.quantization.decode_numerics``, which
``Reader`` applies to the model it is given); ``decoder`` one token per forward, an int8 model through PyTorch's own
int8 kernels, as the evaluation's decoder reads. The two agree for float weights; for an int8 model ``decoder``
measures how far the labeled features are from what decoding reads."""


class Reader:
    """Reads one unpadded sequence per call: the last positions' normed hidden states, logits and the outputs of the
    tapped layers."""

    def __init__(self, model, access: str = "plain", layers: tuple[int, ...] = ()):
        if access not in ACCESS:
            raise UserError(f"unknown access {access!r}; choose one of {', '.join(ACCESS)}")
        self.model = decode_numerics(model) if access == "plain" else model
        self.base = self.model.get_decoder()
        self.access, self.layers = access, tuple(layers)

    @torch.inference_mode()
    def __call__(self, ids: list[int], last: int, prompt: list[int]) -> tuple[torch.Tensor, ...]:
        """The last ``last`` positions of ``ids``, a sequence that starts with the row's ``prompt`` or a part of it."""
        shared = next((i for i, (a, b) in enumerate(zip(ids, prompt)) if a != b), min(len(ids), len(prompt)))
        with prompt_scales(self.model, torch.ones(1, len(prompt), dtype=torch.long), len(prompt)):
            out = self.base(input_ids=torch.tensor([prompt]), use_cache=True, output_hidden_states=True)
        hidden, taps = [out.last_hidden_state[0, :shared]], [tap(out.hidden_states, self.layers)[0, :shared]]
        cache = out.past_key_values
        if shared < len(prompt):
            cache.crop(shared - len(prompt))  # a negative count removes that many tokens from the end
        rest = ids[shared:]
        for chunk in ([rest] if self.access == "plain" else [[t] for t in rest]) if rest else []:
            out = self.base(input_ids=torch.tensor([chunk]), past_key_values=cache, use_cache=True,
                            output_hidden_states=True)
            cache = out.past_key_values
            hidden.append(out.last_hidden_state[0])
            taps.append(tap(out.hidden_states, self.layers)[0])
        hidden, taps = torch.cat(hidden)[-last:].float(), torch.cat(taps)[-last:]
        head = self.model.get_output_embeddings()  # per position, as the decoder computes one distribution a call
        return hidden, torch.cat([head(h.unsqueeze(0)) for h in hidden]).float(), taps


def recompute(row: dict, seq: dict, draft: Reader, target: Reader, sampling: Sampling) -> dict:
    """Every column of one row, read the plain way."""
    ctx = contexts(row, seq)

    def warp(logits):
        return lm.warp_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)

    token = torch.tensor(ctx.token)
    _, q_logits, _ = draft(ctx.label, 1, seq["prompt_ids"])
    _, p_logits, _ = target(ctx.label, 1, seq["prompt_ids"])
    out = {k: v.item() if v.dim() == 0 else v for k, v in lm.token_stats(warp(q_logits[0]), warp(p_logits[0]),
                                                                         token).items()}
    hidden, logits, taps = draft(ctx.features + [ctx.token], 2, seq["prompt_ids"])
    read = warp(logits[0])
    out.update(hidden=hidden[1].numpy(), hidden_prev=hidden[0].numpy(), hidden_layers=taps[1].numpy(),
               hidden_layers_prev=taps[0].numpy(), read_logp_draft=read[ctx.token].item(),
               read_entropy_draft=lm.entropy(read).item(), read_margin_draft=lm.top2_margin(read).item(),
               response_index=len(ctx.label) - ctx.prompt_length)
    # the target's last call: round_index positions back on the label's prefix (its drawn value is taken as stored)
    k = int(row["round_index"])
    drawable = (k == 0) if len(ctx.label) == 1 else 1 <= k <= min(MAX_ROUND_INDEX, len(ctx.label) - 1)
    out["round_index"] = k if drawable else -1  # a k the labeler cannot draw is a mismatch of the column
    if k == 0:  # no earlier target state (a row at the prompt's second token)
        out.update(stale_hidden_target=np.zeros_like(row["stale_hidden_target"]), stale_entropy_target=0.0,
                   stale_top1_target=0.0)
        return out
    stale_hidden, stale_logits, _ = target(ctx.label[: len(ctx.label) - k], 1, seq["prompt_ids"])
    stale = warp(stale_logits[0])
    out.update(stale_hidden_target=stale_hidden[0].numpy(), stale_entropy_target=lm.entropy(stale).item(),
               stale_top1_target=stale.max().exp().item())
    return out


def differences(row: dict, again: dict) -> dict[str, float]:
    """Stored against recomputed, per column (``TOLERANCES``'s measure; hidden states: the largest element; the
    ratio in log space)."""
    diff = {}
    for col in TOLERANCES:
        a, b = np.asarray(row[col], np.float64), np.asarray(again[col], np.float64)
        if col == "ratio":  # q/p is infinite where p = 0: equal when both are
            a, b = np.log(np.maximum(a, 1e-30)), np.log(np.maximum(b, 1e-30))
        scale = 1 + np.abs(b) if col in VECTOR_COLUMNS else 1.0
        diff[col] = 0.0 if np.array_equal(a, b) else float(np.max(np.abs(a - b) / scale))
    return diff


def audit(folder: str | Path, rows: int = 200, seed: int = 0, access: str = "plain", quiet: bool = False) -> dict:
    """Recompute ``rows`` random rows of every split, reading each prefix as ``access`` says; return each column's
    worst difference and whether it passes."""
    folder = Path(folder)
    manifest = read_manifest(folder)  # the shards are the ones the manifest lists
    seqs = load_sequences(folder)
    if seqs is None:
        raise UserError(f"{folder} stores no token sequences (labeled by an older version); label again to audit it")
    by_prompt = {int(p): i for i, p in enumerate(seqs["prompt_id"])}
    settings = json.loads((folder / "run.json").read_text())
    models = []
    for role in ("draft", "target"):
        model, _, identity = load_model(ModelSpec(**settings[role]), settings["dtype"])
        recorded = settings.get("inputs", {}).get(role, {})
        changed = [k for k, v in recorded.items() if identity.get(k) != v]
        if changed:
            raise UserError(f"the {role} at {settings[role]} is not the one {folder} was labeled with "
                            f"({', '.join(changed)} changed)")
        models.append(Reader(model, access, manifest["feature"]["tapped_layers"] if role == "draft" else ()))
    sampling = Sampling(**settings["sampling"])
    rng = np.random.default_rng(seed)
    chosen = []
    for split in SPLITS:
        if not shard_paths(folder, split):
            continue
        ds = load_split(folder, split)
        chosen += [ds[int(i)] for i in rng.choice(len(ds), size=min(rows, len(ds)), replace=False)]
    worst = {c: (0.0, None) for c in TOLERANCES}
    past = dict.fromkeys(TOLERANCES, 0)
    for row in tqdm(chosen, desc="audit", disable=quiet):
        diff = differences(row, recompute(row, seqs[by_prompt[int(row["prompt_id"])]], *models, sampling))
        for col, d in diff.items():
            past[col] += d > TOLERANCES[col]
            if d > worst[col][0]:
                worst[col] = (d, f"prompt {row['prompt_id']} {row['category']} position {row['position']}")
    report = {col: {"worst_diff": d, "tolerance": TOLERANCES[col], "ok": d <= TOLERANCES[col], "worst_row": where,
                    "rows_past": past[col]} for col, (d, where) in worst.items()}
    return {"rows": len(chosen), "columns": report, "ok": all(r["ok"] for r in report.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_gen.audit", description=__doc__.split("\n\n")[0])
    p.add_argument("labels", help="a label folder written by `python -m data_gen`")
    p.add_argument("--rows", type=int, default=200, help="rows drawn from each split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--access", choices=ACCESS, default="plain",
                   help="plain: the prompt, then the rest in one forward, with the labeler's numerics; decoder: the prompt, "
                        "then one token per forward, as decoding")
    a = p.parse_args(argv)
    try:
        result = audit(a.labels, a.rows, a.seed, a.access)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = result["rows"]
    print(f"{'column':<20} {'worst diff':>13} {'tolerance':>10} {'rows past':>10}  worst row   "
          f"(hidden: relative to 1 + |value|)")
    for col, r in result["columns"].items():
        flag = "" if r["ok"] else "  PAST TOLERANCE"
        past = f"{r['rows_past']}/{n}"
        print(f"{col:<20} {r['worst_diff']:>13.3g} {r['tolerance']:>10.3g} {past:>10}  {r['worst_row'] or '-'}{flag}")
    print(f"{result['rows']} rows recomputed: {'all columns within tolerance' if result['ok'] else 'MISMATCH'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Recompute label rows from the dataset alone and compare every column.

    python -m data_gen.audit LABEL_DIR [--rows 200] [--seed 0] [--access plain|decoder]   (make audit LABELS=…)

The labeler reads many prompts at once: left padding, 4D masks that let candidates see only their own prefix, KV
caches cropped and reused. The audit checks every row's place and the columns its prompt's random draws fix
exactly, then reads each chosen row the plainest way there is, one unpadded sequence with no mask, from the token
sequences stored beside the shards (``sequences/``), with the models and settings of ``run.json``, and judges each
column's per-row differences against a tolerance from the models' numerics (``judge``; ``data_gen/SCHEMA.md``, "The
audit"). It prints each column's median and worst difference and exits 1 when a column fails.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binom
from tqdm import tqdm

from core import label_math as lm
from core.adapter import tap
from core.arguments import CommandParser, path_argument, resolve_paths
from core.errors import UserError
from core.models import DTYPES, load_model
from core.quantization import decode_numerics, prompt_scales
from core.runfolder import read_json
from core.sampling import Sampling, prompt_generator
from core.shards import (FLOAT_COLUMNS, SPLITS, load_sequences, load_split, read_manifest, shard_paths,
                         vector_sizes)
from data_gen.config import recorded_model
from data_gen.labeler import MAX_ROUND_INDEX, U_C, U_MIX, U_STALE, U_X, U_Y

VECTOR_COLUMNS = tuple(vector_sizes(1, 1))
"""The vector columns, compared by the norm of the difference relative to the recomputed vector's norm: a head's
linear read of them changes by at most that share."""

DRAFT_COLUMNS = ("logp_draft", "entropy_draft", "read_logp_draft", "read_entropy_draft", "read_margin_draft", "hidden",
                 "hidden_prev", "hidden_layers", "hidden_layers_prev")
TARGET_COLUMNS = ("logp_target", "entropy_target", "stale_entropy_target", "stale_top1_target", "stale_hidden_target")
"""Columns read from one model; the others (acceptance, ratio, tv, js, greedy_match, the drawn token) from both."""

FLOAT32_TOLERANCE = 2e-3
"""The tolerance of a pair read in float32: kernels on batched and unbatched inputs differ by ~1e-5 in log space,
and hidden states are stored in float16 (a relative step of 2^-11 ≈ 5e-4)."""

ROUNDING_UNITS = 4
"""A column's tolerance in units of its models' unit roundoff u (``unit_roundoff``): each of the two readings
rounds what it computes (2u), and a log-softmax can double a difference of the logits (4u). See SCHEMA.md, "The
audit's pass rule"."""

FAR = 32
FAR_SHARE = 0.01
"""Rounding differences grow through the layers and cross decision boundaries (an int8 activation's rounding
step, a near tie at a top-p cut) on some rows, by up to ~16τ on the real int8/bf16 pair; a row past ``FAR`` times
the tolerance is not rounding unless it is rare (at most a share ``FAR_SHARE``): a reading of another prefix, token
or model moves a row by O(1)."""

PAST_SHARE = 0.5
"""Rounding moves a row past its column's tolerance on a minority of rows (the real int8/bf16 pair: 2–32 % of rows
per column); a reading of another prefix, token or model moves nearly every row past it."""

SIGNIFICANCE = 1e-3
"""A column fails when so many rows are past its tolerance that a share of ``PAST_SHARE`` would give that many with
probability below this, or so many past ``FAR`` times it that a share of ``FAR_SHARE`` would (binomial tails)."""

MIN_ROWS = 10
"""Recomputed rows below which the rule cannot fail a reader that moves every row past the tolerance (ten of ten
rows past it happen with probability 2^-10 < ``SIGNIFICANCE`` under ``PAST_SHARE``): fewer are refused."""

EXACT_COLUMNS = ("prompt_id", "category", "position", "loss_mask", "token_id", "response_index", "round_index")
"""Columns the sequences and the prompt's random draws fix whatever the numerics: any difference fails."""

PLACE = ("prompt_id", "category", "position")
"""The exact columns that say where a row sits; the others are compared where the row's place fixes them."""

DISCRETE_COLUMNS = ("greedy_match",)
"""0/1 per row (argmax q == argmax p), judged by the share of rows that differ: a near tie of two tokens flips
under rounding."""

DRAW_COLUMN = "token_draw"
"""The stored token against the prompt's uniform and the recomputed distribution it was drawn from: the probability
mass between the uniform and the stored token's interval of the recomputed CDF (``draw_gap``), 0 when the uniform
draws it. Every CDF value of two distributions differs by at most their total variation, so a correct row's gap is
at most the TV between the labeler's and the audit's readings: it is judged like a probability (``tv``'s
tolerance), while a token drawn from another distribution lands O(1) away on many rows."""

INT8_ROUNDOFF = 2.0 ** -7
"""Half a quantization step of an int8 activation (0..127 over the token's range) relative to its largest
magnitude."""


def unit_roundoff(identity: dict) -> float:
    """u of the numerics a model is read with: half the machine epsilon of its dtype, or of its int8 activations."""
    if quantized(identity):
        return INT8_ROUNDOFF
    return float(torch.finfo(DTYPES[identity["dtype"]]).eps) / 2


def quantized(identity: dict) -> bool:
    return identity.get("quantization", "none") != "none"


def tolerances(draft: dict, target: dict, sizes: dict[str, int]) -> dict[str, float]:
    """Each compared column's tolerance for the models of these identities (``core.models.load_model``) and vector
    columns of these lengths: ``ROUNDING_UNITS`` u for a score, and for a vector read in a float dtype, whose
    elements each round relative to themselves; a vector read from an int8 model rounds every element by up to
    half a step of its token's range (about u times its largest element, which carries its norm), so the
    difference's norm reaches u·√d of the vector's."""
    def tol(col):
        model = draft if col in DRAFT_COLUMNS else target if col in TARGET_COLUMNS else None
        u = unit_roundoff(model) if model else max(unit_roundoff(draft), unit_roundoff(target))
        if col in VECTOR_COLUMNS and quantized(model):
            return max(FLOAT32_TOLERANCE, u * math.sqrt(sizes[col]))
        return max(FLOAT32_TOLERANCE, ROUNDING_UNITS * u)

    out = {c: tol(c) for c in (*FLOAT_COLUMNS, *VECTOR_COLUMNS)}
    return {**out, DRAW_COLUMN: out["tv"], **dict.fromkeys(DISCRETE_COLUMNS, 0.0)}


def judge(diffs: np.ndarray, tolerance: float) -> dict:
    """Whether per-row differences are rounding: no more rows past ``tolerance`` than a share of ``PAST_SHARE``, and
    no more past ``FAR`` times it than a share of ``FAR_SHARE``, make plausible (each a binomial tail at
    ``SIGNIFICANCE``). A 0/1 column (tolerance 0, ``greedy_match``) has no far rows: the first test alone."""
    n, past, far = len(diffs), int((diffs > tolerance).sum()), int((diffs > FAR * tolerance).sum()) if tolerance else 0

    def plausible(count: int, share: float) -> bool:  # P(at least `count` of n rows) under that share
        return count == 0 or float(binom.sf(count - 1, n, share)) >= SIGNIFICANCE

    return {"median_diff": float(np.median(diffs)) if n else 0.0, "worst_diff": float(diffs.max()) if n else 0.0,
            "tolerance": tolerance, "rows_past": past, "rows_far": far, "rows": n,
            "ok": plausible(past, PAST_SHARE) and plausible(far, FAR_SHARE)}


PROMPT_ROWS = {"original": {"original"}, "draft": {"draft"}, "target": {"target", lm.TOKEN_MIXED},
               "interleaved": {"interleaved", lm.TOKEN_MIXED}}
"""The row categories a prompt of each category gives (``data_gen.labeler``)."""


@dataclass
class Contexts:
    """What one row reads: the label's prefix (both models' distributions), the features' prefix, the token, and
    the index of the prompt's random draws the row used."""

    label: list[int]
    features: list[int]
    token: int
    prompt_length: int
    draw: int


def misplaced(row: dict, seq: dict, max_new_tokens: int) -> str | None:
    """Why a row cannot sit where its ``category`` and ``position`` put it in its prompt's sequences, or None."""
    pos, category, n_prompt = int(row["position"]), row["category"], len(seq["prompt_ids"])
    if category not in PROMPT_ROWS.get(seq["category"], ()):
        return "category"
    if category == "original":  # the last rows of the prompt, each read after at least one token
        return None if 1 <= pos < n_prompt and n_prompt - 1 - pos < max_new_tokens else "position"
    end = n_prompt + len(seq["mixed_ids"] if category in ("interleaved", lm.TOKEN_MIXED) else seq["response_ids"])
    return None if n_prompt <= pos < end else "position"


def contexts(row: dict, seq: dict) -> Contexts:
    """A row's prefixes from its prompt's stored sequences (``data_gen.labeler.sequences``)."""
    prompt, response, mixed = seq["prompt_ids"], seq["response_ids"], seq["mixed_ids"]
    pos, category = int(row["position"]), row["category"]
    # an original row's draws are indexed by its distance from the prompt's end, a response row's by its index
    draw = len(prompt) - 1 - pos if category == "original" else pos - len(prompt)
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
    return Contexts(label, features, int(row["token_id"]), len(prompt), draw)


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
        self._prompt: tuple | None = None  # the last prompt read: (its ids, hidden states, taps, KV cache)

    def _read_prompt(self, prompt: list[int]):
        """The prompt's forward, kept for the next call on the same prompt (a row reads its prompt 2–3 times)."""
        if self._prompt is None or self._prompt[0] != prompt:
            with prompt_scales(self.model, torch.ones(1, len(prompt), dtype=torch.long), len(prompt)):
                out = self.base(input_ids=torch.tensor([prompt]), use_cache=True, output_hidden_states=True)
            self._prompt = (list(prompt), out.last_hidden_state[0], tap(out.hidden_states, self.layers)[0],
                            out.past_key_values)
        _, hidden, taps, cache = self._prompt
        return hidden, taps, copy.deepcopy(cache)  # the caller extends and crops its copy

    @torch.inference_mode()
    def __call__(self, ids: list[int], last: int, prompt: list[int]) -> tuple[torch.Tensor, ...]:
        """The last ``last`` positions of ``ids``, a sequence that starts with the row's ``prompt`` or a part of it."""
        shared = next((i for i, (a, b) in enumerate(zip(ids, prompt)) if a != b), min(len(ids), len(prompt)))
        prompt_hidden, prompt_taps, cache = self._read_prompt(prompt)
        hidden, taps = [prompt_hidden[:shared]], [prompt_taps[:shared]]
        if shared < len(prompt):
            cache.crop(shared - len(prompt))  # a negative count removes that many tokens from the end
        rest = ids[shared:]
        for chunk in ([rest] if self.access == "plain" else [[t] for t in rest]) if rest else []:
            out = self.base(input_ids=torch.tensor([chunk]), past_key_values=cache, use_cache=True,
                            output_hidden_states=True)
            cache = out.past_key_values
            hidden.append(out.last_hidden_state[0])
            taps.append(tap(out.hidden_states, self.layers)[0])
        hidden, taps = torch.cat(hidden)[-last:], torch.cat(taps)[-last:]
        head = self.model.get_output_embeddings()  # per position, as the decoder computes one distribution a call
        # the head reads the hidden states in the model's dtype (bfloat16 under `dtype: auto` on a bf16 CPU), as
        # the labeler and the decoder do; only the results are widened
        return hidden.float(), torch.cat([head(h.unsqueeze(0)) for h in hidden]).float(), taps


@dataclass
class Labeling:
    """What a row's random draws depend on besides its prompt: the run's settings (``run.json``)."""

    seed: int
    max_new_tokens: int
    mixing_ratio: float
    sampled_response: bool
    """The target's responses were sampled (``response_source: target``), not teacher-forced answers."""

    def draws(self, prompt_id: int) -> torch.Tensor:
        """The prompt's uniforms, (5, max_new_tokens), as ``Labeler.label`` draws them."""
        g = prompt_generator(self.seed, prompt_id)
        return torch.rand(5, self.max_new_tokens, generator=g, dtype=torch.float64)


def fixed(row: dict, seq: dict, u: torch.Tensor, labeling: Labeling) -> dict:
    """The columns a row's place and its prompt's draws ``u`` fix, without a model: ``response_index``,
    ``round_index``, ``loss_mask``, the ``token_id`` of rows whose token is in the sequences; and which of the
    label prefix's distributions (``q``, ``p`` or None) the token was drawn from, with which uniform."""
    ctx = contexts(row, seq)
    i = ctx.draw
    # the target's last call: round_index positions back, drawn uniform on 1..MAX_ROUND_INDEX, cut so that it stays
    # inside the sequence (0 at the prompt's second token: no earlier target state)
    out = {"response_index": len(ctx.label) - ctx.prompt_length, "loss_mask": True, "draw": ("q", U_Y, i),
           "round_index": max(0, min(int(u[U_STALE, i] * MAX_ROUND_INDEX) + 1, len(ctx.label) - 1))}
    if row["category"] == "interleaved":
        out["draw"] = ("q", U_C, i)
    elif row["category"] == "draft":
        out["token_id"] = seq["response_ids"][i]  # Z_i, the draft's own completion
    elif row["category"] == lm.TOKEN_MIXED:
        from_target = bool(lm.mixing_mask(u[U_MIX, i], labeling.mixing_ratio))
        out["loss_mask"] = not from_target  # a target token is no draft sample
        out["token_id"] = seq["mixed_ids"][i]  # Z_i: X_i where the mixing took the target's token, else Y_i
        if from_target:  # X_i, drawn from p unless it is a teacher-forced answer
            out["draw"] = ("p", U_X, i) if labeling.sampled_response else None
    return out


def draw_gap(logprobs: torch.Tensor, u: float, token: int) -> float:
    """How much probability mass of ``logprobs`` lies between the uniform ``u`` and ``token``'s interval of its CDF
    (``lm.sample_from_logprobs`` draws ``token`` from ``u`` exactly when this is 0): a lower bound on the total
    variation between ``logprobs`` and any distribution that draws ``token`` from ``u``."""
    cdf = logprobs.double().exp().cumsum(-1)
    cdf = cdf / cdf[-1]
    lo, hi = (float(cdf[token - 1]) if token else 0.0), float(cdf[token])
    return max(lo - u, u - hi, 0.0)


def recompute(row: dict, seq: dict, draft: Reader, target: Reader, sampling: Sampling,
              draw: tuple | None = None) -> dict:
    """Every column of one row that the models give, read the plain way; with ``draw`` (``fixed``'s: the
    distribution, the stream and index of the prompt's uniforms ``draw[3]``) also the token that uniform draws
    (``token_draw``)."""
    ctx = contexts(row, seq)

    def warp(logits):
        return lm.warp_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)

    token = torch.tensor(ctx.token)
    _, q_logits, _ = draft(ctx.label, 1, seq["prompt_ids"])
    _, p_logits, _ = target(ctx.label, 1, seq["prompt_ids"])
    q, p = warp(q_logits[0]), warp(p_logits[0])
    out = {k: v.item() if v.dim() == 0 else v for k, v in lm.token_stats(q, p, token).items()}
    if draw is not None:
        dist, stream, i, u = draw
        out[DRAW_COLUMN] = draw_gap(q if dist == "q" else p, float(u[stream, i]), ctx.token)
    hidden, logits, taps = draft(ctx.features + [ctx.token], 2, seq["prompt_ids"])
    read = warp(logits[0])
    out.update(hidden=hidden[1].numpy(), hidden_prev=hidden[0].numpy(), hidden_layers=taps[1].numpy(),
               hidden_layers_prev=taps[0].numpy(), read_logp_draft=read[ctx.token].item(),
               read_entropy_draft=lm.entropy(read).item(), read_margin_draft=lm.top2_margin(read).item(),
               response_index=len(ctx.label) - ctx.prompt_length)
    # the target's last call: round_index positions back on the label's prefix (its drawn value is checked by
    # ``fixed``)
    k = int(row["round_index"])
    drawable = (k == 0) if len(ctx.label) == 1 else 1 <= k <= min(MAX_ROUND_INDEX, len(ctx.label) - 1)
    out["round_index"] = k if drawable else -1  # a k the labeler cannot draw is a mismatch of the column
    if k == 0 or not drawable:  # no earlier target state (a row at the prompt's second token)
        out.update(stale_hidden_target=np.zeros_like(row["stale_hidden_target"]), stale_entropy_target=0.0,
                   stale_top1_target=0.0)
        return out
    stale_hidden, stale_logits, _ = target(ctx.label[: len(ctx.label) - k], 1, seq["prompt_ids"])
    stale = warp(stale_logits[0])
    out.update(stale_hidden_target=stale_hidden[0].numpy(), stale_entropy_target=lm.entropy(stale).item(),
               stale_top1_target=stale.max().exp().item())
    return out


def differences(row: dict, again: dict, compared) -> dict[str, float]:
    """Stored against recomputed, per column of ``compared``: |a − b| (the ratio in log space), ‖a − b‖ / ‖b‖ for
    the vectors, 0/1 for the discrete and exact columns."""
    diff = {}
    for col in compared:
        if col not in again:
            continue
        if col == DRAW_COLUMN:
            diff[col] = float(again[col])
            continue
        if col in EXACT_COLUMNS or col == "greedy_match":
            diff[col] = float(row[col] != again[col])
            continue
        a, b = np.asarray(row[col], np.float64), np.asarray(again[col], np.float64)
        if col == "ratio":  # q/p is infinite where p = 0: equal when both are
            a, b = np.log(np.maximum(a, 1e-30)), np.log(np.maximum(b, 1e-30))
        if np.array_equal(a, b):
            diff[col] = 0.0
        elif col in VECTOR_COLUMNS:
            diff[col] = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
        else:
            diff[col] = float(np.abs(a - b))
    return diff


def audit(folder: str | Path, rows: int = 200, seed: int = 0, access: str = "plain", quiet: bool = False) -> dict:
    """Recompute ``rows`` random rows of every split, reading each prefix as ``access`` says; return each column's
    per-row differences judged against its tolerance (``judge``), and whether every column passes."""
    if rows < 1:
        raise UserError(f"--rows must be at least 1 (rows drawn from each split), got {rows}")
    if seed < 0:
        raise UserError(f"--seed must be 0 or more (it seeds the choice of rows), got {seed}")
    folder = Path(folder)
    manifest = read_manifest(folder)  # the shards are the ones the manifest lists
    if manifest["models"]["draft"].get("backend") == "llama_cpp":
        raise UserError(f"{folder} was labeled on llama.cpp; the audit recomputes rows with transformers forwards "
                        "(the llama.cpp labeler is checked against the transformers one row by row in "
                        "tests/test_llama_cpp_backend.py)")
    if not (folder / "run.json").is_file():
        raise UserError(f"{folder} has no run.json (the models and settings it was labeled with); label it again "
                        "to audit it")
    settings = read_json(folder / "run.json", "label the folder again to audit it")
    models, identities = [], []
    for role in ("draft", "target"):
        model, _, identity = load_model(recorded_model(settings, role), settings["dtype"])
        recorded = settings.get("inputs", {}).get(role, {})
        changed = [k for k, v in recorded.items() if identity.get(k) != v]
        if changed:
            raise UserError(f"the {role} at {settings[role]} is not the one {folder} was labeled with "
                            f"({', '.join(changed)} changed)")
        models.append(Reader(model, access, manifest["feature"]["tapped_layers"] if role == "draft" else ()))
        identities.append(identity)
    sampling = Sampling(**settings["sampling"])
    labeling = Labeling(int(settings["seed"]), sampling.max_new_tokens, float(settings.get("mixing_ratio", 0.0)),
                        settings.get("response_source", "target") == "target")
    tol = tolerances(*identities, manifest["feature"]["sizes"])
    diffs = {c: [] for c in (*EXACT_COLUMNS, *tol)}
    where = {c: [] for c in diffs}

    def note(row, diff):
        for col, d in diff.items():
            diffs[col].append(d)
            where[col].append(f"prompt {row['prompt_id']} {row['category']} position {row['position']}")

    # every row: the columns its place and its prompt's draws fix (no model: cheap)
    rng = np.random.default_rng(seed)
    chosen, seen, draws = [], set(), {}
    for split in SPLITS:
        if not shard_paths(folder, split):
            continue
        seqs = load_sequences(folder, split)
        if seqs is None:
            raise UserError(f"{folder} stores no token sequences (labeled by an older version); label again to audit "
                            "it")
        by_prompt = {int(p): seqs[i] for i, p in enumerate(seqs["prompt_id"])}
        ds = load_split(folder, split)
        picked = set(rng.choice(len(ds), size=min(rows, len(ds)), replace=False).tolist())
        keys = ds.select_columns([c for c in EXACT_COLUMNS if c in ds.column_names])
        for i, row in enumerate(tqdm(keys, desc=f"audit {split} (every row's place)", disable=quiet)):
            seq = by_prompt.get(int(row["prompt_id"]))  # a prompt of this split
            key = (int(row["prompt_id"]), row["category"], int(row["position"]))
            problem = "prompt_id" if seq is None else misplaced(row, seq, labeling.max_new_tokens)
            problem = problem or ("position" if key in seen else None)  # one row per place
            seen.add(key)
            if problem:  # nothing to read it from: wrong in that column, and nothing else is compared
                note(row, {c: float(c == problem) for c in EXACT_COLUMNS})
                continue
            u = draws.setdefault(key[0], labeling.draws(key[0]))
            again = fixed(row, seq, u, labeling)
            note(row, {c: float(row[c] != again.get(c, row[c])) for c in EXACT_COLUMNS if c in again or c in PLACE})
            if i in picked:
                chosen.append((i, ds, seq, (*again["draw"], u) if again["draw"] else None))
    if len(chosen) < MIN_ROWS:
        raise UserError(f"{len(chosen)} rows to recompute in {folder}: at least {MIN_ROWS} are needed to tell a wrong "
                        f"reading from rounding (SCHEMA.md, \"The audit\"); pass a larger --rows")
    # the chosen rows: every column the models give
    chosen.sort(key=lambda c: c[2]["prompt_id"])  # rows of one prompt in a row: its forward is read once
    for i, ds, seq, draw in tqdm(chosen, desc="audit (recomputed rows)", disable=quiet):
        row = ds[i]
        again = recompute(row, seq, *models, sampling, draw)
        note(row, differences(row, again, tol))
    report = {}
    for col in diffs:
        d = np.asarray(diffs[col], np.float64)
        exact = col in EXACT_COLUMNS
        r = {"median_diff": float(np.median(d)) if len(d) else 0.0, "worst_diff": float(d.max()) if len(d) else 0.0,
             "tolerance": 0.0, "rows_past": int((d > 0).sum()), "rows": len(d), "ok": not (d > 0).any()} \
            if exact else judge(d, tol[col])
        r["worst_row"] = where[col][int(np.argmax(d))] if len(d) and r["worst_diff"] > 0 else None
        r["rule"] = "exact" if exact else "rounding"
        report[col] = r
    return {"rows": len(chosen), "rows_placed": len(seen), "columns": report,
            "ok": all(r["ok"] for r in report.values()),
            "unit_roundoff": {role: unit_roundoff(i) for role, i in zip(("draft", "target"), identities)}}


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog="python -m data_gen.audit", description=__doc__.split("\n\n")[0])
    path_argument(p, "labels", "--labels", "a label folder written by `python -m data_gen`")
    p.add_argument("--rows", type=int, default=200, help="rows drawn from each split (at least 1)")
    p.add_argument("--seed", type=int, default=0, help="seeds the choice of rows (0 or more)")
    p.add_argument("--access", choices=ACCESS, default="plain",
                   help="plain: the prompt, then the rest in one forward, with the labeler's numerics; decoder: the prompt, "
                        "then one token per forward, as decoding")
    a = p.parse_args(argv)
    try:
        resolve_paths(a, ("labels", "--labels"))
        result = audit(a.labels, a.rows, a.seed, a.access)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = result["rows"]
    u = result["unit_roundoff"]
    print(f"unit roundoff u: draft {u['draft']:.3g}, target {u['target']:.3g}; a column passes unless most rows are past "
          f"its tolerance, or more than a few past {FAR}x it (SCHEMA.md)")
    print(f"{'column':<20} {'median diff':>12} {'worst diff':>11} {'tolerance':>10} {'rows past':>10}  worst row   "
          f"(vectors: ‖a − b‖ / ‖b‖)")
    for col, r in result["columns"].items():
        flag = "" if r["ok"] else "  FAIL"
        past = f"{r['rows_past']}/{r['rows']}"
        tol = "exact" if r["rule"] == "exact" else f"{r['tolerance']:.3g}"
        print(f"{col:<20} {r['median_diff']:>12.3g} {r['worst_diff']:>11.3g} {tol:>10} {past:>10}  "
              f"{r['worst_row'] or '-'}{flag}")
    failed = [c for c, r in result["columns"].items() if not r["ok"]]
    verdict = "every column within its tolerance" if result["ok"] else f"MISMATCH in {', '.join(failed)}"
    print(f"{result['rows_placed']} rows placed, {n} recomputed: {verdict}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

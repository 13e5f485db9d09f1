"""Stored against recomputed label columns: which columns are compared how, each column's tolerance from the models'
numerics, the per-row differences, and the rule that tells rounding from a wrong reading (``data_gen/SCHEMA.md``,
"The audit")."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import binom

from core.backends import backend_of
from core.shards import FLOAT_COLUMNS, vector_sizes

TARGET_STATE_COLUMNS = ("target_hidden", "target_top1")
"""The sequences' target states (``target_states: true``), compared on the rows labeled on the target's response
(``target``, ``token_mixed``), whose label prefix ends where the stored state at the row's response index was read."""

VECTOR_COLUMNS = (*vector_sizes(1, 1), "target_hidden")
"""The vector columns, compared by the norm of the difference relative to the recomputed vector's norm: a head's
linear read of them changes by at most that share."""

DRAFT_COLUMNS = ("logp_draft", "entropy_draft", "read_logp_draft", "read_entropy_draft", "read_margin_draft", "hidden",
                 "hidden_prev", "hidden_layers", "hidden_layers_prev")
TARGET_COLUMNS = ("logp_target", "entropy_target", "stale_entropy_target", "stale_top1_target", "stale_hidden_target",
                  *TARGET_STATE_COLUMNS)
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
    """u of the numerics a model is read with: half the machine epsilon of the dtype its reads round to, or of its
    int8 activations (``core.backends``: a dynamically quantized model, a k-quant GGUF file on llama.cpp)."""
    if quantized(identity):
        return INT8_ROUNDOFF
    return float(torch.finfo(backend_of(identity).rounds_in(identity)).eps) / 2


def quantized(identity: dict) -> bool:
    return backend_of(identity).quantizes_activations(identity)


def tolerances(draft: dict, target: dict, sizes: dict[str, int]) -> dict[str, float]:
    """Each compared column's tolerance for the models of these identities (``core.models.load_model``) and vector
    columns of these lengths (those a folder holds): ``ROUNDING_UNITS`` u for a score, and for a vector read in a
    float dtype, whose elements each round relative to themselves; a vector read from an int8 model rounds every
    element by up to half a step of its token's range (about u times its largest element, which carries its norm),
    so the difference's norm reaches u·√d of the vector's."""
    def tol(col):
        model = draft if col in DRAFT_COLUMNS else target if col in TARGET_COLUMNS else None
        u = unit_roundoff(model) if model else max(unit_roundoff(draft), unit_roundoff(target))
        if col in VECTOR_COLUMNS and quantized(model):
            return max(FLOAT32_TOLERANCE, u * math.sqrt(sizes[col]))
        return max(FLOAT32_TOLERANCE, ROUNDING_UNITS * u)

    out = {c: tol(c) for c in (*FLOAT_COLUMNS, *(v for v in VECTOR_COLUMNS if v in sizes))}
    if "target_hidden" in sizes:
        out["target_top1"] = tol("target_top1")
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



def differences(row: dict, again: dict, compared) -> dict[str, float]:
    """Stored against recomputed, per column of ``compared``: |a − b| (the ratio in log space), ‖a − b‖ / ‖b‖ for
    the vectors, 0/1 for the discrete and exact columns."""
    diff = {}
    for col in compared:
        if col not in again or (col in TARGET_STATE_COLUMNS and col not in row):  # stored for some rows only
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

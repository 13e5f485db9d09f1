"""Recompute label rows from the dataset alone and compare every column.

    specheads audit LABEL_DIR [--rows 200] [--seed 0] [--access plain|decoder]   (make audit LABELS=…)

The labeler reads many prompts at once: left padding, 4D masks that let candidates see only their own prefix, KV
caches cropped and reused. The audit checks every row's place and the columns its prompt's random draws fix
exactly, then reads each chosen row the plainest way there is, one unpadded sequence with no mask, from the token
sequences stored beside the shards (``sequences/``), with the models and settings of ``run.json``, and judges each
column's per-row differences against a tolerance from the models' numerics (``judge``; ``data_gen/SCHEMA.md``, "The
audit"). Labels made on llama.cpp are read with their GGUF files on llama.cpp. It prints each column's median and
worst difference and exits 1 when a column fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from core import label_math as lm
from core.arguments import CommandParser, description, path_argument, resolve_paths
from core.backends import Context, backend_of
from core.errors import UserError
from core.interrupt import interrupted_line
from core.models import load_model
from core.runfolder import read_json
from core.sampling import Sampling
from core.shards import SPLITS, load_sequences, load_split, read_manifest, shard_paths
from data_gen.audit_compare import (EXACT_COLUMNS, FAR, MIN_ROWS, PLACE, differences, judge, tolerances,
                                    unit_roundoff)
from data_gen.audit_recompute import ACCESS, Labeling, LlamaReader, Reader, fixed, misplaced, recompute
from core.models import recorded_model


def audit(folder: str | Path, rows: int = 200, seed: int = 0, access: str = "plain", quiet: bool = False) -> dict:
    """Recompute ``rows`` random rows of every split, reading each prefix as ``access`` says; return each column's
    per-row differences judged against its tolerance (``judge``), and whether every column passes."""
    if rows < 1:
        raise UserError(f"--rows must be at least 1 (rows drawn from each split), got {rows}")
    if seed < 0:
        raise UserError(f"--seed must be 0 or more (it seeds the choice of rows), got {seed}")
    folder = Path(folder)
    manifest = read_manifest(folder)  # the shards are the ones the manifest lists
    made_on = backend_of(manifest["models"]["draft"])
    if not (folder / "run.json").is_file():
        raise UserError(f"{folder} has no run.json (the models and settings it was labeled with); label it again "
                        "to audit it")
    settings = read_json(folder / "run.json", "label the folder again to audit it")
    recomputable = sum(min(rows, int(split.get("rows", 0))) for split in manifest["splits"].values())
    if recomputable < MIN_ROWS:
        raise UserError(f"{recomputable} rows to recompute in {folder} at --rows {rows}: at least {MIN_ROWS} are "
                        "needed to tell a wrong reading from rounding (SCHEMA.md, \"The audit\"); pass a larger --rows")
    models, identities = [], []
    for role in ("draft", "target"):
        if made_on.keeps_own_cache:  # the GGUF file, read by llama.cpp as the labeler read it
            model, _, identity = made_on.load(recorded_model(settings, role), settings["dtype"],
                                              settings.get("threads"), Context())
        else:
            model, _, identity = load_model(recorded_model(settings, role), settings["dtype"])
        recorded = settings.get("inputs", {}).get(role, {})
        changed = [k for k, v in recorded.items() if identity.get(k) != v]
        if changed:
            raise UserError(f"the {role} at {settings[role]} is not the one {folder} was labeled with "
                            f"({', '.join(changed)} changed)")
        models.append(LlamaReader(model) if made_on.keeps_own_cache else
                      Reader(model, access, manifest["feature"]["tapped_layers"] if role == "draft" else ()))
        identities.append(identity)
    sampling = Sampling(**settings["sampling"])
    labeling = Labeling(int(settings["seed"]), sampling.max_new_tokens, float(settings.get("mixing_ratio", 0.0)),
                        settings.get("response_source", "target") == "target")
    states = manifest["feature"].get("target_states")
    tol = tolerances(*identities, {**manifest["feature"]["sizes"], **({"target_hidden": states} if states else {})})
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
        if states and row["category"] in ("target", lm.TOKEN_MIXED):  # labeled on the response: its state there
            t = int(row["response_index"])
            row = {**row, "target_hidden": np.asarray(seq["target_hidden"]).reshape(-1, states)[t],
                   "target_top1": seq["target_top1"][t]}
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
    p = CommandParser(prog="specheads audit", description=description(__doc__))
    path_argument(p, "labels", "--labels", "a label folder written by `specheads labels`")
    p.add_argument("--rows", type=int, default=200,
                   help=f"rows drawn from each split (at least 1, and {MIN_ROWS} over the splits)")
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
    except KeyboardInterrupt:
        print(interrupted_line(), file=sys.stderr)
        return 130
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

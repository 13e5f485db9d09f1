"""The choice of each family's setting (K, h, τ, …) from its runs on the sweep prompts.

Made by the run (which must know the chosen settings to finish them on every prompt) and shown by the report, so
both choose the same way: lowest latency per generated token over the sweep prompts, measured or predicted by
Eq. 5.1, with approximate policies limited to settings whose pass@1 stays within ``max_pass_drop`` of SD's. With
``select_by: simulated`` the trace simulator's choice (the folder's ``selection.json``: ``modes`` → mode →
family → choice, and ``inputs`` → mode → what the choice was made from) is the only candidate of its family.
"""

from __future__ import annotations

import json
from pathlib import Path

from decoding.policies import POLICIES
from evaluation.config import ESTIMATE_FILES
from decoding.costs import CostModel
from evaluation.rundir import RunDir
from evaluation.summary import Totals, index, totals


def latency(t: Totals, select_by: str, fit: CostModel | None) -> float:
    """Seconds per generated token, measured or predicted (falls back to measured without a fit)."""
    if select_by == "predicted":
        pred = t.predicted_s_per_token(fit)
        if pred is not None:
            return pred
    return t.s_per_token


def preset_runs(out: str | Path, mode: str, select_by: str) -> dict[str, str]:
    """family → the run the trace simulator chose for it in ``mode`` (the folder's ``selection.json``); {} when
    settings are not chosen by simulation or none was."""
    path = RunDir(out).selection
    if select_by != "simulated" or not path.exists():
        return {}
    return {f: c["run"] for f, c in json.loads(path.read_text())["modes"].get(mode, {}).items()}


def choose(records: list[dict], mode: str, families: list[str], sweep_ids: list[int], select_by: str,
           fit: CostModel | None, max_pass_drop: float, preset: dict[str, str] | None = None) -> dict[str, str]:
    """family → the run label chosen for it in ``mode`` (SD first: its pass@1 is the approximate policies' floor).

    Only settings finished on every sweep prompt compete; a family in ``preset`` (the simulator's choice) has
    its run there.
    """
    idx = index(records)
    chosen: dict[str, str] = {}
    order = sorted(families, key=lambda f: f != "sd")
    sd_pass = None
    preset = preset or {}
    for fam in order:
        cands = []
        for (m, run), by_prompt in idx.items():
            if m != mode or next(iter(by_prompt.values()))["family"] != fam:
                continue
            if fam in preset and run != preset[fam]:
                continue
            t = totals(by_prompt, sweep_ids)
            if t is not None:
                cands.append(t)
        if not cands:
            continue
        if not POLICIES[fam].exact and sd_pass is not None:
            ok = [t for t in cands if t.pass_at_1 is None or t.pass_at_1 >= sd_pass - max_pass_drop - 1e-12]
            cands = ok or cands
        best = min(cands, key=lambda t: (latency(t, select_by, fit), t.run))
        chosen[fam] = best.run
        if fam == "sd":
            sd_pass = best.pass_at_1
    return chosen


def chosen_params(chosen: dict[str, str], records: list[dict], mode: str, family: str) -> dict | None:
    """The swept parameters of ``family``'s chosen run in ``mode``; None when it has none."""
    run = chosen.get(family)
    return next((r["params"] for r in records if r["mode"] == mode and r["run"] == run), None)


def best_k(chosen: dict[str, str], records: list[dict], mode: str) -> int | None:
    """K of the chosen fixed-K SD run in ``mode``."""
    k = (chosen_params(chosen, records, mode, "sd") or {}).get("k")
    return None if k is None else int(k)


def chosen_file_settings(chosen: dict[str, str], records: list[dict], mode: str,
                         fixed: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    """head or calibration file → the setting, by its name, of each of our decoder's chosen runs in ``mode`` that
    reads it: h of SpecDec++, τ of SPRINTER (None: the exported one), λ of goodput (None: its default). ``fixed`` is
    each family's fixed keyword arguments (where a file may be named)."""
    out: dict[str, dict[str, float | None]] = {}
    for family, policy in POLICIES.items():
        params = chosen_params(chosen, records, mode, family)
        if policy.head_role is None or params is None:
            continue
        for key in ESTIMATE_FILES:
            path = params.get(key, fixed.get(family, {}).get(key))
            if path is not None:
                out.setdefault(str(path), {})[policy.setting] = params.get(policy.setting)
    return out

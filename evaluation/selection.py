"""The choice of each family's setting (K, h, τ, …) from its runs on the sweep prompts.

Made by the run (which must know the chosen settings to finish them on every prompt) and shown by the report, so
both choose the same way: lowest latency per generated token over the sweep prompts, measured or predicted by
Eq. 5.1, with approximate policies limited to settings whose pass@1 stays within ``max_pass_drop`` of SD's. With
``select_by: simulated`` the trace simulator's choice (the folder's ``selection.json``: ``modes`` → mode →
family → choice, and ``inputs`` → mode → what the choice was made from) is the only candidate of its family; that
choice is made here too (``simulated_settings``), again only when what it was made from changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from core.runfolder import write_json
from decoding.costs import CostModel
from decoding.policies import POLICIES
from evaluation.config import ESTIMATE_FILES, EvalConfig, EvalError, Mode
from evaluation.latency import selection_fit
from evaluation.results import run_label
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


class LabelTraces(NamedTuple):
    """The label traces a simulated choice replays (``evaluation.simulate.selection_traces``), the digest of the
    labels' manifest they were read under, which ``selection.json`` records, and how those labels were sampled."""

    manifest_sha256: str
    sampling: dict
    traces: tuple[list, list]


def read_label_traces(labels: str | Path, decoded: set[str], manifest: dict, digest: str) -> LabelTraces:
    """The traces, less the ``decoded`` prompts, of the labels whose manifest (``manifest``, its file's ``digest``)
    the eval checked its heads against; labels rewritten since then are refused."""
    from core.shards import manifest_sha256
    from evaluation.simulate import selection_traces

    traces = selection_traces(labels, decoded)
    if manifest_sha256(labels) != digest:
        raise EvalError(f"{labels} changed while the eval read it; run the eval again once it is written")
    return LabelTraces(digest, manifest["sampling"], traces)


def simulated_settings(cfg: EvalConfig, mode: Mode, sweeps: list, out: Path, quiet: bool,
                        decoded: set[str], traces: LabelTraces | None) -> dict[str, dict]:
    """family → the setting the trace simulator predicts fastest (``select_by: simulated``), for a mode sampled
    like ``labels_dir``'s labels; {} otherwise (that mode's sweeps run and are measured). The choice never replays
    a prompt the eval decodes (``decoded``: their digests), so that no setting is chosen on the prompts it is then
    measured on (``traces``: as read before the runs, ``read_label_traces``). Written to
    ``selection.json`` with what it was chosen from (labels, costs, grids, the decoded
    prompts), and chosen again when that changes."""
    from core.cache import file_sha256
    from decoding.policies import simulated
    from evaluation.simulate import simulated_choice

    path = RunDir(out).selection
    selection = json.loads(path.read_text()) if path.exists() else {}
    selection.setdefault("modes", {})
    selection.setdefault("inputs", {})
    if traces is None or not mode.samples_like(traces.sampling):  # traces: only with select_by: simulated
        if selection["modes"].pop(mode.name, None) is not None:  # a choice of other settings: not this run's
            selection["inputs"].pop(mode.name, None)
            write_json(RunDir(out).claim(path), selection)
        return {}
    fit = selection_fit(cfg.latency_fits([]), simulated=True)
    if fit is None:
        raise EvalError("select_by: simulated needs per-forward costs: a `timing` file or a real engine, "
                        "which times the pair's forwards")
    chosen_here = [s for s in sweeps if s.family in simulated(exact=True)]
    heads = sorted({str(h) for s in chosen_here for h in [s.fixed.get("head"), *s.grid.get("head", [])] if h})
    inputs = json.loads(json.dumps({
        "labels_manifest_sha256": traces.manifest_sha256,
        "heads_sha256": {h: file_sha256(Path(h)) for h in heads},
        "costs": [fit.t_draft, fit.t_target, fit.t_target_step, fit.intercept, fit.draft_intercept, fit.draft_step,
                  fit.verify_s] + ([fit.draft_catch_up] if fit.draft_catch_up else []),
        "tokens": cfg.max_new_tokens,
        "decoded_prompts": sorted(decoded),
        "families": {s.family: {"fixed": s.fixed, "grid": s.settings()} for s in chosen_here}}))
    if selection["inputs"].get(mode.name) != inputs:
        choice = simulated_choice(cfg.labels_dir, sweeps, fit, cfg.max_new_tokens, exclude=decoded,
                                  label_traces=traces.traces)
        selection["modes"][mode.name] = {f: {**c, "run": run_label(f, c["params"])} for f, c in choice.items()}
        selection["inputs"][mode.name] = inputs
        write_json(RunDir(out).claim(path), selection)
        if not quiet:
            for f, c in selection["modes"][mode.name].items():
                print(f"eval [{mode.name}] {f}: simulator picks {c['run']} (predicted {c['predicted_speedup']:.2f}x "
                      f"over {c['traces']} label traces)", flush=True)
    return {f: c["params"] for f, c in selection["modes"][mode.name].items()}

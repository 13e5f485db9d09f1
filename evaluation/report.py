"""The report of an evaluation run: ``report.json`` (every figure behind it, computed here), ``report.md``
(``evaluation.markdown``) and PNGs (``evaluation.plots``).

Computed from ``results.jsonl`` alone (plus training's ROC output), so it can be rewritten at any time:
``specheads eval --config … --report_only true``. See ``evaluation/REPORT.md`` for how to read it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from core.device import describe_device
from core.intervals import mean_interval, speedup_interval
from core.models import resolve_device
from core.runfolder import write_text
from decoding.policies import POLICIES
from evaluation import quality
from evaluation.config import (ESTIMATE_FILES, HF_FAMILY, HF_GOODPUT, HF_HEAD_FAMILIES, HF_TARGET_ONLY, PEER_FAMILIES,
                               EvalConfig)
from decoding.costs import CostModel
from evaluation.latency import selection_fit
from evaluation.likelihood import attach_scores
from evaluation.markdown import cell, render_md, training_md
from evaluation.plots import plot_pareto, plot_quality, plot_speedup
from evaluation.rundir import RunDir
from evaluation.selection import choose, preset_runs
from evaluation.summary import (Totals, agreement, contention, index, per_prompt_speedup, spread,
                                sprinter_theorem7, totals)


def _rouge_rows(run: dict[int, dict], other: dict[int, dict] | None, refs: dict[int, str | None]) -> dict:
    """ROUGE of a run's completions against SD's (same prompt) and against the references."""
    out = {}
    if other is not None:
        ids = sorted(set(run) & set(other))
        out["vs_sd"] = quality.rouge([run[p]["completion"] for p in ids], [other[p]["completion"] for p in ids]) \
            if ids else None
    ids = sorted(p for p in run if refs.get(p))
    out["vs_ref"] = quality.rouge([run[p]["completion"] for p in ids], [refs[p] for p in ids]) if ids else None
    return out


def _ratio_interval(runs: dict[int, dict], other: dict[int, dict] | None) -> list[float] | None:
    """The paired bootstrap 95 % interval of ``runs``' tokens/s over ``other``'s on the prompts both decoded."""
    ids = sorted(set(runs) & set(other or {}))
    if len(ids) < 2:
        return None
    iv = speedup_interval([runs[i]["stats"] for i in ids], [other[i]["stats"] for i in ids])
    return [iv.low, iv.high]


def _loglik(run: str, runs: dict[int, dict], exact_runs: dict[str, dict[int, dict]]) -> dict:
    """The target's mean log-likelihood per token of the run's outputs (mean over prompts, with its bootstrap
    interval), and its difference, paired by prompt, from the mean over the mode's other exact runs (every one
    samples p: their mean is a steadier reference than target-only's single sample; ``evaluation.likelihood``)."""
    scored = {p: r["target_loglik"] for p, r in runs.items() if r.get("target_loglik") is not None}
    out = {"loglik": None, "loglik_ci": None, "loglik_vs_exact": None, "loglik_vs_exact_ci": None}
    if len(scored) < 2:
        return out
    iv = mean_interval(list(scored.values()))
    out.update(loglik=iv.value, loglik_ci=[iv.low, iv.high])
    diffs = []
    for p, value in scored.items():
        ref = [other[p]["target_loglik"] for name, other in exact_runs.items() if name != run
               and other.get(p, {}).get("target_loglik") is not None]
        if ref:
            diffs.append(value - sum(ref) / len(ref))
    if len(diffs) >= 2:
        iv = mean_interval(diffs)
        out.update(loglik_vs_exact=iv.value, loglik_vs_exact_ci=[iv.low, iv.high])
    return out


def _row(t: Totals, by_prompt: dict[int, dict], base: dict[int, dict] | None, base_t: Totals | None,
         sd_t: Totals | None, fits: dict[str, CostModel | None], greedy: bool = False,
         sd: dict[int, dict] | None = None, exact_runs: dict[str, dict[int, dict]] | None = None) -> dict:
    row = {
        "run": t.run, "family": t.family, "params": t.params, "prompts": len(t.prompts),
        "new_tokens": t.new_tokens, "wall_s": t.wall_s, "tokens_per_s": t.tokens_per_s,
        "speedup_vs_target": t.tokens_per_s / base_t.tokens_per_s if base_t else None,
        "speedup_vs_sd": t.tokens_per_s / sd_t.tokens_per_s if sd_t else None,
        "speedup_vs_target_ci": _ratio_interval(by_prompt, base),
        "speedup_vs_sd_ci": _ratio_interval(by_prompt, sd),
        "n_target": t.target_calls, "n_draft": t.draft_calls, "n_discarded": t.discarded,
        "verification_rate": t.verification_rate, "discard_rate": t.discard_rate,
        "draft_rate": t.draft_calls / t.new_tokens if t.draft_calls is not None and t.new_tokens else None,
        "unused_forwards": t.unused_forwards,
        "mean_accepted": t.mean_accepted, "pass_at_1": t.pass_at_1,
        "per_prompt_speedup": spread(list(per_prompt_speedup(by_prompt, base).values())) if base else None,
        "same_as_target": agreement(by_prompt, base) if greedy and base else None,
        **_loglik(t.run, by_prompt, exact_runs or {}),
    }
    for name, fit in fits.items():
        pred = t.predicted_s_per_token(fit)
        base_pred = base_t.predicted_s_per_token(fit) if base_t else None
        row[f"pred_s_per_token_{name}"] = pred
        row[f"pred_speedup_{name}"] = base_pred / pred if pred and base_pred else None
    return row


def _family_order(cfg: EvalConfig, family: str) -> int:
    """Families in the order the config lists its policies."""
    order = [s.family for s in cfg.policies]
    return order.index(family) if family in order else len(order)


def _sweep_order(cfg: EvalConfig, family: str, params: dict, run: str) -> tuple:
    """Sweep rows by family, then by numeric setting (k=2 before k=10; a head file's own threshold last)."""
    return (_family_order(cfg, family),
            tuple((0, float(v)) if isinstance(v, (int, float)) else (1, str(v)) for v in params.values()), run)


def summarize(cfg: EvalConfig, records: list[dict], prompts: list[dict]) -> dict:
    """Everything the report shows, as plain data (written to ``report.json``)."""
    idx = index(records)
    all_ids = [p["prompt"] for p in prompts]
    sweep_ids = all_ids[: cfg.sweep_prompts] if cfg.sweep_prompts else all_ids
    refs = {p["prompt"]: p["reference"] for p in prompts}
    fits = cfg.latency_fits(records)
    select_fit = selection_fit(fits)
    device = resolve_device(cfg.device)  # where the runs decoded, not the best the machine has
    # a report rewritten (``report_only``) away from the GPU its runs decoded on names that GPU as configured
    device = describe_device(device) if device.type != "cuda" or torch.cuda.is_available() else str(device)
    out = {"device": device, "prompts": len(all_ids), "sweep_prompts": len(sweep_ids),
           "max_new_tokens": cfg.max_new_tokens, "select_by": cfg.select_by,
           "draft": cfg.draft.display_name, "target": cfg.target.display_name,
           "latency_fit": {k: v.to_dict() if v else None for k, v in fits.items()}, "modes": {},
           "cpu_contention": contention(records)}  # CPU runs record their load (``evaluation.runner``)
    selection = RunDir(cfg.output_dir).selection
    out["selection"] = json.loads(selection.read_text())["modes"] \
        if cfg.select_by == "simulated" and selection.exists() else None
    for mode in cfg.modes:
        runs = {run: by for (m, run), by in idx.items() if m == mode.name}
        if not runs:
            continue
        fam_of = {run: next(iter(by.values()))["family"] for run, by in runs.items()}
        ours = sorted({f for f in fam_of.values() if f not in PEER_FAMILIES}, key=lambda f: _family_order(cfg, f))
        chosen = choose(records, mode.name, ours, sweep_ids, cfg.select_by, select_fit, cfg.max_pass_drop,
                        preset=preset_runs(cfg.output_dir, mode.name, cfg.select_by))
        base = runs.get(chosen.get("target_only", "target_only"))
        base_t = totals(base) if base else None
        sd = runs.get(chosen.get("sd", ""))
        sd_t = totals(sd) if sd else None
        greedy = mode.temperature == 0
        exact_runs = {chosen[f]: runs[chosen[f]] for f in ours if f in chosen and POLICIES[f].exact}
        table = []
        for fam in ours:
            if fam in chosen:
                t = totals(runs[chosen[fam]])
                table.append({**_row(t, runs[t.run], base, base_t, sd_t, fits, greedy, sd, exact_runs),
                              **{"rouge": _rouge_rows(runs[t.run], sd, refs)}})
        for run in sorted((r for r, f in fam_of.items() if f in PEER_FAMILIES),
                          key=lambda r: (PEER_FAMILIES.index(fam_of[r]), r)):
            t = totals(runs[run])
            table.append({**_row(t, runs[run], base, base_t, sd_t, fits, greedy, sd, exact_runs),
                          "rouge": _rouge_rows(runs[run], sd, refs)})
        sweep = []
        for run in sorted(runs, key=lambda r: _sweep_order(cfg, fam_of[r], next(iter(runs[r].values()))["params"], r)):
            if fam_of[run] in PEER_FAMILIES:
                continue
            t = totals(runs[run], sweep_ids)
            if t is None:
                continue
            row = _row(t, {p: runs[run][p] for p in sweep_ids}, base, totals(base, sweep_ids) if base else None,
                       totals(sd, sweep_ids) if sd else None, fits, greedy, sd, exact_runs)
            if not POLICIES[fam_of[run]].exact or POLICIES[fam_of[run]].reference:
                row["rouge"] = _rouge_rows({p: runs[run][p] for p in sweep_ids}, sd, refs)
            row["chosen"] = chosen.get(fam_of[run]) == run
            sweep.append(row)
        out["modes"][mode.name] = {"sampling": vars(mode.sampling(cfg.max_new_tokens)), "chosen": chosen,
                                   "table": table, "sweep": sweep}
    out["goals"] = goals(cfg, out, idx)
    fixed_head = next((s.fixed.get("head") for s in cfg.policies if s.family == "sprinter"), None)
    out["theorem7"] = sprinter_theorem7(records, cfg.modes, fixed_head, cfg.labels_dir)
    return out


def _find(mode: dict | None, family: str, run: str | None = None) -> dict | None:
    if mode is None:
        return None
    for row in mode["table"]:
        if row["family"] == family and (run is None or row["run"] == run):
            return row
    return None


def goals(cfg: EvalConfig, summary: dict, idx: dict | None = None) -> list[dict]:
    """The goals of ``cfg.goals``: target, measured value, met or missed and by how much, and the paired bootstrap
    95 % interval over prompts with whether all of it clears the target (``interval_clears``)."""
    targets = cfg.goals
    modes = summary["modes"]
    greedy = next((m.name for m in cfg.modes if m.temperature == 0 and m.name in modes), None)
    primary = next((m.name for m in cfg.modes if m.name in modes), None)
    out = []

    def goal(name, mode, value, target, detail, higher=True, interval=None):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append({"goal": name, "mode": mode, "target": target, "value": None, "met": None,
                        "margin": None, "interval": None, "interval_clears": None, "detail": detail or "not measured"})
            return
        margin = value - target if higher else target - value
        clears = None if interval is None else (interval[0] >= target if higher else interval[1] <= target)
        out.append({"goal": name, "mode": mode, "target": target, "value": value, "met": margin >= 0,
                    "margin": margin, "interval": interval, "interval_clears": clears, "detail": detail})

    g = modes.get(greedy) if greedy else None
    sd = _find(g, "sd")
    k = sd["params"]["k"] if sd else None
    hf = _find(g, HF_FAMILY, f"{HF_FAMILY}[k={k}]") if k is not None else None
    runs = idx or {}
    goal("our SD ≥ HF assisted at the same K (greedy): tokens/s ratio", greedy,
         sd["tokens_per_s"] / hf["tokens_per_s"] if sd and hf else None, targets.sd_vs_hf,
         f"K={k}: ours {sd['tokens_per_s']:.2f} tok/s vs HF {hf['tokens_per_s']:.2f} tok/s" if sd and hf
         else "needs a greedy mode with SD and the HF peer at K",
         interval=_ratio_interval(runs.get((greedy, sd["run"]), {}), runs.get((greedy, hf["run"]))) if sd and hf
         else None)
    p = modes.get(primary)
    sd_p = _find(p, "sd")

    def why(row):  # the counts behind a speedup: rates of the policy against SD's
        if not row or not sd_p:
            return ""
        return (f"{row['run']} vs {sd_p['run']}: N_target/N {cell(row['verification_rate'], '.3f')} vs "
                f"{cell(sd_p['verification_rate'], '.3f')}, N_discarded/N {cell(row['discard_rate'], '.3f')} vs "
                f"{cell(sd_p['discard_rate'], '.3f')}")

    spp = _find(p, "specdecpp")
    goal(f"SpecDec++ ≥ {targets.specdecpp_vs_sd:.2f}× best fixed-K SD (tokens/s)", primary,
         spp["speedup_vs_sd"] if spp else None, targets.specdecpp_vs_sd, why(spp),
         interval=spp.get("speedup_vs_sd_ci") if spp else None)
    spr = _find(p, "sprinter")
    goal(f"SPRINTER ≥ {targets.sprinter_vs_sd:g}× SD (tokens/s)", primary, spr["speedup_vs_sd"] if spr else None,
         targets.sprinter_vs_sd, why(spr), interval=spr.get("speedup_vs_sd_ci") if spr else None)
    drop = (sd_p["pass_at_1"] - spr["pass_at_1"]) if spr and sd_p and spr["pass_at_1"] is not None \
        and sd_p["pass_at_1"] is not None else None
    goal(f"SPRINTER pass@1 within {targets.sprinter_pass_drop * 100:g} points of SD (drop)", primary, drop,
         targets.sprinter_pass_drop,
         f"SD {sd_p['pass_at_1']:.3f}, SPRINTER {spr['pass_at_1']:.3f}" if drop is not None
         else "needs HumanEval prompts", higher=False,
         interval=_drop_interval(runs.get((primary, sd_p["run"])), runs.get((primary, spr["run"])))
         if drop is not None else None)
    for name, m in modes.items():
        _runtime_goals(cfg, name, m, runs, goal)
    return out


def _runtime_goals(cfg: EvalConfig, name: str, m: dict, runs: dict, goal) -> None:
    """The goals of the heads (and the goodput stop) inside transformers' ``generate()`` in one mode, for each head
    (and file) the peer ran."""
    targets = cfg.goals
    table = m["table"]
    own_rules = [r for r in table if r["family"] == HF_FAMILY]
    best_hf = max(own_rules, key=lambda r: r["tokens_per_s"], default=None)
    # transformers' SD: its constant-K run when there is one, else its defaults
    hf_sd = ([r for r in own_rules if "k" in r["params"]] or [r for r in own_rules if not r["params"]] or [None])[0]
    hf_base = _find(m, HF_TARGET_ONLY)

    def ratio(a, b):
        return a["tokens_per_s"] / b["tokens_per_s"] if a and b else None

    def interval(a, b):
        return _ratio_interval(runs.get((name, a["run"]), {}), runs.get((name, b["run"]))) if a and b else None

    stops = {HF_HEAD_FAMILIES["stop"]: "SpecDec++ head", HF_GOODPUT: "goodput stop on"}
    for row in (r for r in table if r["family"] in (*HF_HEAD_FAMILIES.values(), HF_GOODPUT)):
        head = Path(next(row["params"][key] for key in ESTIMATE_FILES if key in row["params"])).name  # or a calibration
        if row["family"] in stops:
            goal(f"generate() + {stops[row['family']]} {head} ≥ {targets.hf_head_vs_hf:.2f}× transformers' best own "
                 "rule (tokens/s)", name, ratio(row, best_hf), targets.hf_head_vs_hf,
                 f"vs {best_hf['run']} ({best_hf['tokens_per_s']:.2f} tok/s)" if best_hf else "needs hf_assisted runs",
                 interval=interval(row, best_hf))
        else:
            goal(f"generate() + SPRINTER verifier {head} ≥ {targets.hf_sprinter_vs_target:g}× the target's own "
                 "generate() (tokens/s)", name, ratio(row, hf_base), targets.hf_sprinter_vs_target,
                 "" if hf_base else "needs hf_peer.target_only", interval=interval(row, hf_base))
            passed = row["pass_at_1"] is not None and hf_sd and hf_sd["pass_at_1"] is not None
            goal(f"generate() + SPRINTER verifier {head}: pass@1 within {targets.sprinter_pass_drop * 100:g} points "
                 "of transformers' SD (drop)", name, hf_sd["pass_at_1"] - row["pass_at_1"] if passed else None,
                 targets.sprinter_pass_drop,
                 f"{hf_sd['run']} {hf_sd['pass_at_1']:.3f}, {row['pass_at_1']:.3f}" if passed else
                 "needs HumanEval prompts and hf_assisted runs", higher=False,
                 interval=_drop_interval(runs.get((name, hf_sd["run"])), runs.get((name, row["run"])))
                 if passed else None)
        ours = _same_head_run(cfg, name, row, runs)
        ours_iv = interval(ours, row)  # one bootstrap, shifted by the − 1 of the overhead
        same = "same head and threshold" if row["family"] != HF_GOODPUT else "same estimates and λ"
        goal(f"runtime overhead of {head}: our decoder's tokens/s over generate()'s − 1, {same}",
             name, ratio(ours, row) - 1 if ours else None, targets.runtime_overhead,
             f"{ours['run']} {ours['tokens_per_s']:.2f} tok/s vs {row['tokens_per_s']:.2f} tok/s" if ours else
             f"needs our decoder's run with the {same}", higher=False,
             interval=[bound - 1 for bound in ours_iv] if ours_iv else None)


def _same_head_run(cfg: EvalConfig, mode: str, peer: dict, runs: dict) -> dict | None:
    """Our decoder's run (as a report row, with tokens/s) of the head (or calibration) a peer row ran, at the same
    threshold (or λ). A peer family is ``hf_`` and the family of our decoder it runs (``evaluation.config``)."""
    family = peer["family"].removeprefix("hf_")
    setting = POLICIES[family].setting
    fixed = next((s.fixed for s in cfg.policies if s.family == family), {})
    source = next(key for key in ESTIMATE_FILES if key in peer["params"])
    for (m, run), by_prompt in runs.items():
        first = next(iter(by_prompt.values()))
        params = first["params"]
        if m == mode and first["family"] == family and params.get(setting) == peer["params"].get(setting) \
                and str(params.get(source, fixed.get(source))) == peer["params"][source]:
            t = totals(by_prompt)
            return {"run": run, "tokens_per_s": t.tokens_per_s}
    return None


def _drop_interval(sd: dict[int, dict] | None, other: dict[int, dict] | None) -> list[float] | None:
    """The bootstrap 95 % interval of SD's pass@1 minus another run's, paired by prompt."""
    ids = sorted(i for i in set(sd or {}) & set(other or {})
                 if sd[i]["passed"] is not None and other[i]["passed"] is not None)
    if len(ids) < 2:
        return None
    iv = mean_interval([float(sd[i]["passed"]) - float(other[i]["passed"]) for i in ids])
    return [iv.low, iv.high]


def write_report(out: Path, cfg: EvalConfig, records: list[dict], prompts: list[dict]) -> dict:
    """Write ``report.md``, ``report.json`` and the PNGs under ``out``; return the summary."""
    folder = RunDir(out)
    folder.root.mkdir(parents=True, exist_ok=True)
    s = summarize(cfg, attach_scores(out, records), prompts)
    training, metrics = training_md(Path(cfg.train_dir) if cfg.train_dir else None, out)
    s["training"] = metrics
    if s["modes"]:
        plot_pareto(s, folder.claim(folder.pareto_png))
        plot_speedup(s, folder.claim(folder.speedup_png))
        plot_quality(s, folder.claim(folder.quality_png))
    write_text(folder.claim(folder.report_json), json.dumps(s, indent=2, default=str) + "\n")
    write_text(folder.claim(folder.report_md), render_md(cfg, s, training))
    return s

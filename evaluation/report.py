"""The report of an evaluation run: ``report.md``, ``report.json`` (every figure behind it), and PNGs.

Computed from ``results.jsonl`` alone (plus training's ROC output), so it can be rewritten at any time:
``python -m evaluation --config … --report_only true``. See ``evaluation/REPORT.md`` for how to read it.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
from pathlib import Path

import torch

from evaluation import quality
from evaluation.config import HF_FAMILY, EvalConfig
from evaluation.latency import LatencyFit, latency_fits, selection_fit
from evaluation.policies import POLICIES
from evaluation.summary import (Totals, agreement, choose, index, per_prompt_speedup, spread, sprinter_theorem7,
                                totals)

GOAL_SD_VS_HF = 1.0
GOAL_SPECDECPP = 1.10
GOAL_SPRINTER = 1.6
GOAL_PASS_DROP = 0.03


def _device() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


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


def _row(t: Totals, by_prompt: dict[int, dict], base: dict[int, dict] | None, base_t: Totals | None,
         sd_t: Totals | None, fits: dict[str, LatencyFit | None], greedy: bool = False) -> dict:
    row = {
        "run": t.run, "family": t.family, "params": t.params, "prompts": len(t.prompts),
        "new_tokens": t.new_tokens, "wall_s": t.wall_s, "tokens_per_s": t.tokens_per_s,
        "speedup_vs_target": t.tokens_per_s / base_t.tokens_per_s if base_t else None,
        "speedup_vs_sd": t.tokens_per_s / sd_t.tokens_per_s if sd_t else None,
        "n_target": t.target_calls, "n_draft": t.draft_calls, "n_discarded": t.discarded,
        "verification_rate": t.verification_rate, "discard_rate": t.discard_rate,
        "draft_rate": t.draft_calls / t.new_tokens if t.draft_calls is not None and t.new_tokens else None,
        "unused_forwards": t.unused_forwards,
        "mean_accepted": t.mean_accepted, "pass_at_1": t.pass_at_1,
        "per_prompt_speedup": spread(list(per_prompt_speedup(by_prompt, base).values())) if base else None,
        "same_as_target": agreement(by_prompt, base) if greedy and base else None,
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
    fits = latency_fits(cfg, records)
    select_fit = selection_fit(fits)
    out = {"device": _device(), "prompts": len(all_ids), "sweep_prompts": len(sweep_ids),
           "max_new_tokens": cfg.max_new_tokens, "select_by": cfg.select_by,
           "draft": cfg.draft.display_name, "target": cfg.target.display_name,
           "latency_fit": {k: v.to_dict() if v else None for k, v in fits.items()}, "modes": {}}
    for mode in cfg.modes:
        runs = {run: by for (m, run), by in idx.items() if m == mode.name}
        if not runs:
            continue
        fam_of = {run: next(iter(by.values()))["family"] for run, by in runs.items()}
        ours = sorted({f for f in fam_of.values() if f != HF_FAMILY}, key=lambda f: _family_order(cfg, f))
        chosen = choose(records, mode.name, ours, sweep_ids, cfg.select_by, select_fit, cfg.max_pass_drop)
        base = runs.get(chosen.get("target_only", "target_only"))
        base_t = totals(base) if base else None
        sd = runs.get(chosen.get("sd", ""))
        sd_t = totals(sd) if sd else None
        greedy = mode.temperature == 0
        table = []
        for fam in ours:
            if fam in chosen:
                t = totals(runs[chosen[fam]])
                table.append({**_row(t, runs[t.run], base, base_t, sd_t, fits, greedy),
                              **{"rouge": _rouge_rows(runs[t.run], sd, refs)}})
        for run in sorted(r for r, f in fam_of.items() if f == HF_FAMILY):
            t = totals(runs[run])
            table.append({**_row(t, runs[run], base, base_t, sd_t, fits, greedy), "rouge": _rouge_rows(runs[run], sd, refs)})
        sweep = []
        for run in sorted(runs, key=lambda r: _sweep_order(cfg, fam_of[r], next(iter(runs[r].values()))["params"], r)):
            if fam_of[run] == HF_FAMILY:
                continue
            t = totals(runs[run], sweep_ids)
            if t is None:
                continue
            row = _row(t, {p: runs[run][p] for p in sweep_ids}, base, totals(base, sweep_ids) if base else None,
                       totals(sd, sweep_ids) if sd else None, fits, greedy)
            if not POLICIES[fam_of[run]].exact or POLICIES[fam_of[run]].reference:
                row["rouge"] = _rouge_rows({p: runs[run][p] for p in sweep_ids}, sd, refs)
            row["chosen"] = chosen.get(fam_of[run]) == run
            sweep.append(row)
        out["modes"][mode.name] = {"sampling": vars(mode.sampling(cfg.max_new_tokens)), "chosen": chosen,
                                   "table": table, "sweep": sweep}
    out["goals"] = goals(cfg, out)
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


def goals(cfg: EvalConfig, summary: dict) -> list[dict]:
    """The issue's three goals: target, measured value, met or missed and by how much."""
    modes = summary["modes"]
    greedy = next((m.name for m in cfg.modes if m.temperature == 0 and m.name in modes), None)
    primary = next((m.name for m in cfg.modes if m.name in modes), None)
    out = []

    def goal(name, mode, value, target, detail, higher=True):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append({"goal": name, "mode": mode, "target": target, "value": None, "met": None,
                        "margin": None, "detail": detail or "not measured"})
            return
        margin = value - target if higher else target - value
        out.append({"goal": name, "mode": mode, "target": target, "value": value, "met": margin >= 0,
                    "margin": margin, "detail": detail})

    g = modes.get(greedy) if greedy else None
    sd = _find(g, "sd")
    k = sd["params"]["k"] if sd else None
    hf = _find(g, HF_FAMILY, f"{HF_FAMILY}[k={k}]") if k is not None else None
    goal("our SD ≥ HF assisted at the same K (greedy): tokens/s ratio", greedy,
         sd["tokens_per_s"] / hf["tokens_per_s"] if sd and hf else None, GOAL_SD_VS_HF,
         f"K={k}: ours {sd['tokens_per_s']:.2f} tok/s vs HF {hf['tokens_per_s']:.2f} tok/s" if sd and hf
         else "needs a greedy mode with SD and the HF peer at K")
    p = modes.get(primary)
    sd_p = _find(p, "sd")

    def why(row):  # the counts behind a speedup: rates of the policy against SD's
        if not row or not sd_p:
            return ""
        return (f"{row['run']} vs {sd_p['run']}: N_target/N {_f(row['verification_rate'], '.3f')} vs "
                f"{_f(sd_p['verification_rate'], '.3f')}, N_discarded/N {_f(row['discard_rate'], '.3f')} vs "
                f"{_f(sd_p['discard_rate'], '.3f')}")

    spp = _find(p, "specdecpp")
    goal("SpecDec++ ≥ 1.10× best fixed-K SD (tokens/s)", primary, spp["speedup_vs_sd"] if spp else None,
         GOAL_SPECDECPP, why(spp))
    spr = _find(p, "sprinter")
    goal("SPRINTER ≥ 1.6× SD (tokens/s)", primary, spr["speedup_vs_sd"] if spr else None, GOAL_SPRINTER, why(spr))
    drop = (sd_p["pass_at_1"] - spr["pass_at_1"]) if spr and sd_p and spr["pass_at_1"] is not None \
        and sd_p["pass_at_1"] is not None else None
    goal("SPRINTER pass@1 within 3 points of SD (drop)", primary, drop, GOAL_PASS_DROP,
         f"SD {sd_p['pass_at_1']:.3f}, SPRINTER {spr['pass_at_1']:.3f}" if drop is not None
         else "needs HumanEval prompts", higher=False)
    return out


# ---------------------------------------------------------------------------------------------------- plots


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _families(mode: dict, keep) -> list[str]:
    """The families of a mode's sweep rows whose policy class passes ``keep``, in table order."""
    return list(dict.fromkeys(r["family"] for r in mode["sweep"] if keep(POLICIES[r["family"]])))


def _pareto_curve(policy: type) -> bool:
    """SpecDec++ Fig. 3's curves: the exact policies swept over a setting, fixed-K SD and the trained stop head."""
    return bool(policy.exact and policy.setting and (policy.reference or policy.trained))


def plot_pareto(summary: dict, path: Path) -> Path:
    """SpecDec++ Fig. 3: verification rate N_target/N against discard rate N_discarded/N, h sweep vs fixed K."""
    plt = _plt()
    modes = list(summary["modes"].items())
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.5), squeeze=False)
    for ax, (name, m) in zip(axes[0], modes):
        for fam, style in zip(_families(m, _pareto_curve), ("o-", "s-")):
            key = POLICIES[fam].setting
            rows = [r for r in m["sweep"] if r["family"] == fam and r["discard_rate"] is not None]
            rows.sort(key=lambda r: r["discard_rate"])
            if rows:
                ax.plot([r["discard_rate"] for r in rows], [r["verification_rate"] for r in rows], style,
                        label="fixed K" if POLICIES[fam].reference else f"{fam} ({key} sweep)")
                for r in rows:
                    v = r["params"].get(key)
                    ax.annotate(f"{key}={'file' if v is None else v}", (r["discard_rate"], r["verification_rate"]),
                                fontsize=7, xytext=(3, 3), textcoords="offset points")
        for r in m["sweep"]:
            p = POLICIES[r["family"]]
            if not _pareto_curve(p) and not (p.reference and p.exact) and r["discard_rate"] is not None:
                ax.plot(r["discard_rate"], r["verification_rate"], "x", color="gray")
                ax.annotate(r["run"], (r["discard_rate"], r["verification_rate"]), fontsize=6, color="gray",
                            xytext=(3, -8), textcoords="offset points")
        ax.set(title=f"{name}: lower-left is better", xlabel="discard rate N_discarded / N",
               ylabel="verification rate N_target / N")
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_speedup(summary: dict, path: Path) -> Path:
    """Per-policy speedup over target-only: mean over prompts with ±1 std error bars, prompts as dots."""
    plt = _plt()
    modes = list(summary["modes"].items())
    fig, axes = plt.subplots(len(modes), 1, figsize=(max(7, 0.7 * max(len(m["table"]) for _, m in modes)),
                                                     3.8 * len(modes)), squeeze=False)
    for ax, (name, m) in zip(axes[:, 0], modes):
        rows = [r for r in m["table"] if r["per_prompt_speedup"] and r["per_prompt_speedup"]["n"]]
        xs = range(len(rows))
        ax.bar(xs, [r["per_prompt_speedup"]["mean"] for r in rows], yerr=[r["per_prompt_speedup"]["std"] for r in rows],
               capsize=3, color=["tab:orange" if r["family"] == HF_FAMILY else "tab:blue" for r in rows])
        ax.scatter([x for x, r in zip(xs, rows)], [r["speedup_vs_target"] for r in rows], marker="_", color="k",
                   s=200, zorder=3, label="overall tokens/s ratio")
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xticks(list(xs), [r["run"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set(title=f"{name}: speedup over target-only (bars: mean per prompt ± std)", ylabel="speedup")
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_quality(summary: dict, path: Path) -> Path:
    """SPRINTER (τ sweep) and Fuzzy SD (T sweep): pass@1 (or ROUGE-L vs SD) against speedup over target-only."""
    plt = _plt()
    modes = list(summary["modes"].items())
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.5), squeeze=False)
    for ax, (name, m) in zip(axes[0], modes):
        has_pass = any(r["pass_at_1"] is not None for r in m["sweep"])
        metric = "pass@1" if has_pass else "ROUGE-L vs SD"

        def y(r):
            if has_pass:
                return r["pass_at_1"]
            vs = (r.get("rouge") or {}).get("vs_sd")
            return vs["rougeL"] if vs else None

        for fam, style in zip(_families(m, lambda p: not p.exact and p.setting), ("o-", "s--")):
            rows = sorted((r for r in m["sweep"] if r["family"] == fam and y(r) is not None),
                          key=lambda r: r["speedup_vs_target"] or 0)
            if rows:
                ax.plot([r["speedup_vs_target"] for r in rows], [y(r) for r in rows], style, label=fam)
                for r in rows:
                    ax.annotate(r["run"].split("[")[-1].rstrip("]"), (r["speedup_vs_target"], y(r)), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
        for r in m["sweep"]:
            if POLICIES[r["family"]].reference and (r["chosen"] or not POLICIES[r["family"]].setting) \
                    and y(r) is not None and r["speedup_vs_target"] is not None:
                ax.plot(r["speedup_vs_target"], y(r), "*", ms=12, label=r["run"])
        ax.set(title=f"{name}: quality vs speed", xlabel="speedup over target-only (measured)", ylabel=metric)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


# ---------------------------------------------------------------------------------------------------- text


def _f(v, fmt=".2f", none="") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return format(v, fmt)


def _table_md(rows: list[dict], fit_names: list[str], sweep: bool = False) -> list[str]:
    cols = ["policy", "tok/s", "× target", "× SD", "per-prompt × target (mean ± std)", "N_target/N",
            "N_draft/N", "N_discarded/N", "unused fwd", "mean accepted", "pass@1", "ROUGE-L vs SD",
            "ROUGE-L vs ref"]
    cols += [f"pred. × target ({n})" for n in fit_names]
    greedy = any(r.get("same_as_target") for r in rows)
    if greedy:
        cols.append("= target-only (identical / common prefix)")
    if sweep:
        cols.append("chosen")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        pp = r["per_prompt_speedup"]
        rg = r.get("rouge") or {}
        cells = [f"`{r['run']}`", _f(r["tokens_per_s"]), _f(r["speedup_vs_target"]), _f(r["speedup_vs_sd"]),
                 f"{pp['mean']:.2f} ± {pp['std']:.2f}" if pp and pp["n"] else "",
                 _f(r["verification_rate"], ".3f"), _f(r.get("draft_rate"), ".3f"), _f(r["discard_rate"], ".3f"),
                 _f(r.get("unused_forwards"), "d"), _f(r["mean_accepted"]),
                 _f(r["pass_at_1"], ".3f"), _f((rg.get("vs_sd") or {}).get("rougeL"), ".3f"),
                 _f((rg.get("vs_ref") or {}).get("rougeL"), ".3f")]
        cells += [_f(r.get(f"pred_speedup_{n}")) for n in fit_names]
        if greedy:
            same = r.get("same_as_target")
            cells.append(f"{same['identical']:.2f} / {same['common_prefix']:.2f}" if same else "")
        if sweep:
            cells.append("✓" if r.get("chosen") else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _rouge_md(rows: list[dict]) -> list[str]:
    lines = ["| policy | R-1 vs SD | R-2 vs SD | R-L vs SD | R-1 vs ref | R-2 vs ref | R-L vs ref |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        rg = r.get("rouge") or {}
        vs_sd, vs_ref = rg.get("vs_sd") or {}, rg.get("vs_ref") or {}
        lines.append(f"| `{r['run']}` | " + " | ".join(_f(d.get(k), ".3f") for d in (vs_sd, vs_ref)
                                                      for k in quality.ROUGE_KEYS) + " |")
    return lines


def _training_md(train_dir: Path | None, out: Path) -> tuple[list[str], dict | None]:
    """Training's ROC figure (copied) and its held-out AUROC of every head and training-free score."""
    if train_dir is None or not (train_dir / "metrics.json").exists():
        return [f"_No training output under `{train_dir}`: ROC curves skipped._"], None
    metrics = json.loads((train_dir / "metrics.json").read_text())
    lines = []
    if (train_dir / "roc.png").exists():
        shutil.copy(train_dir / "roc.png", out / "roc.png")
        lines += ["![ROC curves](roc.png)", ""]
    lines += [f"Held-out test rows of `{train_dir}` (training's figures, not recomputed here).", "",
              "| head | label | threshold | scorer | AUROC | AP |", "|---|---|---|---|---|---|"]
    for m in metrics:
        scorers = sorted({k.split("/")[0] for k in m["test"] if k.endswith("/auroc")}, key=lambda s: s != "head")
        thr = f"{m['threshold']['name']}={m['threshold']['value']:.3f}"
        for s in scorers:
            lines.append(f"| {m['name']} | {m['label']} | {thr} | {s} | {m['test'][f'{s}/auroc']:.3f} | "
                         f"{_f(m['test'].get(f'{s}/ap'), '.3f')} |")
    return lines, metrics


def _theorem7_md(t7: dict) -> str:
    """SPRINTER Theorem 7 as one line: per head, the predicted rate of kept draft tokens, then each run's measured
    one."""
    title = "- SPRINTER Theorem 7 (a draft token is kept with probability 1 − (1 − η_FP)·TV(p, q))"
    if t7["skipped"]:
        return f"{title}: not checked, {t7['skipped']}."
    parts = []
    for head, h in t7["heads"].items():
        weighted = "" if h["predicted_weighted"] is None else (
            f", weighted by the excess mass (q − p)+ (exact for a token-dependent head) {h['eta_fp_weighted']:.3f} "
            f"→ {h['predicted_weighted']:.3f}")
        runs = "; ".join(f"`{r['mode']}` `{r['run']}` {r['kept_rate']:.3f} of {r['drafted']} drafted"
                         + ("" if r["at_exported_tau"] else " (another τ: no prediction)")
                         for r in t7["runs"] if r["head"] == head)
        parts.append(f"`{Path(head).name}` at its exported τ = {h['exported_tau']:.3f}: predicted with "
                     f"η_FP = P(P̂ ≥ τ | q/p > 1) {h['eta_fp']:.3f} → {h['predicted']:.3f}{weighted}; measured {runs}")
    if t7["not_checked"]:
        parts.append(f"not checked: {'; '.join(t7['not_checked'])}")
    return (f"{title}, mean TV {t7['mean_tv']:.3f} over {t7['tv_rows']} test rows of `{t7['labels_dir']}`: "
            + " — ".join(parts) + ".")


def render_md(cfg: EvalConfig, s: dict, training: list[str]) -> str:
    fit_names = list(s["latency_fit"])
    lines = [f"# Evaluation: {s['draft']} → {s['target']}", "",
             f"- device: {s['device']}; {s['prompts']} prompts from `{cfg.prompts.source}`"
             f" (sweeps on the first {s['sweep_prompts']}), at most {s['max_new_tokens']} new tokens each. "
             "A subset of prompts and a short cap keep a CPU run affordable; figures on this subset carry that "
             "sampling noise (see the per-prompt spread).",
             f"- K, h, τ chosen by the lowest {s['select_by']} latency per token on the sweep prompts; SPRINTER "
             f"and Fuzzy SD only among settings within {cfg.max_pass_drop * 100:.0f} pass@1 points of SD.", ""]
    lines += ["## Latency model (SpecDec++ Eq. 5.1)", "",
              "T_total ≈ t_draft·N_draft + t_target·N_target (+ per-run intercept), fitted over every run of our "
              "decoder.", ""]
    for name, f in s["latency_fit"].items():
        if f is None:
            lines.append(f"- {name}: too few runs to fit")
        elif name == "fit":
            lines.append(f"- fitted here: t_draft = {f['t_draft'] * 1e3:.2f} ms, t_target = {f['t_target'] * 1e3:.2f} ms,"
                         f" intercept = {f['intercept'] * 1e3:.1f} ms/run, R² = {f['r2']:.4f} over {f['n_runs']} runs")
        else:
            lines.append(f"- from `{cfg.timing}`: t_draft = {f['t_draft'] * 1e3:.2f} ms, "
                         f"t_target = {f['t_target'] * 1e3:.2f} ms (bench_timing decode step)")
    lines += ["", "## Goals", "", "| goal | mode | target | measured | met | margin | detail |",
              "|---|---|---|---|---|---|---|"]
    for g in s["goals"]:
        met = "n/a" if g["met"] is None else ("met" if g["met"] else "**missed**")
        lines.append(f"| {g['goal']} | {g['mode'] or ''} | {g['target']:g} | {_f(g['value'], '.3f', 'n/a')} | {met} | "
                     f"{_f(g['margin'], '+.3f')} | {g['detail']} |")
    lines += ["", _theorem7_md(s["theorem7"])]
    for name, m in s["modes"].items():
        smp = m["sampling"]
        lines += ["", f"## Mode `{name}` (temperature {smp['temperature']:g}, top-k {smp['top_k']}, "
                      f"top-p {smp['top_p']:g})", "",
                  "Each family at its chosen setting on every prompt, then the HF peer (its discard count is "
                  "unknown). Speedups are ratios of tokens/s.", ""]
        lines += _table_md(m["table"], fit_names)
        lines += ["", "### Sweeps (sweep prompts only)", ""]
        lines += _table_md(m["sweep"], fit_names, sweep=True)
        lines += ["", "### ROUGE (F-measure) of the chosen settings", ""]
        lines += _rouge_md(m["table"])
    lines += ["", "## Figures", "", "![Pareto: verification vs discard rate](pareto.png)", "",
              "![Speedup over target-only](speedup.png)", "", "![Quality vs speed](quality.png)", "",
              "## ROC curves of the heads and the training-free scores", ""]
    lines += training
    return "\n".join(lines) + "\n"


def write_report(out: Path, cfg: EvalConfig, records: list[dict], prompts: list[dict]) -> dict:
    """Write ``report.md``, ``report.json`` and the PNGs under ``out``; return the summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    s = summarize(cfg, records, prompts)
    training, metrics = _training_md(Path(cfg.train_dir) if cfg.train_dir else None, out)
    s["training"] = metrics
    if s["modes"]:
        plot_pareto(s, out / "pareto.png")
        plot_speedup(s, out / "speedup.png")
        plot_quality(s, out / "quality.png")
    (out / "report.json").write_text(json.dumps(s, indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_md(cfg, s, training))
    return s

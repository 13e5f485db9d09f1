"""The report's text: ``report.md`` from the summary (``evaluation.report.summarize``)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from core.cache import file_sha256
from core.runfolder import write_with
from evaluation import quality
from evaluation.config import EvalConfig
from evaluation.rundir import RunDir
from evaluation.summary import CONTENDED_LOAD


def cell(v, fmt=".2f", none="") -> str:
    """``v`` formatted for a table or a sentence; ``none`` where it is missing (None or NaN)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return format(v, fmt)


def with_interval(value, interval, fmt: str = ".2f") -> str:
    """``1.50 [1.32, 1.71]``: a figure with its bootstrap interval (the value alone when there is none, or when it
    is a single point: a run against itself)."""
    if value is None or interval is None or interval[0] == interval[1]:
        return cell(value, fmt)
    return f"{cell(value, fmt)} [{interval[0]:{fmt}}, {interval[1]:{fmt}}]"


def _table_md(rows: list[dict], fit_names: list[str], sweep: bool = False) -> list[str]:
    cols = ["policy", "tok/s", "× target [95 %]", "× SD [95 %]", "per-prompt × target (mean ± std)", "N_target/N",
            "N_draft/N", "N_discarded/N", "unused fwd", "mean accepted", "pass@1", "log p/token [95 %]",
            "Δ log p vs exact [95 %]", "ROUGE-L vs SD", "ROUGE-L vs ref"]
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
        cells = [f"`{r['run']}`", cell(r["tokens_per_s"]), with_interval(r["speedup_vs_target"], r.get("speedup_vs_target_ci")),
                 with_interval(r["speedup_vs_sd"], r.get("speedup_vs_sd_ci")),
                 f"{pp['mean']:.2f} ± {pp['std']:.2f}" if pp and pp["n"] else "",
                 cell(r["verification_rate"], ".3f"), cell(r.get("draft_rate"), ".3f"), cell(r["discard_rate"], ".3f"),
                 cell(r.get("unused_forwards"), "d"), cell(r["mean_accepted"]),
                 cell(r["pass_at_1"], ".3f"), with_interval(r.get("loglik"), r.get("loglik_ci"), ".3f"),
                 with_interval(r.get("loglik_vs_exact"), r.get("loglik_vs_exact_ci"), "+.3f"),
                 cell((rg.get("vs_sd") or {}).get("rougeL"), ".3f"),
                 cell((rg.get("vs_ref") or {}).get("rougeL"), ".3f")]
        cells += [cell(r.get(f"pred_speedup_{n}")) for n in fit_names]
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
        lines.append(f"| `{r['run']}` | " + " | ".join(cell(d.get(k), ".3f") for d in (vs_sd, vs_ref)
                                                      for k in quality.ROUGE_KEYS) + " |")
    return lines


def training_md(train_dir: Path | None, out: Path) -> tuple[list[str], dict | None]:
    """Training's ROC figure (copied) and its held-out AUROC of every head and training-free score."""
    if train_dir is None or not (train_dir / "metrics.json").exists():
        return [f"_No training output under `{train_dir}`: ROC curves skipped._"], None
    metrics = json.loads((train_dir / "metrics.json").read_text())
    state = {m["name"]: _export_state(m) for m in metrics}
    stale = [name for name, st in state.items() if st == "changed"]
    unrecorded = [name for name, st in state.items() if st == "unrecorded"]
    metrics = [m for m in metrics if state[m["name"]] != "changed"]
    roc = RunDir(out).roc_png
    lines = []
    if stale:  # another training wrote those files since: its figures are not the decoded heads'
        roc.unlink(missing_ok=True)
        lines += [f"_Left out: {', '.join(stale)}, whose exported head files are no longer the ones `{train_dir}` "
                  "measured (trained again since, elsewhere); so is its ROC figure._", ""]
    elif (train_dir / "roc.png").exists():
        write_with(RunDir(out).claim(roc), lambda tmp: shutil.copy(train_dir / "roc.png", tmp))
        lines += [f"![ROC curves]({roc.name})", ""]
    if unrecorded:
        lines += [f"_{', '.join(unrecorded)}: `{train_dir}` did not record which head files it measured (trained "
                  "before that was kept); train again to have them checked._", ""]
    if not metrics:
        return lines, None
    lines += [f"Held-out test rows of `{train_dir}` (training's figures, not recomputed here).", "",
              "| head | label | threshold | scorer | AUROC | AP |", "|---|---|---|---|---|---|"]
    for m in metrics:
        scorers = sorted({k.split("/")[0] for k in m["test"] if k.endswith("/auroc")}, key=lambda s: s != "head")
        thr = f"{m['threshold']['name']}={m['threshold']['value']:.3f}"
        for s in scorers:
            lines.append(f"| {m['name']} | {m['label']} | {thr} | {s} | {m['test'][f'{s}/auroc']:.3f} | "
                         f"{cell(m['test'].get(f'{s}/ap'), '.3f')} |")
    return lines, metrics


def _export_state(m: dict) -> str:
    """Whether a training row's head file is still the one it exported: "same" (or it exported none), "changed"
    (another file at its path, or none), or "unrecorded" (a table from before the digests were kept)."""
    path = m.get("export")
    if not path:
        return "same"
    if not Path(path).is_file():
        return "changed"
    if "export_sha256" not in m:
        return "unrecorded"
    return "same" if m["export_sha256"] == file_sha256(Path(path)) else "changed"


def theorem7_md(t7: dict) -> str:
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


def _selection_md(selection: dict | None) -> list[str]:
    """The trace simulator's choice of each family's setting (``select_by: simulated``), with its grid."""
    if not selection:
        return []
    lines = ["", "## Settings chosen by the trace simulator", "",
             "Predicted speedup over target-only for a response of `max_new_tokens` tokens, replaying the label "
             "traces at the pair's per-forward costs (`evaluation.simulate`); only the chosen setting was decoded.",
             "", "| mode | family | chosen | traces | grid (predicted × target) |", "|---|---|---|---|---|"]
    for mode, families in selection.items():
        for family, c in families.items():
            grid = ", ".join(f"{','.join(f'{k}={v}' for k, v in g['params'].items())}: {g['predicted_speedup']:.2f}"
                             for g in c["grid"])
            lines.append(f"| {mode} | {family} | `{c['run']}` {c['predicted_speedup']:.2f}× | {c['traces']} | "
                         f"{grid} |")
    return lines


def _contention_md(c: dict | None) -> list[str]:
    if not c or not c["contended"]:
        return []
    return [f"- **Other work shared the CPU** during {c['contended']} of {c['runs']} runs (1-minute load above the "
            f"eval's {c['threads']} threads + {CONTENDED_LOAD:g}, up to {c['max_load']:.1f}): their timings, and the ratios that pair "
            "them, are noisier than this machine's own. Run the eval again with nothing else running."]


def render_md(cfg: EvalConfig, s: dict, training: list[str]) -> str:
    fit_names = list(s["latency_fit"])
    lines = [f"# Evaluation: {s['draft']} → {s['target']}", "",
             f"- device: {s['device']}; {s['prompts']} prompts from `{cfg.prompts.source}`"
             f" (sweeps on the first {s['sweep_prompts']}), at most {s['max_new_tokens']} new tokens each. "
             "A subset of prompts and a short cap keep a CPU run affordable; figures on this subset carry that "
             "sampling noise (see the per-prompt spread).",
             ("- K, h, τ of the exact policies chosen by the trace simulator over the label traces (below), in "
              "modes sampled like the labels; elsewhere, and for SPRINTER and Fuzzy SD, by the lowest measured "
              if s["select_by"] == "simulated" else f"- K, h, τ chosen by the lowest {s['select_by']} ")
             + f"latency per token on the sweep prompts; SPRINTER and Fuzzy SD only among settings within "
               f"{cfg.max_pass_drop * 100:.0f} pass@1 points of SD.",
             "- log p/token: the target's mean log-likelihood per token of each run's output (one target forward "
             "per completion); Δ vs exact: its difference from the mean of the mode's other exact runs, paired by "
             "prompt. Exact policies sample the target's distribution, so their Δ is 0 up to noise.",
             *_contention_md(s.get("cpu_contention")), ""]
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
            source = "the pair's forwards timed here" if name == "forwards" else f"`{cfg.timing}`"
            step = f.get("t_target_step") or f["t_target"]
            lines.append(f"- from {source}: t_draft = {f['t_draft'] * 1e3:.2f} ms (draft step + the per-token part "
                         f"of a verification), t_target = {f['t_target'] * 1e3:.2f} ms per verification call "
                         f"({step * 1e3:.2f} ms per one-token step of target-only), prefill intercepts "
                         f"{f['intercept']:.2f} s (target) + {f.get('draft_intercept', 0.0):.2f} s (draft)")
    lines += ["", "## Goals", "",
              "Intervals: paired bootstrap 95 % over prompts; \"clears\" when the whole interval is on the goal's side.",
              "", "| goal | mode | target | measured | 95 % interval | met | interval clears | margin | detail |",
              "|---|---|---|---|---|---|---|---|---|"]
    for g in s["goals"]:
        met = "n/a" if g["met"] is None else ("met" if g["met"] else "**missed**")
        iv = g.get("interval")
        clears = {None: "n/a", True: "yes", False: "**no**"}[g.get("interval_clears")]
        lines.append(f"| {g['goal']} | {g['mode'] or ''} | {g['target']:g} | {cell(g['value'], '.3f', 'n/a')} | "
                     f"{f'{iv[0]:.3f}–{iv[1]:.3f}' if iv else ''} | {met} | {clears} | {cell(g['margin'], '+.3f')} | "
                     f"{g['detail']} |")
    lines += ["", theorem7_md(s["theorem7"])]
    lines += _selection_md(s.get("selection"))
    for name, m in s["modes"].items():
        smp = m["sampling"]
        lines += ["", f"## Mode `{name}` (temperature {smp['temperature']:g}, top-k {smp['top_k']}, "
                      f"top-p {smp['top_p']:g})", "",
                  "Each family at its chosen setting on every prompt, then the HF peer (its discard count is "
                  "unknown). Speedups are ratios of tokens/s.", ""]
        lines += _table_md(m["table"], fit_names)
        if not all(r.get("chosen") for r in m["sweep"]):  # else every run was its family's one setting
            lines += ["", "### Sweeps (sweep prompts only)", ""]
            lines += _table_md(m["sweep"], fit_names, sweep=True)
        lines += ["", "### ROUGE (F-measure) of the chosen settings", ""]
        lines += _rouge_md(m["table"])
    lines += ["", "## Figures", "", "![Pareto: verification vs discard rate](pareto.png)", "",
              "![Speedup over target-only](speedup.png)", "", "![Quality vs speed](quality.png)", "",
              "## ROC curves of the heads and the training-free scores", ""]
    lines += training
    return "\n".join(lines) + "\n"

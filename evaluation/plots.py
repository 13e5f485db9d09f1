"""The report's figures (PNG) from the summary (``evaluation.report.summarize``); the policies' registry tells which
families each figure draws as curves."""

from __future__ import annotations

from pathlib import Path

from core.runfolder import write_figure
from decoding.policies import POLICIES
from evaluation.config import PEER_FAMILIES


def save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    try:
        return write_figure(fig, path)
    finally:
        plt.close(fig)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _families(mode: dict, keep) -> list[str]:
    """The families of a mode's sweep rows whose policy class passes ``keep``, in table order."""
    return list(dict.fromkeys(r["family"] for r in mode["sweep"] if keep(POLICIES[r["family"]])))


def _pareto_curve(policy: type) -> bool:
    """SpecDec++ Fig. 3's curves: the exact policies swept over a setting, fixed-K SD and the trained stop head."""
    return bool(policy.exact and policy.setting and (policy.reference or policy.head_role is not None))


def plot_pareto(summary: dict, path: Path) -> Path:
    """SpecDec++ Fig. 3: verification rate N_target/N against discard rate N_discarded/N, h sweep vs fixed K."""
    plt = pyplot()
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
    return save(plt, fig, path)


def plot_speedup(summary: dict, path: Path) -> Path:
    """Per-policy speedup over target-only: mean over prompts with ±1 std error bars, prompts as dots."""
    plt = pyplot()
    modes = list(summary["modes"].items())
    fig, axes = plt.subplots(len(modes), 1, figsize=(max(7, 0.7 * max(len(m["table"]) for _, m in modes)),
                                                     3.8 * len(modes)), squeeze=False)
    for ax, (name, m) in zip(axes[:, 0], modes):
        rows = [r for r in m["table"] if r["per_prompt_speedup"] and r["per_prompt_speedup"]["n"]]
        xs = range(len(rows))
        ax.bar(xs, [r["per_prompt_speedup"]["mean"] for r in rows], yerr=[r["per_prompt_speedup"]["std"] for r in rows],
               capsize=3, color=["tab:orange" if r["family"] in PEER_FAMILIES else "tab:blue" for r in rows])
        ax.scatter([x for x, r in zip(xs, rows)], [r["speedup_vs_target"] for r in rows], marker="_", color="k",
                   s=200, zorder=3, label="overall tokens/s ratio")
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xticks(list(xs), [r["run"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set(title=f"{name}: speedup over target-only (bars: mean per prompt ± std)", ylabel="speedup")
        ax.legend(fontsize=8)
    return save(plt, fig, path)


def plot_quality(summary: dict, path: Path) -> Path:
    """SPRINTER (τ sweep) and Fuzzy SD (T sweep): pass@1 (or ROUGE-L vs SD) against speedup over target-only."""
    plt = pyplot()
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
            rows = sorted((r for r in m["sweep"] if r["family"] == fam and y(r) is not None
                           and r["speedup_vs_target"] is not None),  # None: no target-only run
                          key=lambda r: r["speedup_vs_target"])
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
    return save(plt, fig, path)

"""What ``specheads advise`` writes: the verdict, the settings to paste into each runtime, the table of every rule
priced, and a picture of the predicted speedup over each runtime's own settings (with measured points where
``--check`` ran)."""

from __future__ import annotations

from pathlib import Path

from evaluation.advice_rules import CEILING, LLAMA_CPP, OURS, Setting, best
from evaluation.plots import pyplot, save


def verdict(settings: list[Setting]) -> tuple[Setting | None, str]:
    """(the setting to run, or None for target-only, and the verdict in one sentence): among the settings a runtime
    users run executes (llama.cpp's) whose interval over the prompts lies above 1.0, the fastest predicted."""
    paying = best([s for s in settings if s.speedup.low > 1.0], LLAMA_CPP)
    if paying is None:
        top = best(settings, LLAMA_CPP)
        shown = "" if top is None else f" (the fastest, {top.label}, is predicted at {top.speedup}x)"
        return None, f"do not speculate here: no setting's interval lies above 1.0{shown}"
    return paying, (f"speculate: {paying.drafter} with llama.cpp's {paying.label}, predicted {paying.speedup}x "
                    "target-only")


def llama_flags(pick: Setting | None, threads: int | None) -> dict[str, str]:
    """The setting as llama.cpp's users give it: ``llama-server`` / ``llama-cli`` flags (its server takes no
    per-request speculative fields: they are compiled out of ``tools/server/server-schema.cpp``)."""
    t = [] if threads is None else ["-t", str(threads)]
    if pick is None:
        return {"flags": " ".join(["-m TARGET.gguf", *t])}
    if pick.rule == "draft-simple":
        flags = ["-m TARGET.gguf", "-md DRAFT.gguf", "--spec-type draft-simple",
                 f"--spec-draft-n-max {pick.params['n_max']}", f"--spec-draft-p-min {pick.params['p_min']:g}", *t,
                 *([] if threads is None else ["-td", str(threads)])]
    else:
        flags = ["-m TARGET.gguf", "--spec-type ngram-simple", f"--spec-ngram-simple-size-n {pick.params['n']}",
                 f"--spec-ngram-simple-size-m {pick.params['m']}", *t]
    return {"flags": " ".join(flags)}


def markdown(settings: list[Setting], inputs: dict, pick: Setting | None, sentence: str, flags: dict,
             checked: list[dict] | None = None) -> str:
    """The report."""
    lines = ["# Does speculative decoding pay here?", "", f"**{sentence}.**", "",
             f"- traces: {inputs['traces']} responses of the target from `{inputs['labels']}` "
             f"({inputs['sampling']}, at most {inputs['max_new_tokens']} tokens)",
             f"- costs: `{inputs['timing']}` ({inputs['device']}, {inputs['backend']}, {inputs['threads']} threads): "
             f"target step {1e3 * inputs['target_step']:.1f} ms, draft step {1e3 * inputs['draft_step']:.1f} ms, "
             f"sampler {1e3 * inputs['sampler']:.2f} ms a token; timed by {inputs['timed_with']}",
             "", "## In llama.cpp's terms", "",
             "`llama-server` / `llama-cli` flags (TARGET.gguf and DRAFT.gguf are your two files):", "",
             f"    {flags['flags']}", "", "(llama-server takes them at start only: this llama.cpp compiles its "
             "per-request speculative fields out.)", "",
             "Checked on this machine: " + ("the setting above, llama.cpp's defaults and one more, through "
                                            "`llama-speculative-simple` (below)" if checked else
                                            "nothing (run with `--check` to measure them)") + ".", ""]
    lines += ["## Every rule priced", "",
              "Predicted tokens/s over target-only with a 95 % bootstrap interval over the prompts; N_t/N is target "
              "calls per token, N_x/N drafted tokens discarded per token. `runs in`: llama.cpp (its binaries and "
              "server), specheads (our decoder: `specheads generate`), ceiling (an oracle no decoder runs).", "",
              "| runs in | drafter | rule | speedup | N_t/N | N_x/N |", "|---|---|---|---|---|---|"]
    shown = _shown(settings)
    for s in shown:
        nt, nx = s.rates()
        mark = " (default)" if s.default else ""
        lines.append(f"| {s.runtime} | {s.drafter} | {s.label}{mark} | {s.speedup} | {nt:.3f} | {nx:.3f} |")
    hidden = len(settings) - len(shown)
    if hidden:
        lines += ["", f"{hidden} more settings are in `advice.json`."]
    if checked:
        lines += ["", "## Measured (`--check`)", "",
                  f"llama.cpp's own binaries on {checked[0]['prompts']} prompts not among the traces, interleaved; "
                  "tokens/s over its target alone with a 95 % paired bootstrap interval; N_t/N and N_x/N as "
                  "predicted and as llama.cpp counted them (where they agree and the speedups do not, the costs are "
                  "off, not the replay).", "",
                  "| setting | predicted | measured | measured / predicted | N_t/N pred., meas. | N_x/N pred., meas. |",
                  "|---|---|---|---|---|---|"]
        for c in checked:
            (pt, px), (mt, mx) = c["predicted_rates"], c["measured_rates"]
            lines.append(f"| {c['label']} | {c['predicted']:.3f} | {c['measured']} | "
                         f"{c['measured'].value / c['predicted']:.3f} | {pt:.3f}, {mt:.3f} | {px:.3f}, {mx:.3f} |")
    return "\n".join(lines) + "\n"


def _shown(settings: list[Setting]) -> list[Setting]:
    """The table's rows: every default, the three best of each (runtime, rule), every ceiling and target-only."""
    keep = []
    for runtime in (LLAMA_CPP, OURS, CEILING):
        for rule in dict.fromkeys(s.rule + s.drafter for s in settings if s.runtime == runtime):
            group = [s for s in settings if s.runtime == runtime and s.rule + s.drafter == rule]
            top = sorted(group, key=lambda s: -s.speedup.value)[:3]
            keep += [s for s in group if s in top or s.default or len(group) == 1]
    return keep


def picture(settings: list[Setting], path: Path, checked: list[dict] | None = None) -> Path:
    """Predicted speedup over llama.cpp's own settings: draft-simple over n_max, a line per p_min; ngram-simple per
    (n, m); the ceilings dashed; measured points (``--check``) as crosses."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    simple = [s for s in settings if s.rule == "draft-simple"]
    for p_min in sorted({s.params["p_min"] for s in simple}):
        row = sorted((s for s in simple if s.params["p_min"] == p_min), key=lambda s: s.params["n_max"])
        x = [s.params["n_max"] for s in row]
        left.plot(x, [s.speedup.value for s in row], "o-", label=f"p_min {p_min:g}")
        left.fill_between(x, [s.speedup.low for s in row], [s.speedup.high for s in row], alpha=0.12)
    lookup = [s for s in settings if s.rule == "ngram-simple"]
    right.bar(range(len(lookup)), [s.speedup.value for s in lookup],
              yerr=[[s.speedup.value - s.speedup.low for s in lookup], [s.speedup.high - s.speedup.value
                                                                         for s in lookup]], color="tab:green")
    right.set_xticks(range(len(lookup)), [f"{s.params['n']},{s.params['m']}" for s in lookup], rotation=45)
    for s in settings:
        if s.runtime == CEILING:
            ax = left if s.drafter == "draft model" else right
            ax.axhline(s.speedup.value, ls="--", color="gray", label=f"oracle ({s.drafter})")
    for c in checked or []:
        s = c["setting"]
        value = c["measured"].value
        if s.rule == "draft-simple":
            left.plot(s.params["n_max"], value, "kx", ms=10, mew=2)
        elif s.rule == "ngram-simple":
            right.plot(lookup.index(s), value, "kx", ms=10, mew=2)
    for ax, title, xlabel in ((left, "llama.cpp draft-simple (draft model)", "--spec-draft-n-max"),
                              (right, "llama.cpp ngram-simple (prompt lookup)", "n-gram size n, copy m")):
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("predicted speedup over target-only")
        ax.legend(fontsize=7)
    return save(plt, fig, path)

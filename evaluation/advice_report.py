"""What ``specheads advise`` writes: the verdict, the settings to paste into each runtime, the table of every rule
priced, and a picture of the predicted speedup over each runtime's own settings (with measured points where
``--check`` ran)."""

from __future__ import annotations

import json
from pathlib import Path

from core.intervals import new_set_interval

from evaluation.advice_rules import (CEILING, LLAMA_CPP, OURS, RUNTIMES, TRAINED_RULES, TRANSFORMERS, VLLM,
                                     Setting, best)
from evaluation.plots import pyplot, save
from evaluation.simulate_lookup import priced_runs


def owning(runtime: str) -> str:
    """The runtime's name with its possessive: llama.cpp's, transformers'."""
    return runtime + ("'" if runtime.endswith("s") else "'s")


def verdict(settings: list[Setting], runtime: str = LLAMA_CPP) -> tuple[Setting | None, str]:
    """(the setting to run, or None for target-only, and the verdict in one sentence): among the settings the
    runtime users run executes whose interval over the prompts lies above 1.0, the fastest predicted."""
    paying = best([s for s in settings if s.speedup.low > 1.0], runtime)
    if paying is None:
        top = best(settings, runtime)
        shown = "" if top is None else f" (the fastest, {top.label}, is predicted at {top.speedup}x)"
        return None, f"do not speculate here: no setting's interval lies above 1.0{shown}"
    return paying, (f"speculate: {paying.drafter} with {owning(runtime)} {paying.label}, predicted {paying.speedup}x "
                    "target-only")


def another_set(setting: Setting | None, costs, prompts: list[int] | None, count: int) -> dict | None:
    """How ``setting`` may run on ``count`` other prompts like the traced ones (``core.intervals.new_set_interval``:
    the spread between prompts, which the interval over these prompts' mean leaves out); None without a setting."""
    if setting is None or len(setting.counts) < 2:
        return None
    spread = new_set_interval(*priced_runs(setting.counts, costs, prompts=prompts), count)
    return {"setting": setting.label, "prompts": count, "level": 0.9, "median": spread.value, "low": spread.low,
            "high": spread.high}


def another_set_line(spread: dict, traced: int) -> str:
    return (f"another {spread['prompts']} prompts like these (--check's count, default 20): {spread['setting']} at "
            f"{spread['low']:.2f}–{spread['high']:.2f}x target-only in {spread['level']:.0%} of such sets; the "
            f"bracketed 95 % intervals are the mean's over these {traced} traces")


def paste(runtime: str, pick: Setting | None, threads: int | None, max_new_tokens: int) -> dict:
    """The setting as the runtime's users give it (``flags``: one line to paste)."""
    if runtime == VLLM:
        return vllm_config(pick)
    return llama_flags(pick, threads) if runtime == LLAMA_CPP else assisted_fields(pick, max_new_tokens)


def vllm_config(pick: Setting | None) -> dict:
    """vLLM's setting: ``vllm serve`` with its ``--speculative-config`` (``speculative_config`` of ``LLM(...)``
    holds the same dict)."""
    if pick is None:
        return {"flags": "vllm serve TARGET"}
    config = {"model": "DRAFT", "num_speculative_tokens": int(pick.params["num_speculative_tokens"]),
              "method": "draft_model"}
    return {"flags": f"vllm serve TARGET --speculative-config '{json.dumps(config)}'", "speculative_config": config}


def generation_fields(params: dict) -> dict:
    """An assisted-generation setting as the fields of the draft's ``GenerationConfig`` transformers reads them
    from (``AssistedCandidateGenerator`` copies the assistant's config; keyword arguments of ``generate()`` set the
    target's)."""
    return {"num_assistant_tokens": int(params["k"]), "num_assistant_tokens_schedule": params["schedule"],
            "assistant_confidence_threshold": float(params["threshold"])}


def assisted_fields(pick: Setting | None, max_new_tokens: int) -> dict[str, str]:
    """transformers' setting: the draft's generation-config fields, then the ``generate()`` call."""
    if pick is None:
        return {"flags": f"target.generate(**inputs, do_sample=False, max_new_tokens={max_new_tokens})"}
    fields = "; ".join(f"draft.generation_config.{k} = {v!r}" for k, v in generation_fields(pick.params).items())
    return {"flags": f"{fields}; target.generate(**inputs, assistant_model=draft, do_sample=False, "
                     f"max_new_tokens={max_new_tokens})", "fields": generation_fields(pick.params)}


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
             checked: list[dict] | None = None, runtime: str = LLAMA_CPP) -> str:
    """The report."""
    lines = ["# Does speculative decoding pay here?", "", f"**{sentence}.**", "",
             f"- traces: {inputs['traces']} responses of the target from `{inputs['labels']}` "
             f"({inputs['sampling']}, at most {inputs['max_new_tokens']} tokens)",
             f"- costs: `{inputs['timing']}` ({inputs['device']}, {inputs['backend']}, {inputs['threads']} threads): "
             f"target step {1e3 * inputs['target_step']:.1f} ms, draft step {1e3 * inputs['draft_step']:.1f} ms, "
             f"sampler {1e3 * inputs['sampler']:.2f} ms a token; timed by {inputs['timed_with']}",
             *([f"- our estimates: {', '.join(f'`{e}`' for e in inputs['estimates'])}"]
               if inputs.get("estimates") else []),
             *([f"- {another_set_line(inputs['another_set'], inputs['traces'])}"] if inputs.get("another_set") else []),
             "", f"## In {owning(runtime)} terms", ""]
    if runtime == LLAMA_CPP:
        lines += ["`llama-server` / `llama-cli` flags (TARGET.gguf and DRAFT.gguf are your two files):", "",
                  f"    {flags['flags']}", "", "(llama-server takes them at start only: this llama.cpp compiles its "
                  "per-request speculative fields out.)", ""]
    elif runtime == VLLM:
        lines += ["`vllm serve` (TARGET and DRAFT are your two checkpoints; `LLM(model=TARGET, speculative_config=…)` "
                  "takes the same dict):", "", f"    {flags['flags']}", "",
                  "Priced at the timing file's costs, which our decoder's forwards were timed at, not vLLM's: its "
                  "own step, verification and per-round costs on that device may differ. Its prefill is not "
                  "charged (vLLM reports the time per output token apart).", ""]
    elif pick is None:
        lines += ["The target alone, without an assistant (greedy, as the traces):", "",
                  *[f"    {line.strip()}" for line in flags["flags"].split(";")], ""]
    else:
        lines += ["The draft's generation config (transformers reads the assistant's settings there, not from "
                  "`generate()`'s keyword arguments), then the call (greedy, as the traces):", "",
                  *[f"    {line.strip()}" for line in flags["flags"].split(";")], "",
                  "Its predictions include each call's prefill (a `generate()` call's time does); "
                  "`heuristic_transient` starts every call at K, `heuristic` would carry K over from the last.", ""]
    how = {LLAMA_CPP: "through `llama-speculative-simple`", TRANSFORMERS: "through `generate()`", VLLM: ""}[runtime]
    unchecked = "nothing (`--check` does not run vLLM)" if runtime == VLLM \
        else "nothing (run with `--check` to measure them)"
    done = f"the setting above, {owning(runtime)} defaults and one more, {how} (below)"
    lines += ["Checked on this machine: " + (done if checked else unchecked) + ".", ""]
    lines += ["## Every rule priced", "",
              "Predicted tokens/s over target-only with a 95 % bootstrap interval over the prompts; N_t/N is target "
              "calls per token, N_x/N drafted tokens discarded per token. `runs in`: llama.cpp (its binaries and "
              "server), transformers (its `generate()`), vLLM (its engine), specheads (our decoder: `specheads "
              "generate`), ceiling (an oracle no decoder runs).", "",
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
        retimed = bool(checked[0].get("timed_during"))
        lines += ["", "## Measured (`--check`)", "",
                  f"{runtime} itself ({how}) on {checked[0]['prompts']} prompts not among the traces, interleaved; "
                  "tokens/s over its target alone with a 95 % paired bootstrap interval; N_t/N and N_x/N as "
                  f"predicted and as {runtime} counted them (where they agree and the speedups do not, the costs are "
                  "off, not the replay; transformers does not count the discarded tokens).", "",
                  *during_note(checked),
                  "| setting | predicted | measured | measured / predicted | N_t/N pred., meas. | N_x/N pred., meas. |"
                  + (" at the check's costs | measured / that |" if retimed else ""),
                  "|---|---|---|---|---|---|" + ("---|---|" if retimed else "")]
        for c in checked:
            (pt, px), (mt, mx) = c["predicted_rates"], c["measured_rates"]
            shown_mx = "–" if mx is None else f"{mx:.3f}"
            during = c.get("predicted_during")
            lines.append(f"| {c['label']} | {c['predicted']:.3f} | {c['measured']} | "
                         f"{c['measured'].value / c['predicted']:.3f} | {pt:.3f}, {mt:.3f} | {px:.3f}, {shown_mx} |"
                         + (f" {during:.3f} | {c['measured'].value / during:.3f} |" if during else ""))
    return "\n".join(lines) + "\n"


def during_note(checked: list[dict]) -> list[str]:
    """What the columns at the check's costs are, where the check timed the device during its runs."""
    if not checked[0].get("timed_during"):
        return []
    return [f"The device was timed again {checked[0]['timed_during']} times between the check's runs (of: before "
            "its first prompt, at its middle, after its last) and the same counts priced at the median of those "
            "costs: a shared machine's steps drift by the minute, and where the two predictions differ, so did the "
            "device between the timing and the check.", ""]


def _shown(settings: list[Setting]) -> list[Setting]:
    """The table's rows: every default, the three best of each (runtime, rule), every ceiling and target-only."""
    keep = []
    for runtime in RUNTIMES:
        for rule in dict.fromkeys(s.rule + s.drafter for s in settings if s.runtime == runtime):
            group = [s for s in settings if s.runtime == runtime and s.rule + s.drafter == rule]
            top = sorted(group, key=lambda s: -s.speedup.value)[:3]
            keep += [s for s in group if s in top or s.default or len(group) == 1]
    return keep


DRAFT_RULES = {"draft-simple": ("n_max", "llama.cpp draft-simple (draft model)", "--spec-draft-n-max"),
               "assisted": ("k", "transformers assisted generation (draft model)", "num_assistant_tokens"),
               "draft_model": ("num_speculative_tokens", "vLLM draft-model proposer", "num_speculative_tokens")}
"""Each runtime's draft-model rule as the picture draws it: its length setting on the x axis, a line per setting of
its others."""


def picture(settings: list[Setting], path: Path, checked: list[dict] | None = None) -> Path:
    """Predicted speedup over the runtime's own settings: its draft-model rule over its length, a line per setting
    of the others; ngram-simple per (n, m) where traced in llama.cpp; the ceilings dashed, our rules on a trained
    estimate dotted; measured points (``--check``) as crosses."""
    plt = pyplot()
    lookup = [s for s in settings if s.rule == "ngram-simple"]
    if lookup:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    else:  # a runtime whose prompt lookup is not replayed: its draft model alone
        fig, left = plt.subplots(1, 1, figsize=(8, 4.5))
        right = None
    rule = next((r for r in DRAFT_RULES if any(s.rule == r for s in settings)), "draft-simple")
    length, title, xlabel = DRAFT_RULES[rule]
    drafted = [s for s in settings if s.rule == rule]
    others = sorted({tuple((k, v) for k, v in s.params.items() if k != length) for s in drafted}, key=str)
    for other in others:
        row = sorted((s for s in drafted if all(s.params[k] == v for k, v in other)), key=lambda s: s.params[length])
        x = [s.params[length] for s in row]
        left.plot(x, [s.speedup.value for s in row], "o-", ms=3,
                  label=", ".join(f"{k} {v}" for k, v in other) or title)
        left.fill_between(x, [s.speedup.low for s in row], [s.speedup.high for s in row], alpha=0.08)
    if right is not None:
        right.bar(range(len(lookup)), [s.speedup.value for s in lookup],
                  yerr=[[s.speedup.value - s.speedup.low for s in lookup], [s.speedup.high - s.speedup.value
                                                                             for s in lookup]], color="tab:green")
        right.set_xticks(range(len(lookup)), [f"{s.params['n']},{s.params['m']}" for s in lookup], rotation=45)
    for s in settings:
        ours = s.runtime == OURS and s.rule in TRAINED_RULES
        if (s.runtime == CEILING or ours) and (right is not None or s.drafter == "draft model"):
            ax = left if s.drafter == "draft model" else right
            ax.axhline(s.speedup.value, ls=":" if ours else "--", color=f"C{len(ax.lines) % 10}",
                       label=f"ours: {s.label}" if ours else f"oracle ({s.drafter}{', ' if s.params else ''}"
                                                            f"{', '.join(map(str, s.params.values()))})")
    for c in checked or []:
        s = c["setting"]
        value = c["measured"].value
        if s.rule == rule:
            left.plot(s.params[length], value, "kx", ms=10, mew=2)
        elif s.rule == "ngram-simple":
            right.plot(lookup.index(s), value, "kx", ms=10, mew=2)
    panels = [(left, title, xlabel)] + ([(right, "llama.cpp ngram-simple (prompt lookup)", "n-gram size n, copy m")]
                                        if right is not None else [])
    for ax, name, xname in panels:
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_title(name)
        ax.set_xlabel(xname)
        ax.set_ylabel("predicted speedup over target-only")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    return save(plt, fig, path)

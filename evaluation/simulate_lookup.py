"""Prompt lookup in ``specheads simulate``: its rules replayed along the responses a label folder stores, exactly
(``decoding.replay.prompt_lookup_counts``: a proposal is kept where the response repeats it), at each
``PROMPT_LOOKUP_SETTINGS``, with the oracle's ceiling over the same proposals and the goodput stop
(``decoding.lookup_stop``) where a calibration is given, each with a bootstrap interval over the prompts; and a finished
evaluation's prompt-lookup runs replayed along their own responses, predicted beside measured."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from core.intervals import Interval, speedup_interval
from core.shards import read_manifest
from decoding.costs import CostModel
from decoding.lookup_stop import LookupCalibration, LookupHead
from decoding.replay import Counts, LookupTrace, prompt_lookup_counts, prompt_lookup_oracle_counts
from decoding.traces import Trace, responses_by_prompt, round_states
from evaluation.rundir import RunDir

PROMPT_LOOKUP_SETTINGS = ((12, 48), (4, 16), (2, 8))
"""(n, m) of the prompt-lookup rows: llama.cpp's ngram-simple defaults, then shorter n-grams and copies."""


def priced_runs(counts: list[Counts], costs: CostModel, over: list[Counts] | None = None,
                prompts: list[int] | None = None) -> tuple[list[dict], list[dict]]:
    """The runs ``counts`` (one per prompt) priced under ``costs``, and target-only's on the same responses (or the
    runs ``over``), as the stats a speedup interval reads; ``prompts``: each prompt's length, where every run pays
    its prefill (``CostModel.prefill``)."""
    lengths = prompts or [0] * len(counts)

    def runs(cs):
        return [{"new_tokens": c.n, "wall_s": costs.price(c) + costs.prefill(p, c.draft > 0)}
                for c, p in zip(cs, lengths)]

    base = runs(over) if over is not None else [{"new_tokens": c.n, "wall_s": c.n / costs.target_only_rate()
                                                 + costs.prefill(p, False)} for c, p in zip(counts, lengths)]
    return runs(counts), base


def priced_interval(counts: list[Counts], costs: CostModel, over: list[Counts] | None = None,
                    prompts: list[int] | None = None) -> Interval:
    """The speedup of ``priced_runs`` with a paired bootstrap interval over the prompts."""
    runs, base = priced_runs(counts, costs, over, prompts)
    if len(counts) < 2:  # nothing to resample
        value = sum(r["new_tokens"] for r in runs) / sum(r["wall_s"] for r in runs) \
            / (sum(r["new_tokens"] for r in base) / sum(r["wall_s"] for r in base))
        return Interval(value, value, value)
    return speedup_interval(runs, base)


def total(counts: list[Counts]) -> Counts:
    out = Counts()
    for c in counts:
        out += c
    return out


def prompt_lookup_lines(labels: str | Path, splits: tuple[str, ...], traces: list[Trace], costs: list[float],
                        priced: CostModel | None, calibration: LookupCalibration | None = None,
                        head: LookupHead | None = None) -> str:
    """Prompt lookup's rows: at a cost ratio c every call costs one target step whatever it verifies, so its speedup
    there is N / N_target; ``priced`` charges each call its length, and adds the oracle of each setting and, with
    ``calibration``, the goodput stop at its n and the λ the policy runs at (the calibration's own, else
    target-only's rate), and with ``head`` the goodput stop on a prompt-lookup stop head's chances at its n and the λ
    chosen at its export, reading the target's states the labels store (``target_states: true``). The labels record
    no end token: a last round's proposals past a response's end are priced as proposed."""
    by_prompt = responses_by_prompt(labels, splits, {t.prompt_id for t in traces})
    responses = list(by_prompt.values())
    if not responses:
        return "prompt lookup: not replayed (the labels store no token sequences)"
    max_new = read_manifest(labels)["sampling"]["max_new_tokens"]
    lines = [f"prompt lookup (llama.cpp's ngram-simple, no draft model), replayed along {len(responses)} responses"
             + ("" if priced is None else f"; speedups under {priced.name} with 95 % intervals over the prompts")]
    fixed, traces = {}, {}  # by (n, m): each response's rounds, shared by its replays
    stops = [(e.n, e.m) for e in (calibration, head) if e is not None]
    for n, m in dict.fromkeys((*PROMPT_LOOKUP_SETTINGS, *stops)):
        traces[n, m] = [LookupTrace(prompt, response, n, m, max_new) for prompt, response in responses]
        fixed[n, m] = [prompt_lookup_counts(prompt, response, n, m, max_new, trace=trace)
                       for (prompt, response), trace in zip(responses, traces[n, m])]
        all_of = total(fixed[n, m])
        line = f"  n={n:<3}m={m:<4}N_t/N {all_of.target / all_of.n:.3f}  N_x/N {all_of.discarded / all_of.n:.3f}  " \
               f"at every c {CostModel.eq51(costs[0]).speedup(all_of):.3f}x"
        if priced is not None:
            oracle = [prompt_lookup_oracle_counts(prompt, response, n, m, max_new, priced, trace=trace)
                      for (prompt, response), trace in zip(responses, traces[n, m])]
            line += f"  priced {priced_interval(fixed[n, m], priced)}x  oracle {priced_interval(oracle, priced)}x"
        lines.append(line)
    states = round_states(labels, splits) if head is not None else {}
    if head is not None and set(by_prompt) - set(states):
        lines.append(f"  the goodput stop on the head not replayed: {labels} stores no target states (label with "
                     "`target_states: true`)")
        head = None
    for estimate, what in ((calibration, "the calibration's"), (head, "the head's")):
        if estimate is None or priced is None:
            continue
        n, m = estimate.n, estimate.m
        rule = estimate.stop(priced)
        where = what if estimate.rate is not None else "target-only's"
        stopped = []
        for (prompt_id, (prompt, response)), trace in zip(by_prompt.items(), traces[n, m]):
            length = rule.along(states.get(prompt_id) if estimate is head else None, len(prompt))
            stopped.append(prompt_lookup_counts(prompt, response, n, m, max_new, length=length, trace=trace))
        all_of = total(stopped)
        lines.append(f"  n={n:<3}m={m:<4}goodput stop, {'head' if estimate is head else 'calibration'} (λ "
                     f"{rule.rate:.3f}, {where}): N_t/N {all_of.target / all_of.n:.3f}  N_x/N "
                     f"{all_of.discarded / all_of.n:.3f}  priced {priced_interval(stopped, priced)}x, "
                     f"{priced_interval(stopped, priced, over=fixed[n, m])}x the fixed length's")
    return "\n".join(lines)


def own_response_lines(cfg, ran: dict | None, by_run: dict[tuple[str, str], list[dict]],
                       models_of: Callable[[str, str], dict]) -> tuple[list[str], list[dict]]:
    """The prompt-lookup runs of a finished evaluation (``cfg``, an ``EvalConfig``; ``by_run``: its records by mode
    and run), each replayed along its own responses: a proposal is kept where the run's response repeats it, so the
    counts are the run's own (exactly, for our decoder's runs; llama.cpp's responses are its text read back by our
    tokenizer, and its driver's rounds differ a little from the rule's, ``decoding.policies.prompt_lookup``). What
    is left between predicted and measured is the cost model, priced by each of ``models_of(mode, run)`` (name →
    ``CostModel``): sampled runs draw their own responses, which label traces of other samples cannot foresee.
    ``ran``: the eval's ``settings.json`` (the settings the runs were made at; None where it is missing).
    Returns the lines and a row per run (its rates counted and replayed, speedups measured and predicted)."""
    from core.backends import backend
    from core.cache import file_sha256
    from core.prompts import tokenize_prompt
    from decoding.policies import POLICIES, build_policy
    from decoding.policies.prompt_lookup import PromptLookup
    from evaluation.llama_peer import PROMPT_LOOKUP
    from evaluation.prompts import load_prompts

    families = {"prompt_lookup", "prompt_lookup_goodput", "prompt_lookup_head", PROMPT_LOOKUP}
    runs = {key: recs for key, recs in by_run.items() if recs[0]["family"] in families}
    if not runs:
        return [], []
    if ran is None:
        return [f"prompt lookup's runs not replayed: {RunDir(cfg.output_dir).settings} is missing (the eval's "
                "record of its settings)"], []
    template = ran.get("prompts", {}).get("chat_template", cfg.prompts.chat_template)
    budget = {mode: m.get("max_new_tokens", cfg.max_new_tokens) for mode, m in ran.get("modes", {}).items()}
    recorded = {**ran.get("heads", {}), **ran.get("goodput_timing", {})}  # file → sha256 at the run
    tokenizer = backend(cfg.backend).tokenizer(cfg.target)
    texts = {p["prompt"]: p["text"] for p in load_prompts(cfg.prompts)}
    prompt_ids = {}
    ends = {tokenizer.eos_token_id} - {None}  # and each token our decoder ended a response at (a peer's text
    ends |= {r["tokens"][-1] for (mode, _), recs in by_run.items() for r in recs  # read back holds no end token)
             if r["family"] in POLICIES and r["tokens"] and len(r["tokens"]) < budget.get(mode, cfg.max_new_tokens)}
    fixed = {p.family: p.fixed for p in cfg.policies}
    rows, lines = [], []
    for (mode, run), recs in sorted(runs.items()):
        baseline = {r["prompt"]: r["stats"] for r in by_run.get((mode, "target_only"), [])}
        recs = sorted((r for r in recs if r["prompt"] in baseline and r["prompt"] in texts), key=lambda r: r["prompt"])
        if len(recs) < 2:
            continue
        family = recs[0]["family"]
        params = {**fixed.get(family, {}), **recs[0]["params"]}
        files = [str(params[k]) for k in ("calibration", "timing") if k in params]
        why = [f"{f}: no such file" if not Path(f).is_file() else f"{f}: not recorded with the run"
               if f not in recorded else f"{f} changed since the run" for f in files
               if not Path(f).is_file() or recorded.get(f) != file_sha256(Path(f))]
        if not sum(len(r["tokens"]) for r in recs):
            why.append("its responses hold no tokens")
        if "head" in params:  # (`specheads simulate --lookup_head` replays it along label traces that hold them)
            why.append("its head reads the target's states along the responses, which an eval does not record")
        if why:
            lines.append(f"  {(mode + ' ' + run)[:42]:<43}not replayed: {'; '.join(why)}")
            continue
        policy = PromptLookup(**params) if family == PROMPT_LOOKUP else build_policy(family, **params)
        counts = []
        for r in recs:
            if r["prompt"] not in prompt_ids:
                prompt_ids[r["prompt"]] = tokenize_prompt(tokenizer, texts[r["prompt"]], template)
            counts.append(prompt_lookup_counts(prompt_ids[r["prompt"]], r["tokens"], policy.n, policy.m,
                                               budget.get(mode, cfg.max_new_tokens), sorted(ends),
                                               length=policy.length))
        replayed, n = total(counts), sum(r["stats"]["new_tokens"] for r in recs)
        measured = speedup_interval([r["stats"] for r in recs], [baseline[r["prompt"]] for r in recs])
        tokens = round(replayed.n / len(counts))
        speedups = {name: model.predicted_speedup(replayed, tokens) for name, model in models_of(mode, run).items()
                    if model is not None}
        rows.append({"mode": mode, "run": run, "family": family, "prompts": len(recs),
                     "measured": {"target": sum(r["stats"]["target_calls"] for r in recs) / n,
                                  "discarded": sum(r["stats"]["discarded"] for r in recs) / n,
                                  "speedup": measured.value, "speedup_ci": [measured.low, measured.high]},
                     "replayed": {"target": replayed.target / replayed.n, "discarded": replayed.discarded / replayed.n},
                     "speedups": speedups, "errors": {k: v / measured.value - 1 for k, v in speedups.items()}})
        lines.append(f"  {(mode + ' ' + run)[:42]:<43}N_t/N {rows[-1]['measured']['target']:.3f} "
                     f"{rows[-1]['replayed']['target']:.3f}  N_x/N {rows[-1]['measured']['discarded']:.3f} "
                     f"{rows[-1]['replayed']['discarded']:.3f}  {len(recs)} prompts, measured {measured}x"
                     + "".join(f"  {k} {v:.3f} ({rows[-1]['errors'][k]:+.1%})" for k, v in speedups.items())
                     + ("  (the replay's counts are not the run's: a bug, or files changed)"
                        if family in POLICIES and rows[-1]["replayed"] != {k: rows[-1]["measured"][k]
                                                                            for k in ("target", "discarded")}
                        else ""))
    if rows:
        lines.insert(0, "prompt lookup's runs replayed along their own responses (N_t/N, N_x/N counted by the run and "
                        "replayed, our runs' alike, llama.cpp's apart where its driver drafts past a response's end "
                        "or its text reads back as other tokens; speedup over target-only measured and predicted at "
                        "each cost model, error = predicted / measured − 1)")
    return lines, rows

"""The llama.cpp peer's runs in one mode (``evaluation.llama_peer``), its speculative decoding tuned over
``llama_peer.grid`` on prompts the eval does not decode. Kept apart from ``llama_peer``, which the config reads for
the peer's settings: scheduling runs here needs the config, and the config must not need the runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from core.sampling import Sampling
from evaluation.config import EvalConfig, EvalError, Mode
from evaluation.llama_peer import TARGET_ONLY
from evaluation.prompts import load_prompts
from evaluation.results import ResultStore, run_label
from evaluation.rundir import RunDir
from evaluation.runner import Job, Runner


def llama_jobs(cfg: EvalConfig, runner: Runner, mode: Mode, sampling: Sampling, out: Path, quiet: bool) -> list[Job]:
    """llama.cpp's own runs in one mode: its target alone, and each of its speculative families (the draft model's,
    prompt lookup's) at its defaults and at the grid entry that ran fastest (tokens over seconds, prefill excluded)
    on the tuning prompts, which the eval does not decode; the tuning runs are kept in ``llama_tuning.jsonl``
    (resumed like the results)."""
    peer = cfg.llama_peer
    jobs = [runner.llama(sampling, TARGET_ONLY, {})] if peer.target_only and mode.runs(TARGET_ONLY) else []
    for family, defaults, grid in peer.tuned():
        if not mode.runs(family):
            continue
        if defaults is not None:
            jobs.append(runner.llama(sampling, family, defaults))
        if grid:
            params = tuned_setting(cfg, runner, mode, sampling, out, quiet, family, grid)
            if params != defaults:
                jobs.append(runner.llama(sampling, family, params))
    return jobs


def tuned_setting(cfg: EvalConfig, runner: Runner, mode: Mode, sampling: Sampling, out: Path, quiet: bool,
                  family: str, grid: list[dict]) -> dict:
    """The entry of ``grid`` whose runs of ``family`` are fastest over the tuning prompts."""
    first, end = cfg.llama_peer.tune_prompts
    tuning = load_prompts(dataclasses.replace(cfg.prompts, limit=end))[first:end]
    if not tuning:
        raise EvalError(f"llama_peer.tune_prompts {cfg.llama_peer.tune_prompts}: the prompt source has no prompts "
                        "there")
    store = ResultStore(RunDir(out).claim(RunDir(out).llama_tuning))
    tuner = Runner(cfg, runner.engine, tuning, store, quiet)
    ids = tuner._ids
    if {tuple(v) for v in runner._ids.values()} & {tuple(v) for v in ids.values()}:
        raise EvalError(f"llama_peer.tune_prompts {cfg.llama_peer.tune_prompts} overlap the prompts the eval "
                        "decodes: tune on others")
    tuner.run(mode, [tuner.llama(sampling, family, params) for params in grid], list(ids))
    rates = {}
    for params in grid:
        label = run_label(family, params)
        recs = [store.get((mode.name, label, p)) for p in ids]
        rates[label] = (sum(r["stats"]["new_tokens"] for r in recs) / sum(r["stats"]["wall_s"] for r in recs), params)
    best, (rate, params) = max(rates.items(), key=lambda kv: kv[1][0])
    if not quiet:
        print(f"eval [{mode.name}] {family} tuned on prompts {first}–{end - 1}: {best} ({rate:.2f} tok/s)",
              flush=True)
    return params

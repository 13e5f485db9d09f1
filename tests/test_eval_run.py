"""The evaluation run and report with a fake engine: sweeps, choices, resume, and every report artifact."""

from __future__ import annotations

import json

import pytest
import yaml
from test_eval_fakes import fake_engine, write_prompt_file

from data_gen.models import ModelSpec
from data_gen.prompts import PromptConfig
from evaluation.__main__ import parse
from evaluation.config import EvalConfig, EvalError, HFPeer, Mode, Sweep, resolve_device, resolve_dtype
from evaluation.results import ResultStore
from evaluation.run import run_eval
from evaluation.summary import agreement


def make_cfg(tmp_path, **kw) -> EvalConfig:
    prompts = write_prompt_file(tmp_path / "prompts.jsonl", n=4)
    base = dict(
        draft=ModelSpec(path="fake-draft"), target=ModelSpec(path="fake-target"),
        prompts=PromptConfig(source=str(prompts), response_field="answer"),
        modes=[Mode("sample", 1.0), Mode("greedy", 0.0, families=["target_only", "sd", "hf_assisted"])],
        policies=[Sweep("target_only"), Sweep("draft_only"), Sweep("sd", grid={"k": [1, 2, 3, 4, 6]}),
                  Sweep("specdecpp", grid={"h": [None, 0.5]}), Sweep("sprinter", grid={"tau": [0.3, 0.7]}),
                  Sweep("fuzzy", fixed={"k": 5}, grid={"T": [0.5]})],
        max_new_tokens=8, sweep_prompts=2, train_dir=None, output_dir=str(tmp_path / "eval"), warmup=False,
        hf_peer=HFPeer(confidence_thresholds=[0.3]),
    )
    base.update(kw)
    return EvalConfig(**base)


def test_run_writes_report_and_chooses_by_latency(tmp_path):
    cfg = make_cfg(tmp_path)
    out = run_eval(cfg, fake_engine(), quiet=True)
    for f in ("report.md", "report.json", "pareto.png", "speedup.png", "quality.png", "results.jsonl"):
        assert (out / f).stat().st_size > 0, f
    rep = json.loads((out / "report.json").read_text())
    # With t_draft = 0.01, t_target = 0.05 and 3 tokens accepted per round, K = 3 is the cheapest per token.
    assert rep["modes"]["sample"]["chosen"]["sd"] == "sd[k=3]"
    assert rep["modes"]["greedy"]["chosen"]["sd"] == "sd[k=3]"
    fit = rep["latency_fit"]["fit"]
    assert fit["r2"] == pytest.approx(1.0, abs=1e-9)
    assert fit["t_draft"] == pytest.approx(0.01, rel=1e-6) and fit["t_target"] == pytest.approx(0.05, rel=1e-6)
    runs = {r["run"] for r in rep["modes"]["greedy"]["table"]}
    assert {"target_only", "sd[k=3]", "hf_assisted", "hf_assisted[conf=0.3]", "hf_assisted[k=3]"} == runs
    # the chosen setting ran on all 4 prompts, the others only on the 2 sweep prompts
    store = ResultStore(out / "results.jsonl")
    counts = {}
    for r in store.records():
        counts[(r["mode"], r["run"])] = counts.get((r["mode"], r["run"]), 0) + 1
    assert counts[("sample", "sd[k=3]")] == 4 and counts[("sample", "sd[k=6]")] == 2
    assert counts[("sample", "target_only")] == 4 and ("greedy", "draft_only") not in counts
    md = (out / "report.md").read_text()
    assert "## Goals" in md and "SPRINTER ≥ 1.6× SD" in md and "| `sd[k=3]` |" in md
    goals = {g["goal"]: g for g in rep["goals"]}
    assert goals["our SD ≥ HF assisted at the same K (greedy): tokens/s ratio"]["met"] is not None
    greedy_sd = next(r for r in rep["modes"]["greedy"]["table"] if r["family"] == "sd")
    assert greedy_sd["same_as_target"]["n"] == 4 and "= target-only" in md
    assert all(r["same_as_target"] is None for r in rep["modes"]["sample"]["table"])


def test_resume_skips_finished_runs(tmp_path):
    cfg = make_cfg(tmp_path)
    calls = []
    with pytest.raises(KeyboardInterrupt):
        run_eval(cfg, fake_engine(calls, fail_after=5), quiet=True)
    done = len(ResultStore(tmp_path / "eval" / "results.jsonl"))
    assert done >= 5
    with open(tmp_path / "eval" / "results.jsonl", "a") as f:  # an interrupt mid-write leaves a partial line
        f.write('{"mode": "sample", "run": "x"')
    calls2 = []
    run_eval(cfg, fake_engine(calls2), quiet=True)
    full = []
    run_eval(make_cfg(tmp_path, output_dir=str(tmp_path / "fresh")), fake_engine(full), quiet=True)
    assert len(calls2) == len(full) - done  # nothing finished was redone
    store = ResultStore(tmp_path / "eval" / "results.jsonl")
    lines = (tmp_path / "eval" / "results.jsonl").read_text().splitlines()
    assert len(lines) == len(store) == len(ResultStore(tmp_path / "fresh" / "results.jsonl"))


def test_resume_refuses_other_settings(tmp_path):
    run_eval(make_cfg(tmp_path, policies=[Sweep("target_only")], hf_peer=HFPeer(enabled=False)),
             fake_engine(), quiet=True)
    with pytest.raises(EvalError, match="other settings"):
        run_eval(make_cfg(tmp_path, max_new_tokens=9), fake_engine(), quiet=True)
    run_eval(make_cfg(tmp_path, max_new_tokens=9, overwrite=True), fake_engine(), quiet=True)


def test_missing_head_file_is_one_clear_error(tmp_path):
    cfg = make_cfg(tmp_path, policies=[Sweep("sprinter", fixed={"head": str(tmp_path / "nope.safetensors")})])
    with pytest.raises(EvalError, match="make train"):
        run_eval(cfg, fake_engine(), quiet=True)


def test_unknown_family_lists_known():
    with pytest.raises(EvalError, match="known: target_only"):
        Sweep("medusa")


def test_greedy_agreement_counts_identical_outputs_and_common_prefix():
    base = {0: {"tokens": [1, 2, 3, 4]}, 1: {"tokens": [5, 6]}, 2: {"tokens": [7]}}
    run = {0: {"tokens": [1, 2, 3, 4]}, 1: {"tokens": [5, 9, 9]}}
    assert agreement(run, base) == {"identical": 0.5, "common_prefix": 0.75, "n": 2}
    assert agreement({}, base) is None


def test_auto_dtype_is_bf16_only_where_native(monkeypatch):
    import torch

    assert resolve_dtype("float16", torch.device("cpu")) == "float16"
    assert resolve_dtype("auto", torch.device("cuda")) == "bfloat16"
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda native=native: native)
        assert resolve_dtype("auto", torch.device("cpu")) == expected
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cuda:1") == torch.device("cuda:1")


@pytest.mark.parametrize("path", ["configs/eval/humaneval.yaml", "configs/eval/quick.yaml"])
def test_eval_config_parses_and_repeats_the_labeling_pair(path):
    cfg, report_only = parse(["--config", path])
    assert not report_only and cfg.prompts.source == "humaneval"
    assert {s.family for s in cfg.policies} >= {"target_only", "draft_only", "sd", "specdecpp", "sprinter",
                                                 "hf_heuristic", "confidence", "svip", "fuzzy"}
    labels = yaml.safe_load(open("configs/labels/humaneval.yaml"))
    for role in ("draft", "target"):
        assert vars(getattr(cfg, role)) == {"path": "", **labels[role]}

"""The evaluation run and report with a fake engine: sweeps, choices, resume, and every report artifact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_eval_fakes import fake_engine, write_prompt_file

from core.models import ModelSpec, resolve_device, resolve_dtype
from core.prompts import PromptConfig
from evaluation.config import parse
from evaluation.config import EvalConfig, EvalError, HFPeer, Mode, Sweep
from evaluation.markdown import theorem7_md
from evaluation.prompts import load_prompts
from evaluation.report import write_report
from evaluation.results import ResultStore
from evaluation.run import run_eval
from evaluation.summary import agreement, sprinter_theorem7


def make_cfg(tmp_path, **kw) -> EvalConfig:
    prompts = write_prompt_file(tmp_path / "prompts.jsonl", n=4)
    base = dict(
        draft=ModelSpec(path="fake-draft"), target=ModelSpec(path="fake-target"),
        prompts=PromptConfig(source=str(prompts), response_field="answer"),
        modes=[Mode("sample", 1.0), Mode("greedy", 0.0, families=["target_only", "sd", "hf_assisted"])],
        policies=[Sweep("target_only"), Sweep("draft_only"), Sweep("sd", grid={"k": [1, 2, 3, 4, 6]}),
                  Sweep("specdecpp", grid={"h": [None, 0.5]}), Sweep("sprinter", grid={"tau": [0.3, 0.7]}),
                  Sweep("fuzzy", fixed={"k": 5}, grid={"T": [0.5]})],
        max_new_tokens=8, sweep_prompts=2, train_dir=None, labels_dir=None, output_dir=str(tmp_path / "eval"),
        warmup=False,
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
    # each record keeps the draft's catch-up count the decoding reported; a peer has none
    caught = {(r["run"], r["stats"]["draft_catch_up"]) for r in store.records() if r["run"] in ("sd[k=1]", "sd[k=6]")}
    assert caught == {("sd[k=1]", 3), ("sd[k=6]", 0)}
    assert all(r["stats"].get("draft_catch_up") is None for r in store.records() if r["family"].startswith("hf_"))
    assert counts[("sample", "target_only")] == 4 and ("greedy", "draft_only") not in counts
    # prompt by prompt: each step's runs on one prompt before the next, so a paired ratio's two runs are close in
    # time (the single-setting runs on every prompt: target_only, draft_only, the first two of them)
    single = [(r["run"], r["prompt"]) for r in store.records()
              if r["mode"] == "sample" and r["run"] in ("target_only", "draft_only")]
    assert single == [("target_only", 0), ("draft_only", 0), ("target_only", 1), ("draft_only", 1),
                      ("target_only", 2), ("draft_only", 2), ("target_only", 3), ("draft_only", 3)]
    # past the sweep prompts, the one-setting runs and the chosen ones go in one pass: each prompt's runs together
    late = [(r["prompt"], r["run"]) for r in store.records() if r["mode"] == "sample" and r["prompt"] >= 2]
    assert [p for p, _ in late] == sorted(p for p, _ in late)
    assert {"target_only", "sd[k=3]"} <= {run for p, run in late if p == 3}
    # every ratio goal and table row carries its paired bootstrap interval, and the goal says whether it clears
    sd_row = next(r for r in rep["modes"]["sample"]["table"] if r["family"] == "sd")
    low, high = sd_row["speedup_vs_target_ci"]
    assert low <= sd_row["speedup_vs_target"] <= high
    for g in rep["goals"]:
        if g["value"] is not None:
            lo, hi = g["interval"]
            assert lo <= g["value"] <= hi + 1e-12
            assert g["interval_clears"] == (lo >= g["target"] if "drop" not in g["goal"] else hi <= g["target"])
    assert "| 95 % interval |" in (out / "report.md").read_text()
    md = (out / "report.md").read_text()
    assert "## Goals" in md and "SPRINTER ≥ 1.6× SD" in md and "| `sd[k=3]` |" in md
    goals = {g["goal"]: g for g in rep["goals"]}
    assert goals["our SD ≥ HF assisted at the same K (greedy): tokens/s ratio"]["met"] is not None
    greedy_sd = next(r for r in rep["modes"]["greedy"]["table"] if r["family"] == "sd")
    assert greedy_sd["same_as_target"]["n"] == 4 and "= target-only" in md
    assert all(r["same_as_target"] is None for r in rep["modes"]["sample"]["table"])
    assert "SPRINTER Theorem 7" in md and "not checked, needs `labels_dir`" in md
    sample = {r["family"]: r for r in rep["modes"]["sample"]["table"]}
    assert "unused fwd" in md and sample["target_only"]["unused_forwards"] == 0
    assert sample["sprinter"]["unused_forwards"] is None  # its tokens skip the target: no such identity


FAKE_DRAFT = {"name": "fake-draft", "source": "fake", "sha256": "0" * 64}


def write_test_labels(folder, rows: list[tuple[str, bool, float]], draft: dict = FAKE_DRAFT):
    """A labeled dataset with only a test split: one row per (category, loss_mask, tv); other columns zero."""
    from datasets import List

    from core.runfolder import write_json
    from core.shards import SCHEMA_VERSION, features, shard_records, vector_sizes, write_shard

    n = len(rows)
    cols = {"category": [r[0] for r in rows], "loss_mask": np.array([r[1] for r in rows]),
            "tv": np.array([r[2] for r in rows], np.float32)}
    for name, f in features(vector_sizes(2, 2)).items():  # every other column of the current schema: zeros
        if name not in cols:
            cols[name] = np.zeros((n, f.length), f.feature.dtype) if isinstance(f, List) else np.zeros(n, f.dtype)
    write_shard(folder / "test" / "draft-0000.arrow", cols, vector_sizes(2, 2))
    write_json(folder / "manifest.json", {"schema_version": SCHEMA_VERSION, "models": {"draft": draft},
                                          "sampling": {"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                                                       "max_new_tokens": 8},
                                          "splits": {"test": {"rows": n}}, "shards": shard_records(folder)})
    return folder


def write_verifier(path, eta_fp_thm: float, tau: float = 0.5, draft: dict = FAKE_DRAFT):
    from heads.export import export_head
    from heads.sprinter import SprinterHead

    return export_head(SprinterHead(hidden_size=2), path, draft=draft, vocab_size=16,
                       label={"kind": "sprinter", "lam": 1.5}, role="verifier",
                       threshold={"name": "tau", "value": tau, "rule": "accept when P_hat >= tau"},
                       metrics={"test/head/auroc": 0.8, "test/head/eta_fp_thm": eta_fp_thm,
                                "test/head/eta_fp_thm_weighted": eta_fp_thm / 2})


def test_report_checks_sprinter_theorem_7(tmp_path):
    """Kept rate of draft tokens against 1 − (1 − η_FP)·TV: the fake SPRINTER keeps 7 of every 8 draft tokens; the
    head's η_FP (q/p > 1) is 0.2 and the mean TV of the labels' SPRINTER draft-token test rows 0.2 → 0.84."""
    labels = write_test_labels(tmp_path / "labels", [("draft", True, 0.1), ("target", True, 0.3),
                                                     ("draft", False, 0.9),  # not a draft token
                                                     ("prompt", True, 0.9)])  # not a SPRINTER category
    head = write_verifier(tmp_path / "verifier.safetensors", eta_fp_thm=0.2)
    sprinter = Sweep("sprinter", fixed={"head": str(head)}, grid={"tau": [None, 0.7]})
    cfg = make_cfg(tmp_path, policies=[Sweep("target_only"), Sweep("sd", grid={"k": [2]}), sprinter],
                   labels_dir=str(labels))
    out = run_eval(cfg, fake_engine(), quiet=True)
    t7 = json.loads((out / "report.json").read_text())["theorem7"]
    assert t7["skipped"] is None and t7["mean_tv"] == pytest.approx(0.2) and t7["tv_rows"] == 2
    assert t7["heads"][str(head)]["predicted"] == pytest.approx(1 - (1 - 0.2) * 0.2)
    assert t7["heads"][str(head)]["predicted_weighted"] == pytest.approx(1 - (1 - 0.1) * 0.2)
    by_run = {r["run"]: r for r in t7["runs"]}
    assert set(by_run) == {"sprinter[tau=file]", "sprinter[tau=0.7]"}  # greedy mode ran no SPRINTER
    assert by_run["sprinter[tau=file]"]["kept_rate"] == pytest.approx(7 / 8)
    assert by_run["sprinter[tau=file]"]["at_exported_tau"] and not by_run["sprinter[tau=0.7]"]["at_exported_tau"]
    line = next(x for x in (out / "report.md").read_text().splitlines() if "SPRINTER Theorem 7" in x)
    assert "mean TV 0.200 over 2 test rows" in line and "`verifier.safetensors` at its exported τ = 0.500" in line
    assert "η_FP = P(P̂ ≥ τ | q/p > 1) 0.200 → 0.840" in line and "0.100 → 0.820" in line
    assert "`sample` `sprinter[tau=file]` 0.875 of 16 drafted;" in line
    assert "`sprinter[tau=0.7]` 0.875 of 32 drafted (another τ: no prediction)" in line

    # a head of another draft is not checked against these labels
    write_test_labels(tmp_path / "other", [("draft", True, 0.1)], draft={**FAKE_DRAFT, "sha256": "1" * 64})
    cfg = make_cfg(tmp_path, policies=cfg.policies, labels_dir=str(tmp_path / "other"))
    rep = write_report(out, cfg, ResultStore(out / "results.jsonl").records(), load_prompts(cfg.prompts))
    assert rep["theorem7"]["runs"] == [] and "trained for draft" in rep["theorem7"]["skipped"]


def test_theorem_7_reads_each_runs_head_from_its_grid(tmp_path):
    """Heads swept in the grid: each run is predicted with its own head's η_FP (TV 0.5); a head of another draft
    is named as not checked."""
    labels = write_test_labels(tmp_path / "labels", [("draft", True, 0.5)])
    a = str(write_verifier(tmp_path / "a.safetensors", eta_fp_thm=0.2))
    b = str(write_verifier(tmp_path / "b.safetensors", eta_fp_thm=0.6, tau=0.3))
    c = str(write_verifier(tmp_path / "c.safetensors", eta_fp_thm=0.2, draft={**FAKE_DRAFT, "sha256": "1" * 64}))
    stats = {"wall_s": 1.0, "new_tokens": 10, "target_calls": 2, "draft_calls": 10, "discarded": 2,
             "accepted_lengths": [4, 4]}  # 8 of 10 draft tokens kept
    records = [{"mode": mode, "run": f"sprinter[head={h}]", "family": "sprinter", "params": {"head": h},
                "prompt": 0, "stats": stats, "passed": None} for h in (a, b, c) for mode in ("sample", "greedy")]
    t7 = sprinter_theorem7(records, [Mode("sample", 1.0), Mode("greedy", 0.0)], None, str(labels))
    assert [(r["mode"], r["head"], r["kept_rate"]) for r in t7["runs"]] == [("sample", a, 0.8), ("sample", b, 0.8)]
    assert t7["heads"][a]["predicted"] == pytest.approx(0.6) and t7["heads"][b]["predicted"] == pytest.approx(0.8)
    assert t7["heads"][b]["exported_tau"] == 0.3
    assert len(t7["not_checked"]) == 1 and "c.safetensors: head was trained for draft" in t7["not_checked"][0]
    line = theorem7_md(t7)
    assert "`a.safetensors` at its exported τ = 0.500: predicted with η_FP = P(P̂ ≥ τ | q/p > 1) 0.200 → 0.600" in line
    assert "`b.safetensors` at its exported τ = 0.300" in line and "not checked: " in line


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


def test_resume_refuses_a_head_trained_again_at_the_same_path(tmp_path):
    """Heads re-exported by another `make train` keep their paths; their digests in settings.json tell them apart."""
    head = tmp_path / "verifier.safetensors"
    write_verifier(head, eta_fp_thm=0.2)
    cfg = dict(policies=[Sweep("target_only"), Sweep("sprinter", fixed={"head": str(head)}, grid={"tau": [0.5]})],
               hf_peer=HFPeer(enabled=False), modes=[Mode("sample", 1.0)])
    run_eval(make_cfg(tmp_path, **cfg), fake_engine(), quiet=True)
    run_eval(make_cfg(tmp_path, **cfg), fake_engine(), quiet=True)  # the same file resumes
    write_verifier(head, eta_fp_thm=0.3)
    with pytest.raises(EvalError, match=r"other settings \(heads\)"):
        run_eval(make_cfg(tmp_path, **cfg), fake_engine(), quiet=True)


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


@pytest.mark.parametrize("path", sorted(str(p) for p in Path("configs/eval").glob("*.yaml")))
def test_eval_config_parses_and_names_the_pair_once(path):
    """Every eval config decodes the pair its labels were made with: both include the one pair file; one that runs
    a trained head or calibration decodes HumanEval only (the corpus is what they train on); one that runs prompt
    lookup's calibration or head, only the first 20 edit requests, whose functions its labels (`--skip 20`) never
    hold."""
    cfg, report_only = parse(["--config", path])
    trained = {s.family for s in cfg.policies for key in ("head", "calibration") if key in s.fixed or key in s.grid}
    lookup = {"prompt_lookup_goodput", "prompt_lookup_head"}
    assert not report_only and (cfg.prompts.source == "humaneval" or not trained - lookup)
    if trained & lookup and cfg.prompts.source != "humaneval":
        assert "edits" in cfg.prompts.source and cfg.prompts.limit <= 20
        assert "--skip 20" in Path("configs/labels/edits-llama.yaml").read_text()
    families = {s.family for s in cfg.policies}
    assert families - {"target_only"}  # a policy to judge
    pair = yaml.safe_load(open("configs/models/qwen2.5-coder-0.5b-1.5b.yaml"))
    for role in ("draft", "target"):
        assert vars(getattr(cfg, role)) == vars(ModelSpec(**pair[role]))
    for config in [path, *Path("configs/labels").glob("*.yaml")]:  # named, not copied
        assert "gguf_sha256" not in Path(config).read_text(), config


def test_every_head_is_checked_before_the_first_run(tmp_path):
    from heads.export import HeadFileError

    names = ("a", "b", "other")
    for name in names:
        (tmp_path / f"{name}.safetensors").write_bytes(b"")
    a, b, other = (str(tmp_path / f"{n}.safetensors") for n in names)
    checked, calls = [], []

    def check(path):
        checked.append(path)
        if path == other:
            raise HeadFileError(f"{path}: head was trained for draft 'another'")

    engine = fake_engine(calls)
    engine.check_head = check
    cfg = make_cfg(tmp_path, policies=[Sweep("target_only"), Sweep("specdecpp", fixed={"head": a}),
                                       Sweep("sprinter", grid={"head": [b, other, a]})])
    with pytest.raises(HeadFileError, match="trained for draft 'another'"):
        run_eval(cfg, engine, quiet=True)
    assert checked == [a, b, other] and calls == []  # nothing decoded before the bad head was found


def _peer_heads(tmp_path, verifier_position: str = "prev") -> tuple[str, str]:
    from heads.export import export_head
    from heads.resnet import ResNetHead
    from heads.sprinter import SprinterHead

    stop = export_head(ResNetHead(hidden_size=2, depth=1), tmp_path / "stop.safetensors", draft=FAKE_DRAFT,
                       vocab_size=16, label={"kind": "specdecpp"}, role="stop",
                       threshold={"name": "h", "value": 0.7, "rule": "stop when 1 - prod > h"}, metrics={})
    verifier = export_head(SprinterHead(hidden_size=2), tmp_path / "verifier.safetensors", draft=FAKE_DRAFT,
                           vocab_size=16, label={"kind": "sprinter", "lam": 1.5}, role="verifier",
                           threshold={"name": "tau", "value": 0.5, "rule": "accept when P_hat >= tau"}, metrics={},
                           position=verifier_position)
    return str(stop), str(verifier)


def test_heads_inside_generate_run_as_peers_with_their_goals(tmp_path):
    """Each head in ``hf_peer.heads`` runs as ``hf_specdecpp``/``hf_sprinter`` by its role, beside HF target-only,
    after the policies; the report compares them with transformers' rules and with our decoder on the same head."""
    stop, verifier = _peer_heads(tmp_path)
    calls = []
    cfg = make_cfg(tmp_path, modes=[Mode("sample", 1.0)],
                   policies=[Sweep("target_only"), Sweep("sd", grid={"k": [3]}),
                             Sweep("specdecpp", fixed={"head": stop}, grid={"h": [0.9]}),
                             Sweep("sprinter", grid={"head": [verifier], "tau": [None]})],
                   hf_peer=HFPeer(confidence_thresholds=[0.3], target_only=True, heads=[stop, verifier],
                                  thresholds={stop: 0.9}))
    out = run_eval(cfg, fake_engine(calls), quiet=True)
    peers = list(dict.fromkeys(c[1] for c in calls if c[0] == "hf"))
    assert peers == ["hf_assisted", "hf_target_only", "hf_specdecpp", "hf_sprinter"]
    rep = json.loads((out / "report.json").read_text())
    runs = [r["run"] for r in rep["modes"]["sample"]["table"]]
    assert runs[-3:] == ["hf_target_only", f"hf_specdecpp[head={stop},h=0.9]",
                         f"hf_sprinter[head={verifier},tau=file]"]
    goals = {g["goal"]: g for g in rep["goals"]}
    # fakes: HF's best own rule 0.03 s/token, the stop head inside generate() 0.025, HF target-only 0.05
    best = goals["generate() + SpecDec++ head stop.safetensors ≥ 1.05× transformers' best own rule (tokens/s)"]
    assert best["value"] == pytest.approx(0.03 / 0.025) and best["met"]
    fast = goals["generate() + SPRINTER verifier verifier.safetensors ≥ 1× the target's own generate() (tokens/s)"]
    assert fast["value"] == pytest.approx(0.05 / 0.02)
    overhead = goals["runtime overhead of stop.safetensors: our decoder's tokens/s over generate()'s − 1, same head "
                     "and threshold"]
    assert overhead["value"] is not None and "specdecpp[h=0.9]" in overhead["detail"]
    assert "hf_specdecpp" in (out / "report.md").read_text()


@pytest.mark.parametrize("follow", [True, False])
def test_a_peer_head_takes_the_threshold_our_decoder_chose_for_it(tmp_path, follow):
    """Without a threshold in ``hf_peer.thresholds``, a head inside ``generate()`` runs at the h (τ) of our decoder's
    chosen run of the same head, so the overhead goal compares one stop rule in two loops; the exported one when
    ``same_threshold_as_ours`` is off."""
    stop, verifier = _peer_heads(tmp_path)
    cfg = make_cfg(tmp_path, modes=[Mode("sample", 1.0)],
                   policies=[Sweep("sd", grid={"k": [3]}),
                             Sweep("specdecpp", fixed={"head": stop}, grid={"h": [0.5, 0.8]}),
                             Sweep("sprinter", grid={"head": [verifier], "tau": [0.3]})],
                   hf_peer=HFPeer(confidence_thresholds=[], heads=[stop, verifier], same_threshold_as_ours=follow))
    out = run_eval(cfg, fake_engine(), quiet=True)
    rep = json.loads((out / "report.json").read_text())
    table = rep["modes"]["sample"]["table"]
    chosen = next(r for r in table if r["family"] == "specdecpp")["params"]["h"]  # equal fake costs: the first
    peers = [r["run"] for r in table if r["family"] in ("hf_specdecpp", "hf_sprinter")]
    if follow:
        assert peers == [f"hf_specdecpp[head={stop},h={chosen:g}]", f"hf_sprinter[head={verifier},tau=0.3]"]
        overhead = next(g for g in rep["goals"] if g["goal"].startswith("runtime overhead of stop"))
        assert overhead["value"] is not None
    else:
        assert peers == [f"hf_specdecpp[head={stop},h=file]", f"hf_sprinter[head={verifier},tau=file]"]


def test_a_peer_head_the_runtime_cannot_run_is_refused_before_anything_runs(tmp_path):
    stop, own = _peer_heads(tmp_path, verifier_position="own")
    calls = []
    with pytest.raises(EvalError, match="previous token's state"):
        run_eval(make_cfg(tmp_path, hf_peer=HFPeer(heads=[own])), fake_engine(calls), quiet=True)
    with pytest.raises(EvalError, match="thresholds names heads that hf_peer.heads does not list"):
        run_eval(make_cfg(tmp_path, hf_peer=HFPeer(heads=[stop], thresholds={own: 0.5})), fake_engine(calls),
                 quiet=True)
    from heads.export import export_head
    from heads.resnet import ResNetHead

    head = ResNetHead(hidden_size=2, depth=1, scores=["stale_top1_target"])
    stale = export_head(head, tmp_path / "stale.safetensors", draft=FAKE_DRAFT, vocab_size=16,
                        label={"kind": "specdecpp"}, role="stop", threshold={"name": "h", "value": 0.7, "rule": "t"},
                        metrics={})
    with pytest.raises(EvalError, match="does not compute"):  # a feature family the runtime does not feed
        run_eval(make_cfg(tmp_path, hf_peer=HFPeer(heads=[str(stale)])), fake_engine(calls), quiet=True)
    assert calls == []


def goodput_inputs(tmp_path) -> tuple[str, str]:
    """A calibrated confidence file and a ``bench_timing`` file (target-only's rate 1 / verify(1) = 2 tokens/s)."""
    from test_eval_latency import timing_file

    from decoding.estimates import CalibratedConfidence

    calibration, timing = tmp_path / "calibration.json", tmp_path / "timing.json"
    CalibratedConfidence(q=np.array([0.0, 0.5, 1.0]), acceptance=np.array([0.2, 0.6, 0.95]), rows=3).save(calibration)
    timing.write_text(json.dumps(timing_file()))
    return str(calibration), str(timing)


@pytest.mark.parametrize("follow", [True, False])
def test_the_goodput_stop_inside_generate_runs_at_our_decoders_lambda(tmp_path, follow):
    """Each file of ``hf_peer.goodput`` runs as ``hf_goodput`` at λ of our decoder's chosen ``goodput`` run of the
    same file, or at target-only's rate under ``hf_peer.timing`` when ``same_threshold_as_ours`` is off; λ is in its
    params, and the report compares it with transformers' best own rule and with our run at the same λ."""
    calibration, timing = goodput_inputs(tmp_path)
    cfg = make_cfg(tmp_path, modes=[Mode("sample", 1.0)],
                   policies=[Sweep("sd", grid={"k": [3]}),
                             Sweep("goodput", fixed={"calibration": calibration, "timing": timing},
                                   grid={"lam": [3.0, 5.0]})],
                   hf_peer=HFPeer(confidence_thresholds=[], goodput=[calibration], timing=timing,
                                  same_threshold_as_ours=follow))
    out = run_eval(cfg, fake_engine(), quiet=True)
    rep = json.loads((out / "report.json").read_text())
    table = rep["modes"]["sample"]["table"]
    chosen = next(r for r in table if r["family"] == "goodput")["params"]["lam"]  # equal fake costs: the first
    lam = chosen if follow else 2.0
    peer = next(r for r in table if r["family"] == "hf_goodput")
    assert peer["run"] == f"hf_goodput[calibration={calibration},lam={lam:g}]" and peer["params"]["lam"] == lam
    goals = {g["goal"]: g for g in rep["goals"]}
    # fakes: HF's defaults 0.03 s/token, the goodput stop inside generate() 0.024
    best = goals["generate() + goodput stop on calibration.json ≥ 1.05× transformers' best own rule (tokens/s)"]
    assert best["value"] == pytest.approx(0.03 / 0.024) and best["met"]
    overhead = goals["runtime overhead of calibration.json: our decoder's tokens/s over generate()'s − 1, same "
                     "estimates and λ"]
    assert (overhead["value"] is not None) == follow
    assert "hf_goodput" in (out / "report.md").read_text()


@pytest.mark.parametrize("peer, message", [
    ({"goodput": ["{calibration}"]}, "hf_peer.goodput needs hf_peer.timing"),
    ({"goodput": ["{tmp}/head.pt"], "timing": "{timing}"}, "neither a stop head (.safetensors) nor a calibrated"),
    ({"goodput": ["{tmp}/missing.json"], "timing": "{timing}"}, "missing.json: no such file"),
    ({"goodput": ["{verifier}"], "timing": "{timing}"}, "is a verifier; the goodput stop reads a stop head"),
])
def test_a_goodput_peer_that_cannot_run_is_one_line_before_anything_runs(tmp_path, capsys, peer, message):
    from evaluation.__main__ import main
    from testing.tiny import write_eval_config

    calibration, timing = goodput_inputs(tmp_path)
    _, verifier = _peer_heads(tmp_path)
    names = {"calibration": calibration, "timing": timing, "verifier": verifier, "tmp": str(tmp_path)}
    peer = {k: [v.format(**names) for v in vs] if isinstance(vs, list) else vs.format(**names)
            for k, vs in peer.items()}
    config = write_eval_config(tmp_path / "eval.yaml", tmp_path / "no-draft", tmp_path / "no-target",
                               write_prompt_file(tmp_path / "prompts.jsonl"), tmp_path / "eval",
                               policies=[{"family": "target_only"}], hf_peer=peer)
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err
    assert not (tmp_path / "eval").exists()


def test_labels_rewritten_while_their_traces_are_read_are_refused(label_config, tmp_path, monkeypatch):
    """selection.json names the labels the choice replayed: labels rewritten after the heads were checked against
    them (while the models load, say) are refused in one line before the eval's folder holds any result."""
    import evaluation.simulate
    from test_eval_latency import timing_file

    from data_gen.run import run_labels
    from evaluation.simulate import selection_traces

    labels = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(labels, quiet=True)
    manifest = Path(labels.output_dir) / "manifest.json"

    def read_while_relabeled(*args, **kwargs):
        manifest.write_text(manifest.read_text().replace("{", '{"relabeled": true, ', 1))
        return selection_traces(*args, **kwargs)

    monkeypatch.setattr(evaluation.simulate, "selection_traces", read_while_relabeled)
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps(timing_file()))
    cfg = make_cfg(tmp_path, select_by="simulated", labels_dir=str(labels.output_dir), timing=str(timing),
                   policies=[Sweep("target_only"), Sweep("sd", grid={"k": [1, 2]})])
    with pytest.raises(EvalError, match="changed while the eval read it"):
        run_eval(cfg, fake_engine(), quiet=True)
    assert not (Path(cfg.output_dir) / "results.jsonl").exists()


def test_simulated_selection_decodes_only_the_simulators_pick(label_config, tmp_path, monkeypatch):
    """select_by: simulated: in the mode sampled like the labels, each exact family's setting is the one the trace
    simulator predicts fastest at the costs of the timing file, and only it is decoded; other modes sweep. The
    label traces are read once, before the folder changes."""
    from test_eval_latency import timing_file

    import evaluation.simulate
    from data_gen.run import run_labels
    from decoding.costs import CostModel
    from evaluation.simulate import selection_traces, simulate

    reads = []
    monkeypatch.setattr(evaluation.simulate, "selection_traces",
                        lambda *a, **k: reads.append(a) or selection_traces(*a, **k))

    labels = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(labels, quiet=True)
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps(timing_file()))
    grid = [1, 2, 4, 8]
    cfg = make_cfg(tmp_path, select_by="simulated", labels_dir=str(labels.output_dir), timing=str(timing),
                   policies=[Sweep("target_only"), Sweep("sd", grid={"k": grid}),
                             Sweep("confidence", grid={"threshold": [0.1, 0.5, 0.9]})])
    out = run_eval(cfg, fake_engine(), quiet=True)
    assert len(reads) == 1
    every, _ = selection_traces(labels.output_dir)
    fit = CostModel.from_timing(timing_file())
    predicted = [fit.predicted_speedup(simulate(every, "sd", k=k), cfg.max_new_tokens) for k in grid]
    assert len(set(predicted)) == len(grid)  # the grid's settings are told apart
    best = grid[int(np.argmax(predicted))]
    selection = json.loads((out / "selection.json").read_text())["modes"]["sample"]
    assert selection["sd"]["params"] == {"k": best} and set(selection) == {"sd", "confidence"}
    assert [g["predicted_speedup"] for g in selection["sd"]["grid"]] == pytest.approx(predicted)
    runs = {}
    for r in ResultStore(out / "results.jsonl").records():
        runs.setdefault((r["mode"], r["family"]), set()).add(r["run"])
    assert runs[("sample", "sd")] == {f"sd[k={best}]"} and len(runs[("sample", "confidence")]) == 1
    assert len(runs[("greedy", "sd")]) == len(grid)  # greedy is not what the traces hold: measured sweep
    rep = json.loads((out / "report.json").read_text())
    assert rep["modes"]["sample"]["chosen"]["sd"] == f"sd[k={best}]"
    assert "## Settings chosen by the trace simulator" in (out / "report.md").read_text()
    # resumed with another grid: chosen again from it, not read back from the first choice
    cfg.policies[1] = Sweep("sd", grid={"k": [7, 9]})
    run_eval(cfg, fake_engine(), quiet=True)
    selection = json.loads((out / "selection.json").read_text())["modes"]["sample"]
    assert selection["sd"]["params"]["k"] in (7, 9) and len(selection["sd"]["grid"]) == 2
    # resumed with select_by: measured: the old choice neither decides nor is reported
    cfg.select_by = "measured"
    rep = json.loads((run_eval(cfg, fake_engine(), quiet=True) / "report.json").read_text())
    assert rep["selection"] is None and "sample" not in json.loads((out / "selection.json").read_text())["modes"]
    swept = [r for r in rep["modes"]["sample"]["sweep"] if r["family"] == "sd"]
    assert len(swept) >= 3 and rep["modes"]["sample"]["chosen"]["sd"] == max(swept, key=lambda r: r["tokens_per_s"])["run"]
    with pytest.raises(EvalError, match="labels_dir"):
        make_cfg(tmp_path, select_by="simulated", labels_dir=None)


def test_simulated_selection_without_labels_is_one_line_before_any_model_loads(tmp_path, capsys):
    from evaluation.__main__ import main

    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "draft": {"path": str(tmp_path / "no-draft")}, "target": {"path": str(tmp_path / "no-target")},
        "prompts": {"source": str(write_prompt_file(tmp_path / "prompts.jsonl")), "response_field": "answer"},
        "policies": [{"family": "target_only"}], "select_by": "simulated", "train_dir": None,
        "labels_dir": str(tmp_path / "no-labels"), "output_dir": str(tmp_path / "eval")}))
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no-labels" in errors[0] and "Traceback" not in err


def test_the_forwards_are_timed_again_only_when_the_file_cannot_serve(tmp_path):
    """A resumed eval keeps its timing file on the same machine, shapes and decoder, and times again when the file
    has no table of the target's verification lengths or no draft catch-up read (written before the simulator
    charged them)."""
    from types import SimpleNamespace

    from evaluation.forward_timing import refresh_forward_timing
    from evaluation.rundir import RunDir

    timed = []

    def time_forwards(prompt_tokens, new_tokens):
        timed.append((prompt_tokens, new_tokens))
        return {"models": [{"name": "draft", "catch_up": {"tokens": 2, "median_s": 1.0}},
                           {"name": "target", "verify_by_tokens": {"2": {"median_s": 1.0}}}]}

    engine, runner = SimpleNamespace(time_forwards=time_forwards), SimpleNamespace(_ids={0: [1, 2, 3], 1: [4]})

    def config(new_tokens: int = 8, decoder: str = "eager"):
        return SimpleNamespace(max_new_tokens=new_tokens, resolved_decoder=lambda: decoder)

    cfg = config()
    refresh_forward_timing(cfg, engine, runner, tmp_path, quiet=True)
    refresh_forward_timing(cfg, engine, runner, tmp_path, quiet=True)
    assert timed == [(2, 8)]
    path = RunDir(tmp_path).forward_timing
    old = json.loads(path.read_text())
    del old["models"][1]["verify_by_tokens"]
    path.write_text(json.dumps(old))
    refresh_forward_timing(cfg, engine, runner, tmp_path, quiet=True)
    assert timed == [(2, 8), (2, 8)] and "verify_by_tokens" in json.loads(path.read_text())["models"][1]
    refresh_forward_timing(config(16), engine, runner, tmp_path, quiet=True)  # other shapes
    assert len(timed) == 3
    old = json.loads(path.read_text())
    del old["models"][0]["catch_up"]
    path.write_text(json.dumps(old))
    refresh_forward_timing(config(16), engine, runner, tmp_path, quiet=True)  # no catch-up read
    refresh_forward_timing(config(16, "static"), engine, runner, tmp_path, quiet=True)  # another decoder
    assert len(timed) == 5


def test_the_eval_decodes_only_prompts_no_head_has_seen(tmp_path, capsys):
    """A head's record of the prompts it trained on keeps every policy off them (one line names them); a head that
    saw every prompt is refused."""
    from core.identity import prompt_digest
    from core.prompts import tokenize_prompt
    from evaluation.prompts import text_digests, unseen_prompts
    from heads.export import export_head
    from heads.sprinter import SprinterHead
    from testing.tiny import WORDS, make_tokenizer

    tok = make_tokenizer()
    prompts = [{"prompt": i, "text": " ".join(WORDS[: i + 2])} for i in range(5)]

    def head(name, seen):
        digests = [prompt_digest(tokenize_prompt(tok, prompts[i]["text"], False)) for i in seen]
        return str(export_head(SprinterHead(hidden_size=2), tmp_path / f"{name}.safetensors", draft=FAKE_DRAFT,
                               vocab_size=16, label={"kind": "sprinter", "lam": 1.5}, role="verifier",
                               threshold={"name": "tau", "value": 0.5}, metrics={},
                               trained_on={"labels": "x", "splits": ["train"], "prompts": len(digests),
                                           "digests": "".join(sorted(digests))}))

    digests = {p["prompt"]: text_digests(p["text"], tok, False) for p in prompts}
    kept = unseen_prompts(prompts, [head("a", [1]), head("b", [3])], digests)
    assert [p["prompt"] for p in kept] == [0, 2, 4]
    assert "left out 2 of 5 prompts that a head trained on" in capsys.readouterr().err
    assert unseen_prompts(prompts, [], digests) == prompts
    with pytest.raises(EvalError, match="a head has seen every prompt"):
        unseen_prompts(prompts, [head("all", range(5))], digests)


def test_report_names_the_device_the_eval_ran_on_not_the_best_one_present(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cfg = make_cfg(tmp_path, device="cpu", policies=[Sweep("target_only")], modes=[Mode("sample", 1.0)])
    out = run_eval(cfg, fake_engine(), quiet=True)
    assert json.loads((out / "report.json").read_text())["device"].startswith("cpu (")
    # a report rewritten on a machine without the GPU its runs decoded on
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg.device = "cuda"
    records = ResultStore(out / "results.jsonl").records()
    assert write_report(out, cfg, records, load_prompts(cfg.prompts))["device"] == "cuda"


def test_report_shows_training_figures_only_of_the_head_files_still_exported(tmp_path):
    """A head trained again elsewhere (other labels, another folder) is not the one ``runs/train`` measured: its rows
    and the ROC figure are left out, named in one line, rather than shown beside the head the eval decoded."""
    from core.cache import file_sha256
    from evaluation.markdown import training_md

    train, out = tmp_path / "train", tmp_path / "eval"
    train.mkdir()
    out.mkdir()
    (train / "roc.png").write_bytes(b"png")
    heads = {name: tmp_path / f"{name}.safetensors" for name in ("kept", "retrained")}
    for path in heads.values():
        path.write_bytes(path.name.encode())
    rows = [{"name": name, "label": "soft", "threshold": {"name": "h", "value": 0.9}, "export": str(path),
             "export_sha256": file_sha256(path), "test": {"head/auroc": 0.85, "head/ap": 0.98}}
            for name, path in heads.items()]
    (train / "metrics.json").write_text(json.dumps(rows))
    lines, metrics = training_md(train, out)
    assert [m["name"] for m in metrics] == ["kept", "retrained"] and (out / "roc.png").exists()
    heads["retrained"].write_bytes(b"another head")
    lines, metrics = training_md(train, out)
    assert [m["name"] for m in metrics] == ["kept"] and not (out / "roc.png").exists()
    assert "Left out: retrained" in lines[0] and not any("| retrained |" in line for line in lines)
    # a table from before the digests were kept: shown, with a line saying it was not checked
    for row in rows:
        del row["export_sha256"]
    (train / "metrics.json").write_text(json.dumps(rows))
    lines, metrics = training_md(train, out)
    assert [m["name"] for m in metrics] == ["kept", "retrained"]
    assert any(line.startswith("_kept, retrained: ") and "did not record" in line for line in lines)


def test_report_says_when_other_work_shared_the_cpu(tmp_path, monkeypatch):
    """Each run records the machine's load as it ends; runs timed while other work ran are counted in one line of
    the report, and a quiet machine's report says nothing."""
    import os

    import torch

    (tmp_path / "quiet").mkdir()
    (tmp_path / "busy").mkdir()
    monkeypatch.setattr(os, "getloadavg", lambda: (torch.get_num_threads() + 0.5, 0.0, 0.0))
    policies = [Sweep("target_only"), Sweep("sd", grid={"k": [2]})]
    quiet = run_eval(make_cfg(tmp_path / "quiet", device="cpu", policies=policies), fake_engine(), quiet=True)
    assert "shared the CPU" not in (quiet / "report.md").read_text()
    assert json.loads((quiet / "report.json").read_text())["cpu_contention"]["contended"] == 0
    loads = iter([torch.get_num_threads() + 3.0, torch.get_num_threads()] * 100)
    monkeypatch.setattr(os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    busy = run_eval(make_cfg(tmp_path / "busy", device="cpu", policies=policies), fake_engine(), quiet=True)
    c = json.loads((busy / "report.json").read_text())["cpu_contention"]
    assert 0 < c["contended"] < c["runs"]
    assert f"**Other work shared the CPU** during {c['contended']} of {c['runs']} runs" in \
        (busy / "report.md").read_text()


def test_timing_repeats_keep_the_median_run_in_turns(tmp_path, monkeypatch):
    """``timing_repeats: 3``: each generation runs three times, a prompt's runs in turns (A B A B A B), and the
    record keeps the repeat of median wall time with every repeat's; a repeat that made other tokens is refused."""
    import itertools

    from test_eval_fakes import FakePolicy

    walls = itertools.cycle([0.3, 0.1, 0.2])
    generate = FakePolicy.generate

    def varying(self, pair, prompt_ids, generator):
        result = generate(self, pair, prompt_ids, generator)
        result.stats.wall_s = next(walls)
        return result

    monkeypatch.setattr(FakePolicy, "generate", varying)
    calls = []
    cfg = make_cfg(tmp_path, policies=[Sweep("target_only"), Sweep("sd", fixed={"k": 3})], hf_peer=HFPeer(enabled=False),
                   modes=[Mode("sample", 1.0)], timing_repeats=3)
    out = run_eval(cfg, fake_engine(calls), quiet=True)
    first = [name for name, _, ids in calls if ids == calls[0][2]]
    assert first == ["target_only", "sd"] * 3
    records = ResultStore(out / "results.jsonl").records()
    assert len(records) == 2 * 4
    for r in records:
        assert sorted(r["stats"]["repeat_wall_s"]) == pytest.approx([0.1, 0.2, 0.3])
        assert r["stats"]["wall_s"] == pytest.approx(0.2)
    assert json.loads((out / "settings.json").read_text())["timing_repeats"] == 3
    with pytest.raises(EvalError, match="timing_repeats"):
        make_cfg(tmp_path, timing_repeats=0)


def test_repeats_that_make_other_tokens_are_refused():
    from evaluation.runner import median_run

    stats = {"wall_s": 1.0}
    assert median_run([([1, 2], stats)], "sd", 0) == ([1, 2], stats)
    with pytest.raises(RuntimeError, match="other tokens on prompt 3"):
        median_run([([1, 2], stats), ([1, 3], stats)], "sd", 3)


def test_a_runs_prediction_charges_the_drafts_catch_up_it_recorded():
    """The eval's per-run prediction (``Totals.predicted_s_per_token``) charges each token the draft read beyond one
    its ``draft_catch_up`` seconds; runs with a record made before runs counted them are not predicted where the fit
    prices the catch-up (they would look cheaper than runs that counted it), and predicted as before where not."""
    from decoding.costs import CostModel
    from evaluation.summary import totals

    fit = CostModel(t_draft=0.5, t_target=1.0, intercept=0.0, r2=1.0, n_runs=0, draft_catch_up=0.25)

    def record(prompt, catch_up):
        stats = {"wall_s": 1.0, "new_tokens": 10, "target_calls": 6, "draft_calls": 8, "discarded": 2,
                 "accepted_lengths": [1, 2]}
        return {"prompt": prompt, "run": "sd k=2", "family": "sd", "params": {"k": 2}, "mode": "sample",
                "stats": stats | ({} if catch_up is None else {"draft_catch_up": catch_up})}

    counted = totals({0: record(0, 3), 1: record(1, 1)})
    assert counted.draft_catch_up == 4
    assert counted.predicted_s_per_token(fit) == pytest.approx((0.5 * 16 + 1.0 * 12 + 0.25 * 4) / 20)
    uncounted = totals({0: record(0, 3), 1: record(1, None)})
    assert uncounted.draft_catch_up is None and uncounted.predicted_s_per_token(fit) is None
    unpriced = CostModel(t_draft=0.5, t_target=1.0, intercept=0.0, r2=1.0, n_runs=0)
    assert uncounted.predicted_s_per_token(unpriced) == pytest.approx((0.5 * 16 + 1.0 * 12) / 20)


def test_a_runs_prediction_prices_each_target_forward_at_the_length_it_read():
    """Where a run records its target forwards by the tokens each read (``DecodeStats.target_reads``), a cost by
    length charges each its own: prompt lookup's long copies and its one-token steps differ by more than the line
    over a run's totals can say. The forward that read the prompt is a step; a record without the count keeps the
    line."""
    from decoding.costs import CostModel
    from evaluation.summary import totals

    fit = CostModel.by_length(draft=0.5, verify=lambda m: 1.0 + 0.25 * (m - 1))

    def record(prompt, reads):
        stats = {"wall_s": 1.0, "new_tokens": 20, "target_calls": 5, "draft_calls": 0, "discarded": 2,
                 "accepted_lengths": [9, 6], "draft_catch_up": 0} | ({"target_reads": reads} if reads else {})
        return {"prompt": prompt, "run": "prompt_lookup", "family": "prompt_lookup", "params": {}, "mode": "greedy",
                "stats": stats}

    by_length = totals({0: record(0, {"1": 2, "11": 1, "9": 1}), 1: record(1, {"17": 1, "1": 3})})
    assert by_length.target_reads == {1: 5, 9: 1, 11: 1, 17: 1}
    # reads: 5 steps, 9, 11 and 17 tokens; the two prompts' forwards: a step each
    assert by_length.predicted_s_per_token(fit) == pytest.approx((7 * 1.0 + 3.0 + 3.5 + 5.0) / 40)
    on_the_line = totals({0: record(0, None), 1: record(1, {"17": 1, "1": 3})})
    assert on_the_line.target_reads is None
    assert on_the_line.predicted_s_per_token(fit) == pytest.approx(fit.predict(0, 10, 2) / 40)

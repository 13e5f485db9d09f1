"""``specheads advise`` for transformers:

- its assisted generation replayed along the target's greedy response (``decoding.runtime_replay.assisted_counts``)
  against ``generate()`` itself on the tiny pair: the target's calls exactly, at every schedule and confidence
  threshold (its threshold moves on a ROC curve each round); the draft's forwards exactly where no threshold stops
  it (past a rejection they are expected, not known);
- the command end to end on the tiny pair's transformers labels: the verdict, the fields to set (accepted by
  ``GenerationConfig``), each call's prefill priced, ``--check`` through ``generate()``; sampled traces and a
  timing of the labels' other precision refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from decoding.costs import timing_entry

from core.models import ModelSpec, load_model
from core.sampling import Sampling
from decoding.runtime_replay import ASSISTED_DEFAULTS, assisted_counts
from evaluation.advise_traces import draft_tops
from evaluation.hf_peer import hf_generate

PROMPTS = ("def f ( x ) : return x", "for i in range ( n ) : print ( i )", "x = [ 1 , 2 , 3 ]", "import a b c")
SETTINGS = [("constant", 3, 0.0), ("heuristic", 5, 0.0), ("constant", 20, 0.4), ("heuristic", 4, 0.6),
            ("heuristic", 2, 0.3)]
TOKENS = 24


@pytest.fixture(scope="module")
def generations(tiny_pair):
    """Per prompt: the target's greedy response, the draft's tops along it, and ``generate()``'s forward counts
    at each of ``SETTINGS``. No end-of-sequence token (the padding id, never drafted): a draft that proposes one
    off the trace stops there, which no trace records."""
    draft, tok, _ = load_model(ModelSpec(path=str(tiny_pair[0])))
    target, _, _ = load_model(ModelSpec(path=str(tiny_pair[1])))
    eos, greedy = [tok.pad_token_id], Sampling(temperature=0, max_new_tokens=TOKENS)
    out = []
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        response, _ = hf_generate(draft, target, ids, greedy, eos, 0, assisted=False)
        with torch.no_grad():
            logits = draft(torch.tensor([ids + response[:-1]])).logits[0, len(ids) - 1:]
        match, top = draft_tops(logits, response, top_k=None)
        runs = {}
        for schedule, k, threshold in SETTINGS:
            tokens, stats = hf_generate(draft, target, ids, greedy, eos, 0, {
                "num_assistant_tokens": k, "num_assistant_tokens_schedule": schedule,
                "assistant_confidence_threshold": threshold})
            assert tokens == response  # greedy assisted generation is the target's own
            runs[schedule, k, threshold] = stats
        out.append((match, top, runs))
    return out


def test_the_replay_counts_the_target_calls_generate_makes(generations):
    for match, top, runs in generations:
        for (schedule, k, threshold), stats in runs.items():
            counts = assisted_counts(match, top, k, schedule, threshold, max_new_tokens=TOKENS)
            assert counts.target == stats["target_calls"], (schedule, k, threshold)


def test_without_a_threshold_the_draft_forwards_are_exact_and_with_one_expected(generations):
    for match, top, runs in generations:
        for (schedule, k, threshold), stats in runs.items():
            counts = assisted_counts(match, top, k, schedule, threshold, max_new_tokens=TOKENS,
                                     clears=lambda t: float((top >= t).mean()))
            if threshold == 0:
                assert counts.draft == stats["draft_calls"]
            else:
                assert counts.draft == pytest.approx(stats["draft_calls"], rel=0.5)


def test_the_threshold_moves_as_transformers_moves_it():
    """From six recorded tokens with both outcomes on, the threshold is the ROC cut minimising FPR + 3·FNR: kept
    tokens at 0.97 and rejected ones at 0.6 lift it to 0.97 after three rounds, so the fourth stops after its 0.6
    token (two candidates, where a fixed threshold drafts four) and the fifth after its first 0.9 token (one); that
    kept 0.9 token brings it down to 0.9, and the last round drafts four again."""
    match = np.array([1, 0] * 4 + [1] * 12, bool)
    top = np.array([0.97, 0.6] * 4 + [0.9] * 12)
    fixed = assisted_counts(match, top, 4, "constant", 0.0)
    moving = assisted_counts(match, top, 4, "constant", 0.4)
    assert fixed.calls.tolist() == [0, 0, 1, 0, 0, 6]
    assert moving.calls.tolist() == [0, 0, 1, 1, 0, 5]
    assert ASSISTED_DEFAULTS == {"schedule": "constant", "k": 20, "threshold": 0.4}


@pytest.fixture(scope="module")
def hf_labels(tiny_pair, tmp_path_factory):
    """Greedy ``target`` labels of the tiny pair on transformers, and a timing file of its float32 forwards."""
    import dataclasses

    from core.device import describe_device
    from data_gen.run import run_labels
    from testing.tiny import label_config, write_prompts

    d = tmp_path_factory.mktemp("advise-hf")
    prompts = write_prompts(d / "prompts.jsonl", n=12)
    base = label_config(*tiny_pair, prompts, d / "labels", max_new_tokens=16)
    run_labels(dataclasses.replace(base, categories=["target"],
                                   sampling=dataclasses.replace(base.sampling, temperature=0.0)), quiet=True)
    timing = {"device": describe_device(torch.device("cpu")), "device_type": "cpu", "backend": "transformers",
              "decoder": "eager", "prefill": 64, "models": [
                  timing_entry("draft", "float32", (64, 0.032), 64, {1: 0.002, 2: 0.0025}, verify=None,
                               catch_up=0.0025, shape=str(tiny_pair[0])),
                  timing_entry("target", "float32", (64, 0.064), 64, {m: 0.01 + 0.0005 * m for m in range(1, 22)},
                               verify=8, verify_short=3, by_tokens=True, catch_up=0.0105, shape=str(tiny_pair[1]))]}
    path = d / "timing.json"
    path.write_text(json.dumps(timing))
    return {"labels": d / "labels", "timing": path, "check": write_prompts(d / "check.jsonl", n=3, seed=1)}


def test_the_advice_names_transformers_fields_and_checks_them_with_generate(hf_labels, tmp_path, capsys):
    from test_advise import advise
    from transformers import GenerationConfig

    out = tmp_path / "advice"
    code, printed, err = advise(["--labels", hf_labels["labels"], "--timing", hf_labels["timing"], "--out", out,
                                 "--check", 5, "--check_prompts", hf_labels["check"]], capsys)
    assert code in (0, None), [e for e in err if "error" in e or "Error" in e]
    assert any("timed without `bench-timing --generate`" in e for e in err)  # what its predictions leave out
    assert any("3 prompts not among the traces; checking those, not the 5 asked" in e for e in err)
    saved = json.loads((out / "advice.json").read_text())
    assert saved["runtime"] == "transformers" and saved["verdict"] in printed
    rules = {(s["runs_in"], s["rule"]) for s in saved["settings"]}
    assert {("transformers", "assisted"), ("transformers", "target only"), ("specheads", "sd"),
            ("ceiling", "oracle")} <= rules and not any(r == "llama.cpp" for r, _ in rules)
    defaults = [s["params"] for s in saved["settings"] if s["default"]]
    assert defaults == [ASSISTED_DEFAULTS]
    fields = saved["paste"].get("fields")
    if fields is not None:  # a setting was advised: its fields as transformers takes them
        GenerationConfig(**fields).validate(strict=True)
    assert "transformers' terms" in (out / "advice.md").read_text() and (out / "advice.png").stat().st_size > 0
    checked = saved["checked"]
    assert checked and all(c["measured"]["value"] > 0 for c in checked)
    assert any(c["label"].startswith("assisted (schedule constant, k 20, threshold 0.4)") for c in checked)
    lines = (out / "check.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["made_with"]["wall"] == "generate" and len(lines) == 1 + 3 * (1 + len(checked))
    assert saved["inputs"]["another_set"]["prompts"] == 3 and "another 3 prompts like these" in printed


def test_a_timing_with_generates_own_costs_gets_no_line_about_them(hf_labels, tmp_path, capsys):
    from test_advise import advise

    timing = json.loads(hf_labels["timing"].read_text())
    for m in timing["models"]:
        m.update({"sample": {"tokens": 9, "median_s": 0.0005}, "generate_call": {"cache": 64, "median_s": 0.004}})
    (tmp_path / "timing.json").write_text(json.dumps(timing))
    code, _, err = advise(["--labels", hf_labels["labels"], "--timing", tmp_path / "timing.json", "--out",
                           tmp_path / "advice"], capsys)
    assert code in (0, None) and not any("--generate" in e for e in err), err


def test_a_call_pays_its_prefill_where_the_runtime_times_it():
    """transformers' ``generate()`` time includes its prompt: a prompt read at the timed prefill's rate by the
    target, and by the draft where the call drafts; target-only pays the target's."""
    from decoding.costs import CostModel
    from decoding.replay import Counts
    from evaluation.simulate_lookup import priced_interval

    costs = CostModel.by_length(0.002, {1: 0.01, 2: 0.012, 3: 0.014})
    costs.prefill_token_s, costs.draft_prefill_token_s = 0.001, 0.0005
    rounds = Counts(n=20, draft=10, target=10, calls=np.array([0, 0, 10.0]))
    decode = 10 * 0.002 + 10 * 0.012
    alone = priced_interval([rounds, rounds], costs).value
    with_prompts = priced_interval([rounds, rounds], costs, prompts=[100, 100]).value
    assert alone == pytest.approx(20 * 0.01 / decode)
    assert with_prompts == pytest.approx((20 * 0.01 + 0.1) / (decode + 0.1 + 0.05))


def test_sampled_traces_and_a_timing_of_other_precisions_are_refused(hf_labels, tiny_pair, label_config, tmp_path,
                                                                      capsys):
    import dataclasses

    from data_gen.run import run_labels
    from test_advise import advise

    sampled = label_config(output_dir=str(tmp_path / "sampled"), categories=["target"])
    run_labels(dataclasses.replace(sampled, sampling=dataclasses.replace(sampled.sampling, temperature=1.0)),
               quiet=True)
    other = json.loads(hf_labels["timing"].read_text())
    for m in other["models"]:
        m["precision"] = "bfloat16"
    (tmp_path / "bf16.json").write_text(json.dumps(other))
    capsys.readouterr()
    out = tmp_path / "advice"
    for argv, words in [
        (["--labels", tmp_path / "sampled", "--timing", hf_labels["timing"]], "label with temperature 0"),
        (["--labels", hf_labels["labels"], "--timing", tmp_path / "bf16.json"],
         "time it with `specheads bench-timing --precision float32`"),
    ]:
        code, _, err = advise([*argv, "--out", out], capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("error:") and words in err[0], (argv, err)
        assert not out.exists()


def test_generates_own_costs_are_timed_and_priced(tiny_pair):
    """``bench-timing --generate``: what a ``generate()`` call adds to the bare forwards, per token (priced as the
    sampler: the draft's in its step, the target's per token emitted) and per call (each round's assistant call)."""
    from core.device import describe_device
    from decoding.costs import CostModel
    from evaluation.timers import generate_costs

    draft, _, _ = load_model(ModelSpec(path=str(tiny_pair[0])))
    added = generate_costs(draft, torch.device("cpu"), cache=24, step_s=0.0, repeats=2)
    assert added["sample"]["median_s"] > 0 and added["generate_call"]["median_s"] >= 0
    timing = {"device": describe_device(torch.device("cpu")), "backend": "transformers", "models": [
        {**timing_entry("draft", "float32", (64, 0.032), 64, {1: 0.002}, verify=None, catch_up=0.0025),
         "sample": {"tokens": 9, "median_s": 0.001}, "generate_call": {"cache": 64, "median_s": 0.005}},
        {**timing_entry("target", "float32", (64, 0.064), 64, {m: 0.01 + 0.0005 * m for m in range(1, 10)},
                        verify=8, by_tokens=True), "sample": {"tokens": 9, "median_s": 0.0005}}]}
    costs = CostModel.from_timing(timing)
    assert costs.draft == pytest.approx(0.003) and costs.sample_s == pytest.approx(0.0005)
    assert costs.verify(4) == pytest.approx(0.012 + 0.005) and costs.verify(1) == pytest.approx(0.0105)


def test_an_int8_drafts_tops_are_the_ones_its_steps_compute(tiny_pair, tmp_path):
    """The tops of an int8 draft are read as ``generate()`` computes them: the prompt in one batch (its output row
    alone), then one token at a time. A read of a whole response in one batch quantizes its activations with one
    scale and gives other probabilities (here every one of them)."""
    import dataclasses

    from core.models import ModelSpec as Spec
    from core.shards import read_manifest
    from data_gen.run import run_labels
    from evaluation.advise_traces import advice_traces, load_draft
    from testing.tiny import label_config, write_prompts

    prompts = write_prompts(tmp_path / "prompts.jsonl", n=3)
    base = label_config(*tiny_pair, prompts, tmp_path / "labels", max_new_tokens=10)
    cfg = dataclasses.replace(base, categories=["target"], sampling=dataclasses.replace(base.sampling, temperature=0.0),
                              draft=Spec(path=str(tiny_pair[0]), name="tiny-draft",
                                         quantization="int8-dynamic-per-channel"))
    run_labels(cfg, quiet=True)
    labels = tmp_path / "labels"
    run = json.loads((labels / "run.json").read_text())
    traces = advice_traces(labels, load_draft(read_manifest(labels), run, labels, 1), top_k=None, quiet=True)
    stepped, _, _ = load_model(Spec(path=str(tiny_pair[0]), quantization="int8-dynamic-per-channel"))
    assert traces
    for t in traces:
        probs = []
        with torch.no_grad():
            out = stepped(torch.tensor([t.prompt]), use_cache=True, logits_to_keep=1)  # as generate() prefills
            for token in t.response:
                probs.append(torch.softmax(out.logits[0, -1].float(), -1).max().item())
                out = stepped(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        assert t.top_prob == pytest.approx(np.array(probs), rel=1e-5, abs=1e-6)


def test_vllm_is_advised_from_the_same_traces_as_its_draft_model_proposer(hf_labels, tmp_path, capsys):
    """vLLM's draft-model proposer drafts a fixed number of tokens a round and verifies them by speculative sampling:
    each length is priced as our ``sd`` at that K, and the setting is given as vLLM's ``--speculative-config``."""
    from test_advise import advise

    out = tmp_path / "advice"
    code, printed, err = advise(["--labels", hf_labels["labels"], "--timing", hf_labels["timing"], "--out", out,
                                 "--runtime", "vllm"], capsys)
    assert code in (0, None), [e for e in err if "error" in e]
    saved = json.loads((out / "advice.json").read_text())
    assert saved["runtime"] == "vLLM" and saved["verdict"] in printed
    assert not any(s["runs_in"] == "transformers" for s in saved["settings"])
    ours = {s["params"]["k"]: s for s in saved["settings"] if s["rule"] == "sd"}
    proposer = {s["params"]["num_speculative_tokens"]: s for s in saved["settings"] if s["rule"] == "draft_model"}
    assert proposer and not any(s["default"] for s in proposer.values())
    for k in set(ours) & set(proposer):
        assert proposer[k]["rates"] == ours[k]["rates"] and proposer[k]["speedup"] == ours[k]["speedup"]
    if saved["advised"] is not None:
        config = saved["paste"]["speculative_config"]
        assert config == {"model": "DRAFT", "num_speculative_tokens": saved["advised"]["params"][
            "num_speculative_tokens"], "method": "draft_model"}
        assert json.loads(saved["paste"]["flags"].split("--speculative-config ")[1].strip("'")) == config
    report = (out / "advice.md").read_text()
    assert "vLLM's terms" in report and "`--check` does not run vLLM" in report


def test_vllm_config_is_the_dict_vllm_serve_takes():
    from evaluation.advice_report import vllm_config
    from evaluation.advice_rules import VLLM, Setting

    picked = vllm_config(Setting(VLLM, "draft model", "draft_model", {"num_speculative_tokens": 5}, []))
    assert picked["speculative_config"] == {"model": "DRAFT", "num_speculative_tokens": 5, "method": "draft_model"}
    assert picked["flags"] == ("vllm serve TARGET --speculative-config "
                               "'{\"model\": \"DRAFT\", \"num_speculative_tokens\": 5, \"method\": \"draft_model\"}'")
    assert vllm_config(None) == {"flags": "vllm serve TARGET"}


def test_vllm_advice_is_never_checked_here_nor_priced_at_two_precisions(hf_labels, tmp_path, capsys):
    from test_advise import advise

    both = json.loads(hf_labels["timing"].read_text())
    both["models"] += [{**m, "precision": "bfloat16"} for m in both["models"]]
    (tmp_path / "both.json").write_text(json.dumps(both))
    out = tmp_path / "advice"
    for timing, extra, words in [
        (hf_labels["timing"], ["--check", "2", "--check_prompts", "humaneval"], "vLLM is not run here"),
        (tmp_path / "both.json", [], "holds the draft at float32, bfloat16"),
    ]:
        code, _, err = advise(["--labels", hf_labels["labels"], "--timing", timing, "--out", out, "--runtime", "vllm",
                               *extra], capsys)
        assert code == 2 and len(err) == 1 and words in err[0] and not out.exists(), err


def test_vllm_is_priced_at_its_devices_own_precision_and_over_sampled_traces(hf_labels, label_config, tmp_path,
                                                                               capsys):
    """A GPU's timing file holds the precision that device ran at, not the CPU labels' int8 draft: vLLM's advice
    takes its entries as they are, and sampled traces too (its rejection sampler is speculative sampling)."""
    import dataclasses

    from data_gen.run import run_labels
    from test_advise import advise

    other = json.loads(hf_labels["timing"].read_text())
    for m in other["models"]:
        m["precision"] = "bfloat16"
    (tmp_path / "bf16.json").write_text(json.dumps(other))
    sampled = label_config(output_dir=str(tmp_path / "sampled"), categories=["target"])
    run_labels(dataclasses.replace(sampled, sampling=dataclasses.replace(sampled.sampling, temperature=1.0)),
               quiet=True)
    for labels, timing in ((hf_labels["labels"], tmp_path / "bf16.json"), (tmp_path / "sampled", hf_labels["timing"])):
        out = tmp_path / f"advice-{Path(labels).name}"
        code, _, err = advise(["--labels", labels, "--timing", timing, "--out", out, "--runtime", "vllm"], capsys)
        assert code in (0, None), [e for e in err if "error" in e]
        assert json.loads((out / "advice.json").read_text())["runtime"] == "vLLM"

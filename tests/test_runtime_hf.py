"""Exported heads inside transformers' ``generate()`` (``decoding.runtimes.hf``, ``decoding.runtimes.hf_export``), on
tiny random-init Llama pairs.

- greedy: SpecDec++ (a head on either feature position) gives target-only greedy ``generate()`` token for token,
  and drafts the same rounds as the evaluation's decoder with the same head (so the stop rule reads the same
  states); SPRINTER gives the decoder's tokens and target calls;
- sampling: SpecDec++ through ``generate()`` samples the target's joint distribution of three tokens (χ², with the
  power to tell it from the draft's);
- SPRINTER: an always-accepting verifier reproduces draft-only ``generate()`` for the same seed with no target
  call; an always-rejecting one sends every token through the target (and is then greedy target decoding);
- the exported folder loads through ``custom_generate=<folder>`` in a subprocess that cannot import this project,
  with the head's threshold, the goodput stop on the head and, bundled, on a calibrated confidence;
- a head for another draft, a tampered file and unsupported arguments: one clear error each.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from core.models import ModelSpec, load_model
from core.sampling import Sampling
from decoding.costs import CostModel, read_timing
from decoding.estimates import CalibratedConfidence
from decoding.policies import build_policy
from decoding.runtimes import hf as runtime
from decoding.runtimes import hf_export as export_hf
from decoding.runtimes.hf import HeadCandidateGenerator, HeadDecoding
from decoding.state import Decoding, ModelPair
from heads.export import HeadFileError, export_head
from heads.resnet import ResNetHead
from heads.sprinter import SprinterHead

PROMPTS = [[1, 10, 11, 12], [1, 30, 5], [1, 7, 8, 9, 20, 21]]
P_CRIT = 1e-3
CALIBRATION = CalibratedConfidence(q=np.array([0.0, 0.5, 1.0]), acceptance=np.array([0.2, 0.6, 0.95]), rows=3)
"""A calibrated draft confidence for the goodput stop without a head."""


@pytest.fixture(scope="module")
def models(tiny_pair):
    draft_dir, target_dir = tiny_pair
    return tuple(AutoModelForCausalLM.from_pretrained(d).eval() for d in (draft_dir, target_dir))


def _identity(model_dir) -> dict:
    """The draft record labeling writes into the manifest (and a head file copies)."""
    return load_model(ModelSpec(path=str(model_dir), name=model_dir.name))[2]


def _export(path, head, role: str, value: float, draft: dict, position: str = "own", vocab_size: int = 57):
    return export_head(head, path, draft=draft, vocab_size=vocab_size, label={"kind": "test"}, role=role,
                       threshold={"name": "tau" if role == "verifier" else "h", "value": value, "rule": "test"},
                       metrics={"test/head/auroc": 0.75}, position=position)


def _verifier(hidden: int, bias: float, seed: int | None = None) -> SprinterHead:
    """A SPRINTER head with logit ``bias`` (plus random weights when ``seed`` is given)."""
    head = SprinterHead(hidden_size=hidden)
    with torch.no_grad():
        head.linear.weight.zero_()
        if seed is not None:
            head.linear.weight.normal_(0, 1, generator=torch.Generator().manual_seed(seed))
        head.linear.bias.fill_(bias)
    return head


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny_pair):
    """Heads for the tiny draft, recorded with its real identity: random SpecDec++ stop heads on both feature
    positions (one reading the draft's scores), and SPRINTER verifiers that accept always, never, or sometimes."""
    d = tmp_path_factory.mktemp("heads")
    draft = _identity(tiny_pair[0])
    torch.manual_seed(0)
    stop = ResNetHead(hidden_size=32, depth=2)
    scored = ResNetHead(hidden_size=32, depth=1, scores=["logp_draft", "entropy_draft"])
    with torch.no_grad():
        stop.out.weight.normal_(0, 1)
        scored.out.weight.normal_(0, 0.5)
        scored.score_term.linear.weight.copy_(torch.tensor([[0.8, -0.5]]))
    return {
        "stop": _export(d / "stop.safetensors", stop, "stop", 0.5, draft),
        "stop_prev": _export(d / "stop_prev.safetensors", stop, "stop", 0.5, draft, position="prev"),
        "stop_scores": _export(d / "stop_scores.safetensors", scored, "stop", 0.6, draft),
        "accept": _export(d / "accept.safetensors", _verifier(32, 20.0), "verifier", 0.5, draft, "prev"),
        "reject": _export(d / "reject.safetensors", _verifier(32, -20.0), "verifier", 0.5, draft, "prev"),
        "mixed": _export(d / "mixed.safetensors", _verifier(32, 0.0, seed=1), "verifier", 0.5, draft, "prev"),
    }


@contextmanager
def count_forwards(model):
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


@contextmanager
def record_rounds():
    """The number of candidates of each round the runtime drafts."""
    rounds = []
    get = HeadCandidateGenerator.get_candidates

    def recording(self, input_ids, **kw):
        ids, logits = get(self, input_ids, **kw)
        rounds.append(ids.shape[1] - input_ids.shape[1])
        return ids, logits

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HeadCandidateGenerator, "get_candidates", recording)
        yield rounds


def hf(target, decoding, prompt, **kw):
    """Generated ids only (no prompt) from ``target.generate`` with ``decoding`` as its custom method."""
    out = target.generate(torch.tensor([prompt]), custom_generate=decoding, **kw)
    return out[0, len(prompt):].tolist()


def target_greedy(target, prompt, n) -> list[int]:
    return target.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)[0, len(prompt):].tolist()


# ---------------------------------------------------------------------------------------------------------------
# SpecDec++


@pytest.mark.parametrize("name", ["stop", "stop_prev", "stop_scores"])
def test_greedy_specdecpp_is_target_greedy_and_drafts_the_decoders_rounds(models, heads, name, monkeypatch):
    draft, target = models
    decoding = HeadDecoding(heads[name], draft)
    policy = build_policy("specdecpp", head=heads[name])
    pair = ModelPair(draft, target, eos_token_ids=[target.generation_config.eos_token_id],
                     sampling=Sampling(temperature=0.0, max_new_tokens=24))
    decoder_rounds = []
    verify = Decoding.verify
    monkeypatch.setattr(Decoding, "verify", lambda self, c, *a: decoder_rounds.append(len(c)) or verify(self, c, *a))
    lengths = set()
    for prompt in PROMPTS:
        expected = target_greedy(target, prompt, 24)
        decoder_rounds.clear()
        with record_rounds() as rounds:
            tokens = hf(target, decoding, prompt, max_new_tokens=24, do_sample=False)
        ours = policy.generate(pair, prompt, torch.Generator().manual_seed(0))
        assert tokens == expected == ours.tokens
        assert rounds == decoder_rounds  # the stop rule fired after the same candidates
        lengths |= set(rounds)
    assert len(lengths) > 2 and max(lengths) < runtime.MAX_K  # rounds of several lengths: the head decided


def test_specdecpp_samples_the_target_distribution(tmp_path):
    """χ² of 1000 three-token continuations against the target's exact warped joint (top-k 3 of 5 tokens at
    temperature 0.8); the same counts against the draft's joint must fail, so the test can see a wrong decoder."""
    vocab, prompt, n = 5, [1, 2], 1000
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, bos_token_id=None, eos_token_id=None,
                         pad_token_id=0)
    torch.manual_seed(0)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(10)
    draft = LlamaForCausalLM(config).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.5 * p.std() * torch.randn_like(p))
    head = ResNetHead(hidden_size=16, depth=1)
    with torch.no_grad():
        head.out.weight.normal_(0, 2)
    path = _export(tmp_path / "h.safetensors", head, "stop", 0.5, {"name": "mem", "source": "test"}, "prev", vocab)
    with pytest.warns(UserWarning, match="cannot tell whether the draft"):  # a model built in memory
        decoding = HeadDecoding(path, draft)

    def joint(model) -> torch.Tensor:
        """P(y1, y2, y3 | prompt) under temperature 0.8 and top-k 3, by hand."""
        def dist(ids):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1] / 0.8
            return logits.masked_fill(logits < logits.topk(3).values[-1], -math.inf).softmax(-1)
        out = torch.zeros(vocab, vocab, vocab)
        p1 = dist(prompt)
        for a in range(vocab):
            p2 = dist(prompt + [a])
            for b in range(vocab):
                out[a, b] = p1[a] * p2[b] * dist(prompt + [a, b])
        return out.flatten()

    torch.manual_seed(1)
    counts = torch.zeros(vocab ** 3)
    with record_rounds() as rounds:
        for _ in range(n):
            a, b, c = hf(target, decoding, prompt, max_new_tokens=3, do_sample=True, temperature=0.8, top_k=3,
                         pad_token_id=0)
            counts[a * vocab * vocab + b * vocab + c] += 1
    assert {1, 2} <= set(rounds)  # the head stopped some first rounds after one candidate, not others

    def chi2_p(expected_probs):
        """χ² p-value of the counts; 0 when some continuation lies outside the distribution's support."""
        keep = expected_probs > 0
        if counts[~keep].sum() > 0:
            return 0.0
        return stats.chisquare(counts[keep].numpy(), (expected_probs[keep] * n).numpy()).pvalue

    assert chi2_p(joint(target)) > P_CRIT
    assert chi2_p(joint(draft)) < P_CRIT


def test_draft_generation_config_is_left_as_it_was(models, heads):
    draft, target = models
    before = draft.generation_config.to_dict()
    hf(target, HeadDecoding(heads["stop"], draft), PROMPTS[0], max_new_tokens=8, do_sample=False)
    assert draft.generation_config.to_dict() == before


def test_streamer_and_return_dict(models, heads):
    """The folder entry point (``runtime.generate``, with a head file) streams the prompt and every generated token
    and returns transformers' output type, for both algorithms."""
    draft, target = models

    class Collect:
        def __init__(self):
            self.ids, self.ended = [], False

        def put(self, value):
            self.ids += value.flatten().tolist()

        def end(self):
            self.ended = True

    for name in ("stop", "mixed"):
        streamer = Collect()
        out = runtime.generate(target, torch.tensor([PROMPTS[0]]), assistant_model=draft, head=heads[name],
                               streamer=streamer, max_new_tokens=12, do_sample=True, return_dict_in_generate=True)
        assert streamer.ids == out.sequences[0].tolist() and streamer.ended
        assert out.sequences.shape[1] == len(PROMPTS[0]) + 12 or out.sequences[0, -1] == 2
    out = runtime.generate(target, torch.tensor([PROMPTS[0]]), assistant_model=draft, head=heads["stop"],
                           max_new_tokens=6, return_dict_in_generate=True, output_scores=True)
    assert len(out.scores) == out.sequences.shape[1] - len(PROMPTS[0])


# ---------------------------------------------------------------------------------------------------------------
# SPRINTER


@pytest.mark.parametrize("do_sample", [False, True])
def test_sprinter_accepting_everything_is_draft_only(models, heads, do_sample):
    draft, target = models
    decoding = HeadDecoding(heads["accept"], draft)
    for seed, prompt in enumerate(PROMPTS):
        kw = {"max_new_tokens": 20, "do_sample": do_sample, "top_k": 0}
        torch.manual_seed(seed)
        expected = draft.generate(torch.tensor([prompt]), **kw)[0, len(prompt):].tolist()
        torch.manual_seed(seed)
        with count_forwards(target) as target_calls:
            assert hf(target, decoding, prompt, **kw) == expected
        assert not target_calls


def test_sprinter_rejecting_everything_sends_every_token_through_the_target(models, heads):
    draft, target = models
    decoding = HeadDecoding(heads["reject"], draft)
    for prompt in PROMPTS:
        with count_forwards(target) as target_calls:
            tokens = hf(target, decoding, prompt, max_new_tokens=16, do_sample=False)
        assert tokens == target_greedy(target, prompt, 16)
        assert len(target_calls) == len(tokens)  # one target call per token, none skipped
        torch.manual_seed(0)
        with count_forwards(target) as target_calls:
            tokens = hf(target, decoding, prompt, max_new_tokens=16, do_sample=True)
        assert len(target_calls) == len(tokens)


def test_sprinter_greedy_matches_the_decoder(models, heads):
    """A verifier that accepts some tokens and rejects others: the decoder's SPRINTER tokens and target calls."""
    draft, target = models
    decoding = HeadDecoding(heads["mixed"], draft)
    policy = build_policy("sprinter", head=heads["mixed"])
    pair = ModelPair(draft, target, eos_token_ids=[target.generation_config.eos_token_id],
                     sampling=Sampling(temperature=0.0, max_new_tokens=24))
    skipped = 0
    for prompt in PROMPTS:
        with count_forwards(target) as target_calls:
            tokens = hf(target, decoding, prompt, max_new_tokens=24, do_sample=False)
        ours = policy.generate(pair, prompt, torch.Generator().manual_seed(0))
        assert tokens == ours.tokens and len(target_calls) == ours.stats.target_calls
        skipped += len(tokens) - len(target_calls)
    assert skipped > 0  # some tokens were kept without the target


# ---------------------------------------------------------------------------------------------------------------
# the exported folder


def test_export_hf_folder(models, heads, tmp_path):
    out = tmp_path / "stop_folder"
    export_hf.main([str(heads["stop_scores"]), str(out)])
    code = out / "custom_generate"
    assert (out / "stop_scores.safetensors").read_bytes() == heads["stop_scores"].read_bytes()
    readme = (out / "README.md").read_text()
    assert f'custom_generate="{out}", trust_remote_code=True' in readme and "test/head/auroc | 0.75" in readme
    assert "SpecDec++" in readme and "h = 0.6" in readme
    files = {p.name for p in code.iterdir()}
    assert {"generate.py", "bundled_head.py", "rules.py", "resnet.py", "exported.py", "label_math.py"} <= files
    for path in code.glob("*.py"):
        assert export_hf._project_imports(path.read_text(), str(path)) == []  # nothing of the project is imported
    assert (code / "generate.py").read_text() == export_hf.flatten(Path(runtime.__file__).read_text())
    assert "SAVED = None" in (code / "bundled_costs.py").read_text()  # no timing: the head's h runs


def test_export_hf_folder_with_a_timing_file_carries_its_costs(heads, tmp_path):
    from test_eval_latency import timing_file

    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps(timing_file()))
    out = export_hf.write_folder(heads["stop"], tmp_path / "goodput", timing)
    carried = {}
    exec((out / "custom_generate" / "bundled_costs.py").read_text(), carried)
    costs = read_timing(timing)
    bundled = CostModel.from_dict(json.loads(carried["SAVED"]))
    assert bundled.draft == costs.draft and bundled.catch_up == costs.catch_up
    assert bundled.verify_table(runtime.MAX_K + 1).tolist() == costs.verify_table(runtime.MAX_K + 1).tolist()
    assert carried["RATE"] == "online" and bundled.device is None  # a file that names no device
    readme = (out / "README.md").read_text()
    assert "## The goodput stop" in readme and "an unnamed device" in readme and "`online`" in readme
    fixed = export_hf.write_folder(heads["stop"], tmp_path / "fixed", timing, rate=7.5)
    carried = {}
    exec((fixed / "custom_generate" / "bundled_costs.py").read_text(), carried)
    assert carried["RATE"] == 7.5 and "7.5 tokens/s" in (fixed / "README.md").read_text()
    for bad in (-1.0, float("inf")):
        with pytest.raises(export_hf.ExportError, match="--rate must be"):
            export_hf.write_folder(heads["stop"], tmp_path / "bad", timing, rate=bad)
    with pytest.raises(SystemExit):  # λ without costs to price rounds by: one line
        export_hf.main([str(heads["stop"]), str(tmp_path / "untimed"), "--rate", "5"])
    with pytest.raises(export_hf.ExportError, match="--timing is for a stop head"):
        export_hf.write_folder(heads["reject"], tmp_path / "verifier", timing)
    assert "SAVED = None" in (out / "custom_generate" / "bundled_calibration.py").read_text()  # the head's estimates


def test_export_hf_folder_with_a_calibration_carries_it(heads, tmp_path):
    """``--calibration`` (with ``--timing``) bundles the calibrated confidence the folder's goodput stop reads."""
    from test_eval_latency import timing_file

    (tmp_path / "timing.json").write_text(json.dumps(timing_file()))
    CALIBRATION.save(tmp_path / "calibration.json")
    export_hf.main([str(heads["stop"]), str(tmp_path / "goodput"), "--timing", str(tmp_path / "timing.json"),
                    "--calibration", str(tmp_path / "calibration.json")])
    carried = {}
    exec((tmp_path / "goodput" / "custom_generate" / "bundled_calibration.py").read_text(), carried)
    assert carried["SAVED"] == CALIBRATION.to_dict()
    assert (tmp_path / "goodput" / "custom_generate" / "estimates.py").exists()
    with pytest.raises(export_hf.ExportError, match="give both"):
        export_hf.write_folder(heads["stop"], tmp_path / "untimed", calibration=tmp_path / "calibration.json")


def test_exported_folder_runs_without_the_project(models, heads, tiny_pair, tmp_path):
    """``custom_generate=<folder>`` with ``trust_remote_code=True``, in a Python that cannot import this project:
    the stop head gives target greedy tokens, the always-rejecting verifier too, the always-accepting one the
    draft's; sampling runs."""
    draft_dir, target_dir = tiny_pair
    folders = {}
    for name in ("stop", "reject", "accept"):
        folders[name] = str(export_hf.write_folder(heads[name], tmp_path / f"hf_{name}"))
    from test_eval_latency import timing_file
    (tmp_path / "timing.json").write_text(json.dumps(timing_file()))
    # a fixed λ (target-only's, HeadDecoding's default), so that the draft forwards below do not depend on the clock
    fixed = read_timing(tmp_path / "timing.json").target_only_rate()
    folders["goodput"] = str(export_hf.write_folder(heads["stop"], tmp_path / "hf_goodput", tmp_path / "timing.json",
                                                    rate=fixed))
    CALIBRATION.save(tmp_path / "calibration.json")
    folders["calibrated"] = str(export_hf.write_folder(heads["stop"], tmp_path / "hf_calibrated",
                                                       tmp_path / "timing.json", tmp_path / "calibration.json", fixed))
    for folder in folders.values():  # portable Python only where the folder loads: no Unix-only module at the top
        for module in Path(folder, "custom_generate").glob("*.py"):
            assert not re.search(r"^(import|from) (fcntl|termios|pwd|grp)\b", module.read_text(), re.M), module
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import importlib.util, json, sys
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__
                            and "editable" not in str(getattr(f, "__module__", ""))]
        blocked = [m for m in ("core", "heads", "data_gen", "evaluation", "pipeline") if importlib.util.find_spec(m)]
        import torch
        from transformers import AutoModelForCausalLM
        draft = AutoModelForCausalLM.from_pretrained({str(draft_dir)!r})
        target = AutoModelForCausalLM.from_pretrained({str(target_dir)!r})
        ids = torch.tensor([{PROMPTS[0]}])
        out = {{"importable": blocked, "draft_forwards": {{}}}}
        forward, calls = draft.forward, []
        draft.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
        for name, folder in {folders!r}.items():
            calls.clear()
            out[name] = target.generate(ids, assistant_model=draft, custom_generate=folder, trust_remote_code=True,
                                        max_new_tokens=12, do_sample=False)[0].tolist()
            out["draft_forwards"][name] = len(calls)
        draft.forward = forward
        torch.manual_seed(0)
        out["sampled"] = target.generate(ids, assistant_model=draft, custom_generate={folders["stop"]!r},
                                         trust_remote_code=True, max_new_tokens=12, do_sample=True,
                                         top_p=0.9)[0].tolist()
        out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in ("heads", "data_gen", "evaluation"))
        print(json.dumps(out))
    """))
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-I", str(script)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["importable"] == [] and out["loaded"] == []
    draft, target = models
    prompt = PROMPTS[0]
    expected = prompt + target_greedy(target, prompt, 12)
    assert out["stop"] == expected and out["reject"] == expected and out["goodput"] == expected
    assert out["calibrated"] == expected
    costs = read_timing(tmp_path / "timing.json")
    in_process = {name: draft_forwards(draft, lambda: target.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, custom_generate=HeadDecoding(
            None if name == "calibrated" else heads["stop"], draft, costs=costs,
            calibration=CALIBRATION if name == "calibrated" else None))) for name in ("goodput", "calibrated")}
    assert {name: out["draft_forwards"][name] for name in in_process} == in_process  # each ran its own estimates
    assert in_process["goodput"] != in_process["calibrated"]
    assert out["accept"] == draft.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0].tolist()
    assert len(out["sampled"]) == len(prompt) + 12 or out["sampled"][-1] == 2


def test_an_online_rate_follows_the_generations_tokens_over_its_seconds(models, heads, monkeypatch):
    """``rate="online"``: the goodput stop starts at target-only's λ and, before each later round, takes the tokens
    generated so far over the seconds taken so far (a fake clock, 0.25 s a reading); greedy output stays target
    greedy. A fixed rate never moves."""
    from decoding.costs import CostModel

    draft, target = models
    costs = CostModel.by_length(draft=0.05, verify=lambda m: 0.2 + 0.02 * m)
    clock = iter(np.arange(10_000) * 0.25)
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: float(next(clock)))
    seen = []  # (λ the round runs at, the sequence's length when it starts)
    get = HeadCandidateGenerator.get_candidates

    def recording(self, input_ids, **kw):
        out = get(self, input_ids, **kw)
        seen.append((self.rule.stop.rate, input_ids.shape[-1]))
        return out

    monkeypatch.setattr(HeadCandidateGenerator, "get_candidates", recording)
    prompt = PROMPTS[0]
    tokens = hf(target, HeadDecoding(None, draft, calibration=CALIBRATION, costs=costs, rate="online"), prompt,
                max_new_tokens=16, do_sample=False)
    assert tokens == target_greedy(target, prompt, 16)
    assert len(seen) > 2 and seen[0] == (pytest.approx(1 / 0.22), len(prompt))
    for i, (rate, length) in enumerate(seen[1:], start=1):  # the clock read once at the start and once a round
        assert rate == pytest.approx((length - len(prompt)) / (0.25 * i))
    seen.clear()
    hf(target, HeadDecoding(None, draft, calibration=CALIBRATION, costs=costs, rate=3.0), prompt, max_new_tokens=16,
       do_sample=False)
    assert {rate for rate, _ in seen} == {3.0}
    with pytest.raises(ValueError, match='rate="online" follows the goodput stop'):
        HeadDecoding(heads["stop"], draft, rate="online")


def draft_forwards(draft, run) -> int:
    """How many forwards of ``draft`` ``run()`` makes."""
    forward, calls = draft.forward, []
    draft.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    try:
        run()
    finally:
        del draft.forward
    return len(calls)


# ---------------------------------------------------------------------------------------------------------------
# one clear error each


def test_a_head_for_another_draft_is_refused(models, heads, tiny_pair, tmp_path):
    draft, target = models
    # the tiny target: the same config as the draft, other weights
    other = _identity(tiny_pair[1])
    assert (tiny_pair[0] / "config.json").read_bytes() == (tiny_pair[1] / "config.json").read_bytes()
    path = _export(tmp_path / "other.safetensors", ResNetHead(hidden_size=32, depth=1), "stop", 0.5, other)
    with pytest.raises(HeadFileError, match=rf"trained for draft 'target' \(weights {other['weights']}\)"):
        HeadDecoding(path, draft)
    path = _export(tmp_path / "small.safetensors", ResNetHead(hidden_size=16, depth=1), "stop", 0.5,
                   _identity(tiny_pair[0]))
    with pytest.raises(HeadFileError, match="head expects hidden size 16, the draft has 32"):
        HeadDecoding(path, draft)
    path = _export(tmp_path / "vocab.safetensors", ResNetHead(hidden_size=32, depth=1), "stop", 0.5,
                   _identity(tiny_pair[0]), vocab_size=64)
    with pytest.raises(HeadFileError, match="vocabulary of 64 tokens, the draft has 57"):
        HeadDecoding(path, draft)


def test_a_tampered_head_file_is_refused(models, heads, tmp_path):
    draft, _ = models
    data = bytearray(heads["stop"].read_bytes())
    weights = tmp_path / "weights.safetensors"
    data[-3] ^= 0x40  # one bit of the last weight
    weights.write_bytes(bytes(data))
    with pytest.raises(HeadFileError, match="weights do not match the digest recorded at export"):
        HeadDecoding(weights, draft)
    header = tmp_path / "header.safetensors"
    header.write_bytes(heads["stop"].read_bytes()[:40])  # cut inside the header
    with pytest.raises(HeadFileError, match="not a readable safetensors file"):
        HeadDecoding(header, draft)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_beams": 2}, r"beam search \(num_beams=2\) is not supported"),
    ({"batch": 2}, "batch size 2: speculative decoding with a head runs one sequence at a time"),
    ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences=2 is not supported"),
    ({"penalty_alpha": 0.6, "top_k": 4}, "contrastive search"),
    ({"head": "mixed", "output_scores": True, "return_dict_in_generate": True}, "SPRINTER keeps tokens the target"),
])
def test_unsupported_arguments_are_refused(models, heads, kwargs, match):
    draft, target = models
    kwargs = dict(kwargs)
    decoding = HeadDecoding(heads[kwargs.pop("head", "stop")], draft)
    ids = torch.tensor([PROMPTS[0]] * kwargs.pop("batch", 1))
    with pytest.raises(ValueError, match=match):
        target.generate(ids, custom_generate=decoding, max_new_tokens=4, **kwargs)


def test_the_folder_entry_needs_the_draft_and_a_prev_verifier(models, heads, tiny_pair, tmp_path):
    draft, target = models
    with pytest.raises(ValueError, match="needs the draft it was trained on"):
        runtime.generate(target, torch.tensor([PROMPTS[0]]), head=heads["stop"], max_new_tokens=4)
    with pytest.raises(ValueError, match="no head given"):
        runtime.generate(target, torch.tensor([PROMPTS[0]]), assistant_model=draft, max_new_tokens=4)
    own = _export(tmp_path / "own.safetensors", _verifier(32, 0.0), "verifier", 0.5, _identity(tiny_pair[0]))
    with pytest.raises(ValueError, match="runs SPRINTER with the paper's feature"):
        HeadDecoding(own, draft)
    with pytest.raises(ValueError, match="give a head, or a calibration"):
        HeadDecoding(None, draft)
    with pytest.raises(ValueError, match="give a head, or a calibration"):
        HeadDecoding(heads["stop"], draft, calibration=CALIBRATION)
    with pytest.raises(ValueError, match="a calibration runs the goodput stop: give its costs"):
        HeadDecoding(None, draft, calibration=CALIBRATION)


def test_a_folder_timed_on_another_device_warns_where_it_runs(models, heads, tmp_path, monkeypatch):
    """Its goodput stop prices rounds with the costs of the device it was timed on: one warning where it runs on
    another, none on the same device, none when the caller gives a threshold (no costs are read)."""
    import warnings

    from test_eval_latency import timing_file

    from core.device import describe_device

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    draft, target = models
    ids = torch.tensor([PROMPTS[0]])
    folders = {}
    for name, device in (("gpu", "NVIDIA H100 80GB HBM3"), ("here", describe_device("cpu"))):
        timing = tmp_path / f"timing-{name}.json"
        timing.write_text(json.dumps({**timing_file(), "device": device}))
        folders[name] = str(export_hf.write_folder(heads["stop"], tmp_path / name, timing))

    def run(folder, **kw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            target.generate(ids, assistant_model=draft, custom_generate=folder, trust_remote_code=True,
                            max_new_tokens=4, do_sample=False, **kw)
        return [str(w.message) for w in caught if "were timed on" in str(w.message)]

    warned = run(folders["gpu"])
    assert len(warned) == 1 and "NVIDIA H100 80GB HBM3" in warned[0] and "pass threshold=" in warned[0]
    assert run(folders["here"]) == []
    assert run(folders["gpu"], threshold=0.5) == []

"""Int8 drafts on the tiny pair: the quantization is told back from the modules, loads through a model entry, labels,
trains and decodes, leaves exact decoding exact, and is part of the identity a head checks."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from core import quantization as q
from core.errors import UserError
from core.models import ModelSpec, load_model


def tiny_model(path):
    return AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("name", list(q.QUANTIZATIONS))
def test_each_quantization_is_told_back_from_the_modules(tiny_pair, name):
    model = q.quantize(tiny_model(tiny_pair[0]), name)
    assert q.quantization_of(model) == name
    assert q.output_rows(model) == model.config.vocab_size
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 6]])).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", list(q.QUANTIZATIONS))
def test_the_plain_pytorch_snippet_quantizes_the_same_way(tiny_pair, name):
    """The line the exported folder's README gives users without this project."""
    scope = {"torch": torch, "draft": tiny_model(tiny_pair[0])}
    exec(q.QUANTIZATIONS[name].snippet(), scope)
    assert q.quantization_of(scope["draft"]) == name


def test_plain_and_hand_mixed_models(tiny_pair):
    model = tiny_model(tiny_pair[0])
    assert q.quantization_of(model) == q.NONE and q.quantize(model, q.NONE) is model
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

    mixed = quantize_dynamic(tiny_model(tiny_pair[0]), {"model.layers.0.mlp.up_proj": default_dynamic_qconfig},
                             dtype=torch.qint8)
    assert q.quantization_of(mixed) == "custom"


def test_bad_quantizations_are_one_clear_error(tiny_pair):
    with pytest.raises(UserError, match="unknown quantization 'int4'; choose one of none, int8-dynamic"):
        ModelSpec(path=str(tiny_pair[0]), quantization="int4")
    with pytest.raises(ValueError, match="CPU in float32 only"):
        q.quantize(tiny_model(tiny_pair[0]).to(torch.bfloat16), "int8-dynamic")


def test_a_model_entry_loads_quantized_in_float32(tiny_pair):
    spec = ModelSpec(path=str(tiny_pair[0]), quantization="int8-dynamic-per-channel")
    model, _, identity = load_model(spec, "bfloat16")
    assert identity["quantization"] == "int8-dynamic-per-channel" and identity["dtype"] == "float32"
    assert q.quantization_of(model) == "int8-dynamic-per-channel"
    assert identity["vocab_size"] == model.config.vocab_size


def test_greedy_sd_with_an_int8_draft_equals_the_target(tiny_pair):
    from core.sampling import Sampling
    from decoding.policies import build_policy
    from decoding.state import ModelPair

    draft = q.quantize(tiny_model(tiny_pair[0]), "int8-dynamic")
    pair = ModelPair(draft, tiny_model(tiny_pair[1]), eos_token_ids=[], sampling=Sampling(temperature=0.0,
                                                                                         max_new_tokens=16))
    for prompt in ([1, 10, 11, 12], [1, 30, 5]):
        reference = build_policy("target_only").generate(pair, prompt, torch.Generator().manual_seed(0)).tokens
        for policy in (build_policy("sd", k=4), build_policy("confidence")):
            assert policy.generate(pair, prompt, torch.Generator().manual_seed(0)).tokens == reference


def test_decode_numerics_compute_each_token_as_a_one_token_forward_does():
    """``DecodeScaledLinear`` over many tokens equals PyTorch's int8 Linear called once per token (a decode step), and
    over a shared group equals one call over that group (a prefill); one call over all tokens (what a batched
    forward computes) is far from both, so the comparison can fail."""
    torch.manual_seed(0)
    layer = q.quantize(torch.nn.Sequential(torch.nn.Linear(64, 48)), "int8-dynamic-per-channel")[0]
    x = torch.randn(2, 5, 64)
    x[0, 0, 3] = 80.0  # one large activation, as a prompt's first token has
    scaled = q.DecodeScaledLinear(layer)
    per_token = torch.stack([torch.cat([layer(x[b, t : t + 1]) for t in range(5)]) for b in range(2)])
    scale = per_token.abs().max()
    assert (scaled(x) - per_token).abs().max() < 1e-5 * scale
    assert (layer(x) - per_token).abs().max() > 1e-2 * scale

    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    with q.prompt_scales(torch.nn.Sequential(scaled), mask, 3):
        grouped = scaled(x)
    assert (grouped[0, :3] - layer(x[0, :3])).abs().max() < 1e-5 * scale  # row 0's prompt: tokens 0..2
    assert (grouped[1, 1:3] - layer(x[1, 1:3])).abs().max() < 1e-5 * scale  # row 1's: 1..2 (0 is padding)
    assert (grouped[:, 3:] - per_token[:, 3:]).abs().max() < 1e-5 * scale
    assert (grouped[1, 0] - per_token[1, 0]).abs().max() < 1e-5 * scale
    assert scaled.shared is None  # the groups last for the block only


@pytest.mark.parametrize("magnitude", [1e-7, 1e-3, 1.0, 1e3])
def test_decode_numerics_choose_the_kernels_scale_at_every_magnitude(magnitude):
    """Tiny ranges (PyTorch raises the scale to its floor), all-positive and all-negative tokens, a zero token."""
    torch.manual_seed(1)
    layer = q.quantize(torch.nn.Sequential(torch.nn.Linear(32, 16, bias=False)), "int8-dynamic-per-channel")[0]
    x = torch.randn(6, 32) * magnitude
    x[1], x[2], x[3] = x[1].abs(), -x[2].abs(), 0.0
    expected = torch.cat([layer(x[t : t + 1]) for t in range(6)])
    got = q.DecodeScaledLinear(layer)(x)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_int8_labels_do_not_depend_on_the_batch(tiny_pair):
    """A prompt's draft-side columns are the same labeled alone or beside another prompt, with the decoder's numerics;
    with PyTorch's int8 kernels over the whole batch they are not."""
    from core.adapter import HFCausalLM
    from core.sampling import Sampling
    from data_gen.labeler import Labeler, Prompt

    target = HFCausalLM(tiny_model(tiny_pair[1]))
    one = Prompt(0, [1, 10, 11, 12, 13], "target")
    other = Prompt(1, [1, 20] + [7] * 12, "target")  # longer, so ``one`` is left-padded beside it

    def labels(draft, prompts):
        labeler = Labeler(HFCausalLM(draft), target, Sampling(max_new_tokens=6), seed=0, eos_token_ids=[],
                          pad_token_id=0)
        rows = labeler.label(prompts, torch.device("cpu"))
        keep = rows["prompt_id"] == 0
        return {c: rows[c][keep] for c in ("logp_draft", "read_logp_draft", "hidden", "hidden_layers")}

    def gap(draft):
        alone, beside = labels(draft, [one]), labels(draft, [one, other])
        return max((alone[c].float() - beside[c].float()).abs().max().item() for c in alone)

    int8 = q.quantize(tiny_model(tiny_pair[0]), "int8-dynamic-per-channel")
    assert gap(int8) > 1e-2
    assert gap(q.decode_numerics(int8)) < 2e-3
    assert q.quantization_of(int8) == "int8-dynamic-per-channel"  # still told back after the swap


def test_labels_train_and_decode_with_an_int8_draft(label_config, tiny_pair, tmp_path):
    """The quantized draft labels (its identity in the manifest), a head trains on those labels and carries it,
    loads against the same quantized draft, and refuses the float draft with one line (and the reverse)."""
    from core.shards import read_manifest
    from data_gen.run import run_labels
    from decoding.policies import build_policy
    from decoding.state import ModelPair
    from heads.export import HeadFileError
    from heads.exported import ExportedHead
    from pipeline import train_all

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    cfg.draft.quantization = "int8-dynamic-per-channel"
    run_labels(cfg, quiet=True)
    manifest = read_manifest(cfg.output_dir)
    assert manifest["models"]["draft"]["quantization"] == "int8-dynamic-per-channel"
    from data_gen import audit

    plain = audit.audit(cfg.output_dir, rows=20, quiet=True)  # batched labels = unbatched reads, same numerics
    assert plain["ok"], {c: r["worst_diff"] for c, r in plain["columns"].items() if not r["ok"]}
    assert manifest["models"]["target"]["quantization"] == "none"
    results = train_all.main(["--labels", str(cfg.output_dir), "--out", str(tmp_path / "train"), "--checkpoints",
                              str(tmp_path / "ckpt"), "--heads_dir", str(tmp_path / "heads"), "--max_epochs", "1",
                              "--quiet"])
    stop = next(r.export for r in results if "specdecpp" in r.name)
    head = ExportedHead(stop)
    assert head.meta["draft"]["quantization"] == "int8-dynamic-per-channel"

    draft, _, _ = load_model(cfg.draft)
    head.check(draft)
    from core.sampling import Sampling

    pair = ModelPair(draft, tiny_model(tiny_pair[1]), eos_token_ids=[], sampling=Sampling(max_new_tokens=8))
    result = build_policy("specdecpp", head=stop).generate(pair, [1, 10, 11], torch.Generator().manual_seed(0))
    assert len(result.tokens) == 8

    with pytest.raises(HeadFileError, match="features of the 'int8-dynamic-per-channel' draft, this draft is 'none'"):
        head.check(tiny_model(tiny_pair[0]))
    float_head = ExportedHead(stop)
    float_head.meta["draft"]["quantization"] = "none"
    with pytest.raises(HeadFileError, match="features of the 'none' draft, this draft is 'int8-dynamic-per-channel'"):
        float_head.check(draft)


def test_bench_timing_times_each_precision(tmp_path):
    import json

    from decoding.costs import CostModel
    from evaluation import bench_timing

    out = tmp_path / "timing.json"
    bench_timing.main(["--model", "draft=tiny", "--model", "target=tiny", "--prefill", "4", "--cache", "4",
                       "--verify", "2", "--repeats", "1", "--device", "cpu", "--out", str(out),
                       "--precision", "float32", "int8-dynamic-per-channel"])
    result = json.loads(out.read_text())
    assert [(m["name"], m["precision"]) for m in result["models"]] == [
        ("draft", "float32"), ("draft", "int8-dynamic-per-channel"),
        ("target", "float32"), ("target", "int8-dynamic-per-channel")]
    fit = CostModel.from_timing(result, "draft@int8-dynamic-per-channel", "target@float32")
    # t_draft is the draft's step plus the target's per-token verify slope (evaluation.latency)
    target = result["models"][2]
    slope = max(0.0, target["verify"]["median_s"] - target["decode"]["4"]["median_s"])
    assert fit.t_draft == pytest.approx(result["models"][1]["decode"]["4"]["median_s"] + slope)
    with pytest.raises(KeyError, match="no model 'draft@bfloat16'"):
        CostModel.from_timing(result, "draft@bfloat16")


def test_bench_precision_reads_each_draft_precision_on_the_same_positions(tiny_pair, tmp_path):
    import yaml

    from evaluation import bench_precision

    config = tmp_path / "pair.yaml"
    config.write_text(yaml.safe_dump({"draft": {"path": str(tiny_pair[0])}, "target": {"path": str(tiny_pair[1])}}))
    result = bench_precision.main(["--config", str(config), "--prompts", "2", "--positions", "4", "--cache", "4",
                                   "--verify", "2", "--prefill", "4", "--repeats", "1", "--out",
                                   str(tmp_path / "p.json"), "--precision", "float32", "int8-dynamic"])
    assert [d["precision"] for d in result["drafts"]] == ["float32", "int8-dynamic"]
    assert result["positions"] == 8
    for d in result["drafts"]:
        assert 0 < d["acceptance"] < 1  # the tiny draft is a perturbed copy of the target
    # the quantized draft's distributions differ from the float draft's, but not by much
    assert result["drafts"][0]["acceptance"] != result["drafts"][1]["acceptance"]
    assert abs(result["drafts"][0]["acceptance"] - result["drafts"][1]["acceptance"]) < 0.1

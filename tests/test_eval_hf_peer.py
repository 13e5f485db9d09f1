"""The HF peer on the tiny pair: greedy assisted generation equals plain greedy, counts and settings restored."""

from __future__ import annotations

import torch

from core.models import ModelSpec, load_model, resolve
from core.models import eos_token_ids
from core.sampling import Sampling
from evaluation.hf_peer import hf_generate, peer_settings


def test_hf_peer_greedy_matches_target_and_restores_config(tiny_pair):
    draft, tok, _ = load_model(ModelSpec(path=str(tiny_pair[0])))
    target, _, _ = load_model(ModelSpec(path=str(tiny_pair[1])))
    eos = eos_token_ids(target, tok)
    ids = tok("def f ( x ) : return x")["input_ids"]
    before = draft.generation_config.to_dict()
    tokens, stats = hf_generate(draft, target, ids, Sampling(temperature=0, max_new_tokens=8), eos, 0,
                                peer_settings(3, "k"))
    assert draft.generation_config.to_dict() == before
    plain = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    assert tokens == plain[0, len(ids):].tolist()
    assert stats["new_tokens"] == len(tokens) and 0 < stats["target_calls"] <= len(tokens) + 1
    assert stats["draft_calls"] > 0 and stats["discarded"] is None


def test_generate_runs_on_weights_as_from_pretrained_leaves_them(tiny_pair):
    """Our loader freezes a model's weights; ``generate()`` runs on them as its users' models hold them (requiring
    grad: torch picks other CPU kernels for frozen ones), records nothing, and leaves them frozen after, an
    interrupted call too."""
    from core.models import weights_as_loaded

    draft, tok, _ = load_model(ModelSpec(path=str(tiny_pair[0])))
    target, _, _ = load_model(ModelSpec(path=str(tiny_pair[1])))
    seen = []
    target.lm_head.register_forward_hook(
        lambda module, args, out: seen.append((module.weight.requires_grad, out.requires_grad)))
    ids = tok("def f ( x ) : return x")["input_ids"]
    hf_generate(draft, target, ids, Sampling(temperature=0, max_new_tokens=4), eos_token_ids(target, tok), 0,
                assisted=False)
    assert seen and all(weight and not recorded for weight, recorded in seen)
    assert not any(p.requires_grad for m in (draft, target) for p in m.parameters())
    try:
        with weights_as_loaded(draft, target):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert not any(p.requires_grad for m in (draft, target) for p in m.parameters())


def test_target_only_and_head_peers_are_the_targets_greedy_tokens(tiny_pair, tmp_path):
    """``hf_target_only`` runs the target alone; ``hf_specdecpp`` runs a stop head inside ``generate()`` (exact:
    under greedy decoding, the target's greedy tokens), with the draft's forwards counted."""
    from heads.export import export_head
    from heads.resnet import ResNetHead
    from decoding.runtimes.hf import HeadDecoding

    draft, tok, _ = load_model(ModelSpec(path=str(tiny_pair[0])))
    target, _, _ = load_model(ModelSpec(path=str(tiny_pair[1])))
    eos = eos_token_ids(target, tok)
    ids = tok("def f ( x ) : return x")["input_ids"]
    greedy = Sampling(temperature=0, max_new_tokens=8)
    plain, stats = hf_generate(draft, target, ids, greedy, eos, 0, assisted=False)
    assert stats["draft_calls"] == 0 and stats["target_calls"] == len(plain)
    identity = {"name": tiny_pair[0].name, **resolve(ModelSpec(path=str(tiny_pair[0])))[1]}
    head = export_head(ResNetHead(hidden_size=draft.config.hidden_size, depth=1), tmp_path / "stop.safetensors",
                       draft=identity, vocab_size=draft.config.vocab_size, label={"kind": "test"}, role="stop",
                       threshold={"name": "h", "value": 0.5, "rule": "test"}, metrics={}, position="own")
    tokens, stats = hf_generate(draft, target, ids, greedy, eos, 0, custom_generate=HeadDecoding(head, draft))
    assert tokens == plain and stats["draft_calls"] > 0 and 0 < stats["target_calls"] <= len(tokens) + 1


def test_a_goodput_peer_on_a_calibration_is_exact_and_runs_at_our_lambda(tiny_pair, prompt_file, tmp_path):
    """An eval config with ``hf_peer.goodput: [calibration.json]`` and ``hf_peer.timing`` runs the goodput stop on the
    draft's calibrated confidence inside ``generate()`` (``hf_goodput``), at the λ of our decoder's goodput run of
    the same calibration; under greedy decoding its tokens are the target's own greedy ones."""
    from test_eval_run import goodput_inputs

    from evaluation.__main__ import main as eval_main
    from evaluation.results import ResultStore
    from testing.tiny import write_eval_config

    calibration, timing = goodput_inputs(tmp_path)  # target-only's rate 1 / verify(1) there: 2 tokens/s
    out = tmp_path / "eval"
    config = write_eval_config(
        tmp_path / "eval.yaml", *tiny_pair, prompt_file, out, limit=3, modes=[{"name": "greedy", "temperature": 0.0}],
        policies=[{"family": "target_only"},
                  {"family": "goodput", "fixed": {"calibration": calibration, "timing": timing}, "grid": {"lam": [3]}}],
        max_new_tokens=10, loglik=False, dtype="float32",
        hf_peer={"defaults": False, "confidence_thresholds": [], "same_k_as_sd": False, "target_only": True,
                 "goodput": [calibration], "timing": timing})
    assert eval_main(["--config", str(config)]) == 0
    runs: dict[str, dict[int, dict]] = {}
    for r in ResultStore(out / "results.jsonl").records():
        runs.setdefault(r["run"], {})[r["prompt"]] = r
    peer = runs.pop(f"hf_goodput[calibration={calibration},lam=3]")
    assert {r["params"]["lam"] for r in peer.values()} == {3.0}
    for prompt, record in peer.items():
        assert record["tokens"] == runs["hf_target_only"][prompt]["tokens"] == runs["target_only"][prompt]["tokens"]
        assert record["stats"]["draft_calls"] > 0  # it drafted: the draft's rounds, verified by the target
    assert "hf_goodput" in (out / "report.md").read_text()

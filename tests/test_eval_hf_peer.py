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

"""The HF peer on the tiny pair: greedy assisted generation equals plain greedy, counts and settings restored."""

from __future__ import annotations

import torch

from core.models import ModelSpec, load_model
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

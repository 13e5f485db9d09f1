"""Decoder traces: the replay of a target-sampled response holds exactly what the simulator needs, computed as
plain forwards would; stored per prompt with the digest of its tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from evaluation.likelihood import tokens_sha256
from evaluation.rundir import RunDir
from evaluation.traces import read_recorded, record_trace, trace_digest, write_trace


@pytest.fixture(scope="module")
def models(tiny_pair):
    return tuple(AutoModelForCausalLM.from_pretrained(d).eval() for d in tiny_pair)


@torch.no_grad()
def plain(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden state and log-probs after ``ids``: one uncached forward."""
    out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0, -1], torch.log_softmax(out.logits[0, -1].float(), -1)


def test_a_decoder_trace_equals_plain_forwards_at_every_position(models):
    draft, target = models
    prompt, tokens = [3, 8, 1, 9], [4, 4, 17, 2, 30, 6]
    trace = record_trace(draft, target, prompt, tokens, torch.Generator().manual_seed(0), prompt_id=7)
    assert len(trace) == len(tokens) and trace.prompt_id == 7
    for i in range(len(tokens)):
        prefix = prompt + tokens[:i]
        h_prev, logq = plain(draft, prefix)
        _, logp = plain(target, prefix)
        y = int(trace.candidate[i])
        assert trace.logp_draft[i] == pytest.approx(float(logq[y]), abs=1e-5)
        assert trace.acceptance[i] == pytest.approx(float(torch.exp((logp[y] - logq[y]).clamp(max=0))), abs=1e-5)
        assert trace.entropy_draft[i] == pytest.approx(float(-(logq.exp() * logq).sum()), abs=1e-5)
        torch.testing.assert_close(trace.hidden_prev[i], h_prev, atol=1e-4, rtol=1e-4)
        h_own, _ = plain(draft, prefix + [y])
        torch.testing.assert_close(trace.hidden[i], h_own, atol=1e-4, rtol=1e-4)
    # the candidates are draws from q, not the response's tokens: they differ somewhere on a random tiny pair
    again = record_trace(draft, target, prompt, tokens, torch.Generator().manual_seed(1), prompt_id=7)
    assert not np.array_equal(again.candidate, trace.candidate)


def test_traces_round_trip_with_the_digest_of_their_tokens(models, tmp_path):
    draft, target = models
    tokens = [4, 4, 17]
    trace = record_trace(draft, target, [3, 8], tokens, torch.Generator().manual_seed(0), prompt_id=2)
    path = RunDir(tmp_path).trace("sample", 2)
    assert trace_digest(path) is None
    write_trace(path, trace, tokens_sha256(tokens))
    assert trace_digest(path) == tokens_sha256(tokens) != tokens_sha256([4, 4, 18])
    (back,) = read_recorded(tmp_path, "sample")
    assert back.prompt_id == 2 and np.array_equal(back.acceptance, trace.acceptance)
    assert np.array_equal(back.candidate, trace.candidate)
    assert torch.equal(back.hidden, trace.hidden) and torch.equal(back.hidden_prev, trace.hidden_prev)

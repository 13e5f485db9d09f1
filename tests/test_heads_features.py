"""Draft scores a head reads beside the hidden state: one definition for the labels and the decoder."""

from __future__ import annotations

import math

import pytest
import torch

from heads import build_head
from heads.features import FROM_LOGPROBS, LOGP_FLOOR, SCORES, check_scores, draft_scores, scores_from_logprobs
from pipeline.module import HeadModule


def test_scores_from_columns():
    logp = torch.tensor([math.log(0.5), -50.0])
    entropy = torch.tensor([0.7, 2.0])
    out = draft_scores(["entropy_draft", "p_draft", "logp_draft"], logp, entropy)
    assert out.shape == (2, 3)
    assert torch.allclose(out[0], torch.tensor([0.7, 0.5, math.log(0.5)]))
    assert out[1, 2] == LOGP_FLOOR and out[1, 1] == pytest.approx(math.exp(LOGP_FLOOR))
    assert draft_scores([], logp, entropy).shape == (2, 0)


def test_runtime_scores_equal_the_label_columns():
    """What the decoder computes from the draft's log-probs is what the labels store (log q(y), H(q), the top-2
    margin); the scores it cannot compute from them are refused by name."""
    probs = torch.tensor([0.5, 0.25, 0.25, 0.0])
    logprobs = probs.log()
    out = scores_from_logprobs(list(FROM_LOGPROBS), logprobs, token=1)
    entropy = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert torch.allclose(out, torch.tensor([0.25, math.log(0.25), entropy, 0.25]))
    with pytest.raises(ValueError, match="stale_top1_target"):
        scores_from_logprobs(list(SCORES), logprobs, token=1)


def test_unknown_or_repeated_scores_are_refused():
    with pytest.raises(ValueError, match="known: p_draft, logp_draft, entropy_draft"):
        check_scores(["p_target"])
    with pytest.raises(ValueError, match="repeat"):
        build_head("sprinter", hidden_size=4, scores=["p_draft", "p_draft"])


@pytest.mark.parametrize("name", ["sprinter", "resnet"])
def test_score_term_adds_to_the_hidden_logit(name):
    torch.manual_seed(0)
    plain = build_head(name, hidden_size=8)
    head = build_head(name, hidden_size=8, scores=["p_draft", "entropy_draft"])
    head.load_state_dict({**plain.state_dict(), "score_term.linear.weight": torch.tensor([[2.0, -1.0]])})
    x, s = torch.randn(5, 8), torch.rand(5, 2)
    assert torch.allclose(head(x, s), plain(x) + 2 * s[:, 0] - s[:, 1])
    with pytest.raises(ValueError, match="reads the draft scores"):
        head(x)


def test_score_weights_get_their_own_learning_rate_and_no_weight_decay():
    head = build_head("resnet", hidden_size=8, depth=1, scores=["logp_draft"])
    opt = HeadModule(head, lr=1e-3, weight_decay=0.5, scores_lr=0.03).configure_optimizers()
    hidden_group, score_group = opt.param_groups
    assert (hidden_group["lr"], hidden_group["weight_decay"]) == (1e-3, 0.5)
    assert (score_group["lr"], score_group["weight_decay"]) == (0.03, 0.0)
    assert score_group["params"] == [head.score_term.linear.weight]
    assert len(HeadModule(build_head("sprinter", hidden_size=8)).configure_optimizers().param_groups) == 1

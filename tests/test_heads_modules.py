"""Heads: registry, shapes, golden values with fixed weights, identity init, no shared weights."""

from __future__ import annotations

import math

import pytest
import torch

from heads import HEADS, build_head
from heads.resnet import ResNetHead
from heads.sprinter import SprinterHead


def silu(v: float) -> float:
    return v / (1 + math.exp(-v))


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_registered_head_builds_and_runs(name):
    head = build_head(name, hidden_size=16)
    out = head(torch.randn(5, 16))
    assert out.shape == (5,)
    assert torch.isfinite(out).all()
    assert head.head_type == name


def test_unknown_head_error_lists_known_names():
    with pytest.raises(ValueError, match="known: resnet, sprinter"):
        build_head("mlp", hidden_size=8)


def test_sprinter_has_d_plus_one_parameters():
    assert sum(p.numel() for p in SprinterHead(896).parameters()) == 897


def test_sprinter_golden_values():
    head = SprinterHead(4)
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[1.0, -2.0, 0.5, 0.0]]))
        head.linear.bias.fill_(0.25)
    x = torch.tensor([[1.0, 1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    logits = head(x)
    torch.testing.assert_close(logits, torch.tensor([0.25, 0.25]))  # 1 − 2 + 1 + 0 + 0.25
    torch.testing.assert_close(head.predict_proba(x), torch.full((2,), 1 / (1 + math.exp(-0.25))))


def test_sprinter_golden_values_with_seeded_init():
    torch.manual_seed(0)
    head = SprinterHead(3)
    w, b = head.linear.weight.detach()[0].tolist(), float(head.linear.bias)
    x = [0.5, -1.0, 2.0]
    expected = sum(wi * xi for wi, xi in zip(w, x)) + b
    assert float(head(torch.tensor(x))) == pytest.approx(expected, abs=1e-6)


def test_resnet_starts_as_identity_then_linear():
    torch.manual_seed(0)
    head = ResNetHead(8, depth=3)
    x = torch.randn(4, 8)
    torch.testing.assert_close(head(x), head.out(x).squeeze(-1))


def test_resnet_golden_values():
    head = ResNetHead(2, depth=2)
    with torch.no_grad():
        head.blocks[0].linear.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
        head.blocks[0].linear.bias.copy_(torch.tensor([0.0, 1.0]))
        head.blocks[1].linear.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        head.blocks[1].linear.bias.zero_()
        head.out.weight.copy_(torch.tensor([[1.0, 2.0]]))
        head.out.bias.fill_(-0.5)
    x0, x1 = 1.0, 2.0
    # block 0: x + SiLU(W0 x + b0)
    h0, h1 = x0 + silu(x0), x1 + silu(-x1 + 1.0)
    # block 1: x + SiLU(W1 x)
    g0, g1 = h0 + silu(h1), h1 + silu(h0)
    expected = g0 + 2 * g1 - 0.5
    assert float(head(torch.tensor([x0, x1]))) == pytest.approx(expected, rel=1e-6)


def test_resnet_blocks_have_their_own_weights():
    head = ResNetHead(4, depth=3)
    ids = {id(b.linear.weight) for b in head.blocks}
    assert len(ids) == 3
    assert sum(p.numel() for p in head.parameters()) == 3 * (16 + 4) + 5
    with torch.no_grad():
        head.blocks[0].linear.weight.fill_(1.0)
    assert head.blocks[1].linear.weight.abs().sum() == 0


@pytest.mark.parametrize("depth", [-1, 5])
def test_resnet_depth_range(depth):
    with pytest.raises(ValueError, match="depth"):
        ResNetHead(4, depth=depth)


def test_resnet_depth_zero_is_linear():
    head = ResNetHead(6, depth=0)
    assert sum(p.numel() for p in head.parameters()) == 7

"""Weighted BCE and binary KL against their formulas; metrics against scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from pipeline.loss import binary_kl, weighted_bce
from pipeline.metrics import SplitMetrics
from pipeline.train_all import youden_threshold


def sig(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_weighted_bce_equals_formula_on_hand_numbers():
    z = [0.0, 2.0, -1.0, 0.5]
    p = [1.0, 0.25, 0.0, 0.8]
    w_acc, w_rej = 1.0, 6.0
    expected = sum(-w_acc * pi * math.log(sig(zi)) - w_rej * (1 - pi) * math.log(1 - sig(zi)) for zi, pi in zip(z, p))
    got = weighted_bce(torch.tensor(z), torch.tensor(p), w_acc, w_rej)
    assert float(got) == pytest.approx(expected / 4, rel=1e-6)


def test_plain_bce_matches_torch():
    z, p = torch.randn(50), torch.rand(50)
    torch.testing.assert_close(weighted_bce(z, p), torch.nn.functional.binary_cross_entropy_with_logits(z, p))


def test_weighted_bce_is_stable_at_extreme_logits():
    z = torch.tensor([50.0, -50.0, 50.0, -50.0], requires_grad=True)  # P̂ = σ(z) ≈ 1 − 2e-22 and 2e-22
    p = torch.tensor([1.0, 0.0, 0.0, 1.0])
    loss = weighted_bce(z, p, 1.0, 3.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()
    # right answers: ≈0, ≈0, 3·50 (confidently wrong reject), 1·50 (confidently wrong accept)
    assert float(loss) == pytest.approx((0 + 0 + 3 * 50 + 50) / 4, rel=1e-6)
    torch.testing.assert_close(z.grad, torch.tensor([0.0, 0.0, 3.0, -1.0]) / 4)


def test_binary_kl_formula_and_zero_at_match():
    p, z = torch.tensor([0.3, 1.0, 0.0]), torch.tensor([0.4, -2.0, 50.0])
    q = [sig(v) for v in z.tolist()]
    expected = [0.3 * math.log(0.3 / q[0]) + 0.7 * math.log(0.7 / (1 - q[0])), -math.log(q[1]), 50.0]
    torch.testing.assert_close(binary_kl(p, z), torch.tensor(expected), rtol=1e-5, atol=1e-5)
    zz = torch.logit(torch.tensor([0.2, 0.7]))
    torch.testing.assert_close(binary_kl(torch.sigmoid(zz), zz), torch.zeros(2), atol=1e-6, rtol=0)


def test_metrics_agree_with_sklearn():
    g = torch.Generator().manual_seed(0)
    n = 300
    binary = (torch.rand(n, generator=g) < 0.4).float()
    probs = (0.3 * binary + 0.7 * torch.rand(n, generator=g)).clamp(0, 1)
    p_draft = torch.rand(n, generator=g)
    conf = torch.exp(-3 * torch.rand(n, generator=g))
    m = SplitMetrics()
    for sl in (slice(0, 100), slice(100, 250), slice(250, n)):  # several batches
        batch = {"binary": binary[sl], "p_draft": p_draft[sl], "conf_entropy": conf[sl]}
        m.update(batch, probs[sl], torch.zeros(sl.stop - sl.start), threshold=0.6)
    out = {k: float(v) for k, v in m.compute().items()}
    y = binary.numpy()
    assert out["head/auroc"] == pytest.approx(roc_auc_score(y, probs.numpy()), abs=1e-6)
    assert out["head/ap"] == pytest.approx(average_precision_score(y, probs.numpy()), abs=1e-6)
    assert out["p_draft/auroc"] == pytest.approx(roc_auc_score(y, p_draft.numpy()), abs=1e-6)
    assert out["conf_entropy/ap"] == pytest.approx(average_precision_score(y, conf.numpy()), abs=1e-6)
    pred = probs.numpy() >= 0.6
    assert out["head/eta_tp"] == pytest.approx(pred[y == 1].mean(), abs=1e-6)
    assert out["head/eta_fp"] == pytest.approx(pred[y == 0].mean(), abs=1e-6)


def test_youden_threshold_separates_perfectly_separable_scores():
    y = np.array([0, 0, 0, 1, 1])
    s = np.array([0.1, 0.2, 0.3, 0.7, 0.9])
    tau = youden_threshold(y, s)
    assert ((s >= tau) == y.astype(bool)).all()
    assert youden_threshold(np.ones(3), s[:3]) == 0.5

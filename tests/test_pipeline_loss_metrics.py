"""Weighted BCE and binary KL against their formulas; metrics against scikit-learn, torchmetrics and hand-computed
values (soft-label calibration, Theorem 1's rates)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score
from torchmetrics.classification import BinaryCalibrationError

from core import label_math as lm
from pipeline.loss import binary_kl, weighted_bce
from pipeline.metrics import CalibrationError, SplitMetrics
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
    ratio = torch.rand(n, generator=g) * 2
    m = SplitMetrics()
    for sl in (slice(0, 100), slice(100, 250), slice(250, n)):  # several batches
        batch = {"binary": binary[sl], "target": binary[sl], "ratio": ratio[sl], "p_draft": p_draft[sl],
                 "conf_entropy": conf[sl]}
        m.update(batch, torch.logit(probs[sl], eps=1e-6), threshold=0.6)
    out = {k: float(v) for k, v in m.compute().items()}
    y = binary.numpy()
    probs = torch.sigmoid(torch.logit(probs, eps=1e-6))  # what the metrics saw
    assert out["head/auroc"] == pytest.approx(roc_auc_score(y, probs.numpy()), abs=1e-6)
    assert out["head/ap"] == pytest.approx(average_precision_score(y, probs.numpy()), abs=1e-6)
    assert out["p_draft/auroc"] == pytest.approx(roc_auc_score(y, p_draft.numpy()), abs=1e-6)
    assert out["conf_entropy/ap"] == pytest.approx(average_precision_score(y, conf.numpy()), abs=1e-6)
    pred = probs.numpy() >= 0.6
    assert out["head/eta_tp"] == pytest.approx(pred[y == 1].mean(), abs=1e-6)
    assert out["head/eta_fp"] == pytest.approx(pred[y == 0].mean(), abs=1e-6)
    acceptable = ratio.numpy() <= 1
    assert out["head/eta_fp_thm"] == pytest.approx(pred[~acceptable].mean(), abs=1e-6)
    reference = BinaryCalibrationError(n_bins=15)
    reference.update(probs, binary.long())
    assert out["head/ece"] == pytest.approx(float(reference.compute()), abs=1e-6)


def test_calibration_error_is_torchmetrics_on_binary_labels_including_the_ends():
    g = torch.Generator().manual_seed(1)
    probs = torch.cat([torch.rand(500, generator=g), torch.tensor([0.0, 1.0, 1.0, 1 / 15])])
    binary = (torch.rand(len(probs), generator=g) < probs).long()
    ours, reference = CalibrationError(n_bins=15), BinaryCalibrationError(n_bins=15)
    for sl in (slice(0, 200), slice(200, None)):
        ours.update(probs[sl], binary[sl])
        reference.update(probs[sl], binary[sl])
    assert float(ours.compute()) == pytest.approx(float(reference.compute()), abs=1e-6)


SOFT_PROBS = [0.05, 0.50, 0.52, 0.95]  # bins (width 1/15): 0, 7, 7, 14
SOFT_TARGET = [0.25, 0.40, 0.90, 0.75]  # min(1, p/q) of four draft tokens


def test_calibration_error_against_a_soft_target_by_hand():
    m = CalibrationError(n_bins=15)
    m.update(torch.tensor(SOFT_PROBS), torch.tensor(SOFT_TARGET))
    # bin 0: |0.05 − 0.25|·1/4; bin 7: |0.51 − 0.65|·2/4; bin 14: |0.95 − 0.75|·1/4
    assert float(m.compute()) == pytest.approx(0.05 + 0.07 + 0.05, abs=1e-6)
    binarized = CalibrationError(n_bins=15)  # what 1[P > 0.5] would give: a much smaller, wrong number
    binarized.update(torch.tensor(SOFT_PROBS), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert float(binarized.compute()) == pytest.approx(0.0125 + 0.005 + 0.0125, abs=1e-6)


def test_split_metrics_of_a_soft_head_use_the_soft_target():
    probs, target = torch.tensor(SOFT_PROBS, dtype=torch.float64), torch.tensor(SOFT_TARGET, dtype=torch.float64)
    batch = {"target": target, "binary": (target > 0.5).double(), "ratio": 1 / target,
             "p_draft": probs, "conf_entropy": probs}
    m = SplitMetrics()
    m.update(batch, torch.logit(probs), threshold=0.5)
    out = {k: float(v) for k, v in m.compute().items()}
    assert out["head/ece"] == pytest.approx(0.17, abs=1e-6)
    kl = [t * math.log(t / q) + (1 - t) * math.log((1 - t) / (1 - q)) for t, q in zip(SOFT_TARGET, SOFT_PROBS)]
    assert out["head/kl"] == pytest.approx(sum(kl) / 4, rel=1e-6)


def test_theorem_rates_are_against_q_over_p_whatever_lambda():
    ratio = torch.tensor([0.5, 1.0, 1.3, 2.0, 0.8])  # q/p: acceptable (≤ 1) for rows 0, 1, 4
    binary = lm.sprinter_label(ratio, 1.5).float()  # λ = 1.5 also accepts row 2
    probs = torch.tensor([0.9, 0.2, 0.8, 0.3, 0.6])  # τ = 0.65: the head accepts rows 0 and 2
    batch = {"target": binary, "binary": binary, "ratio": ratio, "p_draft": probs, "conf_entropy": probs}
    m = SplitMetrics()
    m.update(batch, torch.logit(probs), threshold=0.65)
    out = {k: float(v) for k, v in m.compute().items()}
    assert out["head/eta_tp"] == pytest.approx(2 / 4) and out["head/eta_fp"] == pytest.approx(0 / 1)
    assert out["head/eta_tp_thm"] == pytest.approx(1 / 3) and out["head/eta_fp_thm"] == pytest.approx(1 / 2)
    # excess mass (1 − p/q)+ = 0, 0, 3/13, 1/2, 0: of it the head lets through row 2's → (3/13) / (3/13 + 1/2)
    assert out["head/eta_fp_thm_weighted"] == pytest.approx(6 / 19)


def test_weighted_eta_fp_makes_theorem_7_exact_for_a_token_dependent_head():
    """Two positions, rows sampled in proportion to q (4 per position); the head accepts the over-drafted token 0
    at position 1 and rejects everything else. Exact kept rate: position 1 keeps min-mass 3/4 plus the accepted
    excess 1/4 → 1; position 2 keeps 1/2 → mean 3/4. Mean TV = (1/4 + 1/2)/2 = 3/8."""
    q = [[1 / 2, 1 / 4, 1 / 4], [3 / 4, 1 / 4, 0.0]]
    p = [[1 / 4, 1 / 4, 1 / 2], [1 / 4, 1 / 2, 1 / 4]]
    rows = [(0, 0), (0, 0), (0, 1), (0, 2), (1, 0), (1, 0), (1, 0), (1, 1)]  # (position, token)
    ratio = torch.tensor([q[i][y] / p[i][y] for i, y in rows])
    probs = torch.tensor([0.9 if (i, y) == (0, 0) else 0.1 for i, y in rows])
    batch = {"target": (ratio <= 1).float(), "binary": (ratio <= 1).float(), "ratio": ratio, "p_draft": probs,
             "conf_entropy": probs}
    m = SplitMetrics()
    m.update(batch, torch.logit(probs), threshold=0.5)
    out = {k: float(v) for k, v in m.compute().items()}
    mean_tv = 3 / 8
    assert 1 - (1 - out["head/eta_fp_thm_weighted"]) * mean_tv == pytest.approx(3 / 4)
    assert 1 - (1 - out["head/eta_fp_thm"]) * mean_tv == pytest.approx(1 - 3 / 5 * 3 / 8)  # 2 of 5 rows: not exact


def test_youden_threshold_separates_perfectly_separable_scores():
    y = np.array([0, 0, 0, 1, 1])
    s = np.array([0.1, 0.2, 0.3, 0.7, 0.9])
    tau = youden_threshold(y, s)
    assert ((s >= tau) == y.astype(bool)).all()
    assert youden_threshold(np.ones(3), s[:3]) == 0.5

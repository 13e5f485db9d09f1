"""Per-split metrics of a head and of the training-free scores, on the same rows."""

from __future__ import annotations

import torch
from torch import nn
from torchmetrics import MeanMetric, Metric, MetricCollection
from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision

from pipeline.loss import binary_kl

BASELINES = {
    "p_draft": "draft probability of its own token (confidence rule)",
    "conf_entropy": "exp(−draft entropy) (SVIP)",
}
ECE_BINS = 15


class RatesAtThreshold(Metric):
    """η_TP = P(P̂ ≥ τ | positive) and η_FP = P(P̂ ≥ τ | negative); τ is given at update time."""

    full_state_update = False

    def __init__(self):
        super().__init__()
        for name in ("tp", "fn", "fp", "tn"):
            self.add_state(name, default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, probs: torch.Tensor, positive: torch.Tensor, threshold: float) -> None:
        pred, pos = probs >= threshold, positive.bool()
        self.tp += (pred & pos).sum()
        self.fn += (~pred & pos).sum()
        self.fp += (pred & ~pos).sum()
        self.tn += (~pred & ~pos).sum()

    def compute(self) -> dict[str, torch.Tensor]:
        return {
            "eta_tp": self.tp / (self.tp + self.fn).clamp_min(1),
            "eta_fp": self.fp / (self.fp + self.tn).clamp_min(1),
        }


class ExcessMassAcceptRate(Metric):
    """η_FP weighted by the excess mass: Σ 1[P̂ ≥ τ]·(1 − p/q)+ / Σ (1 − p/q)+ over the rows.

    Rows are draft samples y ~ q, so the weight (1 − p/q)+ = (q(y) − p(y))+ / q(y) makes this the share of the
    excess mass Σ_y (q − p)+ = TV(p, q) that the verifier lets through. Theorems 1 and 7 assume one acceptance
    rate on every token with q > p; a learned head's varies from token to token, and with this average
    1 − (1 − η_FP)·TV is still the exact expected rate of kept draft tokens on these rows' contexts.
    """

    full_state_update = False

    def __init__(self):
        super().__init__()
        for name in ("accepted_mass", "mass"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, probs: torch.Tensor, ratio: torch.Tensor, threshold: float) -> None:
        excess = (1 - 1 / ratio.double()).clamp_min(0)  # q/p = inf (p = 0): the whole token is excess
        self.accepted_mass += (excess * (probs >= threshold)).sum()
        self.mass += excess.sum()

    def compute(self) -> torch.Tensor:
        return (self.accepted_mass / self.mass if self.mass > 0 else torch.zeros((), dtype=torch.float64)).float()


class CalibrationError(Metric):
    """Expected calibration error against a target in [0, 1]: Σ_b (n_b / n)·|mean_b(P̂) − mean_b(target)|.

    The target is what the head is trained to predict: SpecDec++'s soft min(1, p/q) or SPRINTER's binary label.
    On a binary target this is torchmetrics' ``BinaryCalibrationError`` (L1), with its binning: ``n_bins``
    equal-width bins on [0, 1) and P̂ = 1 exactly in a bin of its own. Only per-bin sums are kept, so memory does
    not grow with the rows.
    """

    full_state_update = False

    def __init__(self, n_bins: int = ECE_BINS):
        super().__init__()
        self.n_bins = n_bins
        for name in ("count", "sum_probs", "sum_target"):
            self.add_state(name, default=torch.zeros(n_bins + 1, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, probs: torch.Tensor, target: torch.Tensor) -> None:
        probs = probs.detach()
        boundaries = torch.linspace(0, 1, self.n_bins + 1, dtype=probs.dtype, device=probs.device)
        bins = torch.bucketize(probs, boundaries, right=True) - 1
        self.count.index_add_(0, bins, torch.ones_like(probs, dtype=torch.float64))
        self.sum_probs.index_add_(0, bins, probs.double())
        self.sum_target.index_add_(0, bins, target.detach().double())

    def compute(self) -> torch.Tensor:
        gap = (self.sum_probs - self.sum_target).abs()  # n_b·|mean_b(P̂) − mean_b(target)|
        return (gap.sum() / self.count.sum().clamp_min(1)).float()


def ranking(thresholds: int | None = None) -> MetricCollection:
    return MetricCollection({"auroc": BinaryAUROC(thresholds=thresholds),
                             "ap": BinaryAveragePrecision(thresholds=thresholds)})


class SplitMetrics(nn.Module):
    """Every metric of one split, each against the label it means:

    - ranking (AUROC, AP) of the head and of the training-free scores: the binary label (``batch["binary"]``:
      1[q/p ≤ λ] for SPRINTER heads, 1[min(1, p/q) > 0.5] for soft heads);
    - calibration error and binary KL: the training target (``batch["target"]``: the soft min(1, p/q) of a
      SpecDec++ head, or the binary label), since P̂ estimates that target;
    - ``eta_tp``, ``eta_fp`` at the threshold τ: against the binary label;
    - ``eta_tp_thm`` = P(P̂ ≥ τ | q/p ≤ 1) and ``eta_fp_thm`` = P(P̂ ≥ τ | q/p > 1): SPRINTER Theorem 1's rates,
      whatever λ the head was trained at (``batch["ratio"]``); ``eta_fp_thm_weighted``: η_FP weighted by the
      excess mass (``ExcessMassAcceptRate``), the η_FP under which Theorem 7 holds for a token-dependent head.

    ``thresholds=None`` computes AUROC and AP exactly (every score kept until ``compute``); an integer bins the
    scores into that many thresholds (constant memory, used for the training split).
    """

    def __init__(self, thresholds: int | None = None):
        super().__init__()
        self.head = ranking(thresholds)
        self.ece = CalibrationError()
        self.kl = MeanMetric()
        self.rates = RatesAtThreshold()
        self.theorem_rates = RatesAtThreshold()
        self.eta_fp_weighted = ExcessMassAcceptRate()
        self.baselines = nn.ModuleDict({name: ranking(thresholds) for name in BASELINES})

    def update(self, batch: dict, logits: torch.Tensor, threshold: float) -> None:
        probs = torch.sigmoid(logits)
        binary = batch["binary"].long()
        self.head.update(probs, binary)
        self.ece.update(probs, batch["target"])
        self.kl.update(binary_kl(batch["target"], logits))
        self.rates.update(probs, binary, threshold)
        self.theorem_rates.update(probs, batch["ratio"] <= 1, threshold)  # Theorem 1: acceptable iff q/p ≤ 1
        self.eta_fp_weighted.update(probs, batch["ratio"], threshold)
        for name, m in self.baselines.items():
            m.update(batch[name], binary)

    def compute(self) -> dict[str, torch.Tensor]:
        out = {f"head/{k}": v for k, v in self.head.compute().items()}
        out["head/ece"] = self.ece.compute()
        out["head/kl"] = self.kl.compute()
        out.update({f"head/{k}": v for k, v in self.rates.compute().items()})
        out.update({f"head/{k}_thm": v for k, v in self.theorem_rates.compute().items()})
        out["head/eta_fp_thm_weighted"] = self.eta_fp_weighted.compute()
        for name, m in self.baselines.items():
            out.update({f"{name}/{k}": v for k, v in m.compute().items()})
        return out

    def reset(self) -> None:
        for m in (self.head, self.ece, self.kl, self.rates, self.theorem_rates, self.eta_fp_weighted,
                  *self.baselines.values()):
            m.reset()

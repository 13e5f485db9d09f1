"""Per-split metrics of a head and of the training-free scores, on the same rows."""

from __future__ import annotations

import torch
from torch import nn
from torchmetrics import MeanMetric, Metric, MetricCollection
from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision, BinaryCalibrationError

BASELINES = {
    "p_draft": "draft probability of its own token (confidence rule)",
    "conf_entropy": "exp(−draft entropy) (SVIP)",
}


class RatesAtThreshold(Metric):
    """η_TP = P(P̂ ≥ τ | accept) and η_FP = P(P̂ ≥ τ | reject); τ is given at update time."""

    full_state_update = False

    def __init__(self):
        super().__init__()
        for name in ("tp", "fn", "fp", "tn"):
            self.add_state(name, default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, probs: torch.Tensor, binary: torch.Tensor, threshold: float) -> None:
        pred, pos = probs >= threshold, binary > 0.5
        self.tp += (pred & pos).sum()
        self.fn += (~pred & pos).sum()
        self.fp += (pred & ~pos).sum()
        self.tn += (~pred & ~pos).sum()

    def compute(self) -> dict[str, torch.Tensor]:
        return {
            "eta_tp": self.tp / (self.tp + self.fn).clamp_min(1),
            "eta_fp": self.fp / (self.fp + self.tn).clamp_min(1),
        }


def ranking(thresholds: int | None = None) -> MetricCollection:
    return MetricCollection({"auroc": BinaryAUROC(thresholds=thresholds),
                             "ap": BinaryAveragePrecision(thresholds=thresholds)})


class SplitMetrics(nn.Module):
    """Every metric of one split: the head (AUROC, AP, calibration error, binary KL, η_TP, η_FP) and the
    training-free scores (AUROC, AP) against the same binary labels.

    ``thresholds=None`` computes AUROC and AP exactly (every score kept until ``compute``); an integer bins the
    scores into that many thresholds (constant memory, used for the training split).
    """

    def __init__(self, thresholds: int | None = None):
        super().__init__()
        self.head = MetricCollection({**ranking(thresholds), "ece": BinaryCalibrationError(n_bins=15)})
        self.kl = MeanMetric()
        self.rates = RatesAtThreshold()
        self.baselines = nn.ModuleDict({name: ranking(thresholds) for name in BASELINES})

    def update(self, batch: dict, probs: torch.Tensor, kl: torch.Tensor, threshold: float) -> None:
        binary = batch["binary"].long()
        self.head.update(probs, binary)
        self.kl.update(kl)
        self.rates.update(probs, binary, threshold)
        for name, m in self.baselines.items():
            m.update(batch[name], binary)

    def compute(self) -> dict[str, torch.Tensor]:
        out = {f"head/{k}": v for k, v in self.head.compute().items()}
        out["head/kl"] = self.kl.compute()
        out.update({f"head/{k}": v for k, v in self.rates.compute().items()})
        for name, m in self.baselines.items():
            out.update({f"{name}/{k}": v for k, v in m.compute().items()})
        return out

    def reset(self) -> None:
        self.head.reset()
        self.kl.reset()
        self.rates.reset()
        for m in self.baselines.values():
            m.reset()

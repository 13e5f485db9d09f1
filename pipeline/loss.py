"""Weighted binary cross-entropy on (soft) acceptance labels, from logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def weighted_bce(logits: torch.Tensor, target: torch.Tensor, w_acc: float = 1.0, w_rej: float = 1.0,
                 row_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of −w_acc·P·log P̂ − w_rej·(1−P)·log(1−P̂) with P̂ = σ(z) (SpecDec++ Eq. 4.2), each row's term times
    ``row_weight`` when given (weights of mean 1 over a split keep the loss's scale).

    log σ(z) and log(1 − σ(z)) = log σ(−z) come from ``logsigmoid``, so the loss stays finite for any logit.
    With w_acc = w_rej = 1 it is plain BCE (the SPRINTER verifier's loss).
    """
    target = target.to(logits.dtype)
    loss = -(w_acc * target * F.logsigmoid(logits) + w_rej * (1 - target) * F.logsigmoid(-logits))
    return (loss if row_weight is None else loss * row_weight.to(logits.dtype)).mean()


def binary_kl(p: torch.Tensor, logits: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Per-row KL(Bern(P) ‖ Bern(σ(z))) in nats (0·log 0 = 0), the SpecDec++ table's metric."""
    p = p.to(logits.dtype)
    ent = torch.xlogy(p, p.clamp_min(eps)) + torch.xlogy(1 - p, (1 - p).clamp_min(eps))
    return ent - p * F.logsigmoid(logits) - (1 - p) * F.logsigmoid(-logits)

"""HeadModule: one LightningModule that trains any registered head with the weighted BCE."""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
from torch import nn

from core.errors import SettingError
from heads.features import scores_from_columns
from pipeline.loss import weighted_bce
from pipeline.metrics import SplitMetrics

EVAL_SPLITS = ("val", "test")


class HeadModule(pl.LightningModule):
    """Trains ``head`` (injected, a plain ``nn.Module`` returning logits) on the label the data module chose."""

    def __init__(self, head: nn.Module, w_acc: float = 1.0, w_rej: float = 1.0, lr: float = 1e-3,
                 weight_decay: float = 0.0, scores_lr: float | None = None, threshold: float = 0.5):
        """
        Args:
            head: the head, e.g. ``{class_path: heads.resnet.ResNetHead, init_args: {depth: 3}}``; its
                ``hidden_size`` is linked from ``data.hidden_size``.
            w_acc: weight of the accept term −P·log P̂.
            w_rej: weight of the reject term −(1−P)·log(1−P̂) (SpecDec++: 1, 3, 6 or 12).
            lr: Adam learning rate.
            weight_decay: Adam weight decay (L2) of the hidden-state part of the head.
            scores_lr: learning rate of the draft-score weights of a head that reads them (``head.scores``;
                default ``lr``); they get no weight decay.
            threshold: decision threshold τ on P̂ for η_TP and η_FP (against the label and against q/p ≤ 1).
        """
        super().__init__()
        if not (0 < w_acc < math.inf and 0 < w_rej < math.inf):  # NaN fails every comparison
            raise SettingError(f"w_acc and w_rej must be positive, got {w_acc}, {w_rej}")
        if not 0 < lr < math.inf or not (scores_lr is None or 0 < scores_lr < math.inf):
            raise SettingError(f"lr and scores_lr must be positive, got {lr}, {scores_lr}")
        if not weight_decay >= 0:
            raise SettingError(f"weight_decay must be 0 or more, got {weight_decay}")
        if not 0 <= threshold <= 1:
            raise SettingError(f"threshold is a probability: 0 <= threshold <= 1, got {threshold}")
        self.save_hyperparameters(ignore=["head"])
        self.head = head
        self.w_acc, self.w_rej, self.lr, self.weight_decay = w_acc, w_rej, lr, weight_decay
        self.scores_lr = lr if scores_lr is None else scores_lr
        self.threshold = threshold
        # held-out splits only (training rows log the loss): exact AUROC/AP would keep every training score, and
        # binned ones cost more than the step itself. Keys are suffixed: ModuleDict refuses "train".
        self.metrics = nn.ModuleDict({f"{split}_metrics": SplitMetrics() for split in EVAL_SPLITS})

    def forward(self, batch: dict) -> torch.Tensor:
        """Logits of a batch: the hidden states, and the draft scores the head reads (``head.scores``)."""
        names = getattr(self.head, "scores", [])
        if not names:
            return self.head(batch["hidden"])
        return self.head(batch["hidden"], scores_from_columns(names, batch))

    def _step(self, batch: dict, split: str) -> torch.Tensor:
        logits = self(batch)
        loss = weighted_bce(logits, batch["target"], self.w_acc, self.w_rej, batch.get("weight"))
        if split in EVAL_SPLITS:
            self.metrics[f"{split}_metrics"].update(batch, logits.detach(), self.threshold)
        n = len(logits)
        self.log(f"{split}/loss", loss, prog_bar=split != "test", on_step=False, on_epoch=True, batch_size=n,
                 sync_dist=True)  # under DDP: the mean over every rank's rows, which checkpointing monitors
        return loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "test")

    def predict_step(self, batch: dict, batch_idx: int) -> dict[str, torch.Tensor]:
        probs = torch.sigmoid(self(batch))
        return {"probs": probs, **{k: v for k, v in batch.items() if k != "hidden"}}

    def _log_split(self, split: str) -> None:
        m = self.metrics[f"{split}_metrics"]
        if m.kl.update_count == 0:
            return
        values = m.compute()
        # equal on every rank (torchmetrics syncs its states); sync_dist only says so to Lightning
        self.log_dict({f"{split}/{k}": v for k, v in values.items()}, sync_dist=True)
        m.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_split("val")

    def on_test_epoch_end(self) -> None:
        self._log_split("test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        term = getattr(self.head, "score_term", None)
        own = {id(p) for p in term.parameters()} if term is not None else set()
        groups = [{"params": [p for p in self.head.parameters() if id(p) not in own]}]
        if own:
            groups.append({"params": list(term.parameters()), "lr": self.scores_lr, "weight_decay": 0.0})
        return torch.optim.Adam(groups, lr=self.lr, weight_decay=self.weight_decay)

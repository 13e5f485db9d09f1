"""LabelDataModule: batches of (hidden state as float32, label, training-free scores) read from the label shards.

Reads are batched: a batch is one numpy gather per Arrow chunk of the hidden-state column (zero-copy views of
the memory-mapped float16 data) for a sorted array of row indices, never one row at a time. Small per-row columns (labels, draft log-probability,
draft entropy) are held in memory for the selected rows only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Literal

import numpy as np
import pyarrow as pa
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from core import label_math as lm
from core.errors import SettingError
from core.shards import load_split, read_manifest

SMALL_COLUMNS = ("loss_mask", "category", "acceptance", "ratio", "read_logp_draft", "read_entropy_draft")


class LabelRows(Dataset):
    """The selected rows of one split; ``rows[idx_array]`` returns a whole batch as a dict of tensors."""

    def __init__(self, folder: str | Path, split: str, *, label: str, lam: float, categories: list[str],
                 feature_column: str = "hidden"):
        ds = load_split(folder, split)
        table = ds.data.table if hasattr(ds.data, "table") else ds.data
        small = {c: table.column(c) for c in SMALL_COLUMNS}
        mask = small["loss_mask"].to_numpy(zero_copy_only=False).astype(bool)
        cats = small["category"].to_numpy(zero_copy_only=False).astype(str)
        mask &= np.isin(cats, categories)
        self.index = np.flatnonzero(mask)  # row numbers in the Arrow table, ascending
        if not len(self.index):
            raise SettingError(f"{folder}: the {split} split has no draft-token rows of the categories {categories} "
                               f"(label {label!r}); label more prompts or choose other categories")
        hidden: pa.ChunkedArray = table.column(feature_column)
        self.hidden_size = hidden.type.list_size
        # one (rows, d) float16 numpy view per Arrow chunk: zero-copy into the memory map, nothing loaded yet
        self.chunks = [c.flatten().to_numpy(zero_copy_only=False).reshape(-1, self.hidden_size) for c in hidden.chunks]
        self.starts = np.cumsum([0] + [len(c) for c in self.chunks])

        def col(name: str) -> torch.Tensor:
            return torch.from_numpy(small[name].to_numpy(zero_copy_only=False)[self.index].astype(np.float32))

        acceptance, ratio = col("acceptance"), col("ratio")
        self.ratio = ratio  # q/p: η_FP (Theorem 1) is P(accept | q/p > 1) whatever λ the label uses
        if label == "soft":
            self.target = acceptance
            self.binary = (acceptance > 0.5).float()
        else:
            self.target = self.binary = lm.sprinter_label(ratio, lam).float()
        # the draft scores at the prefix the hidden states read (what a decoder computes), for heads and baselines
        self.logp_draft, self.entropy_draft = col("read_logp_draft"), col("read_entropy_draft")
        self.p_draft = self.logp_draft.exp()  # draft probability of its own token
        self.conf_entropy = (-self.entropy_draft).exp()  # exp(−H_draft): monotone in −entropy (SVIP)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, pos: np.ndarray) -> dict[str, torch.Tensor]:
        pos = np.sort(np.asarray(pos))
        rows = self.index[pos]
        hidden = np.empty((len(rows), self.hidden_size), dtype=np.float16)
        which = np.searchsorted(self.starts, rows, side="right") - 1
        local = rows - self.starts[which]
        # rows are sorted, so the rows of one Arrow chunk (≤ 1000 rows as `datasets` writes them) form one run
        bounds = [0, *(np.flatnonzero(np.diff(which)) + 1).tolist(), len(rows)]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            hidden[lo:hi] = self.chunks[which[lo]][local[lo:hi]]
        hidden = torch.from_numpy(hidden).float()  # torch's float16 → float32 cast is vectorised, numpy's is not
        pos_t = torch.from_numpy(pos)
        return {
            "hidden": hidden,
            "target": self.target[pos_t],
            "binary": self.binary[pos_t],
            "ratio": self.ratio[pos_t],
            "p_draft": self.p_draft[pos_t],
            "conf_entropy": self.conf_entropy[pos_t],
            "logp_draft": self.logp_draft[pos_t],
            "entropy_draft": self.entropy_draft[pos_t],
        }


class BlockSampler(Sampler):
    """Yields index arrays of ``batch_size`` positions; with ``shuffle`` the rows are permuted each epoch.

    ``block_size`` > 1 shuffles blocks of neighbouring rows instead of single rows (fewer, longer reads).
    """

    def __init__(self, n: int, batch_size: int, shuffle: bool, block_size: int = 1, seed: int = 0):
        self.n, self.batch_size, self.shuffle, self.block_size, self.seed = n, batch_size, shuffle, block_size, seed
        self.epoch = 0

    def __len__(self) -> int:
        return (self.n + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[np.ndarray]:
        order = np.arange(self.n)
        if self.shuffle:
            rng = np.random.default_rng((self.seed, self.epoch))
            self.epoch += 1
            blocks = np.arange(0, self.n, self.block_size)
            rng.shuffle(blocks)
            order = np.concatenate([np.arange(b, min(b + self.block_size, self.n)) for b in blocks]) if (
                self.block_size > 1) else rng.permutation(self.n)
        for i in range(0, self.n, self.batch_size):
            yield order[i : i + self.batch_size]


class LabelDataModule(pl.LightningDataModule):
    """Train/val/test splits of a labeled dataset (``data_gen`` output), with the label of your choice."""

    def __init__(
        self,
        labels: str = "runs/labels/humaneval",
        label: Literal["soft", "sprinter"] = "soft",
        lam: float = 1.0,
        categories: list[str] | None = None,
        feature_position: Literal["own", "prev"] = "own",
        batch_size: int = 256,
        eval_batch_size: int = 4096,
        block_size: int = 1,
        num_workers: int = 0,
        seed: int = 0,
    ):
        """
        Args:
            labels: folder written by ``python -m data_gen`` (shards and ``manifest.json``).
            label: ``soft``: the acceptance probability min(1, p/q) (SpecDec++); ``sprinter``: 1[q/p ≤ lam].
            lam: SPRINTER's λ (only with ``label: sprinter``).
            categories: train on rows of these categories (default: the rows of the label's head,
                ``label_math.ROWS_FOR_LABEL``).
            feature_position: the hidden state the head reads: ``own`` (column ``hidden``, after reading the
                token; SpecDec++ Eq. 4.1) or ``prev`` (column ``hidden_prev``, the state that produced q for it;
                SPRINTER §3.2).
            batch_size: training rows per step.
            eval_batch_size: rows per validation/test/predict batch.
            block_size: shuffle blocks of this many neighbouring rows (1: a full row permutation).
            num_workers: DataLoader worker processes.
            seed: seed of the shuffling.
        """
        super().__init__()
        if label not in ("soft", "sprinter"):
            raise SettingError(f"label must be 'soft' or 'sprinter', got {label!r}")
        if lam <= 0:
            raise SettingError(f"lam must be positive, got {lam}")
        unknown = sorted(set(categories or ()) - set(lm.ROW_CATEGORIES))
        if unknown:
            raise SettingError(f"unknown categories {unknown}; known: {', '.join(lm.ROW_CATEGORIES)}")
        if feature_position not in lm.FEATURE_POSITIONS:
            raise SettingError(f"feature_position must be one of {', '.join(lm.FEATURE_POSITIONS)}, "
                             f"got {feature_position!r}")
        self.save_hyperparameters()
        self.labels, self.label, self.lam = labels, label, lam
        self.categories = list(categories or lm.ROWS_FOR_LABEL[label])
        self.feature_position = feature_position
        self.batch_size, self.eval_batch_size, self.block_size = batch_size, eval_batch_size, block_size
        self.num_workers, self.seed = num_workers, seed
        self.manifest = read_manifest(labels)
        self.splits: dict[str, LabelRows] = {}

    @property
    def hidden_size(self) -> int:
        """Size of the feature (the draft's hidden state), from the manifest."""
        return int(self.manifest["feature"]["hidden_size"])

    @property
    def draft(self) -> dict:
        return self.manifest["models"]["draft"]

    def rows(self, split: str) -> LabelRows:
        if split not in self.splits:
            rows = LabelRows(self.labels, split, label=self.label, lam=self.lam, categories=self.categories,
                             feature_column=lm.FEATURE_POSITIONS[self.feature_position].column)
            if rows.hidden_size != self.hidden_size:
                raise SettingError(f"{self.labels}: the manifest gives hidden size {self.hidden_size}, the {split} "
                                 f"shards hold features of size {rows.hidden_size}; label again or fix the manifest")
            self.splits[split] = rows
        return self.splits[split]

    def _loader(self, split: str, train: bool) -> DataLoader:
        rows = self.rows(split)
        bs = self.batch_size if train else self.eval_batch_size
        sampler = BlockSampler(len(rows), bs, shuffle=train, block_size=self.block_size, seed=self.seed)
        return DataLoader(rows, sampler=sampler, batch_size=None, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", False)

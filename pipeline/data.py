"""LabelDataModule: batches of (hidden state as float32, label, training-free scores) read from the label shards.

Reads are batched: a batch is one numpy gather per Arrow chunk of the hidden-state column (zero-copy views of
the memory-mapped float16 data) for a sorted array of row indices, never one row at a time. Small per-row columns (labels, draft log-probability,
draft entropy) are held in memory for the selected rows only.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Iterator, Literal

import numpy as np
import pyarrow as pa
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from core import label_math as lm
from core.backends import backend_of
from core.errors import SettingError
from core.identity import identity_mismatch
from core.shards import load_split, read_manifest
from heads.features import SHARD_SCORE_COLUMNS, vector_column
from pipeline.lookup_data import LookupStopRows, state_width

SMALL_COLUMNS = ("loss_mask", "category", "acceptance", "ratio", "prompt_id", *SHARD_SCORE_COLUMNS)


class LabelRows(Dataset):
    """The selected rows of one split; ``rows[idx_array]`` returns a whole batch as a dict of tensors."""

    def __init__(self, folder: str | Path, split: str, *, label: str, lam: float, categories: list[str],
                 feature_column: str = "hidden", vector_columns: list[str] = (), balance: bool = False,
                 prompt_share: float = 1.0, seed: int = 0):
        ds = load_split(folder, split)
        table = ds.data.table if hasattr(ds.data, "table") else ds.data
        missing = [c for c in (*SMALL_COLUMNS, feature_column, *vector_columns) if c not in table.column_names]
        if missing:
            raise SettingError(f"{folder}: the {split} shards have no columns {missing}; label again with this "
                               f"version (data_gen/SCHEMA.md)")
        small = {c: table.column(c) for c in SMALL_COLUMNS}
        mask = small["loss_mask"].to_numpy(zero_copy_only=False).astype(bool)
        cats = small["category"].to_numpy(zero_copy_only=False).astype(str)
        mask &= np.isin(cats, categories)
        if prompt_share < 1:
            prompt_ids = small["prompt_id"].to_numpy(zero_copy_only=False)
            mask &= np.isin(prompt_ids, first_prompts(np.unique(prompt_ids[mask]), prompt_share, seed))
        self.index = np.flatnonzero(mask)  # row numbers in the Arrow table, ascending
        if not len(self.index):
            raise SettingError(f"{folder}: the {split} split has no draft-token rows of the categories {categories} "
                               f"(label {label!r}); label more prompts or choose other categories")
        # each row's weight in the loss: 1, or (balance) n / (C·n_c) for a row of category c, which gives each of the
        # C categories present an equal share of the loss while the weights keep a mean of 1
        self.weight = torch.ones(len(self.index))
        if balance:
            _, of_row, counts = np.unique(cats[self.index], return_inverse=True, return_counts=True)
            self.weight = torch.from_numpy(len(self.index) / (len(counts) * counts[of_row])).float()
        self.hidden_size = table.column(feature_column).type.list_size
        # the head's input: the hidden state, then each vector feature; per column one (rows, size) float16 numpy
        # view per Arrow chunk: zero-copy into the memory map, nothing loaded yet
        self.vectors = [_chunk_views(table.column(c)) for c in (feature_column, *vector_columns)]
        self.input_size = sum(v[0].shape[1] for v in self.vectors)
        self.starts = np.cumsum([0] + [len(c) for c in self.vectors[0]])

        def col(name: str) -> torch.Tensor:
            return torch.from_numpy(small[name].to_numpy(zero_copy_only=False)[self.index].astype(np.float32))

        acceptance, ratio = col("acceptance"), col("ratio")
        self.ratio = ratio  # q/p: η_FP (Theorem 1) is P(accept | q/p > 1) whatever λ the label uses
        if label == "soft":
            self.target = acceptance
            self.binary = (acceptance > 0.5).float()
        else:
            self.target = self.binary = lm.sprinter_label(ratio, lam).float()
        # every scalar a head may read (``heads.features.SCORES``), by label column; the draft scores are at the
        # prefix the hidden states read (what a decoder computes)
        self.columns = {c: col(c) for c in SHARD_SCORE_COLUMNS}
        self.prompt_id = torch.from_numpy(small["prompt_id"].to_numpy(zero_copy_only=False)[self.index])
        self.prompt_ids = np.unique(self.prompt_id.numpy())
        """The prompts of the selected rows."""
        self.logp_draft, self.entropy_draft = self.columns["read_logp_draft"], self.columns["read_entropy_draft"]
        self.p_draft = self.logp_draft.exp()  # draft probability of its own token
        self.conf_entropy = (-self.entropy_draft).exp()  # exp(−H_draft): monotone in −entropy (SVIP)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, pos: np.ndarray) -> dict[str, torch.Tensor]:
        pos = np.sort(np.asarray(pos))
        rows = self.index[pos]
        hidden = np.empty((len(rows), self.input_size), dtype=np.float16)
        which = np.searchsorted(self.starts, rows, side="right") - 1
        local = rows - self.starts[which]
        # rows are sorted, so the rows of one Arrow chunk (≤ 1000 rows as `datasets` writes them) form one run
        bounds = [0, *(np.flatnonzero(np.diff(which)) + 1).tolist(), len(rows)]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            at = 0
            for chunks in self.vectors:
                size = chunks[0].shape[1]
                hidden[lo:hi, at : at + size] = chunks[which[lo]][local[lo:hi]]
                at += size
        hidden = torch.from_numpy(hidden).float()  # torch's float16 → float32 cast is vectorised, numpy's is not
        pos_t = torch.from_numpy(pos)
        return {
            **{c: v[pos_t] for c, v in self.columns.items()},
            "prompt_id": self.prompt_id[pos_t],
            "hidden": hidden,
            "target": self.target[pos_t],
            "weight": self.weight[pos_t],
            "binary": self.binary[pos_t],
            "ratio": self.ratio[pos_t],
            "p_draft": self.p_draft[pos_t],
            "conf_entropy": self.conf_entropy[pos_t],
            "logp_draft": self.logp_draft[pos_t],
            "entropy_draft": self.entropy_draft[pos_t],
        }


def first_prompts(prompt_ids: np.ndarray, share: float, seed: int) -> np.ndarray:
    """The first ``share`` of ``prompt_ids`` (at least one) in an order fixed by the seed and each id alone, so the
    prompts of a smaller share are among those of every larger one (nested subsets for a learning curve)."""
    order = np.argsort([hashlib.sha256(f"{seed}:{int(p)}".encode()).digest() for p in prompt_ids], kind="stable")
    return prompt_ids[order[: max(1, math.ceil(share * len(prompt_ids) - 1e-9))]]  # 0.1 * 30 is 3.0000000000000004


def _chunk_views(column: pa.ChunkedArray) -> list[np.ndarray]:
    size = column.type.list_size
    return [c.flatten().to_numpy(zero_copy_only=False).reshape(-1, size) for c in column.chunks]


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


def check_same_pair(manifest: dict, other: dict, labels: str, other_labels: str) -> None:
    """Refuse test labels of another draft or target than the training labels' (their features, or the acceptance
    they are judged against, would differ)."""
    for role in ("draft", "target"):
        differs = identity_mismatch(manifest["models"][role], other["models"][role])
        if differs is not None:
            key, mine, theirs = differs
            raise SettingError(f"{other_labels} was labeled with another {role} than {labels} ({key} {theirs} "
                               f"against {mine}); test on labels of the same pair")


class LabelDataModule(pl.LightningDataModule):
    """Train/val/test splits of a labeled dataset (``data_gen`` output), with the label of your choice."""

    def __init__(
        self,
        labels: str = "runs/labels/corpus",
        test_labels: str | None = None,
        train_share: float = 1.0,
        label: Literal["soft", "sprinter", "lookup"] = "soft",
        lam: float = 1.0,
        lookup_n: int = 4,
        lookup_m: int = 48,
        categories: list[str] | None = None,
        balance_categories: bool | None = None,
        feature_position: Literal["own", "prev"] = "own",
        vectors: list[str] | None = None,
        batch_size: int = 256,
        eval_batch_size: int = 4096,
        block_size: int = 1,
        num_workers: int = 0,
        seed: int = 0,
    ):
        """
        Args:
            labels: folder written by ``specheads labels`` (shards and ``manifest.json``).
            test_labels: a label folder whose ``test`` split is the test set instead of ``labels``' (held-out
                prompts, e.g. ``runs/labels/humaneval-heldout`` beside corpus labels); labeled with the same draft.
            train_share: train on this share of the train split's prompts (all their rows), the same prompts for
                the same seed, and a smaller share's prompts among a larger one's (a learning curve).
            label: ``soft``: the acceptance probability min(1, p/q) (SpecDec++); ``sprinter``: 1[q/p ≤ lam];
                ``lookup``: whether the target keeps a prompt-lookup candidate, on the target's state where its
                round starts (``pipeline.lookup_data``; labels of ``target_states: true``).
            lam: SPRINTER's λ (only with ``label: sprinter``).
            lookup_n: with ``label: lookup``, the n-gram prompt lookup looks up (llama.cpp's ``ngram-simple``
                size n).
            lookup_m: with ``label: lookup``, the longest continuation it copies (size m).
            categories: train on rows of these categories (default: the rows of the label's head,
                ``label_math.ROWS_FOR_LABEL``).
            balance_categories: weight the rows so that each category has an equal share of the loss, whatever its
                row count (SPRINTER §3.2: equal shares of prefixes; prompts are assigned in equal shares, but a
                category's rows per prompt differ). Default: for the ``sprinter`` label.
            feature_position: the hidden state the head reads: ``own`` (column ``hidden``, after reading the
                token; SpecDec++ Eq. 4.1) or ``prev`` (column ``hidden_prev``, the state that produced q for it;
                SPRINTER §3.2).
            vectors: vector features appended to the hidden state (``heads.features.VECTORS``: ``layers``,
                ``stale_target``), in this order; their total size is linked into the head's ``extra_size``.
            batch_size: training rows per step.
            eval_batch_size: rows per validation/test/predict batch.
            block_size: shuffle blocks of this many neighbouring rows (1: a full row permutation).
            num_workers: DataLoader worker processes.
            seed: seed of the shuffling.
        """
        super().__init__()
        if label not in ("soft", "sprinter", "lookup"):
            raise SettingError(f"label must be 'soft', 'sprinter' or 'lookup', got {label!r}")
        if label == "lookup" and (vectors or categories or min(lookup_n, lookup_m) < 1):
            raise SettingError("label: lookup reads the target's state and no vector feature or category; lookup_n "
                               f"and lookup_m are at least 1 (got vectors {vectors}, categories {categories}, "
                               f"lookup_n {lookup_n}, lookup_m {lookup_m})")
        if not 0 < lam < math.inf:  # a NaN λ would label every row 0
            raise SettingError(f"lam must be positive, got {lam}")
        if not 0 < train_share <= 1:
            raise SettingError(f"train_share must be in (0, 1], got {train_share}")
        small = {k: v for k, v in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size),
                                   ("block_size", block_size)) if v < 1}
        if small or num_workers < 0:
            raise SettingError(f"batch_size, eval_batch_size and block_size must be 1 or more, num_workers 0 or more; "
                               f"got {small or {'num_workers': num_workers}}")
        unknown = sorted(set(categories or ()) - set(lm.ROW_CATEGORIES))
        if unknown:
            raise SettingError(f"unknown categories {unknown}; known: {', '.join(lm.ROW_CATEGORIES)}")
        if feature_position not in lm.FEATURE_POSITIONS:
            raise SettingError(f"feature_position must be one of {', '.join(lm.FEATURE_POSITIONS)}, "
                             f"got {feature_position!r}")
        self.save_hyperparameters()
        self.labels, self.label, self.lam = labels, label, lam
        self.lookup = (lookup_n, lookup_m)
        self.categories = list(categories or lm.ROWS_FOR_LABEL.get(label, ()))
        self.balance_categories = label == "sprinter" if balance_categories is None else balance_categories
        self.feature_position = feature_position
        self.vectors = list(vectors or [])
        self.vector_columns = [vector_column(v, feature_position) for v in self.vectors]
        self.batch_size, self.eval_batch_size, self.block_size = batch_size, eval_batch_size, block_size
        self.num_workers, self.seed = num_workers, seed
        self.manifest = read_manifest(labels)
        self.test_labels, self.train_share = test_labels, train_share
        if test_labels is not None:
            check_same_pair(self.manifest, read_manifest(test_labels), labels, test_labels)
        self.splits: dict[str, LabelRows] = {}

    @property
    def hidden_size(self) -> int:
        """Size of the feature (the draft's hidden state; the target's for ``label: lookup``), from the manifest."""
        if self.label == "lookup":
            return state_width(self.manifest, self.labels)
        return int(self.manifest["feature"]["hidden_size"])

    @property
    def extra_size(self) -> int:
        """Total size of the vector features appended to the hidden state, from the manifest."""
        sizes = self.manifest["feature"].get("sizes", {})
        missing = [c for c in self.vector_columns if c not in sizes]
        if missing:
            why = ("they were labeled on llama.cpp, which gives no layer but the last: train without the vector "
                   "'layers'" if not backend_of(self.draft).taps_layers
                   else "label again with this version (data_gen/SCHEMA.md)")
            raise SettingError(f"{self.labels}: the labels hold no columns {missing} (vectors {self.vectors}); {why}")
        return sum(int(sizes[c]) for c in self.vector_columns)

    @property
    def draft(self) -> dict:
        return self.manifest["models"]["draft"]

    def folder(self, split: str) -> str:
        """The label folder a split is read from."""
        return self.test_labels if split == "test" and self.test_labels is not None else self.labels

    def rows(self, split: str) -> LabelRows | LookupStopRows:
        if split not in self.splits and self.label == "lookup":
            folder = self.folder(split)
            share = None
            if split == "train" and self.train_share < 1:
                every = LookupStopRows(folder, split, n=self.lookup[0], m=self.lookup[1]).prompt_ids
                share = first_prompts(every, self.train_share, self.seed)
            self.splits[split] = LookupStopRows(folder, split, n=self.lookup[0], m=self.lookup[1], prompt_ids=share)
        if split not in self.splits:
            folder = self.folder(split)
            rows = LabelRows(folder, split, label=self.label, lam=self.lam, categories=self.categories,
                             feature_column=lm.FEATURE_POSITIONS[self.feature_position].column,
                             vector_columns=self.vector_columns, balance=self.balance_categories,
                             prompt_share=self.train_share if split == "train" else 1.0, seed=self.seed)
            if rows.hidden_size != self.hidden_size or rows.input_size != self.hidden_size + self.extra_size:
                raise SettingError(f"{folder}: the manifest gives hidden size {self.hidden_size}, the {split} "
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

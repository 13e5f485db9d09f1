"""``make bench-train``: one epoch of the SPRINTER verifier over cached fp16 features, through the real data
module and Trainer, next to a plain in-memory tensor pass over the same rows (the input pipeline's overhead).

    specheads bench-train [--rows 1000000] [--hidden_size 896] [--batch_size 4096]

The random features and labels are written once under ``runs/bench/`` and reused.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from core import label_math as lm
from core.arguments import CommandParser, check_counts, description
from core.interrupt import run_main
from core.runfolder import RunFolder
from core.shards import FLOAT_COLUMNS, SCHEMA_VERSION, shard_records, write_shard

SHARD_ROWS = 100_000


def _shard_columns(n: int, d: int, rng: np.random.Generator, w: np.ndarray) -> dict[str, np.ndarray]:
    hidden = rng.standard_normal((n, d), dtype=np.float32).astype(np.float16)
    logit = hidden.astype(np.float32) @ w + rng.standard_normal(n, dtype=np.float32)
    cols = {c: rng.random(n, dtype=np.float32) for c in FLOAT_COLUMNS}
    cols["ratio"] = np.exp(-logit).astype(np.float32)  # learnable: 1[q/p ≤ 1] = 1[logit ≥ 0] up to noise
    cols["acceptance"] = np.minimum(1.0, 1.0 / cols["ratio"]).astype(np.float32)
    cols["logp_draft"] = np.log(cols["logp_draft"] + 1e-3)
    return {
        "prompt_id": np.arange(n, dtype=np.int64),
        "category": np.array(["target"] * n),
        "position": np.zeros(n, dtype=np.int32),
        "token_id": np.zeros(n, dtype=np.int32),
        "loss_mask": np.ones(n, dtype=bool),
        **cols,
        "greedy_match": np.zeros(n, dtype=bool),
        "round_index": np.ones(n, dtype=np.int32),
        "response_index": np.zeros(n, dtype=np.int32),
        "hidden": hidden,
    }


def bench_cache(folder: Path) -> RunFolder:
    """The cache of random rows: a label folder's layout, written only by this command."""
    return RunFolder(folder, "bench-train", "--dir", ("manifest.json", "*/*.arrow", "*/*.arrow.json"))


def make_bench_labels(folder: Path, rows: int, d: int, seed: int = 0) -> Path:
    """Write ``rows`` random training rows (+ a small val split) and a manifest, unless already there: shards and
    manifest as a labeling run writes them (``core.shards``: each shard's digest listed), which the data module
    checks as it reads."""
    if (folder / "manifest.json").exists():
        return folder
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d, dtype=np.float32) / np.sqrt(d)
    counts = {"train": rows, "val": min(10_000, rows), "test": min(10_000, rows)}
    cache = bench_cache(folder)
    for split, n in counts.items():
        for i, start in enumerate(range(0, n, SHARD_ROWS)):
            cols = _shard_columns(min(SHARD_ROWS, n - start), d, rng, w)
            shard = folder / split / f"target-{i:04d}.arrow"
            cache.claim(shard)
            cache.claim(shard.with_name(shard.name + ".json"))
            write_shard(shard, cols, {"hidden": d})
    draft = {"name": "random-bench", "source": "bench", "fingerprint": "none", "hidden_size": d, "vocab_size": 1}
    cache.write_json(folder / "manifest.json", {
        "schema_version": SCHEMA_VERSION, "models": {"draft": draft, "target": draft},
        "feature": {"column": "hidden", "hidden_size": d, "dtype": "float16"},
        "splits": {s: {"rows": n, "loss_rows": n} for s, n in counts.items()}, "seed": seed,
        "shards": shard_records(folder),
    })
    return folder


def pipeline_epoch(folder: Path, batch_size: int) -> tuple[float, int]:
    """Seconds for one training epoch through LabelDataModule + HeadModule + Trainer (metrics included)."""
    import pytorch_lightning as pl

    from heads.sprinter import SprinterHead
    from pipeline.data import LabelDataModule
    from pipeline.module import HeadModule

    dm = LabelDataModule(str(folder), label="sprinter", lam=1.0, batch_size=batch_size)
    model = HeadModule(SprinterHead(dm.hidden_size))
    trainer = pl.Trainer(max_epochs=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    n = len(dm.rows("train"))
    t = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    return time.perf_counter() - t, n


def tensor_epoch(folder: Path, batch_size: int) -> tuple[float, float, int]:
    """(seconds to load all features into memory, seconds for the same epoch as a plain tensor loop, rows)."""
    from core.shards import load_split
    from heads.sprinter import SprinterHead
    from pipeline.loss import weighted_bce

    t = time.perf_counter()
    table = load_split(folder, "train").data
    flat = table.column("hidden").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    hidden = torch.from_numpy(flat.copy()).view(table.num_rows, -1)
    target = lm.sprinter_label(torch.from_numpy(table.column("ratio").to_numpy()), 1.0).float()
    load_s = time.perf_counter() - t
    head = SprinterHead(hidden.shape[1])
    opt = torch.optim.Adam(head.parameters(), lr=1e-3)
    t = time.perf_counter()
    for idx in torch.randperm(len(target)).split(batch_size):
        loss = weighted_bce(head(hidden[idx].float()), target[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return load_s, time.perf_counter() - t, len(target)


def main(argv: list[str] | None = None) -> None:
    p = CommandParser(prog="specheads bench-train", description=description(__doc__))
    p.add_argument("--rows", type=int, default=1_000_000, help="random label rows in the epoch (default 1000000)")
    p.add_argument("--hidden_size", type=int, default=896, help="width of each row's feature (default 896)")
    p.add_argument("--batch_size", type=int, default=4096, help="rows per training batch (default 4096)")
    p.add_argument("--dir", default="runs/bench", help="where the random shards are cached")
    a = p.parse_args(argv)
    check_counts({"--rows": a.rows, "--hidden_size": a.hidden_size, "--batch_size": a.batch_size})
    folder = Path(a.dir) / f"labels-{a.rows}x{a.hidden_size}"
    cache = bench_cache(folder)
    cache.check()
    t = time.perf_counter()
    with cache.hold("a training benchmark"):
        cache.check()
        cache.start()
        make_bench_labels(folder, a.rows, a.hidden_size)
    print(f"bench: {a.rows} rows × {a.hidden_size} fp16 under {folder} ({time.perf_counter() - t:.1f} s to prepare)")
    pipe_s, n = pipeline_epoch(folder, a.batch_size)
    load_s, plain_s, _ = tensor_epoch(folder, a.batch_size)
    print(f"{'':<34}{'seconds':>9}{'rows/s':>12}")
    print(f"{'pipeline epoch (Trainer + shards)':<34}{pipe_s:>9.1f}{n / pipe_s:>12,.0f}")
    print(f"{'plain in-memory tensor epoch':<34}{plain_s:>9.1f}{n / plain_s:>12,.0f}   (+{load_s:.1f} s to load)")
    print(f"pipeline / plain time ratio: {pipe_s / plain_s:.2f}×; goal: pipeline epoch ≤ 60 s "
          f"({'met' if pipe_s <= 60 else 'NOT met'})")


if __name__ == "__main__":
    run_main(main)

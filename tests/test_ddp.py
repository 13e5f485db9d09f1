"""Scale-out on the CPU with gloo: the commands users run, with two processes (Lightning's DDP launcher starts the
second by running the same command again). Labeling gives the one-process shards byte for byte; `python -m pipeline
fit` trains and checkpoints on two ranks; `train_all` fits on two ranks and exports once, from rank 0."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import torch

from core import shards
from data_gen.run import run_labels
from testing import tiny


def _run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=os.getcwd(), env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _rows(out) -> dict[str, pd.DataFrame]:
    frames = {s: shards.load_split(out, s).to_pandas() for s in shards.SPLITS}
    return {s: f.sort_values(["prompt_id", "category", "position"], ignore_index=True) for s, f in frames.items()}


def test_labeling_with_two_processes_gives_the_one_process_rows(tiny_pair, prompt_file, tmp_path):
    cfg = tiny.label_config(*tiny_pair, prompt_file, tmp_path / "one", max_new_tokens=4, batch_size=4)
    one = run_labels(cfg, quiet=True)
    _run(["-m", "data_gen", "--draft.path", str(tiny_pair[0]), "--draft.name", "tiny-draft",
          "--target.path", str(tiny_pair[1]), "--target.name", "tiny-target",
          "--prompts.source", str(prompt_file), "--prompts.response_field", "answer",
          "--sampling.max_new_tokens", "4", "--batch_size", "4", "--output_dir", str(tmp_path / "two"),
          "--accelerator", "cpu", "--devices", "2", "--dtype", "float32"], tmp_path)
    two = shards.read_manifest(tmp_path / "two")
    assert two["shards"] == one["shards"]  # the same shards, byte for byte, whichever rank wrote them
    a, b = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    for s in shards.SPLITS:
        pd.testing.assert_frame_equal(a[s], b[s])


def test_training_with_two_processes_checkpoints_on_the_validation_loss(tiny_pair, prompt_file, tmp_path):
    labels = tmp_path / "labels"
    run_labels(tiny.label_config(*tiny_pair, prompt_file, labels, max_new_tokens=6, batch_size=4,
                                 split_fractions=(0.5, 0.25, 0.25)), quiet=True)
    root = tmp_path / "train"
    _run(["-m", "pipeline", "fit", "--seed_everything", "0",
          "--model.head.class_path", "heads.sprinter.SprinterHead", "--data.labels", str(labels),
          "--data.label", "sprinter", "--data.lam", "1.5", "--data.batch_size", "16",
          "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
          "--trainer.max_epochs", "2", "--trainer.default_root_dir", str(root), "--trainer.logger", "false",
          "--trainer.enable_progress_bar", "false", "--checkpoint.dirpath", str(root / "ckpt")], tmp_path)
    ckpt = torch.load(root / "ckpt" / "best.ckpt", weights_only=False)
    callbacks = {k: v for k, v in ckpt["callbacks"].items() if k.startswith("ModelCheckpoint")}
    (state,) = callbacks.values()
    assert state["best_model_path"].endswith("best.ckpt") and torch.isfinite(state["best_model_score"])


def test_make_train_takes_the_device_flags(tiny_pair, prompt_file, tmp_path):
    """``train_all --devices 2``: both ranks fit, rank 0 picks the threshold, tests and exports once."""
    from heads.export import load_head

    labels = tmp_path / "labels"
    run_labels(tiny.label_config(*tiny_pair, prompt_file, labels, max_new_tokens=6, batch_size=4,
                                 split_fractions=(0.5, 0.25, 0.25)), quiet=True)
    proc = _run(["-m", "pipeline.train_all", "--labels", str(labels), "--configs", "configs/train/sprinter_lam1.yaml",
                 "--out", str(tmp_path / "train"), "--checkpoints", str(tmp_path / "ckpt"),
                 "--heads_dir", str(tmp_path / "heads"), "--max_epochs", "1", "--accelerator", "cpu",
                 "--devices", "2", "--strategy", "ddp", "--quiet"], tmp_path)
    _, meta = load_head(tmp_path / "heads" / "sprinter_lam1.safetensors")
    assert meta["role"] == "verifier" and 0 <= meta["threshold"]["value"] <= 1
    assert proc.stdout.count("exported ") == 1

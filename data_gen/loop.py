"""The Lightning prediction loop that labels a run's batches. ``Trainer.predict`` drives it, so the same command runs
on N GPUs or nodes under Lightning's DDP: every rank labels every world_size-th batch and writes each one's shard as
soon as it is labeled."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from lightning_utilities.core import rank_zero as lightning_rank_zero
from pytorch_lightning.callbacks import BasePredictionWriter, TQDMProgressBar

from core import shards
from core.adapter import HFCausalLM
from core.models import eos_token_ids
from data_gen.batches import BatchList, finished, labeling_order
from data_gen.config import LabelConfig
from data_gen.errors import LabelingInterrupted
from data_gen.labeler import Labeler
from data_gen.sequences import SEQUENCES, with_target_states
from data_gen.llama_labeler import LlamaLabeler, is_llama


class LabelingModule(pl.LightningModule):
    """Holds draft and target; ``predict_step`` labels one batch of prompts."""

    def __init__(self, draft, target, labeler_kwargs: dict):
        super().__init__()
        self.draft, self.target = draft, target
        self.labeler_kwargs = labeler_kwargs

    def on_predict_start(self) -> None:
        self.labeler = new_labeler(self.draft, self.target, self.labeler_kwargs)

    def predict_step(self, batch, batch_idx):
        cols = with_target_states(self.labeler.label(batch["prompts"], self.device), self.labeler.target_states)
        return {"key": batch["key"], "n_prompts": len(batch["prompts"]), "cols": cols}


def labeler_settings(cfg: LabelConfig, target, tok) -> dict:
    """The keyword arguments of a labeler for ``cfg``'s run of a loaded pair (``load_pair``)."""
    return dict(sampling=cfg.sampling, seed=cfg.seed, eos_token_ids=eos_token_ids(target, tok),
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                mixing_ratio=cfg.mixing_ratio, target_states=cfg.target_states)


def new_labeler(draft, target, settings: dict):
    """The labeler of the pair's backend (``LlamaLabeler`` for llama.cpp models, else ``Labeler``)."""
    if is_llama(draft):
        return LlamaLabeler(draft, target, **settings)
    return Labeler(HFCausalLM(draft), HFCausalLM(target), mask_dtype=next(draft.parameters()).dtype, **settings)


class ShardWriter(BasePredictionWriter):
    """Writes each batch's rows as one shard, atomically, as soon as the batch is labeled.

    A rank started by another process (Lightning's DDP launcher) stops before its next batch once that process is
    gone, so that no orphaned rank labels on, and writes shards, after the run was killed."""

    def __init__(self, out_dir: Path, sizes: dict[str, int]):
        super().__init__(write_interval="batch")
        self.out_dir, self.sizes = out_dir, sizes
        self._launcher: int | None = None

    def on_predict_start(self, trainer, pl_module) -> None:
        self._launcher = os.getppid() if trainer.global_rank > 0 else None

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self._launcher is not None and os.getppid() != self._launcher:
            raise LabelingInterrupted(f"rank {trainer.global_rank}: the process that launched this run is gone; "
                                      "stopping (the same command resumes the run)")

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        shard = self.out_dir / f"{prediction['key']}.arrow"
        shards.write_sequences(shards.sequences_path(shard), prediction["cols"][SEQUENCES])
        shards.write_shard(shard, prediction["cols"], self.sizes)  # last: the batch is done


class LabelProgress(TQDMProgressBar):
    """Lightning's progress bar, with prompts/s and labeled tokens/s."""

    def on_predict_epoch_start(self, trainer, pl_module) -> None:
        super().on_predict_epoch_start(trainer, pl_module)
        self._t0, self._prompts, self._tokens = time.perf_counter(), 0, 0

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._prompts += outputs["n_prompts"]
        self._tokens += len(outputs["cols"]["prompt_id"])
        dt = max(time.perf_counter() - self._t0, 1e-9)
        self.predict_progress_bar.set_postfix(prompts_s=f"{self._prompts / dt:.2f}", tok_s=f"{self._tokens / dt:.1f}")
        super().on_predict_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)


def _done(shard: Path) -> bool:
    """Whether a batch's shard and its sequences are written and intact; a damaged shard is removed, so that the
    batch is labeled again."""
    if not shard.exists():
        return False
    if finished(shard):
        return True
    shard.unlink(missing_ok=True)  # every rank checks the same list
    return False


def _no_ctrl_c_line(record: logging.LogRecord) -> bool:
    """A log filter: drops Lightning's "Detected KeyboardInterrupt, attempting graceful shutdown", which would come
    before the command's own line about the Ctrl-C (``LabelingInterrupted``)."""
    return "Detected KeyboardInterrupt" not in record.getMessage()


def label_batches(cfg: LabelConfig, out: Path, draft, target, tok, models: dict, batches: list[dict],
                  callbacks: list | None, quiet: bool) -> bool:
    """Label the batches without a shard in ``out`` through ``Trainer.predict``; True on rank 0."""
    todo = [b for b in labeling_order(batches) if not _done(out / f"{b['key']}.arrow")]
    module = LabelingModule(draft, target, labeler_settings(cfg, target, tok))
    llama = is_llama(draft)
    sizes = shards.vector_sizes(models["draft"]["hidden_size"], models["target"]["hidden_size"], tapped=not llama)
    trainer = pl.Trainer(
        accelerator="cpu" if llama else cfg.accelerator,
        devices=1 if llama else cfg.devices,
        num_nodes=cfg.num_nodes,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        enable_progress_bar=not quiet,
        callbacks=[ShardWriter(out, sizes), *([] if quiet else [LabelProgress()]),
                   *(callbacks or [])],
    )
    if not quiet:
        n_prompts = sum(len(b["prompts"]) for b in batches)
        print(f"labeling {n_prompts} prompts in {len(batches)} batches ({len(batches) - len(todo)} already done)")
    if todo:
        # every rank labels every world_size-th remaining batch (the list is the same on all ranks)
        rank, world = trainer.global_rank, trainer.world_size
        loader = torch.utils.data.DataLoader(BatchList(todo[rank::world]), batch_size=None, collate_fn=lambda b: b)
        lightning_log = lightning_rank_zero.log  # where Lightning says it caught a Ctrl-C: ours says it instead
        lightning_log.addFilter(_no_ctrl_c_line)
        try:
            trainer.predict(module, loader, return_predictions=False)
        except SystemExit as e:
            if not isinstance(e.__context__, KeyboardInterrupt):  # Lightning's exit on Ctrl-C, not another one
                raise
            # Lightning answers Ctrl-C with exit status 1 and leaves SIGINT ignored
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise LabelingInterrupted("stopped by Ctrl-C; every finished batch is kept: run the same command again "
                                      "to resume") from None
        finally:
            lightning_log.removeFilter(_no_ctrl_c_line)
        trainer.strategy.barrier()
    return trainer.global_rank == 0

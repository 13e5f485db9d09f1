"""A labeling run's batches: its prompts as records with their split and category (``build_records``), fixed
batches of them, each with a stable key (grouped by split and category, sorted by length), the order a run labels
them in (``labeling_order``), and whether a batch's shard is finished. A shard named after its batch's key exists only
once the batch is fully written, so a resumed run skips exactly the finished batches."""

from __future__ import annotations

from pathlib import Path

import torch

from core import label_math as lm
from core import shards
from core.prompts import load_prompt_table, split_by_prompt, tokenize_prompt
from data_gen.config import LabelConfig
from data_gen.errors import LabelingError
from data_gen.labeler import Prompt


def make_batches(records: list[dict], batch_size: int) -> list[dict]:
    """Fixed batches keyed ``split/category-NNNN``: one category per batch, similar lengths together."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["split"], r["prompt"].category), []).append(r)
    batches = []
    for (split, cat), rs in sorted(groups.items()):
        rs.sort(key=lambda r: (-len(r["prompt"].input_ids), r["prompt"].prompt_id))
        for i in range(0, len(rs), batch_size):
            chunk = rs[i : i + batch_size]
            batches.append({"key": f"{split}/{cat}-{i // batch_size:04d}", "prompts": [r["prompt"] for r in chunk]})
    return batches


GOLDEN = (5 ** 0.5 - 1) / 2


def labeling_order(batches: list[dict]) -> list[dict]:
    """The order a run labels ``batches`` in (the same on every resume and rank): each split and category's batches
    in a golden-ratio sequence through its longest-first list, the groups interleaved in proportion to their sizes.
    So the batches finished at any time cover every split and the whole range of lengths, rather than one split's
    longest prompts first."""
    groups: dict[str, list[dict]] = {}
    for b in batches:
        groups.setdefault(b["key"].rsplit("-", 1)[0], []).append(b)
    timed = []
    for group in groups.values():
        spread = sorted(range(len(group)), key=lambda i: ((i * GOLDEN) % 1, i))
        timed += [((rank + 0.5) / len(group), group[i]["key"], group[i]) for rank, i in enumerate(spread)]
    return [b for _, _, b in sorted(timed, key=lambda t: t[:2])]


class BatchList(torch.utils.data.Dataset):
    def __init__(self, batches: list[dict]):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict:
        return self.batches[i]


def build_records(cfg: LabelConfig, tokenizer, context: int, table: list[dict] | None = None) -> list[dict]:
    """Every prompt as a record with its split and SPRINTER category; ``table``: the prompt rows, if read already."""
    if table is None:
        table = load_prompt_table(cfg.prompts, need_response=cfg.response_source == "dataset")
    splits = split_by_prompt(len(table), cfg.split_fractions, cfg.seed)
    records = []
    for split in shards.SPLITS:
        idx = [i for i, s in enumerate(splits) if s == split]
        cats = lm.assign_categories(len(idx), tuple(cfg.categories), torch.Generator().manual_seed(cfg.seed + 1))
        for i, cat in zip(idx, cats):
            ids = tokenize_prompt(tokenizer, table[i]["text"], cfg.prompts.chat_template)
            if len(ids) + cfg.sampling.max_new_tokens > context:
                raise LabelingError(
                    f"prompt {i} has {len(ids)} tokens; with max_new_tokens={cfg.sampling.max_new_tokens} it exceeds "
                    f"the context window of {context} tokens"
                )
            if len(ids) < 2 and cat == "original":
                raise LabelingError(f"prompt {i} has fewer than 2 tokens: nothing to label in its original prefix")
            resp = None
            if cfg.response_source == "dataset":
                resp = tokenizer(table[i]["response"] or "", add_special_tokens=False)["input_ids"]
                resp = resp or [tokenizer.eos_token_id]
            records.append({"split": split, "prompt": Prompt(i, ids, cat, resp)})
    return records


def finished(shard: Path) -> bool:
    """Whether a batch's shard and its sequences are written and intact (read only)."""
    seqs = shards.sequences_path(shard)
    try:
        return shard.exists() and shards.shard_problem(shard) is None and seqs.exists() \
            and shards.shard_problem(seqs) is None
    except FileNotFoundError:  # removed while it was read (another rank, or the run a snapshot reads)
        return False

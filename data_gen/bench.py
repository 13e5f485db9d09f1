"""``make bench-labels``: labeled target positions per second beside plain ``target.generate``, and where the
labeling time goes.

On the same prompts and sampling settings, batch by batch in one process (these machines are noisy, so the runs
are interleaved rather than minutes apart): ``target.generate`` one prompt at a time (batch 1, what a decoder
pays per response), ``target.generate`` at the labeling batch, and the labeler at that batch. The labeler's rate
counts its ``target`` rows (one per position of a target response, the stop head's positions), per second of the
whole labeling call; its time is split into target generation, draft reading and scoring
(``Labeler.timing``). The goal: labeling at >= 3x the target positions per second of ``target.generate`` at
batch 1. ``--generate_batches 1 4 8 16`` also times ``target.generate`` alone at those batch sizes (the
measurement behind a config's ``batch_size``).

    python -m data_gen.bench --config configs/labels/corpus.yaml --bench_prompts 16
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch
from jsonargparse import ArgumentParser

from core.adapter import HFCausalLM
from core.errors import UserError
from core.models import context_window, eos_token_ids
from data_gen.__main__ import parser as label_parser
from data_gen.labeler import Labeler
from data_gen.run import LabelConfig, build_records, load_pair, make_batches


def _generate_tokens(target, tok, prompts, cfg: LabelConfig) -> int:
    """Plain ``target.generate`` on one left-padded batch; returns the number of generated tokens."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(p.input_ids) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p.input_ids)) + p.input_ids for p in prompts], device=target.device)
    mask = (torch.arange(width, device=ids.device) >= torch.tensor([width - len(p.input_ids) for p in prompts], device=ids.device).unsqueeze(1)).long()
    s = cfg.sampling
    greedy = s.temperature == 0
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=s.max_new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else s.temperature,
        top_k=s.top_k or None,
        top_p=s.top_p if s.top_p < 1 else None,
        pad_token_id=pad,
        eos_token_id=eos_token_ids(target, tok),
    )
    new = out[:, width:]
    ended = torch.isin(new, torch.tensor(eos_token_ids(target, tok), device=new.device))
    # count tokens up to and including the first end-of-sequence token
    after_end = (ended.cumsum(-1) - ended.long()) > 0
    return int((~after_end).sum())


def bench_records(records: list[dict], n: int) -> list[dict]:
    """The ``n`` train prompts nearest the median prompt length. A labeling run sorts each split's prompts by length
    before it cuts them into batches, so a batch's prompts have nearly one length; the bench's batches then pay the
    padding a run pays, not that of prompts of any length side by side."""
    train = sorted((r for r in records if r["split"] == "train"),
                   key=lambda r: (len(r["prompt"].input_ids), r["prompt"].prompt_id))
    start = max(0, (len(train) - n) // 2)
    return train[start:start + n]


def main(argv: list[str] | None = None) -> int:
    p: ArgumentParser = label_parser()
    p.prog = "python -m data_gen.bench"
    p.add_argument("--bench_prompts", type=int, default=16, help="how many prompts to time (train prompts of about the median length)")
    p.add_argument("--generate_batches", type=list[int], default=[],
                   help="also time target.generate alone at these batch sizes, on the same prompts")
    try:
        ns = p.instantiate(p.parse_args(argv))
        n_prompts, gen_batches = ns.pop("bench_prompts"), ns.pop("generate_batches")
        if n_prompts < 1 or any(b < 1 for b in gen_batches):
            raise UserError(f"--bench_prompts and --generate_batches must be 1 or more, got {n_prompts} and "
                            f"{gen_batches}")
        cfg = LabelConfig(**{k: v for k, v in vars(ns).items() if k != "config"})
        draft, target, tok, _ = load_pair(cfg)  # as labeling loads them, int8 models with its numerics
        device = torch.device("cuda" if torch.cuda.is_available() and cfg.accelerator != "cpu" else "cpu")
        draft.to(device)
        target.to(device)
        records = bench_records(build_records(cfg, tok, min(context_window(draft), context_window(target))),
                                n_prompts)
        if not records:
            raise UserError("the config's train split holds no prompt to time (split_fractions, prompts.limit)")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    batches = make_batches(records, cfg.batch_size)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    labeler = Labeler(
        HFCausalLM(draft),
        HFCausalLM(target),
        cfg.sampling,
        seed=cfg.seed,
        eos_token_ids=eos_token_ids(target, tok),
        pad_token_id=pad,
        mixing_ratio=cfg.mixing_ratio,
        mask_dtype=next(draft.parameters()).dtype,
    )
    labeler.timing = {}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn):
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            out = fn()
        sync()
        return out, time.perf_counter() - t

    tot = defaultdict(float)  # gen1 / genB tokens and seconds; label target rows, all rows and seconds
    torch.manual_seed(cfg.seed)
    print(f"timing {len(records)} prompts in {len(batches)} batches of <= {cfg.batch_size}, "
          f"max_new_tokens={cfg.sampling.max_new_tokens}, {device}, {cfg.model_dtype}, "
          f"{torch.get_num_threads()} threads")
    for b in batches:
        n1, t1 = 0, 0.0
        for prompt in b["prompts"]:
            n, t = timed(lambda: _generate_tokens(target, tok, [prompt], cfg))
            n1, t1 = n1 + n, t1 + t
        print(f"  {b['key']:<24} generate b=1 {n1:5d} tok {t1:7.1f} s", flush=True)
        nb, tb = timed(lambda: _generate_tokens(target, tok, b["prompts"], cfg))
        print(f"  {b['key']:<24} generate b={len(b['prompts'])} {nb:5d} tok {tb:7.1f} s", flush=True)
        cols, tl = timed(lambda: labeler.label(b["prompts"], device))
        n_target = sum(c == "target" for c in cols["category"])
        for k, v in (("gen1_tok", n1), ("gen1_s", t1), ("genB_tok", nb), ("genB_s", tb), ("lab_target", n_target),
                     ("lab_rows", len(cols["category"])), ("lab_s", tl)):
            tot[k] += v
        print(f"  {b['key']:<24} label {n_target:5d} target positions ({len(cols['category'])} rows) {tl:7.1f} s",
              flush=True)
    sweep = {}
    for bs in gen_batches:
        n, t = 0, 0.0
        for i in range(0, len(records), bs):
            ni, ti = timed(lambda: _generate_tokens(target, tok, [r["prompt"] for r in records[i : i + bs]], cfg))
            n, t = n + ni, t + ti
        sweep[bs] = n / t
        print(f"  target.generate alone, batch {bs:3d}: {n:5d} tok {t:7.1f} s  {n / t:7.2f} tok/s", flush=True)

    g1, gb = tot["gen1_tok"] / tot["gen1_s"], tot["genB_tok"] / tot["genB_s"]
    lab = tot["lab_target"] / tot["lab_s"]
    print(f"\n{'':<34} {'tokens/s':>10} {'x batch-1 generate':>20}")
    print(f"{'target.generate, batch 1':<34} {g1:10.2f} {1.0:20.2f}")
    print(f"{f'target.generate, batch {cfg.batch_size}':<34} {gb:10.2f} {gb / g1:20.2f}")
    print(f"{f'labeled target positions, batch {cfg.batch_size}':<34} {lab:10.2f} {lab / g1:20.2f}")
    print(f"{f'labeled rows (all), batch {cfg.batch_size}':<34} {tot['lab_rows'] / tot['lab_s']:10.2f}")
    for bs, rate in sweep.items():
        print(f"{f'target.generate alone, batch {bs}':<34} {rate:10.2f} {rate / g1:20.2f}")
    gen, rd = labeler.timing.get("target_generation", 0.0), labeler.timing.get("draft_reading", 0.0)
    print(f"labeling time: target generation {gen / tot['lab_s']:.0%}, draft reading {rd / tot['lab_s']:.0%}, "
          f"scoring {(tot['lab_s'] - gen - rd) / tot['lab_s']:.0%} of {tot['lab_s']:.1f} s")
    print("goal: labeled target positions/s >= 3x target.generate at batch 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())

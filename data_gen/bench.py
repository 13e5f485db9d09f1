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

    specheads bench-labels --config configs/labels/corpus.yaml --bench_prompts 16
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch
from jsonargparse import ArgumentParser

from core.arguments import description, parse_settings
from core.errors import UserError
from core.backends import BACKENDS
from core.models import context_window, eos_token_ids, weights_as_loaded
from data_gen.__main__ import CONFIG, parser as label_parser
from data_gen.batches import build_records, make_batches
from data_gen.config import LabelConfig
from data_gen.llama_labeler import is_llama
from data_gen.loop import labeler_settings, new_labeler
from data_gen.run import load_pair


def _generate_tokens(target, tok, prompts, cfg: LabelConfig) -> int:
    """Plain ``target.generate`` on one left-padded batch; returns the number of generated tokens."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(p.input_ids) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p.input_ids)) + p.input_ids for p in prompts], device=target.device)
    mask = (torch.arange(width, device=ids.device) >= torch.tensor([width - len(p.input_ids) for p in prompts], device=ids.device).unsqueeze(1)).long()
    s = cfg.sampling
    greedy = s.temperature == 0
    with weights_as_loaded(target):
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
    p.prog, p.description = "specheads bench-labels", description(__doc__)
    p.add_argument("--bench_prompts", type=int, default=16, help="how many prompts to time (train prompts of about the median length)")
    p.add_argument("--generate_batches", type=list[int], default=[],
                   help="also time target.generate alone at these batch sizes, on the same prompts")
    p.add_argument("--backends", type=list[str], default=list(BACKENDS),
                   help="the labelers to time on the same batches, one after the other batch by batch (the first "
                        "is the reference); target.generate runs on transformers")
    try:
        ns = p.instantiate(parse_settings(p, argv, CONFIG))
        n_prompts, gen_batches, backends = ns.pop("bench_prompts"), ns.pop("generate_batches"), ns.pop("backends")
        if n_prompts < 1 or any(b < 1 for b in gen_batches):
            raise UserError(f"--bench_prompts and --generate_batches must be 1 or more, got {n_prompts} and "
                            f"{gen_batches}")
        if not backends or set(backends) - set(BACKENDS) or len(set(backends)) < len(backends):
            raise UserError(f"--backends takes distinct ones of {', '.join(BACKENDS)}, got {backends}")
        settings = {k: v for k, v in vars(ns).items() if k != "config"}
        cfgs = {b: LabelConfig(**{**settings, "backend": b}) for b in backends}
        pairs = {b: load_pair(c) for b, c in cfgs.items()}  # as labeling loads them, int8 models with its numerics
        cfg, (draft, target, tok, _) = cfgs[backends[0]], pairs[backends[0]]
        device = torch.device("cuda" if torch.cuda.is_available() and cfg.accelerator != "cpu" else "cpu")
        for d, t, _, _ in pairs.values():
            if not is_llama(d):
                d.to(device)
                t.to(device)
        window = min(context_window(m) for d, t, _, _ in pairs.values() for m in (d, t))
        records = bench_records(build_records(cfg, tok, window), n_prompts)  # one tokenization: one vocabulary
        if not records:
            raise UserError("the config's train split holds no prompt to time (split_fractions, prompts.limit)")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    batches = make_batches(records, cfg.batch_size)
    labelers = {b: new_labeler(d, t, labeler_settings(cfgs[b], t, tk)) for b, (d, t, tk, _) in pairs.items()}
    for labeler in labelers.values():
        labeler.timing = {}
    hf = pairs.get("transformers")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn):
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            out = fn()
        sync()
        return out, time.perf_counter() - t

    tot = defaultdict(float)  # gen1 / genB tokens and seconds; each backend's target rows, all rows and seconds
    torch.manual_seed(cfg.seed)
    threads = ", ".join(f"{b}: {pairs[b][0].threads if is_llama(pairs[b][0]) else torch.get_num_threads()} threads"
                        for b in backends)
    print(f"timing {len(records)} prompts in {len(batches)} batches of <= {cfg.batch_size}, "
          f"max_new_tokens={cfg.sampling.max_new_tokens}, {device}, transformers in {cfg.model_dtype}; {threads}")
    for b in batches:
        if hf is not None:
            n1, t1 = 0, 0.0
            for prompt in b["prompts"]:
                n, t = timed(lambda: _generate_tokens(hf[1], hf[2], [prompt], cfg))
                n1, t1 = n1 + n, t1 + t
            print(f"  {b['key']:<24} generate b=1 {n1:5d} tok {t1:7.1f} s", flush=True)
            nb, tb = timed(lambda: _generate_tokens(hf[1], hf[2], b["prompts"], cfg))
            print(f"  {b['key']:<24} generate b={len(b['prompts'])} {nb:5d} tok {tb:7.1f} s", flush=True)
            for k, v in (("gen1_tok", n1), ("gen1_s", t1), ("genB_tok", nb), ("genB_s", tb)):
                tot[k] += v
        for backend, labeler in labelers.items():
            cols, tl = timed(lambda: labeler.label(b["prompts"], device))
            n_target = sum(c == "target" for c in cols["category"])
            for k, v in (("target", n_target), ("rows", len(cols["category"])), ("s", tl)):
                tot[f"{backend}_{k}"] += v
            print(f"  {b['key']:<24} {backend:<12} label {n_target:5d} target positions ({len(cols['category'])} "
                  f"rows) {tl:7.1f} s", flush=True)
    sweep = {}
    for bs in gen_batches if hf is not None else []:
        n, t = 0, 0.0
        for i in range(0, len(records), bs):
            ni, ti = timed(lambda: _generate_tokens(hf[1], hf[2], [r["prompt"] for r in records[i : i + bs]], cfg))
            n, t = n + ni, t + ti
        sweep[bs] = n / t
        print(f"  target.generate alone, batch {bs:3d}: {n:5d} tok {t:7.1f} s  {n / t:7.2f} tok/s", flush=True)

    reference = tot[f"{backends[0]}_target"] / tot[f"{backends[0]}_s"]
    print(f"\n{'':<44} {'tokens/s':>10} {f'x {backends[0]} labeling':>22}")
    if hf is not None:
        g1, gb = tot["gen1_tok"] / tot["gen1_s"], tot["genB_tok"] / tot["genB_s"]
        print(f"{'target.generate, batch 1':<44} {g1:10.2f} {g1 / reference:22.2f}")
        print(f"{f'target.generate, batch {cfg.batch_size}':<44} {gb:10.2f} {gb / reference:22.2f}")
        for bs, rate in sweep.items():
            print(f"{f'target.generate alone, batch {bs}':<44} {rate:10.2f} {rate / reference:22.2f}")
    for backend, labeler in labelers.items():
        rate, seconds = tot[f"{backend}_target"] / tot[f"{backend}_s"], tot[f"{backend}_s"]
        print(f"{f'{backend}: labeled target positions, batch {cfg.batch_size}':<44} {rate:10.2f} "
              f"{rate / reference:22.2f}")
        print(f"{f'{backend}: labeled rows (all)':<44} {tot[f'{backend}_rows'] / seconds:10.2f}")
        gen, rd = (labeler.timing.get(k, 0.0) for k in ("target_generation", "draft_reading"))
        print(f"  {backend} labeling time: target generation {gen / seconds:.0%}, draft reading {rd / seconds:.0%}, "
              f"scoring {(seconds - gen - rd) / seconds:.0%} of {seconds:.1f} s")
    print("goals: transformers labeling >= 3x target.generate at batch 1; llama.cpp labeling >= 4x transformers "
          "labeling")
    return 0


if __name__ == "__main__":
    sys.exit(main())

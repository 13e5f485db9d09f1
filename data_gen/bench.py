"""``make bench-labels``: labeled tokens/s divided by tokens/s of plain ``target.generate``, side by side.

Same prompts, same batch size, same sampling settings, batch by batch in one process (these machines are noisy,
so the two are interleaved rather than run minutes apart). The goal is a ratio >= 0.80: the target's own
sampling is the floor, and labeling should add at most a quarter on top.

    python -m data_gen.bench --config configs/labels/humaneval.yaml --bench_prompts 16
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


def main(argv: list[str] | None = None) -> int:
    p: ArgumentParser = label_parser()
    p.add_argument("--bench_prompts", type=int, default=16, help="how many prompts to time (the first ones)")
    ns = p.instantiate(p.parse_args(argv))
    n_prompts = ns.pop("bench_prompts")
    try:
        cfg = LabelConfig(**{k: v for k, v in vars(ns).items() if k != "config"})
        draft, target, tok, _ = load_pair(cfg)  # as labeling loads them, int8 models with its numerics
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.accelerator != "cpu" else "cpu")
    draft.to(device)
    target.to(device)
    records = build_records(cfg, tok, min(context_window(draft), context_window(target)))
    records = sorted(records, key=lambda r: r["prompt"].prompt_id)[:n_prompts]
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
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    stats = defaultdict(lambda: [0, 0.0, 0, 0.0])  # category -> gen tokens, gen s, labeled rows, label s
    torch.manual_seed(cfg.seed)
    print(f"timing {len(records)} prompts in {len(batches)} batches of <= {cfg.batch_size}, "
          f"max_new_tokens={cfg.sampling.max_new_tokens}, {device}, {cfg.model_dtype}")
    for b in batches:
        cat = b["prompts"][0].category
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            n_gen = _generate_tokens(target, tok, b["prompts"], cfg)
        sync()
        t_gen = time.perf_counter() - t
        t = time.perf_counter()
        rows = len(labeler.label(b["prompts"], device)["prompt_id"])
        sync()
        t_lab = time.perf_counter() - t
        s = stats[cat]
        s[0] += n_gen; s[1] += t_gen; s[2] += rows; s[3] += t_lab
        print(f"  {b['key']:<24} generate {n_gen:5d} tok {t_gen:7.1f} s | label {rows:5d} rows {t_lab:7.1f} s")

    def line(name, g, tg, r, tl):
        gen_rate, lab_rate = g / tg, r / tl
        print(f"{name:<14} {gen_rate:12.2f} {lab_rate:14.2f} {lab_rate / gen_rate:8.2f}")

    print(f"\n{'category':<14} {'generate t/s':>12} {'labeled t/s':>14} {'ratio':>8}")
    for cat, s in sorted(stats.items()):
        line(cat, *s)
    tot = [sum(s[i] for s in stats.values()) for i in range(4)]
    line("all", *tot)
    resp = [sum(s[i] for c, s in stats.items() if c != "original") for i in range(4)]
    if resp[1] > 0 and resp[3] > 0:
        line("responses", *resp)
    print("ratio = labeled tokens/s (ours) / generated tokens/s (target.generate); goal >= 0.80")
    return 0


if __name__ == "__main__":
    sys.exit(main())

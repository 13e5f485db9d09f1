"""Timing a model's forwards, for the benches that write timing files (``evaluation.bench_timing``, its llama.cpp
half ``evaluation.bench_timing_llama``) and the GPU check: medians timed in turns, the decoder's own forwards, the
draft's catch-up read, and the timing file a bench writes."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from core.runfolder import OutputFile, write_text
from core.sampling import Sampling


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn, device: torch.device, repeats: int) -> dict:
    return time_in_turns({"": fn}, device, repeats)[""]


def time_in_turns(fns: dict[str, Callable[[], Any]], device: torch.device, repeats: int) -> dict[str, dict]:
    """Each of ``fns`` timed ``repeats`` times in turns, one of each per round: a shared CPU's speed drifts (by a
    quarter within an hour here), and timed in turns every figure sees the same drift, where timed one after the
    other a figure timed in a slow minute would stand out of line with its neighbours."""
    for fn in fns.values():
        fn()  # warm-up (allocator, kernels)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t)
    return {name: {"median_s": statistics.median(ts), "min_s": min(ts), "repeats": repeats}
            for name, ts in times.items()}


PAIR_VERIFY_LENGTHS = tuple(range(2, 22))
"""Verification lengths (candidates + 1) ``time_pair`` times the target at: every length up to SpecDec++'s longest
round (20 candidates). Every one, because on a CPU the cost is not smooth in the length (4, 8 and 16 tokens cost
less than 3, 6 and 11): an interpolation between a few lengths would miss that."""


@torch.no_grad()
def decoder_forward_times(model, decoder: str, prefix: int, lengths, repeats: int,
                          rows: int | None = None) -> dict[int, float]:
    """Median seconds of the decoder's own forward (``decoding.backends.CachedLM.advance``: the model under
    ``decoder``, with the logits and warp of every row, as a verification reads them; of the last ``rows`` rows
    where given, as a draft step reads them) of m new tokens after ``prefix`` cached ones, for each m of
    ``lengths``, timed in turns (other tokens each time: a real forward)."""
    from decoding.backends import CachedLM, model_device
    from decoding.state import decoder_runner

    device = model_device(model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (prefix,), generator=g).tolist()
    static = decoder_runner(model, decoder, prefix + max(lengths) + 1)
    lm = CachedLM(model, Sampling(temperature=1.0), static=static)
    lm.advance(ids)
    times: dict[int, list[float]] = {m: [] for m in lengths}
    for r in range(repeats + 2):  # two rounds of warm-up
        for m in lengths:
            new = torch.randint(0, vocab, (m,), generator=g).tolist()
            sync(device)
            t = time.perf_counter()
            lm.advance(ids + new, rows=m if rows is None else min(rows, m))
            sync(device)
            if r >= 2:
                times[m].append(time.perf_counter() - t)
    return {m: statistics.median(ts) for m, ts in times.items()}


def catch_up_entry(draft, decoder: str, cache: int, repeats: int) -> dict:
    """The draft's forward of two new tokens with the last row out: how it reads the last candidate and the bonus
    token after a fully accepted round (``decoding.costs.CostModel.draft_catch_up``)."""
    seconds = decoder_forward_times(draft, decoder, cache, [2], repeats, rows=1)[2]
    return {"tokens": 2, "cache": cache, "median_s": seconds}


def timing_file(out: Path) -> OutputFile:
    """A timing file this command writes: a new one, or one it wrote before (replaced)."""
    return OutputFile(out, "bench-timing", "timing file")


def write_json(result: dict, out: OutputFile) -> None:
    """Write a benchmark's figures as JSON, whole or not at all (``core.runfolder``), and say where."""
    write_text(out.claim(), json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.path}")


GENERATE_TOKENS = 9
"""Tokens of the longer ``generate()`` call ``generate_costs`` times beside a one-token call."""


@torch.no_grad()
def generate_costs(model, device: torch.device, cache: int, step_s: float, repeats: int) -> dict:
    """What a transformers ``generate()`` call adds to the model's bare forwards, after ``cache`` cached tokens
    (``step_s``: its bare one-token step there): ``sample``, the seconds per token beyond the step (generate's logits
    processors, stopping criteria and bookkeeping around each forward: what the decoding priced by a timing of bare
    forwards does not see), and ``generate_call``, the seconds a call costs beyond its tokens (its setup: what an
    assisted-generation round pays again for each call of its assistant). From greedy calls of 1 and
    ``GENERATE_TOKENS`` new tokens over a cache cut back to ``cache`` tokens after each, timed in turns."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, cache + 1), generator=g).to(device)
    past = DynamicCache(config=model.config)
    model(ids[:, :cache], past_key_values=past, use_cache=True)

    def call(tokens: int):
        def fn():
            model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=past, max_new_tokens=tokens,
                           min_new_tokens=tokens, do_sample=False, output_scores=True, return_dict_in_generate=True,
                           pad_token_id=0, eos_token_id=None, temperature=None, top_k=None, top_p=None)
            past.crop(cache - past.get_seq_length())
        return fn

    timed = time_in_turns({1: call(1), GENERATE_TOKENS: call(GENERATE_TOKENS)}, device, repeats)
    per_token = (timed[GENERATE_TOKENS]["median_s"] - timed[1]["median_s"]) / (GENERATE_TOKENS - 1)
    return {"sample": {"tokens": GENERATE_TOKENS, "median_s": max(0.0, per_token - step_s), "by": "generate()"},
            "generate_call": {"cache": cache, "median_s": max(0.0, timed[1]["median_s"] - per_token)}}

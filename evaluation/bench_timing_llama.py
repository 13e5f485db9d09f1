"""``specheads bench-timing --backend llama_cpp``: the pair's GGUF files timed as llama.cpp runs them, in the layout
``evaluation.bench_timing`` writes for transformers models (``decoding.costs`` reads both)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from core.device import describe_device
from decoding.costs import find_entry, sampler_s, step_s, timing_entry, verify_table
from evaluation.bench_timing_binaries import TIMED_THROUGH_BINDING, time_binaries
from evaluation.timers import (PAIR_VERIFY_LENGTHS, catch_up_entry, decoder_forward_times, median_time,
                               timing_file, write_json)


DRAFT_READ_LENGTHS = (2, 3, 5, 9, 17)
"""Tokens of the draft's one-row reads timed: llama.cpp's draft re-reads each verified batch (up to n_max + 1)."""


def batch_read_times(model, cache: int, repeats: int) -> dict[int, float]:
    """Median seconds of llama.cpp's draft re-reading a verified batch of m tokens after ``cache`` cached ones, for
    each m of ``DRAFT_READ_LENGTHS``: one batch, the last row's logits only (``LlamaCppModel.read_last``), timed in
    turns, other tokens each time."""
    import statistics
    import time

    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, model.config.vocab_size, (cache,), generator=g).tolist()
    model.reset()
    model.read(prefix)
    times: dict[int, list[float]] = {m: [] for m in DRAFT_READ_LENGTHS}
    for r in range(repeats + 2):  # two rounds of warm-up
        for m in DRAFT_READ_LENGTHS:
            new = torch.randint(0, model.config.vocab_size, (m,), generator=g).tolist()
            t = time.perf_counter()
            model.read_last(new)
            if r >= 2:
                times[m].append(time.perf_counter() - t)
            model.crop(cache)
    model.reset()
    return {m: statistics.median(ts) for m, ts in times.items()}


def time_llama_pair(draft, target, prompt_tokens: int, new_tokens: int, verify: int = 9, repeats: int = 5,
                    verify_lengths: tuple[int, ...] = ()) -> dict:
    """``time_pair`` for a pair run by llama.cpp (``core.llama_cpp``): every figure is the decoder's own forward
    (``CachedLM.advance`` over the backend: the batch, its logits and their warp), the prefill a read of
    ``prompt_tokens``; the target's verification at ``PAIR_VERIFY_LENGTHS`` and ``verify_lengths`` tokens (prompt
    lookup verifies up to its copy length and one); the result names the backend and each model's threads."""
    cache = prompt_tokens + new_tokens // 2
    device = torch.device("cpu")
    result = {"device": describe_device(device, target.threads), "device_type": "cpu", "prefill": prompt_tokens,
              "verify": verify, "decoder": "eager", "backend": "llama_cpp", "threads": target.threads, "models": []}
    for name, model in (("draft", draft), ("target", target)):
        lengths = sorted({1, 3, verify, *((*PAIR_VERIFY_LENGTHS, *verify_lengths) if name == "target" else ())})
        seconds = decoder_forward_times(model, "eager", cache, lengths, repeats)
        prompt = [i % model.config.vocab_size for i in range(100, 100 + prompt_tokens)]
        prefill = median_time(lambda: (model.reset(), model.read(prompt)), device, max(1, repeats // 2))["median_s"]
        catch_up = None if name == "target" else catch_up_entry(model, "eager", cache, repeats)["median_s"]
        reads = {} if name == "target" else {"read_by_tokens": {
            str(m): {"cache": cache, "median_s": s} for m, s in batch_read_times(model, cache, repeats).items()}}
        result["models"].append(timing_entry(name, model.description, (prompt_tokens, prefill), cache, seconds,
                                             verify, 3, by_tokens=name == "target", catch_up=catch_up,
                                             shape=model.path.name, threads=model.threads, **reads))
    return result


def llama_main(a: argparse.Namespace) -> list[dict]:
    """``--backend llama_cpp``: the pair file's GGUF files as llama.cpp runs them, at each of ``--threads``, each
    thread count's file written as soon as it is timed (a Ctrl-C keeps the ones done)."""
    from core.models import ModelSpec, gguf_file, load_llama_model, read_pair_file

    specs = {role: ModelSpec(**entry) for role, entry in read_pair_file(a.pair).items()}
    results = []
    for threads in tqdm(a.threads, desc="bench-timing", unit="thread count", file=sys.stderr):
        if a.tools is not None:
            paths = {role: gguf_file(spec)[0] for role, spec in specs.items()}
            result = time_binaries(a.tools, paths, threads, a.prefill, a.cache[0],
                                   (*PAIR_VERIFY_LENGTHS, *a.verify_lengths), DRAFT_READ_LENGTHS,
                                   a.verify, a.repeats)
        else:
            models = {role: load_llama_model(spec, threads=threads, n_ctx=a.prefill + 2 * max(a.cache) + 64)[0]
                      for role, spec in specs.items()}
            result = time_llama_pair(models["draft"], models["target"], a.prefill, 2 * (a.cache[0] - a.prefill),
                                     a.verify, a.repeats, tuple(a.verify_lengths))
            del models
        for role, spec in specs.items():
            find_entry(result, role)["shape"] = spec.display_name
        print(llama_table(result))
        write_json(result, timing_file(Path(a.out or "runs/bench") / f"timing-{a.backend}-{threads}t.json"))
        results.append(result)
    return results


def llama_table(result: dict) -> str:
    """The figures of a llama.cpp profile: the draft step, each verification length, c and T(m)/T(1)."""
    draft, target = (find_entry(result, n) for n in ("draft", "target"))
    t1, d1 = step_s(target), step_s(draft)
    lines = [f"llama.cpp timed by {result.get('timed_with', TIMED_THROUGH_BINDING)}, {result['threads']} thread(s), "
             f"{result['device']}: times in ms (median)",
             f"draft step {d1 * 1e3:.1f}, target step {t1 * 1e3:.1f}, c = {d1 / t1:.3f}; "
             f"prefill of {result['prefill']}: draft {draft['prefill']['median_s'] * 1e3:.0f}, "
             f"target {target['prefill']['median_s'] * 1e3:.0f}",
             *([f"draft catch-up (2 tokens read, 1 row out) {draft['catch_up']['median_s'] * 1e3:.1f}: "
                f"{draft['catch_up']['median_s'] / d1:.2f} steps"] if "catch_up" in draft else []),
             *([f"sampler per token: draft {sampler_s(draft) * 1e3:.2f}, target {sampler_s(target) * 1e3:.2f}"]
               if "sample" in target else []),
             "target verification of m tokens: T(m) ms, T(m)/T(1)"]
    table = verify_table(target)
    lines += [f"  m={m:>2}: {table[m] * 1e3:8.1f}  {table[m] / t1:5.2f}" for m in sorted(table)]
    return "\n".join(lines)

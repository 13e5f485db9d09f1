"""The pair's decode step and verification on a GPU, eager against CUDA graphs (a static cache and
``torch.compile(mode="reduce-overhead")``): what the cost ratio c becomes once kernel launches stop setting it.

    specheads bench-compiled-step --out runs/bench/compiled-step.json

Our decoders run eagerly; this measures what a compiled runtime would give the same shapes (random weights, bf16,
batch 1), to say which c a GPU stands for. Each compile takes about 30 s on an H100. Every timed call appends to
the cache, so the cache grows by a few hundred positions over the timing (immaterial at this length).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from core.arguments import CommandParser, description
from core.errors import SettingError
from core.interrupt import run_main
from evaluation.bench_timing import DEFAULT_MODELS, build, model_config

WARMUP = 3


def time_forwards(model, prefix: int, lengths: tuple[int, ...], repeats: int, compiled: bool) -> dict[int, float]:
    """Median seconds of a forward of each of ``lengths`` tokens after ``prefix`` cached ones."""
    from transformers import StaticCache

    device = next(model.parameters()).device
    cache = StaticCache(config=model.config, max_cache_len=prefix + (WARMUP + repeats + 1) * sum(lengths))
    vocab = model.config.vocab_size
    model(torch.randint(0, vocab, (1, prefix), device=device), cache=cache, use_cache=True)
    forward = torch.compile(model.forward, mode="reduce-overhead", dynamic=False) if compiled else model.forward
    out = {}
    for n in lengths:
        ids = torch.randint(0, vocab, (1, n), device=device)
        times = []
        for i in range(WARMUP + repeats):
            torch.cuda.synchronize()
            t = time.perf_counter()
            forward(ids, cache=cache, use_cache=True)
            torch.cuda.synchronize()
            if i >= WARMUP:
                times.append(time.perf_counter() - t)
        out[n] = statistics.median(times)
    return out


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog="specheads bench-compiled-step", description=description(__doc__))
    p.add_argument("--prefix", type=int, default=256, help="cached tokens before the timed forwards")
    p.add_argument("--verify", type=int, default=8, help="tokens of the timed verification")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats of each forward (median reported)")
    p.add_argument("--out", default="runs/bench/compiled-step.json",
                   help="the JSON file of the times (default runs/bench/compiled-step.json)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SettingError("this compares CUDA graphs with eager forwards: it needs a CUDA GPU")
    lengths = (1, a.verify)
    result = {"device": torch.cuda.get_device_name(), "prefix": a.prefix, "models": {}}
    for spec in DEFAULT_MODELS:
        name, shape = spec.split("=")
        model = build(model_config(shape), torch.device("cuda"), "bfloat16")
        result["models"][name] = {mode: {str(n): t for n, t in time_forwards(model, a.prefix, lengths, a.repeats,
                                                                            mode == "compiled").items()}
                                  for mode in ("eager", "compiled")}
        del model
    m = result["models"]
    for mode in ("eager", "compiled"):
        step, target = m["draft"][mode]["1"], m["target"][mode]
        print(f"{mode:>9}: draft step {step * 1e3:.2f} ms, target step {target['1'] * 1e3:.2f} ms, target forward of "
              f"{a.verify} {target[str(a.verify)] * 1e3:.2f} ms; c = {step / target['1']:.3f} per step, "
              f"{step / target[str(a.verify)]:.3f} against the verification")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    run_main(main)

"""``make bench-timing``: per-forward times of model shapes on this device, for Eq. 5.1 latency predictions.

    specheads bench-timing                                  # Qwen2.5 0.5B draft + 1.5B target shapes
    specheads bench-timing --model draft=~/.cache/specheads/converted/<id> --model tiny=qwen2.5-0.5b
    specheads bench-timing --out runs/bench/timing-h100.json

Weights are random (timing does not depend on their values), so only a shape is needed: a built-in name, a
``config.json`` or a checkpoint folder holding one. For each model it times, with a KV cache:

- ``prefill``: one forward over ``--prefill`` prompt tokens;
- ``decode``: one forward of one token after a cache of each ``--cache`` length (the draft step, and the target's
  cost per call in Eq. 5.1);
- ``verify``: one forward of ``--verify`` tokens after the first cache length (an SD verification call), and
  ``verify_short``, one of ``--verify_short`` tokens, which separate a verification's fixed and per-token parts;
- ``verify_by_tokens`` (with ``--verify_lengths``): one forward of each of those lengths, where a line through two
  lengths does not describe the cost (``decoding.costs``).

The verification lengths are timed in turns, one forward of each per round, so the machine's drift during the timing
does not bend the table.

Each model is timed at every ``--precision``: a dtype, or an int8 quantization of ``core.quantization`` (CPU
only, on float32 weights). The table ends with the cost ratio c = t_draft / t_target of the decode step for each
draft and target precision. CUDA timers are synchronized. The JSON keeps every figure, so ``evaluation`` can
predict this device's latency from acceptance traces measured elsewhere (``timing:``; an entry is named
``draft`` or ``draft@<precision>``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from core.arguments import CommandParser, check_counts, description
from core.backends import BACKENDS, backend
from core.errors import SettingError
from core.interrupt import run_main
from core.device import describe_device
from core.models import resolve_device, resolve_dtype
from core.runfolder import OutputFile, write_text
from core.sampling import Sampling
from core.quantization import QUANTIZATIONS, quantize
from decoding.backends import keeps_own_cache
from decoding.costs import find_entry, step_s, timing_entry, verify_table

# Shapes of the real pair (Qwen2.5-Coder-0.5B / 1.5B share them with Qwen2.5-0.5B / 1.5B).
BUILTIN = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=64, tie_word_embeddings=False),
}
DEFAULT_MODELS = ("draft=qwen2.5-0.5b", "target=qwen2.5-1.5b")
DTYPES = ("float32", "bfloat16", "float16")


def default_precisions(device: torch.device) -> list[str]:
    """Every precision worth timing on ``device``: on the CPU both dtypes and each int8 quantization."""
    if device.type == "cpu":
        return ["float32", "bfloat16", *QUANTIZATIONS]
    return [resolve_dtype("auto", device)]


def model_config(source: str):
    """A transformers config from a built-in name, a config.json, or a folder holding one."""
    from transformers import AutoConfig, Qwen2Config

    if source in BUILTIN:
        return Qwen2Config(**BUILTIN[source], max_position_embeddings=32768)
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise SettingError(f"{source!r} is neither a built-in shape ({', '.join(BUILTIN)}) nor a config.json")
    raw = json.loads(path.read_text())
    raw.pop("quantization_config", None)
    model_type = raw.pop("model_type", None) or "qwen2"
    return AutoConfig.for_model(model_type, **raw)


def build(config, device: torch.device, precision: str):
    """A random-init causal LM of this shape on ``device`` at ``precision`` (a dtype or a quantization; cheap init:
    values do not matter for timing)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    dtype = getattr(torch, precision if precision in DTYPES else "float32")
    with no_init_weights(), torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # finite values: uninitialised memory could hold NaNs/denormals (slow on CPU)
            p.normal_(0.0, 0.02, generator=g)
    model.eval()
    return model if precision in DTYPES else quantize(model, precision)


def count_parameters(config) -> int:
    """The parameters of a model of this shape (built on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device: torch.device, repeats: int) -> dict:
    return _time_in_turns({"": fn}, device, repeats)[""]


def _time_in_turns(fns: dict[str, Callable[[], Any]], device: torch.device, repeats: int) -> dict[str, dict]:
    """Each of ``fns`` timed ``repeats`` times in turns, one of each per round: a shared CPU's speed drifts (by a
    quarter within an hour here), and timed in turns every figure sees the same drift, where timed one after the
    other a figure timed in a slow minute would stand out of line with its neighbours."""
    for fn in fns.values():
        fn()  # warm-up (allocator, kernels)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            t = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t)
    return {name: {"median_s": statistics.median(ts), "min_s": min(ts), "repeats": repeats}
            for name, ts in times.items()}


@torch.no_grad()
def bench_model(model, device: torch.device, prefill: int, caches: list[int], verify: int, repeats: int,
                verify_short: int = 3, verify_lengths: tuple[int, ...] = ()) -> dict:
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> torch.Tensor:
        return torch.randint(0, vocab, (1, n), generator=g).to(device)

    out = {"prefill": {"tokens": prefill, **_time(lambda: model(ids(prefill), use_cache=True), device, repeats)}}

    def cached(length: int):
        cache = DynamicCache(config=model.config)
        model(ids(length), past_key_values=cache, use_cache=True)
        return cache

    def step(cache, length: int, n: int):
        def fn():
            model(ids(n), past_key_values=cache, use_cache=True)
            cache.crop(-n)  # back to the same cache length for the next repeat
        return fn

    out["decode"] = {}
    for length in caches:
        cache = cached(length)
        out["decode"][str(length)] = _time(step(cache, length, 1), device, repeats)
    cache = cached(caches[0])
    lengths = sorted({verify, *([verify_short] if 1 < verify_short < verify else []), *verify_lengths})
    timed = _time_in_turns({m: step(cache, caches[0], m) for m in lengths}, device, repeats)
    out["verify"] = {"tokens": verify, "cache": caches[0], **timed[verify]}
    if 1 < verify_short < verify:
        out["verify_short"] = {"tokens": verify_short, "cache": caches[0], **timed[verify_short]}
    if verify_lengths:
        out["verify_by_tokens"] = {str(m): {"cache": caches[0], **timed[m]} for m in sorted(set(verify_lengths))}
    return out


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
            _sync(device)
            t = time.perf_counter()
            lm.advance(ids + new, rows=m if rows is None else min(rows, m))
            _sync(device)
            if r >= 2:
                times[m].append(time.perf_counter() - t)
    return {m: statistics.median(ts) for m, ts in times.items()}


def time_pair(draft, target, device: torch.device, prompt_tokens: int, new_tokens: int, verify: int = 9,
              repeats: int = 5, decoder: str = "eager") -> dict:
    """The loaded draft and target timed at a decoding run's shapes (prefill of ``prompt_tokens``, one-token
    steps and 3- and ``verify``-token forwards halfway through ``new_tokens``; the target's verifications of each of
    ``PAIR_VERIFY_LENGTHS`` tokens too), in this module's JSON layout. Under another ``decoder`` than eager (a
    static cache, CUDA graphs), the steps and verifications are the decoder's own forwards under it, since those are
    what its runs pay. A pair whose runtime keeps its own cache (llama.cpp's) is timed as ``time_llama_pair``
    times it."""
    if keeps_own_cache(draft):
        return time_llama_pair(draft, target, prompt_tokens, new_tokens, verify, repeats)
    cache = prompt_tokens + new_tokens // 2
    result = {"device": str(device), "device_type": device.type, "prefill": prompt_tokens, "verify": verify,
              "decoder": decoder, "models": []}
    for name, model in (("draft", draft), ("target", target)):
        entry = {"name": name, "precision": str(getattr(model, "dtype", "")),
                 **bench_model(model, device, prompt_tokens, [cache], verify, repeats,
                               verify_lengths=PAIR_VERIFY_LENGTHS if name == "target" else ())}
        if decoder != "eager":
            timed = [entry[k] for k in ("verify", "verify_short") if k in entry]
            by_tokens = entry.get("verify_by_tokens", {})
            lengths = sorted({1, *(t["tokens"] for t in timed), *map(int, by_tokens)})
            seconds = decoder_forward_times(model, decoder, cache, lengths, repeats)
            entry["decode"][str(cache)]["median_s"] = seconds[1]
            for t in timed:
                t["median_s"] = seconds[t["tokens"]]
            for m, t in by_tokens.items():
                t["median_s"] = seconds[int(m)]
        if name == "draft":
            entry["catch_up"] = catch_up_entry(model, decoder, cache, repeats)
        result["models"].append(entry)
    return result


def catch_up_entry(draft, decoder: str, cache: int, repeats: int) -> dict:
    """The draft's forward of two new tokens with the last row out: how it reads the last candidate and the bonus
    token after a fully accepted round (``decoding.costs.CostModel.draft_catch_up``)."""
    seconds = decoder_forward_times(draft, decoder, cache, [2], repeats, rows=1)[2]
    return {"tokens": 2, "cache": cache, "median_s": seconds}


def time_llama_pair(draft, target, prompt_tokens: int, new_tokens: int, verify: int = 9, repeats: int = 5) -> dict:
    """``time_pair`` for a pair run by llama.cpp (``core.llama_cpp``): every figure is the decoder's own forward
    (``CachedLM.advance`` over the backend: the batch, its logits and their warp), the prefill a read of
    ``prompt_tokens``; the result names the backend and each model's threads."""
    cache = prompt_tokens + new_tokens // 2
    device = torch.device("cpu")
    result = {"device": describe_device(device, target.threads), "device_type": "cpu", "prefill": prompt_tokens,
              "verify": verify, "decoder": "eager", "backend": "llama_cpp", "threads": target.threads, "models": []}
    for name, model in (("draft", draft), ("target", target)):
        lengths = sorted({1, 3, verify, *(PAIR_VERIFY_LENGTHS if name == "target" else ())})
        seconds = decoder_forward_times(model, "eager", cache, lengths, repeats)
        prompt = [i % model.config.vocab_size for i in range(100, 100 + prompt_tokens)]
        prefill = _time(lambda: (model.reset(), model.read(prompt)), device, max(1, repeats // 2))["median_s"]
        catch_up = None if name == "target" else catch_up_entry(model, "eager", cache, repeats)["median_s"]
        result["models"].append(timing_entry(name, model.description, (prompt_tokens, prefill), cache, seconds,
                                             verify, 3, by_tokens=name == "target", catch_up=catch_up,
                                             shape=model.path.name, threads=model.threads))
    return result


def llama_main(a: argparse.Namespace) -> list[dict]:
    """``--backend llama_cpp``: the pair file's GGUF files as llama.cpp runs them, at each of ``--threads``, each
    thread count's file written as soon as it is timed (a Ctrl-C keeps the ones done)."""
    import yaml

    from core.models import ModelSpec, load_llama_model

    try:
        pair = yaml.safe_load(Path(a.pair).read_text())
        specs = {role: ModelSpec(**pair[role]) for role in ("draft", "target")}
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise SettingError(f"--pair {a.pair}: not a pair file with draft and target ({e})") from None
    results = []
    for threads in tqdm(a.threads, desc="bench-timing", unit="thread count", file=sys.stderr):
        models = {role: load_llama_model(spec, threads=threads, n_ctx=a.prefill + 2 * max(a.cache) + 64)[0]
                  for role, spec in specs.items()}
        result = time_llama_pair(models["draft"], models["target"], a.prefill, 2 * (a.cache[0] - a.prefill),
                                 a.verify, a.repeats)
        for m, (role, spec) in zip(result["models"], specs.items()):
            m["shape"] = spec.display_name
        print(llama_table(result))
        write_json(result, timing_file(Path(a.out or "runs/bench") / f"timing-{a.backend}-{threads}t.json"))
        results.append(result)
        del models
    return results


def llama_table(result: dict) -> str:
    """The figures of a llama.cpp profile: the draft step, each verification length, c and T(m)/T(1)."""
    draft, target = (find_entry(result, n) for n in ("draft", "target"))
    t1, d1 = step_s(target), step_s(draft)
    lines = [f"llama.cpp, {result['threads']} thread(s), {result['device']}: times in ms (median)",
             f"draft step {d1 * 1e3:.1f}, target step {t1 * 1e3:.1f}, c = {d1 / t1:.3f}; "
             f"prefill of {result['prefill']}: draft {draft['prefill']['median_s'] * 1e3:.0f}, "
             f"target {target['prefill']['median_s'] * 1e3:.0f}",
             *([f"draft catch-up (2 tokens read, 1 row out) {draft['catch_up']['median_s'] * 1e3:.1f}: "
                f"{draft['catch_up']['median_s'] / d1:.2f} steps"] if "catch_up" in draft else []),
             "target verification of m tokens: T(m) ms, T(m)/T(1)"]
    table = verify_table(target)
    lines += [f"  m={m:>2}: {table[m] * 1e3:8.1f}  {table[m] / t1:5.2f}" for m in sorted(table)]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="specheads bench-timing", description=description(__doc__))
    p.add_argument("--model", action="append", default=None, metavar="NAME=SHAPE",
                   help=f"a model to time (repeatable); SHAPE: {', '.join(BUILTIN)}, a config.json or a checkpoint "
                        f"folder; default: {' '.join(DEFAULT_MODELS)}")
    p.add_argument("--prefill", type=int, default=256, help="prompt tokens of the prefill forward")
    p.add_argument("--cache", type=int, nargs="+", default=[256, 1024], help="KV-cache lengths of the decode step")
    p.add_argument("--verify", type=int, default=8, help="tokens of one verification forward")
    p.add_argument("--verify_short", type=int, default=None,
                   help="tokens of a shorter verification forward, 2 to --verify - 1 (separates a verification's "
                        "fixed and per-token costs; 0 = skip; default 3 where --verify is above 3, else skip)")
    p.add_argument("--verify_lengths", type=int, nargs="*", default=[],
                   help="also time a verification of each of these lengths (a cost table the latency model "
                        f"interpolates; the evaluation times the target at {' '.join(map(str, PAIR_VERIFY_LENGTHS))})")
    p.add_argument("--repeats", type=int, default=10, help="timed repeats per figure (median reported)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--precision", nargs="+", default=None, choices=["auto", *DTYPES, *QUANTIZATIONS],
                   help="dtypes and int8 quantizations to time (default: on the CPU float32, bfloat16 and every "
                        "quantization; on CUDA the auto dtype, bfloat16)")
    p.add_argument("--out", default=None, help="JSON output (default runs/bench/timing-<device>.json; with "
                                                   "--backend llama_cpp a folder, default runs/bench, one file per "
                                                   "thread count)")
    p.add_argument("--backend", default="transformers", choices=list(BACKENDS),
                   help="llama_cpp: time the --pair file's GGUF files as llama.cpp runs them (the decoder's own "
                        "forwards), at each --threads")
    p.add_argument("--pair", default="configs/models/qwen2.5-coder-0.5b-1.5b.yaml",
                   help="the model pair file (--backend llama_cpp)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="CPU threads (--backend llama_cpp)")
    a = p.parse_args(argv)
    # each bad value in one line (run_main), not under argparse's usage
    if any(m < 2 for m in a.verify_lengths):
        raise SettingError(f"--verify_lengths are tokens per verification forward (candidates + 1), each >= 2; "
                           f"got {' '.join(map(str, a.verify_lengths))}")
    check_counts({"--repeats": a.repeats, "--prefill": a.prefill, "--cache": a.cache, "--verify": a.verify})
    if a.verify_short is None:
        a.verify_short = 3 if a.verify > 3 else 0
    elif a.verify_short != 0 and not 1 < a.verify_short < a.verify:
        raise SettingError(f"--verify_short must be 0 (skip) or from 2 to --verify - 1 ({a.verify - 1}), got "
                           f"{a.verify_short}")
    if any(t < 1 for t in a.threads):
        raise SettingError(f"--threads must be at least 1, got {' '.join(map(str, a.threads))}")
    per_threads = backend(a.backend).own_threads  # one file per thread count, into a folder
    if per_threads and a.out is not None and Path(a.out).is_file():
        raise SettingError(f"--out {a.out} is a file: with --backend {a.backend} give the folder to write into")
    outs = ([Path(a.out or "runs/bench") / f"timing-{a.backend}-{t}t.json" for t in a.threads]
            if per_threads else [Path(a.out)] if a.out is not None else [])
    for out in outs:
        timing_file(out).check()
    return a


def timing_file(out: Path) -> OutputFile:
    """A timing file this command writes: a new one, or one it wrote before (replaced)."""
    return OutputFile(out, "bench-timing", "timing file")


def table(result: dict) -> str:
    caches = sorted({int(c) for m in result["models"] for c in m["decode"]})
    head = f"{'model@precision':<46}{'shape':<30}{'params':>9}{'prefill':>10}" + "".join(f"{f'step@{c}':>11}" for c in caches)
    head += f"{'verify':>10}"
    lines = [f"device: {result['device']}; times in ms (median)", head, "-" * len(head)]
    for m in result["models"]:
        row = f"{m['name'] + '@' + m['precision']:<46.46}{m['shape'][-29:]:<30}{m['params'] / 1e6:>8.0f}M{m['prefill']['median_s'] * 1e3:>10.1f}"
        row += "".join(f"{m['decode'][str(c)]['median_s'] * 1e3:>11.2f}" if str(c) in m["decode"] else f"{'':>11}"
                       for c in caches)
        lines.append(row + f"{m['verify']['median_s'] * 1e3:>10.2f}")
    lines.append(f"prefill: {result['prefill']} tokens; step@L: one token after a cache of L; "
                 f"verify: {result['verify']} tokens after a cache of {caches[0]}")
    drafts = [m for m in result["models"] if m["name"] == "draft"]
    targets = [m for m in result["models"] if m["name"] == "target"]
    if drafts and targets:
        lines.append(f"cost ratio c = t_draft / t_target of the decode step after {caches[0]} tokens "
                     f"(rows: draft precision, columns: target precision)")
        lines.append(f"{'':<36}" + "".join(f"{t['precision']:>38.38}" for t in targets))
        for d in drafts:
            lines.append(f"{d['precision']:<36.36}" + "".join(f"{step_s(d) / step_s(t):>38.3f}" for t in targets))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict | list[dict]:
    a = parse_args(argv)
    if backend(a.backend).own_threads:
        return llama_main(a)
    device = resolve_device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SettingError(f"--device {a.device}: this machine has no CUDA GPU that torch can use; use auto or cpu")
    out = timing_file(Path(a.out or f"runs/bench/timing-{device.type}.json"))
    out.check()
    precisions = [resolve_dtype(p, device) for p in a.precision] if a.precision else default_precisions(device)
    if device.type != "cpu" and set(precisions) & set(QUANTIZATIONS):
        raise SettingError("the int8 quantizations run on the CPU only (--device cpu)")
    result = {"device": describe_device(device), "device_type": device.type, "precisions": precisions,
              "torch": torch.__version__, "prefill": a.prefill, "verify": a.verify, "models": []}
    shapes = []
    for spec in a.model or DEFAULT_MODELS:
        label, _, shape = spec.partition("=")
        if not shape:
            label, shape = Path(spec).name, spec
        shapes.append((label, shape, model_config(shape)))
    jobs = [(label, shape, config, precision) for label, shape, config in shapes for precision in precisions]
    bar = tqdm(jobs, desc="bench-timing", unit="model", file=sys.stderr)
    try:
        for label, shape, config, precision in bar:
            bar.set_postfix_str(f"{label}@{precision}")
            entry = time_model(label, shape, config, precision, device, a)
            result["models"].append(entry)
            bar.write(f"{label}@{precision}: decode step {step_s(entry) * 1e3:.1f} ms", file=sys.stderr)
    except KeyboardInterrupt:
        bar.close()
        keep_interrupted(result, out)
        raise
    bar.close()
    print(table(result))
    write_json(result, out)
    return result


def time_model(label: str, shape: str, config, precision: str, device: torch.device, a: argparse.Namespace) -> dict:
    """One model's timing entry (``main``): the shape built at ``precision`` on ``device``, timed, then freed."""
    model = build(config, device, precision)
    entry = {"name": label, "precision": precision, "shape": shape, "params": count_parameters(config),
             **bench_model(model, device, a.prefill, a.cache, a.verify, a.repeats, a.verify_short,
                           tuple(a.verify_lengths))}
    entry["catch_up"] = catch_up_entry(model, "eager", a.cache[0], a.repeats)  # priced where it drafts
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def keep_interrupted(result: dict, out: OutputFile) -> None:
    """After a Ctrl-C, the entries timed so far written to ``out`` as a finished run writes them (marked
    ``"interrupted": true``; the model being timed is left out), so minutes of timing are not lost; nothing is
    written before the first entry is done."""
    if result["models"]:
        write_json({**result, "interrupted": True}, out)
        timed = ", ".join(f"{m['name']}@{m['precision']}" for m in result["models"])
        print(f"kept what was timed before the interrupt ({timed}) in {out.path}", file=sys.stderr)


def write_json(result: dict, out: OutputFile) -> None:
    """Write a benchmark's figures as JSON, whole or not at all (``core.runfolder``), and say where."""
    write_text(out.claim(), json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.path}")


if __name__ == "__main__":
    run_main(main)

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
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from core.arguments import CommandParser, check_counts, description
from core.backends import BACKENDS, backend
from core.errors import SettingError
from core.interrupt import run_main
from core.device import describe_device
from core.models import resolve_device, resolve_dtype
from core.runfolder import OutputFile
from core.quantization import QUANTIZATIONS, quantize
from decoding.backends import keeps_own_cache
from decoding.costs import step_s
from evaluation.bench_timing_llama import llama_main, time_llama_pair
from evaluation.timers import (PAIR_VERIFY_LENGTHS, catch_up_entry, decoder_forward_times, generate_costs, median_time,
                               time_in_turns, timing_file, write_json)

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


@torch.no_grad()
def bench_model(model, device: torch.device, prefill: int, caches: list[int], verify: int, repeats: int,
                verify_short: int = 3, verify_lengths: tuple[int, ...] = ()) -> dict:
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> torch.Tensor:
        return torch.randint(0, vocab, (1, n), generator=g).to(device)

    out = {"prefill": {"tokens": prefill, **median_time(lambda: model(ids(prefill), use_cache=True), device, repeats)}}

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
        out["decode"][str(length)] = median_time(step(cache, length, 1), device, repeats)
    cache = cached(caches[0])
    lengths = sorted({verify, *([verify_short] if 1 < verify_short < verify else []), *verify_lengths})
    timed = time_in_turns({m: step(cache, caches[0], m) for m in lengths}, device, repeats)
    out["verify"] = {"tokens": verify, "cache": caches[0], **timed[verify]}
    if 1 < verify_short < verify:
        out["verify_short"] = {"tokens": verify_short, "cache": caches[0], **timed[verify_short]}
    if verify_lengths:
        out["verify_by_tokens"] = {str(m): {"cache": caches[0], **timed[m]} for m in sorted(set(verify_lengths))}
    return out


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
    p.add_argument("--generate", action="store_true",
                   help="--backend transformers: also time what transformers' generate() adds to each model's "
                        "forwards, per token and per call (the costs its own assisted generation pays, which "
                        "`specheads advise` prices it with)")
    p.add_argument("--tools", default=None, metavar="DIR",
                   help="--backend llama_cpp: time llama.cpp's own binaries in DIR (`make llama-tools`: llama-bench's "
                        "forwards, llama-completion's sampler), as its users run them, instead of the decoder's "
                        "forwards through llama-cpp-python; the costs `specheads advise` prices llama.cpp with")
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
    if a.generate and backend(a.backend).own_threads:
        raise SettingError("--generate times transformers' generate(): it needs --backend transformers")
    if a.tools is not None and not backend(a.backend).own_threads:
        raise SettingError(f"--tools times llama.cpp's binaries: it needs --backend llama_cpp, not {a.backend}")
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
    longest = max(a.prefill, max(a.cache) + max([a.verify, *a.verify_lengths]))  # tokens a timed forward reaches
    for spec in a.model or DEFAULT_MODELS:
        label, _, shape = spec.partition("=")
        if not shape:
            label, shape = Path(spec).name, spec
        shapes.append((label, shape, model_config(shape)))
        window = getattr(shapes[-1][2], "max_position_embeddings", None)
        if window is not None and longest > window:
            raise SettingError(f"--model {spec}: its context holds {window} tokens; --prefill, --cache and the "
                               f"verifications after it reach {longest}")
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
    if a.generate:
        entry.update(generate_costs(model, device, a.cache[0], step_s(entry), a.repeats))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def keep_interrupted(result: dict, out: OutputFile) -> None:
    """After a Ctrl-C, the entries timed so far written beside ``out`` (``<name>.interrupted.json``, marked
    ``"interrupted": true``; the model being timed is left out), so minutes of timing are not lost and a whole
    timing file there is not replaced by a part; nothing is written before the first entry is done."""
    if result["models"]:
        out = timing_file(out.path.with_name(out.path.stem + ".interrupted.json"))
        out.check()
        write_json({**result, "interrupted": True}, out)
        timed = ", ".join(f"{m['name']}@{m['precision']}" for m in result["models"])
        print(f"kept what was timed before the interrupt ({timed}) in {out.path}", file=sys.stderr)


if __name__ == "__main__":
    run_main(main)

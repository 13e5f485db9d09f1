"""``specheads bench-timing --backend llama_cpp --tools DIR``: the pair's GGUF files timed by llama.cpp's own binaries
(``make llama-tools``), as its users run them, in the layout ``decoding.costs`` reads.

The forwards are ``llama-bench``'s, after ``cache`` tokens in the KV cache (``-d``): the one-token step (``tg``), a
batch of m tokens with every row's logits out (``pp`` with ``-embd 1``: a verification of m − 1 candidates) for the
target, with the last row's only (``-embd 0``: the draft re-reading a verified batch) for
the draft, and the prefill. The sampler's time per token is ``llama-completion``'s own count (its ``sampling time``
over the tokens it sampled): llama.cpp builds every sampled row's candidates over the whole vocabulary, a cost
beyond the forward that the target pays for every token it emits (alone or after a verification) and the draft for
each token it drafts (its top-10 sampler). The sampler is timed greedy: a sampled chain costs a little more, the
same on both sides of a speedup.

Through llama-cpp-python the same kernels are timed without the sampler, and in our decoder's calls rather than
the binary's."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from core.device import describe_device
from core.errors import UserError
from core.llama_cpp import repacks_safely
from core.sampling import Sampling
from decoding.costs import find_entry, read_table, timing_entry, verify_table
from evaluation import llama_peer

TIMED_WITH = "llama-bench"
"""A timing file's ``timed_with`` where llama.cpp's own binaries timed it."""
TIMED_THROUGH_BINDING = "llama-cpp-python"
"""What timed a file without ``timed_with``: the decoder's forwards through the binding (``bench_timing_llama``)."""
DRAFT_SAMPLER_TOP_K = 10
"""The draft's sampler in llama.cpp's ``draft-simple``: top-k 10 alone (``common/speculative.cpp``)."""
SAMPLED_TOKENS = 32
"""Tokens ``llama-completion`` samples to time its sampler."""
SAMPLER_PROMPT = "def fibonacci(n):"


def run_binary(tools: str | Path, name: str, model: Path, args: list[str], last: str | None = None) -> str:
    """llama.cpp's ``name`` from ``tools`` on ``model`` with ``args`` (the weights loaded as our binding loads them),
    its stdout and stderr, made again while its log lacks ``last`` (``llama_peer.run_printing``); one line saying
    why where it fails."""
    binary = llama_peer.LlamaPeer(enabled=True, tools=str(tools)).binary(name)
    keep_layout = ["--repack", "0"] if name == "llama-bench" else ["--no-repack"]
    cmd = [str(binary), "-m", str(model), *args, *([] if repacks_safely() else keep_layout)]
    try:
        done = llama_peer.run_printing(cmd, last)
    except RuntimeError as e:
        raise UserError(f"{name} on {model.name}: {' '.join(str(e).split()[-40:])}") from None
    return done.stdout + done.stderr


def llama_bench(tools: str | Path, model: Path, threads: int, args: list[str]) -> list[dict]:
    """``llama-bench`` on ``model`` with ``args``: one record per test (its JSON lines), or one line saying why not."""
    out = run_binary(tools, "llama-bench", model, ["-t", str(threads), "-o", "jsonl", *args])
    try:
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    except json.JSONDecodeError as e:
        raise UserError(f"llama-bench printed a line that is not JSON on {model.name}: {e}") from None


def median_s(record: dict) -> float:
    """A test's median seconds over its repetitions (a generation test's per token)."""
    per_test = statistics.median(record["samples_ns"]) / 1e9
    return per_test / record["n_gen"] if record["n_gen"] else per_test


def tests_by_tokens(records: list[dict], model: Path) -> dict[int, float]:
    """m → median seconds of ``llama-bench``'s tests: a prompt of m tokens, or per token of a generation as m = 1."""
    try:
        return {1 if r["n_gen"] else int(r["n_prompt"]): median_s(r) for r in records}
    except (KeyError, TypeError, ValueError, statistics.StatisticsError) as e:
        raise UserError(f"llama-bench's records on {model.name} lack a time ({e!r}): is it llama.cpp's?") from None


def forward_times(tools, model: Path, threads: int, cache: int, lengths, all_rows: bool,
                  repeats: int) -> tuple[str, dict[int, float]]:
    """(llama.cpp's description of the model, m → seconds of a forward of m tokens after ``cache`` cached ones);
    m = 1 is the one-token step; the others return every row's logits where ``all_rows``, else the last row's."""
    batch = sorted(m for m in set(lengths) if m > 1)
    records = llama_bench(tools, model, threads, ["-d", str(cache), "-r", str(repeats), "-n", "16",
                                                  "-p", ",".join(map(str, batch)), "-embd", str(int(all_rows))])
    seconds = tests_by_tokens(records, model)
    missing = sorted({1, *batch} - set(seconds))
    if missing:
        raise UserError(f"llama-bench printed no time for {missing} tokens on {model.name}")
    return str(records[0].get("model_type", model.name)), seconds


def prefill_time(tools, model: Path, threads: int, tokens: int, repeats: int) -> float:
    """Seconds of ``llama-bench``'s prompt of ``tokens`` tokens into an empty cache."""
    timed = tests_by_tokens(llama_bench(tools, model, threads, ["-p", str(tokens), "-n", "0", "-r", str(repeats)]),
                            model)
    if tokens not in timed:
        raise UserError(f"llama-bench printed no time for a prompt of {tokens} tokens on {model.name}")
    return timed[tokens]


def sampler_seconds(tools, model: Path, threads: int, tokens: int, top_k: int | None = None) -> float:
    """Seconds llama.cpp's sampler spends on a token: ``llama-completion``'s own count (its ``sampling time``: each
    row's candidates over the whole vocabulary, then the chain) over ``tokens`` tokens sampled after a short prompt;
    the chain ``llama_peer.sampling_flags`` sets at temperature 0, or top-k ``top_k`` alone (the draft's in
    ``draft-simple``)."""
    chain = (["--samplers", "top_k", "--top-k", str(top_k)] if top_k
             else llama_peer.sampling_flags(Sampling(temperature=0.0)))
    out = run_binary(tools, "llama-completion", model, ["-p", SAMPLER_PROMPT, "-n", str(tokens), "-t", str(threads),
                                                        "-tb", str(threads), "--ignore-eos", "-no-cnv",
                                                        "--no-display-prompt", *chain],
                     last=r"samplers time =")
    ms = re.search(r"sampling time =\s*([\d.]+) ms", out)
    sampled = re.search(r"samplers time =\s*[\d.]+ ms /\s*(\d+) tokens", out)
    if ms is None or sampled is None or int(sampled.group(1)) == 0:
        raise UserError(f"llama-completion printed no time of its sampler on {model.name}")
    # it prints hundredths of a millisecond: a tiny vocabulary's sampler may print 0.00, below that resolution
    return max(float(ms.group(1)), 0.005) / 1e3 / int(sampled.group(1))


def time_binaries(tools, paths: dict[str, Path], threads: int, prompt_tokens: int, cache: int,
                  verify_lengths, draft_reads, verify: int = 9, repeats: int = 5) -> dict:
    """A timing file of the pair at ``paths`` (role → GGUF) timed by llama.cpp's binaries in ``tools``: the draft's
    step, its one-row reads of ``draft_reads`` tokens (two of them its catch-up read) and its sampler; the target's
    step, its verifications of ``verify_lengths`` tokens and its sampler; both prefills."""
    result = {"device": describe_device("cpu", threads), "device_type": "cpu", "prefill": prompt_tokens,
              "verify": verify, "decoder": "eager", "backend": "llama_cpp", "threads": threads,
              "timed_with": TIMED_WITH, "models": []}
    for role, path in paths.items():
        target = role == "target"
        lengths = {3, verify, *verify_lengths} if target else {2, *draft_reads}
        precision, seconds = forward_times(tools, path, threads, cache, lengths, target, repeats)
        prefill = prefill_time(tools, path, threads, prompt_tokens, max(1, repeats // 2))
        sample = sampler_seconds(tools, path, threads, SAMPLED_TOKENS, None if target else DRAFT_SAMPLER_TOP_K)
        reads = {} if target else {"read_by_tokens": {str(m): {"cache": cache, "median_s": seconds[m]}
                                                      for m in sorted(draft_reads)}}
        entry = timing_entry(role, precision, (prompt_tokens, prefill), cache, seconds, verify if target else None,
                             3 if target else None, by_tokens=target,
                             catch_up=None if target else seconds[2], shape=path.name, threads=threads,
                             sample={"tokens": SAMPLED_TOKENS, "median_s": sample}, **reads)
        result["models"].append(entry)
    return result


def layout(timing: dict) -> tuple:
    """What ``time_alike`` times again of a timing file: (threads, the target's prompt tokens, its cache length, its
    verification lengths, the draft's batch-read lengths, the target's verification length)."""
    target, draft = find_entry(timing, "target"), find_entry(timing, "draft")
    return (int(timing["threads"]), int(target["prefill"]["tokens"]), min(map(int, target["decode"])),
            sorted(verify_table(target) or {}), sorted(set(read_table(draft, 0.0) or {}) - {1}),
            int(target["verify"]["tokens"]))


def time_alike(timing: dict, tools, paths: dict[str, Path], repeats: int) -> dict:
    """``time_binaries`` again at the ``layout`` of a timing file it made: the device's costs at another minute
    (``specheads advise --check`` times them during its runs: a shared machine's steps drift by the minute, and a
    prediction at an hour-old timing carries the drift)."""
    threads, prompt, cache, lengths, reads, verify = layout(timing)
    return time_binaries(tools, paths, threads, prompt, cache, lengths, reads, verify, repeats)


def median_timing(timings: list):
    """One timing of several that ``time_alike`` made at other minutes: each time (``median_s``) the median of
    theirs, every other field the first's."""
    first = timings[0]
    if isinstance(first, dict):
        return {k: statistics.median(t[k] for t in timings) if k == "median_s"
                else median_timing([t[k] for t in timings]) for k in first}
    if isinstance(first, list):
        return [median_timing([t[i] for t in timings]) for i in range(len(first))]
    return first

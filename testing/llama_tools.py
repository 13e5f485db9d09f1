"""Stand-ins for llama.cpp's binaries (``make llama-tools``): scripts that print what ``llama-completion``,
``llama-speculative-simple`` and ``llama-bench`` print, with fixed numbers, and record the arguments of every call
beside them (``<name>.calls``, one JSON list a line)."""

from __future__ import annotations

import sys
from pathlib import Path

STUB = r'''#!{python}
"""Prints what llama.cpp's {name} prints on stdout and stderr (the speculative example echoes the prompt; both add
newlines as they end; the completion's perf lines start with the prompt's), and records its arguments."""
import json, sys
args = sys.argv[1:]
prompt = args[args.index("-p") + 1]
with open(__file__ + ".calls", "a") as log:
    log.write(json.dumps(args) + "\n")
text = "return a + b"
if "{name}" == "llama-completion":
    sys.stdout.write(text + " [end of text]\n" + "\n\n")
    print("common_perf_print: prompt eval time =      10.00 ms /    12 tokens (    0.83 ms per token,  1200.00 "
          "tokens per second)", file=sys.stderr)
    print("common_perf_print:        eval time =     100.00 ms /     4 runs   (   25.00 ms per token,    40.00 "
          "tokens per second)", file=sys.stderr)
    print("common_perf_print:    sampling time =       5.00 ms\n"
          "common_perf_print:    samplers time =       4.00 ms /     5 tokens\n"
          "common_perf_print:       total time =     116.00 ms /    16 tokens", file=sys.stderr)
else:
    n_max = int(args[args.index("--spec-draft-n-max" if "-md" in args else "--spec-ngram-simple-size-m") + 1])
    sys.stdout.write("\n\n" + prompt + text + "\n\n" + "\n\n")
    print(f"decoded    5 tokens in    {{0.1 + 0.01 * n_max:.3f}} seconds, speed:   40.000 t/s", file=sys.stderr)
    print("n_drafted = 6\nn_accept  = 3", file=sys.stderr)
'''


BENCH_STUB = r'''#!{python}
"""Prints what llama.cpp's llama-bench prints with ``-o jsonl``: one line per test, a forward of m tokens taking
(10 + 2 m) ms, 1.5 times that with every row out (``-embd 1``), a generated token 8 ms; records its arguments."""
import json, sys
args = sys.argv[1:]
with open(__file__ + ".calls", "a") as log:
    log.write(json.dumps(args) + "\n")
def value(flag, default):
    return args[args.index(flag) + 1] if flag in args else default
prompts = [int(p) for p in value("-p", "512").split(",") if int(p) > 0]
gen, depth, rows = int(value("-n", "128")), int(value("-d", "0")), value("-embd", "0") == "1"
reps = int(value("-r", "5"))
tests = [(p, 0) for p in prompts] + ([(0, gen)] if gen else [])
for p, n in tests:
    ns = int(1e6 * (8 * n if n else (10 + 2 * p) * (1.5 if rows else 1.0)))
    print(json.dumps({{"model_type": "stub 1B Q4_K - Medium", "n_prompt": p, "n_gen": n, "n_depth": depth,
                      "embeddings": rows, "avg_ns": ns, "samples_ns": [ns] * reps}}))
'''


def write_stub_tools(folder: Path) -> Path:
    """The stand-ins in ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("llama-completion", "llama-speculative-simple", "llama-bench"):
        path = folder / name
        text = BENCH_STUB if name == "llama-bench" else STUB
        path.write_text(text.format(python=sys.executable, name=name))
        path.chmod(0o755)
    return folder

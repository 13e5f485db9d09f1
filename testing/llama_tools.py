"""Stand-ins for llama.cpp's binaries (``make llama-tools``): scripts that print what ``llama-completion`` and
``llama-speculative-simple`` print, with fixed numbers, and record the arguments of every call beside them
(``<name>.calls``, one JSON list a line)."""

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
else:
    n_max = int(args[args.index("--spec-draft-n-max" if "-md" in args else "--spec-ngram-simple-size-m") + 1])
    sys.stdout.write("\n\n" + prompt + text + "\n\n" + "\n\n")
    print(f"decoded    5 tokens in    {{0.1 + 0.01 * n_max:.3f}} seconds, speed:   40.000 t/s", file=sys.stderr)
    print("n_drafted = 6\nn_accept  = 3", file=sys.stderr)
'''


def write_stub_tools(folder: Path) -> Path:
    """The two stand-ins in ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("llama-completion", "llama-speculative-simple"):
        path = folder / name
        path.write_text(STUB.format(python=sys.executable, name=name))
        path.chmod(0o755)
    return folder

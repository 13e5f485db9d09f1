"""llama.cpp's own decoding as eval runs, run as its users run it: its binaries (``make llama-tools``, built from the
source llama-cpp-python vendors, so the kernels are our backend's), one process per prompt.

- ``llama_target_only``: ``llama-completion`` (the target alone);
- ``llama_speculative``: ``llama-speculative-simple`` with the draft (``--spec-type draft-simple``), at its
  defaults (``n_max`` 3, ``p_min`` 0) and at the (p_min, n_max) of a small grid that runs fastest on tuning prompts
  the eval does not decode;
- ``llama_prompt_lookup``: ``llama-speculative-simple`` with no draft model (``--spec-type ngram-simple``), at its
  defaults (n-gram ``n`` 12, copy ``m`` 48) and at the (n, m) of a grid that runs fastest on the tuning prompts.
  Its driver stops at a round's end, so a run may decode a few tokens past ``max_new_tokens``; rates are per token.

Both read the prompt as text (the text our tokenizer's ids decode to, special tokens included, which llama.cpp
parses back into the same ids), sample as the mode does (top-k, top-p and min-p off unless the mode sets them,
greedy at temperature 0), stop at the end of generation or ``max_new_tokens``, and report their own decoding time
with the prompt's prefill excluded and the sampler included (``WALL``): a run's ``wall_s`` is that time, so ours run
with ``untimed_prefill``.
Its tokens are our tokenizer's reading of the text it printed (the peer prints text, not ids). llama.cpp's
verification keeps a draft token only when the target's own sample equals it (not with min(1, p/q)): at temperature
1 it is exact but accepts less than speculative sampling does.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UserError
from core.llama_cpp import repacks_safely
from core.sampling import Sampling

TARGET_ONLY = "llama_target_only"
SPECULATIVE = "llama_speculative"
PROMPT_LOOKUP = "llama_prompt_lookup"
FAMILIES = (TARGET_ONLY, SPECULATIVE, PROMPT_LOOKUP)
DEFAULTS = {"p_min": 0.0, "n_max": 3}
"""llama.cpp's own defaults for speculative decoding (``common/common.h``)."""
LOOKUP_DEFAULTS = {"n": 12, "m": 48}
"""llama.cpp's own defaults for ``ngram-simple`` (``--spec-ngram-simple-size-n``, ``--spec-ngram-simple-size-m``)."""


@dataclass
class LlamaPeer:
    """llama.cpp's own decoding on the same prompts (``backend: llama_cpp`` only)."""

    enabled: bool = False
    """Run it at all."""
    tools: str = ".llama.cpp/build/bin"
    """Where ``make llama-tools`` put ``llama-completion`` and ``llama-speculative-simple``."""
    target_only: bool = True
    """One run of the target alone (``llama_target_only``)."""
    defaults: bool = True
    """One speculative run at llama.cpp's defaults (p_min 0, n_max 3)."""
    grid: list[list[float]] = field(default_factory=lambda: [[0.0, 1], [0.0, 2], [0.5, 4], [0.75, 16], [0.9, 4],
                                                             [0.9, 8]])
    """(p_min, n_max) pairs to tune over; the fastest on ``tune_prompts`` runs on the eval's prompts."""
    prompt_lookup: bool = False
    """One run of its prompt lookup (``ngram-simple``, no draft model) at its defaults (n 12, m 48)."""
    prompt_lookup_grid: list[list[int]] = field(default_factory=list)
    """(n, m) pairs of ``ngram-simple`` to tune over as ``grid``; the fastest runs on the eval's prompts."""
    tune_prompts: list[int] = field(default_factory=lambda: [40, 60])
    """[first, end) of the prompt source's prompts the tuning runs on: ones the eval does not decode (HumanEval
    40–59 beside an eval of 0–39)."""

    def __post_init__(self) -> None:
        for pair in self.grid:
            if len(pair) != 2 or not 0 <= pair[0] <= 1 or int(pair[1]) != pair[1] or pair[1] < 1:
                raise UserError(f"llama_peer.grid: each entry is [p_min in 0…1, n_max ≥ 1], got {pair}")
        if len(self.tune_prompts) != 2 or not 0 <= self.tune_prompts[0] < self.tune_prompts[1]:
            raise UserError(f"llama_peer.tune_prompts is [first, end), got {self.tune_prompts}")
        for pair in self.prompt_lookup_grid:
            if len(pair) != 2 or not all(isinstance(v, int) and 1 <= v <= 1024 for v in pair):
                raise UserError(f"llama_peer.prompt_lookup_grid: each entry is [n, m], whole numbers 1…1024, got "
                                f"{pair}")

    def tuned(self) -> list[tuple[str, dict | None, list[dict]]]:
        """(family, its defaults to run or None, its grid to tune over) of each speculative family."""
        return [(SPECULATIVE, dict(DEFAULTS) if self.defaults else None,
                 [{"p_min": float(p), "n_max": int(n)} for p, n in self.grid]),
                (PROMPT_LOOKUP, dict(LOOKUP_DEFAULTS) if self.prompt_lookup else None,
                 [{"n": int(n), "m": int(m)} for n, m in self.prompt_lookup_grid])]

    def binary(self, name: str) -> Path:
        path = Path(self.tools) / name
        if not path.is_file():
            raise UserError(f"llama_peer: {path} not found; run `make llama-tools` (builds llama.cpp's binaries)")
        return path


def sampling_flags(s: Sampling) -> list[str]:
    """llama.cpp's sampler set to ours: only temperature, top-k and top-p (min-p off); greedy at temperature 0."""
    return ["--temp", repr(float(s.temperature)), "--top-k", str(int(s.top_k)), "--top-p", repr(float(s.top_p)),
            "--min-p", "0"]


LOG_TRIES = 3
"""Runs of a binary made before its lost summary lines count as a failure (``run_printing``)."""


def run_printing(cmd: list[str], last: str | None, stdout_end: str = "") -> subprocess.CompletedProcess:
    """Run llama.cpp's binary ``cmd`` until its stderr holds ``last`` (a pattern of the summary it prints as it ends;
    None: nothing is checked) and its stdout ends with ``stdout_end``. Its log is written by a thread the process
    does not wait for at exit (``common/log.cpp``), so a run that ends within milliseconds of its last lines, as a
    tiny model's does, may lose them though it succeeded: such a run is made again, up to ``LOG_TRIES`` times. A run
    that fails is one ``RuntimeError`` with its log's end."""
    name = Path(cmd[0]).name
    for _ in range(LOG_TRIES):
        done = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"{name} exited {done.returncode}: {done.stderr[-600:]}")
        if (last is None or re.search(last, done.stderr)) and done.stdout.endswith(stdout_end):
            return done
    raise RuntimeError(f"{name} printed no {last!r} (or not its output's end) in {LOG_TRIES} runs; its log ends:\n"
                       f"{done.stderr[-600:]}")


def _number(pattern: str, text: str, what: str) -> float:
    m = re.search(pattern, text)
    if m is None:
        raise RuntimeError(f"llama.cpp's {what} printed no {pattern!r}; its log ends:\n{text[-600:]}")
    return float(m.group(1))


LAST_READ = {"llama-completion": (r"(?<!prompt )eval time =", ""),
             "llama-speculative-simple": (r"n_accept\s*=", "\n\n\n\n")}
"""Of each binary, the last line of its summary ``run`` reads (its stderr), and how its output ends (its stdout;
llama-completion's text ends before its summary)."""


def run(peer: LlamaPeer, family: str, params: dict, target: Path, draft: Path, prompt_text: str, sampling: Sampling,
        seed: int, threads: int, n_ctx: int = 4096) -> tuple[str, dict]:
    """One generation of ``family`` with ``params`` ({}, p_min and n_max, or n and m); return its text and its stats
    (``wall_s``: decoding seconds, prefill excluded; ``new_tokens``, and for the speculative run the tokens it
    drafted and kept). The prompt goes on the command line: llama.cpp drops the last newline of a prompt file."""
    common = ["-m", str(target), "-p", prompt_text, "-n", str(sampling.max_new_tokens), "-t", str(threads),
              "-c", str(n_ctx), "-s", str(seed), *sampling_flags(sampling),
              *([] if repacks_safely() else ["--no-repack"])]  # as our binding loads them (core.llama_cpp)
    if family == TARGET_ONLY:
        cmd = [str(peer.binary("llama-completion")), *common, "-no-cnv", "--no-display-prompt", "-tb", str(threads)]
    elif family == PROMPT_LOOKUP:
        cmd = [str(peer.binary("llama-speculative-simple")), *common, "--spec-type", "ngram-simple",
               "--spec-ngram-simple-size-n", str(int(params["n"])), "--spec-ngram-simple-size-m",
               str(int(params["m"]))]
    else:
        cmd = [str(peer.binary("llama-speculative-simple")), *common, "-md", str(draft), "--spec-type",
               "draft-simple", "-td", str(threads), "--spec-draft-n-max", str(int(params["n_max"])),
               "--spec-draft-p-min", repr(float(params["p_min"]))]
    done = run_printing(cmd, *LAST_READ[Path(cmd[0]).name])
    if family == TARGET_ONLY:
        # it prints the generation, " [end of text]\n" at an end-of-generation token, and "\n\n" as it exits
        text = done.stdout.removesuffix("\n\n").removesuffix(" [end of text]\n")
        runs = _number(r"(?<!prompt )eval time =\s*[\d.]+ ms /\s*(\d+) runs", done.stderr, "llama-completion")
        # its first token is drawn from the prompt's forward, timed as prefill; each later one is one run. Its
        # decoding time is each token's forward and its sampler, as llama-speculative-simple's "decoded in" counts
        eval_ms = _number(r"(?<!prompt )eval time =\s*([\d.]+) ms", done.stderr, "llama-completion")
        sampler_ms = _number(r"sampling time =\s*([\d.]+) ms", done.stderr, "llama-completion")
        return text, {"wall_s": (eval_ms + sampler_ms) / 1e3, "new_tokens": int(runs), "target_calls": int(runs),
                      "draft_calls": 0}
    # it prints "\n\n", the prompt, the generation, and "\n\n" twice as it ends
    out = done.stdout.removeprefix("\n\n").removesuffix("\n\n\n\n")
    text = out.removeprefix(prompt_text) if out.startswith(prompt_text) else out
    seconds = _number(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", done.stderr, "llama-speculative-simple")
    new = _number(r"decoded\s+(\d+) tokens", done.stderr, "llama-speculative-simple")
    drafted = _number(r"n_drafted\s*=\s*(\d+)", done.stderr, "llama-speculative-simple")
    accepted = _number(r"n_accept\s*=\s*(\d+)", done.stderr, "llama-speculative-simple")
    # prompt lookup copies its candidates: no draft forward made them
    return text, {"wall_s": seconds, "new_tokens": int(new),
                  "draft_calls": 0 if family == PROMPT_LOOKUP else int(drafted),
                  "discarded": int(drafted - accepted), "target_calls": int(new - accepted)}


WALL = "decoding with the sampler, prefill excluded"
"""What a run's ``wall_s`` counts (``run``): a record of runs names it, so runs timed otherwise are not mixed in."""

"""``specheads compare FOLDER A/B [C/D …]``: the tokens-per-second ratio of one run of a finished eval over
another, with its paired bootstrap 95 % interval over the prompts both decoded (``core.intervals.speedup_interval``,
the interval the report gives against target-only and SD), for pairs the report's table does not hold (SpecDec++
over the confidence stop, a goodput run over transformers' defaults).

A and B name runs by the start of their label (``specdecpp`` matches ``specdecpp[h=0.8]``); ``--mode`` picks the
mode when the eval has several. A name that matches no run, or more than one, is a one-line error naming the runs.
"""

from __future__ import annotations

import json
import math
import sys

from core.arguments import CommandParser, description
from core.errors import UserError
from core.intervals import Interval, speedup_interval
from evaluation.rundir import RunDir


class PairError(UserError):
    """A pair the eval folder cannot answer."""


def runs_by_prompt(folder: str, mode: str | None) -> dict[str, dict[int, dict]]:
    """run label → prompt → the run's ``stats`` on it, for one mode of the eval at ``folder``."""
    path = RunDir(folder).results
    if not path.exists():
        raise PairError(f"{folder}: no results.jsonl (not an eval folder, or nothing decoded yet)")
    records = []
    for line in path.read_text().splitlines():  # read only: a running eval may be appending (no ResultStore repair)
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the partial line a running or interrupted eval leaves
            continue
    modes = sorted({r["mode"] for r in records})
    if not modes:
        raise PairError(f"{folder}: results.jsonl holds no finished run yet")
    if mode is None and len(modes) > 1:
        raise PairError(f"{folder} has modes {', '.join(modes)}: pick one with --mode")
    mode = mode or modes[0]
    if mode not in modes:
        raise PairError(f"{folder} has no mode {mode!r} (it has {', '.join(modes)})")
    runs: dict[str, dict[int, dict]] = {}
    for r in records:
        if r["mode"] == mode:
            wall, tokens = r["stats"].get("wall_s"), r["stats"].get("new_tokens")
            if not (isinstance(wall, (int, float)) and 0 < wall < math.inf and isinstance(tokens, int)):
                raise PairError(f"{path}: run {r['run']} on prompt {r['prompt']} records wall_s {wall!r} and new_tokens "
                                f"{tokens!r}, not a time and a count (the file was edited or damaged)")
            runs.setdefault(r["run"], {})[r["prompt"]] = r["stats"]
    return runs


def find_run(runs: dict, name: str) -> str:
    """The one run whose label is ``name`` or starts with ``name[``."""
    found = [label for label in runs if label == name or label.startswith(name + "[")]
    if len(found) != 1:
        raise PairError(f"{'no run' if not found else 'several runs'} named {name!r}: the runs are "
                        f"{', '.join(sorted(runs))}")
    return found[0]


def ratio(runs: dict, a: str, b: str) -> tuple[str, str, Interval, int]:
    """(run a, run b, a's tokens/s over b's with its interval, prompts) over the prompts both decoded."""
    a, b = find_run(runs, a), find_run(runs, b)
    prompts = sorted(set(runs[a]) & set(runs[b]))
    if len(prompts) < 2:
        raise PairError(f"{a} and {b} share {len(prompts)} prompts; a paired interval needs 2 or more")
    return a, b, speedup_interval([runs[a][p] for p in prompts], [runs[b][p] for p in prompts]), len(prompts)


def main(argv: list[str] | None = None) -> list[tuple[str, str, Interval, int]]:
    p = CommandParser(prog="specheads compare", description=description(__doc__))
    p.add_argument("folder", help="a finished eval's output_dir")
    p.add_argument("pairs", nargs="+", metavar="A/B", help="run A over run B, by the start of their labels")
    p.add_argument("--mode", default=None, help="the eval's mode (needed when it has several)")
    a = p.parse_args(argv)
    try:
        runs = runs_by_prompt(a.folder, a.mode)
        if any(pair.count("/") != 1 for pair in a.pairs):
            raise PairError(f"pairs are A/B, got {' '.join(x for x in a.pairs if x.count('/') != 1)}")
        out = [ratio(runs, *pair.split("/")) for pair in a.pairs]
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    for first, second, interval, n in out:
        print(f"{first} / {second}: {interval.value:.3f} [{interval.low:.3f}, {interval.high:.3f}] "
              f"(tokens/s, paired 95 % over {n} prompts)")
    return out


if __name__ == "__main__":
    main()

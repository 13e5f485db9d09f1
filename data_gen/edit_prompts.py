"""``specheads edit-prompts``: edit requests over functions of the corpus (never the standard library), a prompts
file where a response repeats much of its prompt, as code edits and reviews do: where prompt lookup drafts.

Each prompt is one instruction (``INSTRUCTIONS``, in turn) and a whole function of the corpus (its signature,
docstring and body, ``--min_lines`` to ``--max_lines`` lines) in a fenced block; a jsonl file of ``prompt``,
``instruction`` and the function's ``task_id``, ``qualname`` and ``package``, for ``prompts.source`` (with
``chat_template: true``: an edit request is a user turn).

    specheads edit-prompts --corpus runs/corpus --out runs/prompts/edits.jsonl --count 20
    specheads edit-prompts --corpus runs/corpus --out runs/prompts/edits-train.jsonl --skip 20 --count 100
"""

from __future__ import annotations

import json
import sys

from core.arguments import CommandParser, check_counts, description
from core.errors import UserError
from core.interrupt import run_main
from core.runfolder import OutputFile, write_text

INSTRUCTIONS = ("Add type hints to this function. Reply with the whole function.",
                "Rename the local variables of this function to clearer names. Reply with the whole function.",
                "Add a short comment above each line of this function. Reply with the whole function.")
"""The edits asked, one per prompt in turn: each keeps most of the function as it is."""


def edit_prompts(rows: list[dict], count: int, min_lines: int, max_lines: int, skip: int = 0) -> list[dict]:
    """The corpus rows (in the corpus' own order) whose whole function has ``min_lines`` to ``max_lines`` lines,
    the first ``skip`` of them left out and the next ``count`` kept, each as an edit request: one function per
    request, so files written with disjoint ranges (``--skip``) share no function."""
    out = []
    seen = 0
    for row in rows:
        function = row["prompt"] + row["canonical_solution"]
        if min_lines <= function.count("\n") <= max_lines:
            seen += 1
            if seen <= skip:
                continue
            instruction = INSTRUCTIONS[(seen - 1) % len(INSTRUCTIONS)]
            out.append({"prompt": f"{instruction}\n\n```python\n{function}```", "instruction": instruction,
                        "task_id": row["task_id"], "qualname": row["qualname"], "package": row["package"]})
            if len(out) == count:
                break
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = CommandParser(prog="specheads edit-prompts", description=description(__doc__))
    p.add_argument("--corpus", default="runs/corpus", help="a corpus folder `specheads corpus` wrote (default "
                                                           "runs/corpus)")
    p.add_argument("--out", default="runs/prompts/edits.jsonl", help="the prompts file to write (jsonl)")
    p.add_argument("--count", type=int, default=20, help="edit requests to write (default 20)")
    p.add_argument("--skip", type=int, default=0, help="functions to leave out first, the ones of another file "
                                                        "(default 0): `--skip 20` after a held-out file of 20 "
                                                        "writes a training file that shares none of its functions")
    p.add_argument("--min_lines", type=int, default=5, help="a function's lines, at least (default 5)")
    p.add_argument("--max_lines", type=int, default=50, help="a function's lines, at most (default 50)")
    a = p.parse_args(argv)
    check_counts({"--count": a.count, "--min_lines": a.min_lines, "--max_lines": a.max_lines})
    if a.skip < 0:
        raise UserError(f"--skip must be 0 or more, got {a.skip}")
    if a.max_lines < a.min_lines:
        raise UserError(f"--max_lines {a.max_lines} is below --min_lines {a.min_lines}")
    out = OutputFile(a.out, "edit-prompts", "prompts file")
    out.check()
    import datasets

    try:
        rows = datasets.Dataset.from_parquet(f"{a.corpus}/corpus.parquet").to_list()
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as e:
        raise UserError(f"--corpus {a.corpus}: no corpus.parquet that `specheads corpus` wrote ({e})") from None
    prompts = edit_prompts(rows, a.count, a.min_lines, a.max_lines, a.skip)
    if len(prompts) < a.count:
        beyond = f" beyond the first {a.skip}" if a.skip else ""
        raise UserError(f"--corpus {a.corpus} holds {len(prompts)} functions of {a.min_lines} to {a.max_lines} lines"
                        f"{beyond}, not {a.count}: build a larger corpus or widen the lines")
    out.path.parent.mkdir(parents=True, exist_ok=True)
    write_text(out.claim(), "".join(json.dumps(r) + "\n" for r in prompts))
    print(f"wrote {out.path}: {len(prompts)} edit requests", file=sys.stderr)
    return prompts


if __name__ == "__main__":
    run_main(main)

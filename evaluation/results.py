"""The incremental results file: one JSON line per (mode, run, prompt), appended as each run finishes.

A record::

    mode      "sample" | "greedy" | …            run     "sd[k=4]" (family plus its setting)
    family    "sd"                                params  {"k": 4}
    prompt    index in the prompt table           task_id HumanEval task id (or the row index)
    tokens    generated ids                       text    their decoded text
    passed    HumanEval pass (null without tests)
    stats     {wall_s, new_tokens, target_calls, draft_calls, discarded, accepted_lengths, draft_catch_up,
               target_reads: {"tokens read": forwards}}
              (counts a peer cannot report are null or absent, as in a record made before they were kept)

An interrupted run leaves at most one partial last line; it is dropped on load and that run is redone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def run_label(family: str, params: dict) -> str:
    """``sd[k=4]``, ``specdecpp[h=file]`` (``null`` = the head file's own threshold), or ``target_only``."""
    if not params:
        return family
    return f"{family}[{','.join(f'{k}={_fmt(v)}' for k, v in params.items())}]"


def _fmt(v) -> str:
    if v is None:
        return "file"
    return f"{v:g}" if isinstance(v, float) else str(v)


def record_key(record: dict) -> tuple[str, str, int]:
    return record["mode"], record["run"], int(record["prompt"])


class ResultStore:
    """Append-only JSONL of finished runs, loaded on open so a resumed evaluation skips them."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._records: dict[tuple[str, str, int], dict] = {}
        if self.path.exists():
            lines = self.path.read_text().splitlines()
            good = []
            for line in lines:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # the partial line an interrupt left behind
                    continue
                self._records[record_key(rec)] = rec
                good.append(line)
            if len(good) != len(lines):  # rewrite without the broken line so appends start on a fresh line
                self.path.write_text("".join(g + "\n" for g in good))

    def __contains__(self, key: tuple[str, str, int]) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: tuple[str, str, int]) -> dict | None:
        """The record of (mode, run, prompt), or None."""
        return self._records.get(key)

    def add(self, record: dict) -> None:
        """Append one record and flush it to disk before returning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._records[record_key(record)] = record

    def records(self) -> list[dict]:
        return list(self._records.values())

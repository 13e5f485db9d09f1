"""The files of an evaluation's output folder, named once: every module that reads or writes one of them asks a
``RunDir`` for its path.

::

    settings.json        the settings, inputs and head digests the results were made with (``run.py``)
    results.jsonl        one record per (mode, run, prompt) (``results.py``)
    selection.json       the settings the trace simulator chose, and what it chose them from (``run.py``)
    forward_timing.json  the pair's timed forwards on this device (``bench_timing`` layout; ``run.py``)
    loglik.jsonl         the target's log-likelihood of each record's tokens (``likelihood.py``)
    traces/<mode>/<prompt>.safetensors   decoder traces of the target-only responses (``traces.py``)
    report.md, report.json, pareto.png, speedup.png, quality.png   the report (``report.py``), and roc.png, the
                         training run's ROC copied beside it
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

@dataclass(frozen=True)
class RunDir:
    """An evaluation's output folder."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    @property
    def settings(self) -> Path:
        return self.root / "settings.json"

    @property
    def results(self) -> Path:
        return self.root / "results.jsonl"

    @property
    def selection(self) -> Path:
        return self.root / "selection.json"

    @property
    def forward_timing(self) -> Path:
        return self.root / "forward_timing.json"

    @property
    def loglik(self) -> Path:
        return self.root / "loglik.jsonl"

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    def trace(self, mode: str, prompt: int) -> Path:
        """The decoder trace of prompt ``prompt``'s target-only response in ``mode``."""
        return self.traces / mode / f"{prompt:05d}.safetensors"

    def recorded_traces(self, mode: str) -> list[Path]:
        return sorted((self.traces / mode).glob("*.safetensors"))

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_json(self) -> Path:
        return self.root / "report.json"

    @property
    def pareto_png(self) -> Path:
        return self.root / "pareto.png"

    @property
    def speedup_png(self) -> Path:
        return self.root / "speedup.png"

    @property
    def quality_png(self) -> Path:
        return self.root / "quality.png"

    @property
    def roc_png(self) -> Path:
        """The training run's ROC, copied beside the report."""
        return self.root / "roc.png"

    def files(self) -> list[Path]:
        """Every file an evaluation wrote into the folder that is there, and nothing else: what ``overwrite``
        deletes."""
        # not roc.png: a report whose training folder is gone keeps showing the copy it has
        named = [self.settings, self.results, self.loglik, self.forward_timing, self.selection, self.report_md,
                 self.report_json, self.pareto_png, self.speedup_png, self.quality_png]
        return [*(p for p in named if p.is_file()), *sorted(self.traces.glob("*/*.safetensors"))]

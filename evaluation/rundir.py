"""The files of an evaluation's output folder, named once: every module that reads or writes one of them asks a
``RunDir`` for its path."""

from __future__ import annotations

from pathlib import Path

from core.runfolder import Ledger


def _file(name: str, doc: str) -> property:
    return property(lambda self: self.root / name, doc=f"``{name}``: {doc}")


class RunDir:
    """An evaluation's output folder."""

    settings = _file("settings.json", "the settings, inputs and head digests its results were made with (``run.py``)")
    results = _file("results.jsonl", "one record per (mode, run, prompt) (``results.py``)")
    selection = _file("selection.json", "the settings the trace simulator chose, and what it chose them from")
    forward_timing = _file("forward_timing.json", "the pair's forwards timed on this device (``bench_timing``'s "
                                                  "layout)")
    llama_tuning = _file("llama_tuning.jsonl", "llama.cpp's speculative decoding over its grid on the tuning "
                                               "prompts (``run.llama_jobs``)")
    loglik = _file("loglik.jsonl", "the target's log-likelihood of each record's tokens (``likelihood.py``)")
    traces = _file("traces", "the decoder traces of the target-only responses, by mode (``traces.py``)")
    report_md = _file("report.md", "the report (``report.py``)")
    report_json = _file("report.json", "every number behind the report")
    pareto_png = _file("pareto.png", "verification rate against discard rate")
    speedup_png = _file("speedup.png", "speedup over target-only per policy")
    quality_png = _file("quality.png", "quality against speedup of the approximate policies")
    roc_png = _file("roc.png", "the training run's ROC, copied beside the report")
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.ledger = Ledger(self.root, ".eval-files")
        """The files an evaluation wrote here (``core.runfolder.Ledger``): all that ``overwrite`` deletes."""

    def trace(self, mode: str, prompt: int) -> Path:
        """The decoder trace of prompt ``prompt``'s target-only response in ``mode``."""
        return self.traces / mode / f"{prompt:05d}.safetensors"

    def recorded_traces(self, mode: str) -> list[Path]:
        return sorted((self.traces / mode).glob("*.safetensors"))

    def claim(self, path: Path) -> Path:
        """Record ``path``, a file of this folder, as an evaluation's before it is written; returns it."""
        return self.ledger.claim(path)

    def files(self) -> list[Path]:
        """Every file an evaluation wrote into the folder that is there, and nothing else: what ``overwrite``
        deletes. The ledger's files; in a folder written before the ledger, the files under an evaluation's
        names."""
        return self.ledger.files() if self.ledger.exists() else self._named()

    def strays(self) -> list[Path]:
        """Files under an evaluation's names that no evaluation wrote (not in the ledger): the next run would read
        them as its own or write over them."""
        return self.ledger.strays(self._named()) if self.ledger.exists() else []

    def _named(self) -> list[Path]:
        # not roc.png: a report whose training folder is gone keeps showing the copy it has
        named = [self.settings, self.results, self.loglik, self.llama_tuning, self.forward_timing, self.selection,
                 self.report_md, self.report_json, self.pareto_png, self.speedup_png, self.quality_png]
        return [*(p for p in named if p.is_file()), *sorted(self.traces.glob("*/*.safetensors"))]

"""The files of an evaluation's output folder, named once: every module that reads or writes one of them asks a
``RunDir`` for its path."""

from __future__ import annotations

from pathlib import Path

from core.runfolder import RunFolder


def _file(name: str, doc: str) -> property:
    return property(lambda self: self.root / name, doc=f"``{name}``: {doc}")


class RunDir:
    """An evaluation's output folder."""

    settings = _file("settings.json", "the settings, inputs and head digests its results were made with "
                                      "(``resume.py``)")
    results = _file("results.jsonl", "one record per (mode, run, prompt) (``results.py``)")
    selection = _file("selection.json", "the settings the trace simulator chose, and what it chose them from")
    forward_timing = _file("forward_timing.json", "the pair's forwards timed on this device (``bench_timing``'s "
                                                  "layout)")
    llama_tuning = _file("llama_tuning.jsonl", "llama.cpp's speculative decoding over its grid on the tuning "
                                               "prompts (``llama_tuning.py``)")
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
        self.folder = RunFolder(self.root, "eval", "--output_dir", NAMES)
        """The folder's ownership (``core.runfolder``): what an evaluation may write, and all ``overwrite``
        deletes."""

    def trace(self, mode: str, prompt: int) -> Path:
        """The decoder trace of prompt ``prompt``'s target-only response in ``mode``."""
        return self.traces / mode / f"{prompt:05d}.safetensors"

    def recorded_traces(self, mode: str) -> list[Path]:
        return sorted((self.traces / mode).glob("*.safetensors"))

    def claim(self, path: Path) -> Path:
        """Record ``path``, a file of this folder, as an evaluation's before it is written; returns it."""
        return self.folder.claim(path)


NAMES = ("settings.json", "results.jsonl", "selection.json", "forward_timing.json", "llama_tuning.jsonl",
         "loglik.jsonl", "traces/*/*.safetensors", "report.md", "report.json", "pareto.png", "speedup.png",
         "quality.png", "roc.png")
"""Every file an evaluation writes (``RunDir``'s), as ``RunFolder`` patterns."""

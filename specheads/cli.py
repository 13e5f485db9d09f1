"""``specheads <command> [its flags]``: every command of the project under one name, in pipeline order.

Each subcommand runs its module exactly as ``python -m <module>`` does (its flags, its help, its one-line errors and
exit status), so both spellings stay equivalent; ``specheads`` alone, or ``--help``, lists them.
"""

from __future__ import annotations

import importlib.util
import logging
import runpy
import sys
import warnings
from pathlib import Path

COMMANDS = {
    "corpus": ("data_gen.corpus", "prompts shaped like HumanEval from installed packages (never the stdlib)"),
    "edit-prompts": ("data_gen.edit_prompts", "edit requests over corpus functions, where prompt lookup drafts"),
    "labels": ("data_gen", "label a draft/target pair: a config, e.g. --config configs/labels/corpus.yaml"),
    "snapshot": ("data_gen.snapshot", "the batches a labeling run has finished, as a dataset of their own"),
    "audit": ("data_gen.audit", "recompute random label rows with plain forwards and compare every column"),
    "bench-labels": ("data_gen.bench", "labeled target positions/s against plain target.generate"),
    "train": ("pipeline.train_all", "train, test and export every head of a list of training configs"),
    "lightning": ("pipeline", "one training config through LightningCLI: fit, validate, test or predict"),
    "curve": ("pipeline.learning_curve", "the heads' learning curve over shares of the labels"),
    "bench-train": ("pipeline.bench", "one training epoch over cached rows against a plain tensor pass"),
    "calibrate": ("decoding.calibrate", "calibrate the draft's confidence on label rows"),
    "simulate": ("evaluation.simulate", "replay every policy over label traces, beside the oracle"),
    "advise": ("evaluation.advise", "does speculative decoding pay for a pair here, in llama.cpp's own settings"),
    "eval": ("evaluation", "decode with every policy and transformers' peer, and write the report"),
    "compare": ("evaluation.pairs", "the tokens/s ratio of two runs of an eval, with its paired interval"),
    "export-hf": ("decoding.runtimes.hf_export", "a head as a transformers custom_generate folder"),
    "generate": ("decoding.runtimes.llama_cpp", "two GGUF files decoded in llama.cpp by one of our policies"),
    "bench-timing": ("evaluation.bench_timing", "per-forward times of the pair's shapes on this device"),
    "bench-precision": ("evaluation.bench_precision", "the draft at each precision: step, c and 1 - TV"),
    "bench-compiled-step": ("scripts.bench_compiled_step", "a GPU's decode step, eager against CUDA graphs"),
    "gpu-schedule": ("evaluation.schedule", "a trace-forced schedule from held-out labels, for the GPU check"),
    "gpu-check": ("scripts.gpu_check", "the graph decoder checked and timed on a GPU (scripts/gpu_check.sh)"),
    "smoke": ("scripts.smoke", "every stage on tiny random-init models"),
}
"""Subcommand → (the module it runs as ``python -m``, what it does), in pipeline order."""

LIGHTNING = {"labels", "snapshot", "bench-labels", "train", "lightning", "curve", "bench-train"}
"""The commands whose modules import Lightning as they load."""

CHECKOUT_ONLY = "scripts"
"""The package of the commands that run from a checkout of the repository: ``scripts/`` and the tiny models of
``testing/`` it decodes are not installed (``pyproject.toml``), so they are read from the checkout beside this
package, which an editable install (``pip install -e .``, ``make install``) has."""


def checkout() -> Path | None:
    """The repository checkout this package is in (the folder holding ``scripts/`` and ``testing/``), None for an
    installed wheel."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / CHECKOUT_ONLY / "__init__.py").is_file() and (root / "testing" / "__init__.py").is_file() \
        else None


def preload(name: str) -> None:
    """Import the native libraries a command's module imports as it loads (torch, and Lightning where it uses it)
    before running it, with a Ctrl-C held until they are in (``core.interrupt.CtrlCGuard.deferred``): raised inside
    torch's import, it aborts the process or ends in a traceback. Then the libraries' noise is hidden (``quiet``)."""
    from core.interrupt import CtrlCGuard

    guard = CtrlCGuard()
    with guard, guard.deferred():
        import torch  # noqa: F401

        if name in LIGHTNING:
            import pytorch_lightning  # noqa: F401
        quiet()  # transformers' logging is imported for it


OURS = r"(core|heads|decoding|data_gen|pipeline|evaluation|scripts|testing|specheads)(\.|$)"
"""The modules whose warnings are the project's own (``quiet`` never hides them)."""

LIBRARY_LOGGERS = tuple(f"{package}.utilities.{module}" for package in ("pytorch_lightning", "lightning_fabric",
                                                                       "lightning.pytorch", "lightning.fabric")
                        for module in ("rank_zero", "seed"))
"""Lightning's info loggers: at INFO they print the user's hardware ("GPU available: False"), "💡 Tip: …" adverts and
"Seed set to 0" on every run. Named one by one: Lightning sets its packages' loggers to INFO as it loads, after
``quiet``, where a command imports it late."""


class NoDeprecations(logging.Filter):
    """Drops a library's log records about its own deprecations (transformers' "`past_key_values` … are deprecated",
    "Passing `generation_config` together with generation-related arguments … is deprecated", which its own assisted
    generation triggers inside ``AssistedCandidateGenerator``): nothing a user of this project can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "deprecated" not in record.getMessage()


def quiet() -> None:
    """What the libraries print that is not for this project's users, hidden before a command runs, as the Makefile's
    ``PYTHONWARNINGS`` hides it: deprecation warnings, Lightning's warnings about its own settings (a run's batch count
    under ``log_every_n_steps``, a checkpoint folder a rerun finds full) and its info lines, transformers' deprecation
    messages. Errors, and the warnings of this project's own modules (``OURS``), still print. A ``-W`` option or
    ``PYTHONWARNINGS`` of the user's own decides the warnings instead; ``python -m <module>`` shows everything."""
    if not sys.warnoptions:
        for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("ignore", module=r"(pytorch_lightning|lightning_fabric|lightning)(\.|$)")
        warnings.filterwarnings("default", category=UserWarning, module=OURS)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if importlib.util.find_spec("transformers") is not None:
        from transformers.utils import logging as transformers_logging

        transformers_logging.get_logger()  # its handler, made once on the library's root logger
        for handler in logging.getLogger("transformers").handlers:
            if not any(isinstance(f, NoDeprecations) for f in handler.filters):
                handler.addFilter(NoDeprecations())


def usage() -> str:
    lines = ["usage: specheads <command> [flags]   (specheads <command> --help: its flags)", "", "commands:"]
    lines += [f"  {name:<20} {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"error: no command {name!r}; the commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    if module.startswith(CHECKOUT_ONLY + "."):
        root = checkout()
        if root is None:
            print(f"error: specheads {name} runs from a checkout of the repository ({CHECKOUT_ONLY}/ is not "
                  "installed): clone it and `pip install -e .` there", file=sys.stderr)
            return 2
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    sys.argv = [f"specheads {name}", *rest]
    try:
        if not {"-h", "--help"} & set(rest):
            preload(name)
    except KeyboardInterrupt:
        from core.interrupt import interrupted_line

        print(interrupted_line(), file=sys.stderr)
        return 130
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

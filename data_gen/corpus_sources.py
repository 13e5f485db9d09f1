"""The source files a corpus is read from: installed distributions and folders, with the standard library (and
copies of it) refused and test suites left out."""

from __future__ import annotations

import importlib.metadata
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from data_gen.corpus_config import STDLIB_COPIES, CorpusConfig, CorpusError


def stdlib_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths[k]).resolve() for k in ("stdlib", "platstdlib")})


def is_stdlib(path: Path) -> bool:
    """Whether ``path`` is standard-library source: inside the interpreter's stdlib folder and not in a
    site-packages/dist-packages folder below it (a pyenv or system Python keeps those there)."""
    path = Path(path).resolve()
    for d in stdlib_dirs():
        if path == d or d in path.parents:
            rel = path.relative_to(d).parts
            return not any(p in ("site-packages", "dist-packages") for p in rel)
    return False


def refuse_stdlib(path: Path, package: str) -> None:
    if is_stdlib(path):
        raise CorpusError(f"{path} ({package}) is in the Python standard library, which is reserved for "
                          "out-of-distribution evaluation; it cannot be a corpus source")


def is_test_file(path: Path) -> bool:
    """Test suites (``tests/``, ``test_*.py``, ``conftest.py``): asserts on fixtures, not HumanEval-shaped tasks."""
    parts = Path(path).parts
    name = parts[-1]
    return (any(p in ("tests", "test", "testing") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


@dataclass
class Source:
    package: str
    version: str
    files: list[Path]  # sorted .py files
    root: Path  # provenance paths are relative to it


def distribution_source(name: str) -> Source | None:
    """An installed distribution's .py files (None when it is not installed); refuses stdlib copies and files."""
    canon = re.sub(r"[-_.]+", "-", name).lower()
    if canon in STDLIB_COPIES:
        raise CorpusError(f"{name} is refused as a corpus source (a copy of standard-library code, HumanEval, or "
                          "this project)")
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = sorted({Path(dist.locate_file(f)).resolve() for f in dist.files or [] if f.suffix == ".py"})
    files = [f for f in files if f.is_file() and not is_test_file(f)]
    root = Path(dist.locate_file("")).resolve()
    for f in files:
        refuse_stdlib(f, name)
    return Source(dist.metadata["Name"], dist.version, files, root)


def folder_source(folder: str) -> Source:
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise CorpusError(f"source folder not found: {folder}")
    refuse_stdlib(root, root.name)
    files = sorted(p.resolve() for p in root.rglob("*.py") if not is_test_file(p.relative_to(root)))
    for f in files:
        refuse_stdlib(f, root.name)
    return Source(root.name, "local", files, root.parent)


def sources(cfg: CorpusConfig) -> tuple[list[Source], list[str]]:
    """The sources to read, and the requested distributions that are not installed."""
    names = cfg.packages
    if names == ["all"]:
        names = sorted({d.metadata["Name"] for d in importlib.metadata.distributions()
                        if re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() not in STDLIB_COPIES},
                       key=str.lower)
    out, missing = [], []
    for n in names:
        s = distribution_source(n)
        if s is None:
            missing.append(n)
        elif s.files:
            out.append(s)
    out += [folder_source(p) for p in cfg.paths]
    if not out:
        raise CorpusError("no source files: none of the packages is installed and no paths were given")
    return out, missing

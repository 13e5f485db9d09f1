"""The candidate rows of one source file: every documented function or method as a HumanEval-shaped prompt and
body, filtered (``data_gen.corpus`` lists the filters)."""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from pathlib import Path

from data_gen.corpus_config import CorpusConfig
from data_gen.corpus_sources import Source

TOKEN = re.compile(r"\w+|[^\w\s]")
STUB_SUMMARY = re.compile(r"^(deprecated|alias|see |same as|todo|fixme|internal|private|helper|wrapper|"
                          r"override|overrides|implements|compat|backport|\w+\(\))", re.I)



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

"""The import graph, read from the sources: stages import downward only, no module imports itself through others,
and no module takes a private name (``_x``) from another."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {
    "core": {"core"},
    "heads": {"core", "heads"},
    "decoding": {"core", "heads", "decoding"},
    "data_gen": {"core", "data_gen"},
    "pipeline": {"core", "heads", "decoding", "pipeline"},
    "evaluation": {"core", "heads", "decoding", "evaluation"},
    "testing": {"core", "data_gen", "testing"},
    "scripts": {"core", "heads", "decoding", "data_gen", "pipeline", "evaluation", "testing", "scripts"},
    "specheads": {"core", "specheads"},
}
"""Per stage (top-level package), the packages its modules may import: the layers below it and itself."""

IMPORTED_ONLY_BY = {"evaluation": {"evaluation", "scripts"}, "testing": {"testing", "scripts"}}
# specheads, the command line, reaches every stage by module name when a subcommand runs, never by an import (core's
# Ctrl-C guard it uses while it preloads torch)
"""Packages that only some others may import (``tests/`` may import any): the experiment harness, which only the
scripts that drive it use, so the decoding library a user imports never reaches into it; and the tiny and stub
models, which only the tests and the smoke run decode with."""


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted module name: file} of every module in the stage packages (a package is its ``__init__``)."""
    modules = {}
    for package in ALLOWED:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports(name: str, source: str, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """The project modules ``source`` (module ``name``) imports anywhere in its text, each with the names it takes
    from it: ``from a.b import c`` is module ``a.b.c`` when that is a module, else names ``c`` of ``a.b``."""
    package = name if modules.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    found.append((f"{base}.{a.name}", []))
                elif base in modules:
                    found.append((base, [a.name]))
    return found


def violations(modules: dict[str, Path], sources: dict[str, str]) -> list[str]:
    """Upward imports, imports of private names, and import cycles, one line each."""
    problems = []
    graph: dict[str, set[str]] = {}
    for name in modules:
        stage = name.split(".")[0]
        graph[name] = set()
        for target, names in imports(name, sources[name], modules):
            if target.split(".")[0] not in ALLOWED[stage]:
                problems.append(f"{name} imports {target}: against the layers "
                                f"({stage} may import {', '.join(sorted(ALLOWED[stage]))})")
            importers = IMPORTED_ONLY_BY.get(target.split(".")[0])
            if importers is not None and stage not in importers:
                problems.append(f"{name} imports {target}: only {', '.join(sorted(importers))} may")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and target != name:
                problems.append(f"{name} imports private {', '.join(private)} from {target}")
            if target != name:
                graph[name].add(target)
    problems += [f"import cycle among {', '.join(c)}" for c in cycles(graph)]
    return list(dict.fromkeys(problems))  # one line per pair of modules, not per imported name


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each import cycle: every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_project_imports_flow_downward():
    modules = project_modules()
    sources = {name: path.read_text() for name, path in modules.items()}
    assert violations(modules, sources) == []


def test_checks_can_fail():
    modules = {name: Path(f"{name.replace('.', '/')}.py") for name in
               ("core.a", "heads.b", "heads.c", "evaluation.d", "data_gen.e", "decoding.f")}
    sources = {
        "core.a": "from heads.b import thing\n",  # upward
        "heads.b": "def f():\n    from heads.c import x\n",  # a lazy import still counts
        "heads.c": "from heads.b import y\n",  # ... and closes a cycle
        "evaluation.d": "from data_gen.e import _private\n",  # a stage beside it, and a private name
        "data_gen.e": "from core.a import ok\n",
        "decoding.f": "from evaluation.d import harness\n",  # the library reaching into the harness
    }
    found = violations(modules, sources)
    assert any(p.startswith("core.a imports heads.b: against the layers") for p in found)
    assert "import cycle among heads.b, heads.c" in found
    assert any(p.startswith("evaluation.d imports data_gen.e: against the layers") for p in found)
    assert "evaluation.d imports private _private from data_gen.e" in found
    assert not any(p.startswith("data_gen.e") for p in found)
    assert "decoding.f imports evaluation.d: only evaluation, scripts may" in found


BACKEND_MODULES = {"core.backends", "decoding.backends", "core.llama_cpp"}
"""Where a backend is told apart from another; everywhere else asks a backend what it can do."""


def backend_tests(sources: dict[str, str]) -> list[str]:
    """Each place outside ``BACKEND_MODULES`` that tests which backend it holds: a comparison with a backend's
    name, or an ``isinstance`` check against llama.cpp's model class."""
    from core.backends import BACKENDS

    found = []
    for name, source in sources.items():
        if name in BACKEND_MODULES:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Constant) and s.value in BACKENDS for s in sides):
                    found.append(f"{name}:{node.lineno} compares with a backend's name")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" \
                    and "LlamaCppModel" in ast.unparse(node.args[1]):
                found.append(f"{name}:{node.lineno} tests for llama.cpp's model class")
    return found


def test_no_stage_tests_which_backend_it_holds():
    modules = project_modules()
    assert backend_tests({name: path.read_text() for name, path in modules.items()}) == []
    broken = {"evaluation.x": 'if cfg.backend == "llama_cpp":\n    pass\n',
              "data_gen.y": "ok = isinstance(model, LlamaCppModel)\n", "core.backends": 'b == "llama_cpp"\n'}
    assert backend_tests(broken) == ["evaluation.x:1 compares with a backend's name",
                                     "data_gen.y:1 tests for llama.cpp's model class"]

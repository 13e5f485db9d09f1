"""The corpus builder on a small fixture package: filters, dedup, provenance, HumanEval overlap, stdlib refusal,
determinism, and reading the folder back through ``prompts.source``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from core.errors import UserError
from core.prompts import PromptConfig, load_prompt_table
from data_gen import corpus, corpus_dedupe, corpus_sources
from data_gen.corpus import build_corpus
from data_gen.corpus_config import CorpusConfig, CorpusError

GOOD = '''
def running_total(values, start=0):
    """Return the running totals of values, starting from start."""
    out = []
    acc = start
    for v in values:
        if v is None:
            continue
        acc += v
        out.append(acc)
    if not out:
        return [start]
    return out
'''

NEAR = '''
def running_sum(items, start=0):
    """Compute running sums of the items, beginning at start."""
    out = []
    acc = start
    for v in items:  # a comment does not make a new function
        if v is None:
            continue
        acc += v
        out.append(acc)
    if not out:
        return [start]
    return out
'''

OTHERS = '''
import functools


def no_doc(x):
    y = x + 1
    z = y * 2
    return z


def stub(x):
    """Compute something that subclasses must provide."""
    raise NotImplementedError


def short(x):
    """Return x plus one, always."""
    y = x + 1
    return y


def alias(x):
    """Deprecated: use running_total instead."""
    a = x
    b = a
    return b


class Grid:
    """A grid of cells."""

    @functools.lru_cache
    def neighbours(self, row, col):
        """List the in-bounds neighbours of a cell in the grid."""
        cells = []
        for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
            r, c = row + dr, col + dc
            if 0 <= r < self.rows and 0 <= c < self.cols:
                cells.append((r, c))
        return cells


def test_skipped(x):
    """A test in the package, not a task for the corpus."""
    a = x
    b = a
    return b
'''

# NEAR's body differs from GOOD's in one token: 5-gram shingle Jaccard 30/40 = 0.75

# HumanEval/0's canonical solution under another name: must be dropped as a HumanEval near-duplicate
HUMANEVAL_COPY = '''
def close_pairs(numbers, threshold):
    """Tell whether any two numbers are closer than the threshold."""
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = abs(elem - elem2)
                if distance < threshold:
                    return True

    return False
'''


def fixture_package(root: Path) -> Path:
    pkg = root / "fixturepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "tests").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text(GOOD)
    (pkg / "sub" / "copy.py").write_text(GOOD)  # an exact duplicate, in a file sorted after good.py
    (pkg / "sub" / "near.py").write_text(NEAR)
    (pkg / "others.py").write_text(OTHERS)
    (pkg / "he.py").write_text(HUMANEVAL_COPY)
    (pkg / "tests" / "helpers.py").write_text(GOOD.replace("running_total", "in_tests"))
    return pkg


def build(tmp_path, out="out", **kw) -> tuple[dict, list[dict]]:
    pkg = fixture_package(tmp_path / "src") if not (tmp_path / "src").exists() else tmp_path / "src" / "fixturepkg"
    cfg = CorpusConfig(out=str(tmp_path / out), packages=[], paths=[str(pkg)], min_prompts=0, **kw)
    manifest = build_corpus(cfg)
    rows = load_prompt_table(PromptConfig(source=str(tmp_path / out)), need_response=True)
    return manifest, rows


def test_filters_dedup_and_provenance(tmp_path):
    manifest, rows = build(tmp_path)
    names = sorted(r["text"].split("def ")[1].split("(")[0] for r in rows)
    assert names == ["neighbours", "running_total"]  # the copy, the near-duplicate and everything filtered: gone
    c = manifest["counts"]
    assert c["exact_duplicates"] == 1 and c["near_duplicates"] == 1
    assert c["trivial_body"] == 1 and c["body_length"] == 1 and c["docstring_quality"] == 1
    assert c["test_function"] == 1
    assert manifest["humaneval"]["dropped"] == ["fixturepkg:fixturepkg.he.close_pairs (1.00)"]
    assert manifest["humaneval"]["near_duplicates_kept"] == 0
    import datasets

    table = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "corpus.parquet"), split="train")
    by_name = {r["entry_point"]: r for r in table}
    total = by_name["running_total"]
    assert (total["package"], total["version"], total["file"], total["line"], total["kind"]) == (
        "fixturepkg", "local", "fixturepkg/good.py", 2, "function")
    assert total["qualname"] == "fixturepkg.good.running_total"
    assert total["canonical_solution"].startswith("    out = []\n")
    method = by_name["neighbours"]
    assert method["qualname"] == "fixturepkg.others.Grid.neighbours" and method["kind"] == "method"
    # class context kept, the lru_cache decorator dropped; prompt + body is valid Python
    assert method["prompt"].startswith("class Grid:\n    def neighbours(self, row, col):\n        \"\"\"List")
    compile(method["prompt"] + method["canonical_solution"], "<row>", "exec")
    assert manifest["rows"] == 2 and manifest["packages"]["fixturepkg"]["rows"] == 2


def test_deterministic_digest(tmp_path):
    m1, rows1 = build(tmp_path, "a")
    m2, rows2 = build(tmp_path, "b")
    assert m1["digest"] == m2["digest"] and rows1 == rows2
    # any change in a source changes the digest
    (tmp_path / "src" / "fixturepkg" / "good.py").write_text(GOOD.replace("acc += v", "acc = acc + v"))
    m3, _ = build(tmp_path, "c")
    assert m3["digest"] != m1["digest"]


def test_refuses_the_standard_library(tmp_path):
    stdlib_pkg = Path(json.__file__).parent
    assert corpus_sources.is_stdlib(stdlib_pkg / "decoder.py")
    # site-packages, even when it sits below the stdlib folder
    assert not corpus_sources.is_stdlib(Path(pytest.__file__))
    with pytest.raises(CorpusError, match="standard library"):
        build_corpus(CorpusConfig(out=str(tmp_path / "o"), packages=[], paths=[str(stdlib_pkg)], min_prompts=0))
    with pytest.raises(CorpusError, match="standard-library"):
        build_corpus(CorpusConfig(out=str(tmp_path / "o"), packages=["multiprocess"], min_prompts=0))


def test_too_few_prompts_and_cli_errors(tmp_path, capsys):
    pkg = fixture_package(tmp_path / "src")
    with pytest.raises(CorpusError, match="only 2 prompts"):
        build_corpus(CorpusConfig(out=str(tmp_path / "o"), packages=[], paths=[str(pkg)], min_prompts=10))
    assert corpus.main(["--packages", "[]", "--paths", f"[{tmp_path / 'missing'}]", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: source folder not found: {tmp_path / 'missing'}"]


def test_prompt_folder_without_parquet(tmp_path):
    from core.errors import UserError

    with pytest.raises(UserError, match="no .parquet files"):
        load_prompt_table(PromptConfig(source=str(tmp_path)), need_response=False)


def test_humaneval_overlap_scores():
    he = corpus_dedupe.HumanEvalOverlap(10)
    first = corpus_dedupe.humaneval_problems()[0]
    assert he.score(first["canonical_solution"]) == 1.0
    assert he.score(textwrap.dedent(GOOD)) == 0.0


def test_refuses_a_folder_that_is_not_a_corpus(tmp_path, capsys, monkeypatch):
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "manifest.json").write_text('{"splits": {}}\n')
    (labels / "data.parquet").write_text("not ours")
    before = {f.name: f.read_text() for f in labels.iterdir()}
    with pytest.raises(UserError, match="no `specheads corpus` wrote it"):
        build(tmp_path, "labels")
    assert {f.name: f.read_text() for f in labels.iterdir()} == before  # untouched
    assert corpus.main(["--packages", "[]", "--paths", f"[{tmp_path}]", "--out", str(labels)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --out") and "no `specheads corpus` wrote it" in err[0]
    (labels / "manifest.json").write_text('{"kind": "corpus"}\n')  # shaped like a corpus's: still not ours
    with pytest.raises(UserError, match="no `specheads corpus` wrote it"):
        build(tmp_path, "labels")
    monkeypatch.chdir(tmp_path / "src")
    with pytest.raises(UserError, match="is the current directory"):
        build_corpus(CorpusConfig(out=".", packages=[], paths=[str(tmp_path / "src" / "fixturepkg")], min_prompts=0))


def test_rebuilds_a_corpus_folder_in_place(tmp_path):
    first, _ = build(tmp_path)
    assert first["kind"] == "corpus"
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "src" / "fixturepkg" / "good.py").write_text(GOOD.replace("acc += v", "acc = acc + v"))
    second, rows = build(tmp_path)
    assert second["digest"] != first["digest"] and len(rows) == second["rows"]
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == [".specheads-files", "corpus.parquet",
                                                                   "manifest.json", "notes.txt"]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["digest"] == second["digest"]


def test_edit_prompts_ask_for_edits_of_whole_corpus_functions(tmp_path):
    """``specheads edit-prompts``: each corpus function whole (signature, docstring, body) under one edit request in
    turn, a prompts file the eval reads; too few functions, or a file no run of it wrote, is one line."""
    from core.errors import UserError
    from data_gen import edit_prompts

    build(tmp_path)
    out = tmp_path / "prompts" / "edits.jsonl"
    args = ["--corpus", str(tmp_path / "out"), "--out", str(out), "--min_lines", "1"]
    prompts = edit_prompts.main([*args, "--count", "2"])
    assert [p["instruction"] for p in prompts] == list(edit_prompts.INSTRUCTIONS[:2])
    assert all(p["prompt"].startswith(p["instruction"]) and "```python\n" in p["prompt"] for p in prompts)
    neighbours = next(p for p in prompts if p["qualname"].endswith("neighbours"))
    assert 'class Grid:\n    def neighbours(self, row, col):\n        """List' in neighbours["prompt"]
    rows = load_prompt_table(PromptConfig(source=str(out), response_field=None), need_response=False)
    assert [r["text"] for r in rows] == [p["prompt"] for p in prompts]
    second = edit_prompts.main([*args, "--count", "1", "--skip", "1"])  # a file sharing no function
    assert second[0]["qualname"] == prompts[1]["qualname"] and second[0]["instruction"] == prompts[1]["instruction"]
    edit_prompts.main([*args, "--count", "1"])  # its own file is replaced
    with pytest.raises(UserError, match="holds 2 functions of 1 to 50 lines, not 3"):
        edit_prompts.main([*args, "--count", "3"])
    (tmp_path / "notes.jsonl").write_text("mine\n")
    with pytest.raises(UserError, match="exists and no `specheads edit-prompts` wrote it"):
        edit_prompts.main([*args[:2], "--out", str(tmp_path / "notes.jsonl"), "--count", "1"])
    assert (tmp_path / "notes.jsonl").read_text() == "mine\n"

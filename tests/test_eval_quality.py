"""HumanEval pass@1 through the execution harness, stop-sequence truncation, and ROUGE sanity."""

from __future__ import annotations

import pytest

from evaluation import quality

PROBLEM = {
    "task_id": "toy/0",
    "prompt": "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n",
    "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}


@pytest.mark.parametrize("backend", ["subprocess", "auto"])
def test_pass_fail_and_timeout(backend):
    assert quality.check(PROBLEM, "    return a + b\n", 5, backend)["passed"]
    wrong = quality.check(PROBLEM, "    return a - b\n", 5, backend)
    assert not wrong["passed"] and wrong["result"].startswith("failed")
    hang = quality.check(PROBLEM, "    while True:\n        pass\n", 1, backend)
    assert not hang["passed"] and hang["result"] == "timed out"


def test_truncate_at_stop_sequences():
    text = "    return a + b\n\ndef other():\n    pass\n"
    assert quality.truncate(text) == "    return a + b\n"
    assert quality.truncate("    return 1\n# comment") == "    return 1"
    assert quality.truncate("    return 1") == "    return 1"
    assert quality.check(PROBLEM, quality.truncate("    return a + b\nprint(add(1, 2))\n"), 5)["passed"]


def test_pass_at_1():
    assert quality.pass_at_1([True, False, None, True]) == pytest.approx(2 / 3)
    assert quality.pass_at_1([None, None]) is None


def test_rouge_sanity():
    same = quality.rouge(["return a + b"], ["return a + b"])
    assert all(v == pytest.approx(1.0) for v in same.values())
    disjoint = quality.rouge(["x y z"], ["p q r"])
    assert all(v == pytest.approx(0.0) for v in disjoint.values())
    partial = quality.rouge(["return a + b"], ["return a - b"])
    assert 0 < partial["rouge2"] < partial["rouge1"] < 1
    # punctuation counts: code differing only in an operator is not a perfect match
    assert quality.rouge(["a+b"], ["a-b"])["rouge1"] < 1

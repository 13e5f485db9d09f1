"""``specheads advise --check``: the runtime itself at the advised setting, at its defaults and at a few more, beside
its target alone, on prompts that are not among the traces; measured against predicted. llama.cpp through its own
binaries (``make llama-tools``), transformers through ``generate()`` (``evaluation.hf_peer``)."""

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
from decoding.costs import CostModel
from evaluation import llama_peer
from evaluation.advice_rules import LLAMA_CPP, TRANSFORMERS, Setting, best, budget
from evaluation.advise_inputs import timed_with
from evaluation.bench_timing_binaries import TIMED_WITH, layout, median_timing, time_alike
from evaluation.simulate_lookup import priced_interval

MORE = {LLAMA_CPP: ("draft-simple", {"n_max": 16, "p_min": 0.0}),
        TRANSFORMERS: ("assisted", {"schedule": "heuristic_transient", "k": 20, "threshold": 0.4})}
"""The one more setting ``--check`` measures: llama.cpp's former default n_max with today's p_min, where users report
acceptance falling apart; transformers' former default schedule (K moved each round) at its defaults otherwise."""


RETIMING_REPEATS = 3
"""``llama-bench``'s repetitions of each forward when the check times the device again (three times: before its
first prompt, at its middle, after its last; each time about a minute on two cores for the default pair)."""


def check_settings(settings: list[Setting], pick: Setting | None, runtime: str = LLAMA_CPP) -> list[Setting]:
    """What ``--check`` runs beside target-only: the advised setting (or, when none is, the best predicted), each
    of the runtime's rules' defaults, the best predicted setting of each drafter, and ``MORE``."""
    chosen = [pick or best(settings, runtime)] + [s for s in settings if s.runtime == runtime and s.default]
    chosen += [best(settings, runtime, "draft model"), best(settings, runtime, "prompt lookup")]
    rule, params = MORE[runtime]
    chosen += [s for s in settings if s.rule == rule and s.params == params]
    return [s for s in dict.fromkeys(chosen) if s is not None]


def check(a, run: dict, settings: list[Setting], pick: Setting | None, traces, sampling: dict,
          folder: RunFolder, runtime: str = LLAMA_CPP) -> list[dict]:
    """The runtime on ``--check`` prompts that are not among the traces, each prompt's runs one after another (a
    paired ratio meets the machine's speed of that minute); measured against predicted. Each run is kept in
    ``check.jsonl`` as it ends, under the settings it was made with: a rerun with the same ones runs only what is
    missing, one with other settings or other runs to make starts the file again. With a timing of llama.cpp's
    binaries the device is timed again before the first prompt's runs, at the middle and after the last
    (``timing_places``), each timing kept beside the runs, and the counts priced at their median as well; a timing
    file of other lengths starts the file again, and where every run is kept no timing is made (it would not be
    the check's)."""
    opened = (open_llama if runtime == LLAMA_CPP else open_transformers)(a, run, sampling)
    tok, made_with, run_one, timer, timed_like = opened
    template = bool(run["prompts"].get("chat_template"))
    seen = {prompt_digest(t.prompt) for t in traces}
    rows = load_prompt_table(PromptConfig(source=a.check_prompts, response_field=None, chat_template=template),
                             need_response=False)
    prompts = [ids for ids in (tokenize_prompt(tok, r["text"], template) for r in rows)
               if prompt_digest(ids) not in seen][:a.check]
    if len(prompts) < 2:
        raise UserError(f"--check_prompts {a.check_prompts}: {len(prompts)} prompts not among the traces; --check "
                        "needs at least 2")
    if len(prompts) < a.check:
        print(f"advise: --check_prompts {a.check_prompts}: {len(prompts)} prompts not among the traces; checking "
              f"those, not the {a.check} asked", file=sys.stderr)
    chosen = check_settings(settings, pick, runtime)
    runs = [("target only", None), *[(c.label, c) for c in chosen]]
    # the runs kept are reused only for the same runs: a pick that moved would pair new runs with target-only runs
    # of another hour, which the report calls side by side
    made_with = {**made_with, "runs": sorted(label for label, _ in runs), "timed_like": timed_like}
    record = folder.claim(folder.root / "check.jsonl")
    done, kept = read_check(record, made_with)
    if not done and not kept:
        record.write_text(json.dumps({"made_with": made_with}) + "\n")
    if (done or kept) and not record.read_text().endswith("\n"):  # a killed run's half line: the next on its own
        with record.open("a") as f:
            f.write("\n")
    todo = [(i, ids, run_) for i, ids in enumerate(prompts) for run_ in runs
            if (prompt_digest(ids), run_[0]) not in done]
    places = {} if timer is None else timing_places([prompt_digest(ids) for ids in prompts])
    timings = {place: t for place, t in kept.items() if place in places.values() and timed_alike(t, timed_like)}
    # timed only between runs made now: timings made after every run was kept would not be the check's
    missing = [place for place in places.values() if place not in timings] if todo else []
    bar = tqdm(total=len(todo) + len(missing), desc="advise: --check", disable=a.quiet, file=sys.stderr)
    for i in range(len(prompts) + 1):
        if places.get(i) in missing:  # the device's costs at this minute, between the prompts' runs
            timings[places[i]] = timer()
            append_line(record, {"device_timing": places[i], "timing": timings[places[i]]})
            bar.update()
        for _, ids, (label, setting) in (t for t in todo if t[0] == i):
            done[prompt_digest(ids), label] = stats = run_one(setting, ids, prompt_seed(0, i))
            append_line(record, {"prompt": prompt_digest(ids), "run": label, "stats": stats})
            bar.update()
    bar.close()
    during = CostModel.from_timing(median_timing([timings[k] for k in sorted(timings)])) if timings else None
    measured = {label: [done[prompt_digest(ids), label] for ids in prompts] for label, _ in runs}
    return [{"setting": c, "label": c.label, "predicted": c.speedup.value, "prompts": len(prompts),
             "predicted_during": None if during is None else priced_interval(c.counts, during).value,
             "timed_during": len(timings), "measured": speedup_interval(measured[c.label], measured["target only"]),
             "predicted_rates": c.rates(), "measured_rates": rates(measured[c.label])} for c in chosen]


def timing_places(digests: list[str]) -> dict[int, str]:
    """Before which prompt's runs (index ``len(digests)``: after the last prompt's) the check times the device
    again, and how its ``check.jsonl`` line names that place: before the first prompt, at the middle, after the
    last, each by a prompt's digest (a check of other prompts times the device again)."""
    n = len(digests)
    return {i: f"before {digests[i]}" if i < n else f"after {digests[-1]}" for i in sorted({0, n // 2, n})}


def timed_alike(timing, like: tuple | None) -> bool:
    """Whether a kept timing was made at ``like``'s layout (a hand-edited or foreign line is not: it is made
    again)."""
    try:
        return like is not None and layout(timing) == like
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return False


def append_line(record: Path, line: dict) -> None:
    with record.open("a") as f:
        f.write(json.dumps(line) + "\n")


def open_llama(a, run: dict, sampling: dict):
    """(tokenizer, what the runs are made with, one run of a setting — None: the target alone — on a prompt, a
    timing of the device like ``--timing``'s and that timing's ``layout``; both None where ``--timing`` was not
    timed by llama.cpp's binaries) of llama.cpp's own binaries."""
    peer = llama_peer.LlamaPeer(enabled=True, tools=a.tools)
    for name in ("llama-completion", "llama-speculative-simple"):
        peer.binary(name)  # missing binaries: one line, before anything runs
    target_spec, draft_spec = recorded_model(run, "target"), recorded_model(run, "draft")
    target_path, target_id = gguf_file(target_spec)
    draft_path, draft_id = gguf_file(draft_spec)
    tok = llama_tokenizer(target_spec, target_path, target_id)
    s = Sampling(temperature=sampling["temperature"], top_k=sampling["top_k"], top_p=sampling["top_p"],
                 max_new_tokens=budget(sampling))
    made_with = {"target": target_id, "draft": draft_id, "sampling": vars(s), "threads": a.threads,
                 "tools": str(Path(a.tools).resolve()), "wall": llama_peer.WALL}
    family = {"draft-simple": llama_peer.SPECULATIVE, "ngram-simple": llama_peer.PROMPT_LOOKUP}

    def run_one(setting: Setting | None, ids: list[int], seed: int) -> dict:
        fam, params = (llama_peer.TARGET_ONLY, {}) if setting is None else (family[setting.rule], setting.params)
        try:
            return llama_peer.run(peer, fam, params, target_path, draft_path, tok.decode(ids), s, seed, a.threads)[1]
        except RuntimeError as e:  # the binary failed: its last lines, in one
            raise UserError(" ".join(str(e).split())) from None

    timing = json.loads(Path(a.timing).read_text())
    # a timing of llama.cpp's binaries is made again during the check (those kept from a run at another timing
    # file's lengths are not mixed in); one through the binding is of the decoder's forwards, not the binaries'
    paths = {"draft": draft_path, "target": target_path}
    if timed_with(timing) != TIMED_WITH:
        return tok, made_with, run_one, None, None
    return tok, made_with, run_one, lambda: time_alike(timing, a.tools, paths, RETIMING_REPEATS), layout(timing)


def open_transformers(a, run: dict, sampling: dict):
    """``open_llama``'s five of transformers' ``generate()`` (no timing again: its forwards are timed otherwise):
    the labels' pair loaded as they were labeled, the draft as ``assistant_model`` with the setting on its
    generation config; greedy, as the traces."""
    import torch

    from core.backends import backend
    from core.models import eos_token_ids
    from evaluation.advice_report import generation_fields
    from evaluation.hf_peer import hf_generate

    pair = backend(TRANSFORMERS).load_pair(recorded_model(run, "draft"), recorded_model(run, "target"),
                                           run.get("dtype", "float32"))
    eos = eos_token_ids(pair.target, pair.tokenizer)
    s = Sampling(temperature=0.0, max_new_tokens=budget(sampling, TRANSFORMERS))
    made_with = {"target": pair.models["target"], "draft": pair.models["draft"], "sampling": vars(s),
                 "threads": torch.get_num_threads(), "wall": "generate"}

    def run_one(setting: Setting | None, ids: list[int], seed: int) -> dict:
        if setting is None:
            return hf_generate(pair.draft, pair.target, ids, s, eos, seed, assisted=False)[1]
        return hf_generate(pair.draft, pair.target, ids, s, eos, seed, generation_fields(setting.params))[1]

    return pair.tokenizer, made_with, run_one, None, None


def rates(runs: list[dict]) -> tuple[float, float | None]:
    """(target calls, drafted tokens discarded) per token over the runtime's runs, as ``Setting.rates`` predicts
    them (None where the runtime does not count them): where these agree and the speedups do not, the costs are
    off, not the replay."""
    tokens = sum(r["new_tokens"] for r in runs)
    discarded = [r["discarded"] for r in runs]
    return (sum(r["target_calls"] for r in runs) / tokens,
            None if None in discarded else sum(discarded) / tokens)


def read_check(path: Path, made_with: dict) -> tuple[dict, dict]:
    """((prompt digest, run) → stats, place → the device's timing there) of what ``check.jsonl`` holds, when made with
    ``made_with``; else none. A line a killed run left half-written is skipped (its run is made again)."""
    lines = path.read_text().splitlines() if path.is_file() else []
    try:
        if not lines or json.loads(lines[0]).get("made_with") != json.loads(json.dumps(made_with)):
            return {}, {}
    except (ValueError, AttributeError):
        return {}, {}
    done, timings = {}, {}
    for line in lines[1:]:
        try:
            r = json.loads(line)
            if "device_timing" in r:
                timings[str(r["device_timing"])] = r["timing"]
            else:
                done[r["prompt"], r["run"]] = r["stats"]
        except (ValueError, KeyError, TypeError):
            continue
    return done, timings

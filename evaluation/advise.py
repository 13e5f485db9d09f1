"""``specheads advise``: does speculative decoding pay for this pair, on this machine, and with which settings of
the runtime it runs on, llama.cpp, transformers or vLLM? From a label folder's traces of the target's responses (``make
labels``, on the runtime's backend) and this device's timing file of that backend (``specheads bench-timing``),
every drafter and rule the runtime offers is replayed at every setting of its grid beside our rules and the oracles
(``evaluation.advice_rules``); the fastest setting whose interval over the prompts clears 1.0 is advised in the
runtime's own terms (llama.cpp's flags, transformers' assisted-generation fields), or "do not speculate here".
``--runtime vllm`` advises vLLM's draft-model proposer (``speculative_config``) from traces made in transformers and
the timing file of the device it runs on (``--other_device``); it is priced, never run here.
``--check N`` runs the runtime itself (llama.cpp's binaries, transformers' ``generate()``) at the advised setting,
its defaults and one more, and its target alone, on N prompts that are not among the traces, and prints measured
beside predicted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from core.arguments import CommandParser, description
from core.errors import SettingError, UserError
from core.interrupt import run_main
from core.models import read_pair_file
from core.prompts import PromptConfig, load_prompt_table
from core.runfolder import RunFolder
from core.shards import SPLITS
from decoding.costs import read_timing
from evaluation.advice_report import another_set, another_set_line, markdown, paste, picture, verdict
from evaluation.advice_rules import (CEILING, DRAFT_PROBABILITY_TOP_K, LLAMA_CPP, OURS, TRAINED_RULES, TRANSFORMERS,
                                     VLLM, best, budget, ceilings, our_settings, our_trained_settings, price,
                                     runtime_settings)
from evaluation.advise_check import check
from evaluation.advise_inputs import check_inputs, check_labels, read_estimates, timed_with
from evaluation.advise_traces import advice_traces, load_draft
from evaluation.bench_timing_binaries import TIMED_WITH
from evaluation.llama_peer import LlamaPeer

OUTPUTS = ("advice.md", "advice.json", "advice.png", "check.jsonl", "pair.yaml", "traces.yaml")


ANOTHER_SET = 20
"""How many other prompts the advice says the advised setting may run at, without ``--check`` (with it: its count)."""


def parse_args(argv: list[str] | None = None):
    p = CommandParser(prog="specheads advise", description=description(__doc__))
    p.add_argument("--labels", default=None, metavar="FOLDER",
                   help="a label folder made on llama.cpp (`backend: llama_cpp`) or transformers; its `target` "
                        "responses are the traces, whatever their split, and its backend the runtime advised "
                        "(default: traced here in llama.cpp, from --pair and --prompts)")
    p.add_argument("--timing", default=None, metavar="FILE",
                   help="this device's costs on the labels' backend: `specheads bench-timing --backend llama_cpp "
                        "--tools … --verify_lengths …`, or `--backend transformers --precision …` (default: timed "
                        "here in llama.cpp, from --pair)")
    p.add_argument("--out", required=True, metavar="FOLDER",
                   help="folder for advice.md, advice.json, advice.png (and traces/, timing/ where made here)")
    p.add_argument("--pair", default=None, metavar="FILE",
                   help="a pair file (configs/models/*.yaml) of two GGUF files, traced and timed here in llama.cpp "
                        "where --labels or --timing is not given")
    p.add_argument("--draft", default=None, metavar="GGUF", help="instead of --pair: the draft's GGUF file")
    p.add_argument("--target", default=None, metavar="GGUF", help="instead of --pair: the target's GGUF file")
    p.add_argument("--prompts", default="humaneval", metavar="SOURCE",
                   help="the prompts traced with --pair: a .jsonl with a `prompt` field, or humaneval (default)")
    p.add_argument("--traces", type=int, default=20, help="prompts traced with --pair (default 20)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the target's sampling temperature for the traces (0, the default: greedy)")
    p.add_argument("--max_new_tokens", type=int, default=255, help="tokens of each traced response (default 255)")
    p.add_argument("--chat_template", action="store_true", help="read each prompt as a user turn of the chat template")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads of the timing made here (default 2)")
    p.add_argument("--runtime", default=None, choices=("llama.cpp", "transformers", "vllm"),
                   help="the runtime to advise (default: the labels' backend's: llama.cpp or transformers); vllm: its "
                        "draft-model proposer, from traces made in transformers, priced at --timing (typically a "
                        "GPU's, with --other_device) and never run here")
    p.add_argument("--other_device", action="store_true",
                   help="advise from a timing file of another device: the advice is then for that device")
    p.add_argument("--check", type=int, default=0, metavar="N",
                   help="also run the runtime itself (llama.cpp's own binaries, `make llama-tools`; transformers' "
                        "generate()) on N prompts of --check_prompts that are not among the traces: the advised "
                        "setting, its defaults, one more, and its target alone (default 0: no check)")
    p.add_argument("--check_prompts", default=None, metavar="SOURCE",
                   help="the prompts --check runs (a .jsonl with a `prompt` field, or `humaneval`); the labels' "
                        "chat template setting applies")
    p.add_argument("--heads", nargs="+", default=[], metavar="FILE",
                   help="our exported stop heads (`role: stop`, trained for the labels' draft) to price beside the "
                        "runtime's rules: SpecDec++'s stop at each head's threshold, and the goodput stop on it")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="the draft's calibrated confidence (`specheads calibrate`): prices our goodput stop on it")
    p.add_argument("--lookup_calibration", default=None, metavar="FILE",
                   help="prompt lookup's keep chance (`specheads calibrate --prompt_lookup`): prices our "
                        "prompt-lookup goodput stop")
    p.add_argument("--tools", default=".llama.cpp/build/bin", help="where `make llama-tools` put llama.cpp's binaries")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    if a.check < 0:
        raise SettingError(f"--check is a number of prompts, got {a.check}")
    if a.check and not a.check_prompts:
        raise SettingError("--check needs --check_prompts: prompts that are not among the traces")
    a.runtime_flag, a.runtime = a.runtime, VLLM if a.runtime == "vllm" else a.runtime
    if a.runtime in (TRANSFORMERS, VLLM) and (a.labels is None or a.timing is None):
        raise SettingError(f"--runtime {a.runtime_flag} is advised from traces made in transformers (`specheads "
                           "labels` with `backend: transformers`) and a timing of that backend: give --labels and "
                           "--timing; the ones made here are llama.cpp's")
    if a.check and a.runtime == VLLM:
        raise SettingError("--check runs the runtime on this machine, and vLLM is not run here: its advice is priced, "
                           "not measured")
    if a.check and a.other_device:
        raise SettingError("--check measures this machine, --other_device advises another: give one of them")
    if (a.draft is None) != (a.target is None) or (a.draft is not None and a.pair is not None):
        raise SettingError("name the pair once: --pair FILE, or both --draft and --target")
    if a.pair is None and a.draft is None and (a.labels is None or a.timing is None):
        raise SettingError("give --labels and --timing, or the pair (--pair, or --draft and --target) to trace and "
                           "time it here")
    if a.traces < 2 or a.max_new_tokens < 1 or a.threads < 1 or not a.temperature >= 0:
        raise SettingError("--traces must be at least 2, --max_new_tokens and --threads at least 1, --temperature "
                           "0 or more")
    return a


TIMED_LENGTHS = (24, 28, 32, 33, 36, 40, 44, 48, 49)
"""Verification lengths timed beyond the decoder's own (up to 21 tokens): prompt lookup's copies, up to 48 + 1.
A full copy of m = 32 or 48 verifies m + 1 tokens, one past the kernels' blocks of 16 rows, where the cost jumps
(evaluation/DESIGN.md, "The advice"): those lengths are timed, not interpolated."""


def make_inputs(a, folder: RunFolder) -> None:
    """The traces (``--labels``) and the costs (``--timing``) not given, made in ``--out`` from the pair (a pair file
    written there from ``--draft`` and ``--target``)."""
    if a.pair is None:
        import yaml

        pair = {role: {"path": str(Path(path).resolve()), "name": Path(path).stem}
                for role, path in (("draft", a.draft), ("target", a.target))}
        a.pair = str(folder.write_text(folder.root / "pair.yaml", yaml.safe_dump(pair)))
    if a.labels is None:
        a.labels = str(trace(a, folder))
    if a.timing is None:
        from evaluation import bench_timing

        timed = folder.root / "timing" / f"timing-llama_cpp-{a.threads}t.json"
        # llama.cpp's own binaries where built: the costs its users' runs pay (evaluation.bench_timing_binaries)
        built = (Path(a.tools) / "llama-bench").is_file()
        # a rerun reuses this device's timing, unless the binaries have been built since it was made without them
        if not timed.is_file() or (built and timed_with(json.loads(timed.read_text())) != TIMED_WITH):
            binaries = ["--tools", a.tools, "--repeats", "5"] if built else []
            if not built:
                print(f"advise: {a.tools} has no llama-bench (`make llama-tools`): timing through llama-cpp-python, "
                      "without llama.cpp's sampler", file=sys.stderr)
            bench_timing.main(["--backend", "llama_cpp", "--pair", a.pair, "--threads", str(a.threads), "--out",
                               str(timed.parent), "--verify_lengths", *map(str, TIMED_LENGTHS),
                               "--cache", str(decoding_context(a.labels)), *binaries])
        a.timing = str(timed)


def decoding_context(labels: str | Path) -> int:
    """The cache length the traces of the label folder ``labels`` decode after (``mean_context``)."""
    from decoding.traces import responses_by_prompt

    return mean_context(responses_by_prompt(labels, SPLITS).values())


def mean_context(responses) -> int:
    """The cache length the tokens of ``responses`` ((prompt, response) pairs) are decoded after, on average: each
    prompt and half its response (a step's cost grows with it; 256 where there are none)."""
    responses = list(responses)
    return round(sum(len(p) + len(x) / 2 for p, x in responses) / len(responses)) if responses else 256


def trace(a, folder: RunFolder) -> Path:
    """The target's responses to the first ``--traces`` prompts, labeled on llama.cpp (``target`` rows only) by the
    labeling command, as a user runs it, from a config written beside them (``traces.yaml``); resumed like any
    labeling run."""
    import subprocess

    import yaml

    specs = read_pair_file(a.pair)
    out = folder.root / "traces"
    config = {**specs, "prompts": {"source": a.prompts, "response_field": None, "limit": a.traces,
                                   "chat_template": a.chat_template},
              "sampling": {"temperature": a.temperature, "max_new_tokens": a.max_new_tokens},
              "output_dir": str(out), "categories": ["target"], "split_fractions": [0.0, 0.0, 1.0],
              "backend": "llama_cpp", "threads": a.threads}
    written = folder.write_text(folder.root / "traces.yaml", yaml.safe_dump(config, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "data_gen", "--config", str(written)])
    if done.returncode != 0:  # the labeling command said why, in its own line
        raise UserError(f"labeling the traces failed (exit {done.returncode}); its config: {written}")
    return out


def note_context(a, traces, timed_after: int | None) -> None:
    """A line where the timing's cache length (``timed_after``) is far from the one the ``traces`` decode at (a
    step's cost grows with it, the draft's most: the predictions of drafting by the draft model are then off)."""
    context = mean_context((t.prompt, t.response) for t in traces)
    if timed_after and not 2 / 3 <= context / timed_after <= 3 / 2:
        print(f"advise: --timing {a.timing} timed the steps after {timed_after} cached tokens, the traces decode "
              f"after about {context}: time the device at `specheads bench-timing --cache {context}` for "
              "predictions of drafting by the draft model", file=sys.stderr)


def unseen_traces(traces: list, heads: list[str]) -> list:
    """The traces of prompts no head of ``heads`` trained on or had its threshold chosen on: every rule is priced
    over them alike, as ``specheads simulate`` replays (a head's speed on prompts it saw is optimistic)."""
    from decoding.traces import unseen
    from heads.export import read_metadata, seen_prompts

    seen = set().union(*(seen_prompts(read_metadata(h)) for h in heads))
    return [t for t in traces if unseen([t.trace], seen)]


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    folder = RunFolder(a.out, "advise", "--out", OUTPUTS)
    # bad input in one line before the folder is touched, or minutes are spent on the other input
    read_estimates(a)
    if a.check:
        load_prompt_table(PromptConfig(source=a.check_prompts, response_field=None), need_response=False)
    given = a.labels is not None and a.timing is not None
    if given:
        inputs = check_inputs(a)
    elif a.labels is not None:
        check_labels(a.labels)
    elif a.timing is not None:
        read_timing(a.timing)
    if a.check and a.runtime in (None, LLAMA_CPP):  # traced here, or labels made on llama.cpp: its binaries run
        for name in ("llama-completion", "llama-speculative-simple"):
            LlamaPeer(enabled=True, tools=a.tools).binary(name)
    if not given and a.pair is not None:
        read_pair_file(a.pair)
    folder.check(beside=None)
    with folder.hold("an advice"):
        if not given:
            folder.start()
            make_inputs(a, folder)
            inputs = check_inputs(a)
        manifest, run, costs, timed_by, timed_after = inputs
        a.threads = costs.threads or 1
        sampling = manifest["sampling"]
        max_new = int(sampling["max_new_tokens"])
        runtime = a.runtime
        draft = load_draft(manifest, run, a.labels, a.threads)
        try:
            traces = advice_traces(a.labels, draft, DRAFT_PROBABILITY_TOP_K[runtime], a.quiet)
        finally:
            getattr(draft, "close", lambda: None)()
        kept = unseen_traces(traces, a.heads)
        seen = f", {len(traces) - len(kept)} of prompts a head of --heads has seen" if len(kept) < len(traces) else ""
        if len(kept) < 2:
            raise UserError(f"{a.labels}: {len(traces)} traced responses{seen}; the advice needs at least 2"
                            f"{' others' if seen else ''} (its intervals are over prompts)")
        note_context(a, kept, timed_after)
        if seen:
            print(f"advise: left out {len(traces) - len(kept)} of {len(traces)} traces: prompts a head of --heads "
                  "trained on or had its threshold chosen on", file=sys.stderr)
        traces = kept
        greedy = sampling["temperature"] == 0
        # a generate() call's time includes its prompt's prefill; llama.cpp's decode times do not
        prompts = [len(t.prompt) for t in traces] if runtime == TRANSFORMERS else None
        settings = runtime_settings(runtime, traces, budget(sampling, runtime), a.quiet) \
            + our_settings(traces, greedy, a.quiet) \
            + our_trained_settings(traces, costs, a.heads, a.calibration, a.lookup, budget(sampling, runtime))
        lookup = best(price(settings, costs, prompts), runtime, "prompt lookup")
        # prompt lookup's oracle at the runtime's best (n, m), and at our stop's where it runs at another
        lookups = [s.params for s in settings if s is lookup or s.rule == "prompt_lookup_goodput"]
        settings += price(ceilings(traces, costs, lookups, budget(sampling, runtime)), costs, prompts)
        pick, sentence = verdict(settings, runtime)
        flags = paste(runtime, pick, costs.threads, budget(sampling, runtime))
        folder.start()
        checked = check(a, run, settings, pick, traces, sampling, folder, runtime) if a.check else None
        # what other prompts (as many as --check ran) may measure: the mean's interval leaves the spread between
        # prompts out
        spread = another_set(pick or best(settings, runtime), costs, prompts,
                             checked[0]["prompts"] if checked else a.check or ANOTHER_SET)
        inputs = {"labels": a.labels, "traces": len(traces), "timing": a.timing, "device": costs.device,
                  "backend": costs.backend, "threads": costs.threads or torch_threads(), "max_new_tokens": max_new,
                  "sampling": "greedy" if sampling["temperature"] == 0 else f"temperature {sampling['temperature']}",
                  "target_step": costs.verify(1), "draft_step": costs.draft, "timed_with": timed_by,
                  "sampler": costs.sample_s, "estimates": [*a.heads, *filter(None, (a.calibration,
                                                                                    a.lookup_calibration))],
                  "another_set": spread}
        folder.write_text(folder.root / "advice.md", markdown(settings, inputs, pick, sentence, flags, checked,
                                                                       runtime))
        folder.write_json(folder.root / "advice.json", {
            "inputs": inputs, "verdict": sentence, "runtime": runtime, "paste": flags,
            "advised": None if pick is None else {"rule": pick.rule, "params": pick.params},
            "settings": [{"runs_in": s.runtime, "drafter": s.drafter, "rule": s.rule, "params": s.params,
                          "default": s.default, "speedup": vars(s.speedup), "rates": s.rates()} for s in settings],
            "checked": None if checked is None else [
                {"label": c["label"], "predicted": c["predicted"], "measured": vars(c["measured"]),
                 "predicted_at_check_costs": c["predicted_during"], "device_timed_during_check": c["timed_during"],
                 "predicted_rates": c["predicted_rates"], "measured_rates": c["measured_rates"]} for c in checked]})
        picture(settings, folder.claim(folder.root / "advice.png"), checked)
    print(sentence)
    if spread is not None:
        print(another_set_line(spread, len(traces)))
    print(f"{runtime}: {flags['flags']}")
    for s in (best(settings, runtime, "draft model"), best(settings, runtime, "prompt lookup"),
              *[best([s for s in settings if s.rule in TRAINED_RULES], OURS, drafter)
                for drafter in ("draft model", "prompt lookup")],
              *[s for s in settings if s.runtime == CEILING]):
        if s is None:
            continue
        print(f"  {s.runtime:<13}{s.drafter:<15}{s.label:<40} {s.speedup}x")
    for c in checked or []:
        during = "" if c["predicted_during"] is None else f" (at the check's costs {c['predicted_during']:.3f}x)"
        print(f"  checked {c['label']:<44} predicted {c['predicted']:.3f}x{during}  measured {c['measured']}x  "
              f"(N_t/N {c['predicted_rates'][0]:.3f}, measured {c['measured_rates'][0]:.3f})")
    print(f"report: {folder.root / 'advice.md'}")
    return {"verdict": sentence, "advised": pick, "settings": settings, "checked": checked}


if __name__ == "__main__":
    run_main(main)

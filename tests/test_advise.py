"""``specheads advise`` and the replays it prices:

- llama.cpp's ``draft-simple`` replayed along a trace (``decoding.runtime_replay``) gives the counts of llama.cpp's
  own loop (``examples/speculative-simple`` and ``common/speculative.cpp`` transliterated below) on a stub pair: the
  target's batches by length, the draft's one-token forwards (the one whose token fails ``p_min`` too) and its
  batch re-reads, drafted and kept tokens; a replay that forgets the failing forward, or keeps past a rejection,
  does not;
- a draft read's cost comes from the draft's timed lengths, and the rounds are priced with it;
- the command end to end on a tiny GGUF pair's llama.cpp labels: the verdict, llama.cpp's flags (accepted by its
  flag names), the report, the picture, ``--check`` through stand-ins of llama.cpp's binaries;
- bad input (a timing file of another backend, device or pair, labels of the transformers backend priced with
  llama.cpp's costs, ``--check`` without prompts): one ``error:`` line, exit 2, nothing written.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from decoding.costs import CostModel, timing_entry
from decoding.replay import Counts
from decoding.runtime_replay import continuation, continue_chance, draft_simple_counts

VOCAB = 50


def target_next(seq: tuple) -> int:
    """The stub target's greedy token after ``seq``."""
    return hash(("target", *seq)) % VOCAB


def stub_draft(prompt: tuple, response: list[int], agree: float = 0.7):
    """A draft whose top token after a prefix of the target's ``response`` is the target's with chance ``agree``
    (by a hash of the prefix) and whose probability of it varies there; off the response it is always sure of its
    own token (probability 0.99), so a replay given ``continues`` 1 is exact at any ``p_min``."""
    on_trace = {prompt + tuple(response[:i]): i for i in range(len(response) + 1)}

    def top(seq: tuple) -> tuple[int, float]:
        h = hash(("draft", *seq))
        if seq not in on_trace:
            return h % VOCAB, 0.99
        agrees = (h % 1000) / 1000 < agree
        token = target_next(seq) if agrees else (target_next(seq) + 1 + h % (VOCAB - 1)) % VOCAB
        return token, 0.2 + 0.8 * ((h // 1000) % 100) / 100
    return top


def llama_speculative_simple(prompt: tuple, draft_top, n_max: int, p_min: float, n_predict: int) -> dict:
    """llama.cpp's ``speculative-simple`` with ``draft-simple`` at greedy sampling, ``n_min`` 0, transliterated:
    the prompt but its last token is prefilled; each round the draft reads the last token and drafts its top token
    while it clears ``p_min`` (a failing token's forward is paid) up to ``n_max`` or the budget left less one (a cap
    of 0 meaning none); the target reads the last token and the draft in one batch and keeps the draft up to its
    first disagreement, adding its own token; the draft re-reads the target's batch; it stops once it has produced
    more than ``n_predict`` tokens."""
    context = list(prompt)
    produced: list[int] = []
    forwards, batches, reads = 0, Counter(), Counter()
    drafted = accepted = 0
    while True:
        room = max(n_predict - len(produced) - 1, 0)
        seq = tuple(context)
        draft: list[int] = []
        while True:
            forwards += 1
            token, p = draft_top(seq + tuple(draft))
            if p < p_min:
                break
            draft.append(token)
            if n_max <= len(draft) or (room > 0 and room <= len(draft)):
                break
        batches[len(draft) + 1] += 1
        reads[len(draft) + 1] += 1
        ids = []
        for i in range(len(draft) + 1):
            ids.append(target_next(seq + tuple(draft[:i])))
            if i == len(draft) or ids[-1] != draft[i]:
                break
        drafted += len(draft)
        accepted += len(ids) - 1
        produced += ids
        context += ids
        if len(produced) > n_predict:
            break
    return {"response": produced, "forwards": forwards, "batches": batches, "reads": reads, "drafted": drafted,
            "accepted": accepted}


def target_response(prompt: tuple, n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(target_next(tuple(seq)))
    return seq[len(prompt):]


def replay_inputs(prompt: tuple, response: list[int], draft_top) -> tuple[np.ndarray, np.ndarray]:
    tops = [draft_top(prompt + tuple(response[:i])) for i in range(len(response))]
    return np.array([t == r for (t, _), r in zip(tops, response)]), np.array([p for _, p in tops])


@pytest.mark.parametrize("n_max, p_min", [(1, 0.0), (3, 0.0), (5, 0.0), (16, 0.0), (3, 0.5), (8, 0.6), (8, 0.95)])
@pytest.mark.parametrize("prompt", [(1, 2, 3), (7, 7, 9, 4)])
def test_the_draft_simple_replay_counts_what_llama_cpps_loop_does(prompt, n_max, p_min):
    n_predict = 40
    response = target_response(prompt, n_predict + 20)
    top = stub_draft(prompt, response)
    ran = llama_speculative_simple(prompt, top, n_max, p_min, n_predict)
    assert ran["response"] == response[:len(ran["response"])]  # greedy: the target's own response, whatever drafted
    trace = ran["response"]
    match, top_prob = replay_inputs(prompt, trace, top)
    counts = draft_simple_counts(match, top_prob, n_max, p_min, continues=1.0, max_new_tokens=n_predict)
    assert counts.n == len(trace)
    assert counts.draft == ran["forwards"]
    assert counts.target == sum(ran["batches"].values())
    assert {m: c for m, c in enumerate(counts.calls) if c} == dict(ran["batches"])
    assert {m: c for m, c in enumerate(counts.draft_reads) if c} == dict(ran["reads"])
    assert counts.discarded == ran["drafted"] - ran["accepted"]


def test_past_the_first_rejection_the_draft_goes_on_with_the_traces_chance():
    """At p_min 0 every round drafts its cap; past a rejection each further token is drafted with ``continues``:
    the lengths' chances sum to 1 and the expected forwards follow them."""
    outcomes = continuation(3, 0.5)
    assert sum(c for _, c, _ in outcomes) == pytest.approx(1.0)
    assert sum(t * c for t, c, _ in outcomes) == pytest.approx(0.5 + 0.25 + 0.125)
    match, sure = np.array([False] * 6), np.full(6, 0.9)
    assert continue_chance([sure], 0.0) == 1.0 and continue_chance([sure, np.array([0.2])], 0.5) == 6 / 7
    at_zero = draft_simple_counts(match, sure, 4, 0.0, continues=1.0)
    # p_min 0 clears every token: each round drafts its cap, 4 or the budget left less one (a cap of 0: none)
    assert at_zero.draft == 4 + 4 + 3 + 2 + 1 + 4
    half = draft_simple_counts(match, np.full(6, 0.9), 4, 0.5, continues=0.5)
    assert at_zero.draft > half.draft > 6  # fewer drafted past each rejection, and never fewer than one forward


def test_a_draft_read_is_priced_from_the_drafts_timed_one_row_reads():
    """A batch read of m tokens with one row out at the draft's timed ``read_by_tokens`` (interpolated), else on the
    line through its step and its two-token catch-up read; a round's reads are added to its price."""
    entry = timing_entry("draft", "q4", (64, 0.5), 64, {1: 0.04, 3: 0.06, 8: 0.1}, verify=8, verify_short=3,
                         catch_up=0.05)
    target = timing_entry("target", "q4", (64, 1.0), 64, {1: 0.1, 2: 0.12, 3: 0.14, 8: 0.25}, verify=8,
                          verify_short=3, by_tokens=True, catch_up=0.15)
    line = CostModel.from_timing({"models": [entry, target], "backend": "llama_cpp"})
    assert line.draft_read(1) == pytest.approx(0.04) and line.draft_read(5) == pytest.approx(0.04 + 4 * 0.01)
    entry["read_by_tokens"] = {"2": {"cache": 64, "median_s": 0.045}, "5": {"cache": 64, "median_s": 0.05},
                               "9": {"cache": 64, "median_s": 0.07}}
    timed = CostModel.from_timing({"models": [entry, target], "backend": "llama_cpp"})
    assert timed.draft_read(1) == pytest.approx(0.04) and timed.draft_read(7) == pytest.approx(0.06)
    assert timed.draft_read(13) == pytest.approx(0.09)  # past the longest: on the line through the last two
    plain = Counts(n=4, draft=2, target=1, calls=np.array([0, 0, 0, 1.0]))
    reading = dataclasses.replace(plain, draft_reads=np.array([0, 0, 0, 1.0]))
    assert timed.price(reading) - timed.price(plain) == pytest.approx(timed.draft_read(3))


# ---------------------------------------------------------------------------------------------------------------
# the command, on a tiny GGUF pair's labels made on llama.cpp

@pytest.fixture(scope="module")
def llama_labels(tiny_pair, tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make install` (make test needs it)")
    from core.device import describe_device
    from core.models import ModelSpec
    from data_gen.run import run_labels
    from testing.tiny import label_config, write_prompts
    from testing.tiny_gguf import write_gguf

    d = tmp_path_factory.mktemp("advise")
    gguf = [write_gguf(path, d / f"{path.name}.gguf") for path in tiny_pair]
    prompts = write_prompts(d / "prompts.jsonl", n=12)
    base = label_config(*tiny_pair, prompts, d / "labels", max_new_tokens=16)
    cfg = dataclasses.replace(
        base, backend="llama_cpp", threads=1, categories=["target"],
        sampling=dataclasses.replace(base.sampling, temperature=0.0),
        draft=ModelSpec(path=str(gguf[0]), tokenizer=str(tiny_pair[0]), name="tiny-draft"),
        target=ModelSpec(path=str(gguf[1]), tokenizer=str(tiny_pair[1]), name="tiny-target"))
    run_labels(cfg, quiet=True)
    timing = {"device": describe_device("cpu", 1), "device_type": "cpu", "backend": "llama_cpp", "threads": 1,
              "decoder": "eager", "models": [
                  timing_entry("draft", "f32", (64, 0.02), 64, {1: 0.004, 2: 0.005, 3: 0.006, 8: 0.01}, verify=8,
                               verify_short=3, catch_up=0.005, shape="tiny-draft"),
                  timing_entry("target", "f32", (64, 0.04), 64, {m: 0.01 + 0.001 * m for m in range(1, 18)}, verify=8,
                               verify_short=3, by_tokens=True, catch_up=0.011, shape="tiny-target")]}
    path = d / "timing.json"
    path.write_text(json.dumps(timing))
    pair = d / "pair.yaml"
    pair.write_text(json.dumps({role: {"path": str(g), "tokenizer": str(t), "name": f"tiny-{role}"}
                                for role, g, t in zip(("draft", "target"), gguf, tiny_pair)}))
    return {"labels": d / "labels", "timing": path, "prompts": prompts, "dir": d, "pair": pair}


def test_the_drafts_tops_are_read_at_each_position_of_the_response(llama_labels):
    """One batched read of prompt + response gives, at row j, the draft's distribution after the prompt and the
    first j response tokens: the same top token and draft-sampler probability as a read of that prefix alone."""
    import torch

    from decoding.traces import responses_by_prompt
    from core.shards import SPLITS
    from evaluation.advise_traces import draft_tops, load_draft

    draft = load_draft(*labels_of(llama_labels["labels"]), llama_labels["labels"], threads=1)
    try:
        prompt, response = next(iter(responses_by_prompt(llama_labels["labels"], SPLITS).values()))
        _, batched = draft.read(prompt + response[:-1], rows=len(response))
        alone = torch.cat([draft.read(prompt + response[:j], rows=1)[1] for j in range(len(response))])
    finally:
        draft.close()
    match, prob = draft_tops(batched, response)
    match_alone, prob_alone = draft_tops(alone, response)
    assert (match == match_alone).all() and np.allclose(prob, prob_alone, atol=1e-3)
    assert ((prob > 0.1 - 1e-9) & (prob <= 1 + 1e-9)).all()  # a softmax over 10 logits: at least a tenth


def test_a_batch_read_with_the_last_row_only_leaves_the_cache_a_read_would(llama_labels):
    """``read_last`` (what the timing of llama.cpp's draft re-read runs) caches the same keys and values as ``read``:
    the next token's logits after it equal those after reading the whole sequence afresh."""
    import torch

    from evaluation.advise_traces import load_draft

    draft = load_draft(*labels_of(llama_labels["labels"]), llama_labels["labels"], threads=1)
    try:
        seq = [3, 17, 5, 9, 40, 2, 11]
        draft.reset()
        draft.read(seq[:3])
        draft.read_last(seq[3:-1])
        assert draft.ids == seq[:-1]
        _, after = draft.read(seq, rows=1)
        draft.reset()
        _, fresh = draft.read(seq, rows=1)
    finally:
        draft.close()
    assert torch.allclose(after, fresh, atol=1e-3)


def labels_of(folder):
    from core.runfolder import read_json
    from core.shards import read_manifest

    return read_manifest(folder), read_json(folder / "run.json", "")


def advise(argv, capsys):
    from specheads.cli import main

    try:
        code = main(["advise", "--quiet", *map(str, argv)])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def test_the_advice_names_a_setting_in_llama_cpps_flags(llama_labels, tmp_path, capsys):
    out = tmp_path / "advice"
    code, printed, _ = advise(["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--out", out],
                              capsys)
    assert code in (0, None)
    saved = json.loads((out / "advice.json").read_text())
    assert saved["verdict"].split(":")[0] in ("speculate", "do not speculate here")
    assert saved["verdict"] in printed and (out / "advice.png").stat().st_size > 0
    rules = {(s["runs_in"], s["rule"]) for s in saved["settings"]}
    assert {("llama.cpp", "draft-simple"), ("llama.cpp", "ngram-simple"), ("llama.cpp", "target only"),
            ("specheads", "sd"), ("ceiling", "oracle")} <= rules
    defaults = [s for s in saved["settings"] if s["default"]]
    assert {(s["rule"], json.dumps(s["params"], sort_keys=True)) for s in defaults} == {
        ("draft-simple", '{"n_max": 3, "p_min": 0.0}'), ("ngram-simple", '{"m": 48, "n": 12}')}
    ceiling = max(s["speedup"]["value"] for s in saved["settings"] if s["rule"] == "oracle" and
                  s["drafter"] == "draft model")
    for s in saved["settings"]:  # no rule over the draft model beats the oracle over its candidates
        if s["drafter"] == "draft model" and s["runs_in"] != "ceiling":
            assert s["speedup"]["value"] <= ceiling + 1e-9, s
    assert saved["runtime"] == "llama.cpp"
    flags = saved["paste"]["flags"].split()
    known = {"-m", "-md", "-t", "-td", "--spec-type", "--spec-draft-n-max", "--spec-draft-p-min",
             "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"}
    assert {f for f in flags if f.startswith("-")} <= known
    assert "advice.md" in printed and "llama.cpp's terms" in (out / "advice.md").read_text()
    # how another 20 prompts may run (``core.intervals.new_set_interval``), printed and in the report
    another = saved["inputs"]["another_set"]
    assert another["prompts"] == 20 and another["low"] < another["median"] < another["high"]
    assert f"another 20 prompts like these (--check's count, default 20): {another['setting']}" in printed
    assert "another 20 prompts like these" in (out / "advice.md").read_text()


def tiny_head(manifest: dict, path: Path, role: str = "stop", seen: list[str] = ()) -> str:
    """A random SpecDec++ head exported for the labels' draft, trained on the prompts of digests ``seen``."""
    import torch

    from heads.export import export_head
    from heads.resnet import ResNetHead

    draft = manifest["models"]["draft"]
    torch.manual_seed(0)
    head = ResNetHead(hidden_size=draft["hidden_size"], depth=1)
    with torch.no_grad():
        head.out.weight.normal_(0, 1)
    setting = {"stop": "h", "verifier": "tau"}[role]
    return str(export_head(head, path, draft=draft, vocab_size=draft["vocab_size"], label={"kind": "test"}, role=role,
                           threshold={"name": setting, "value": 0.5, "rule": "test"}, metrics={},
                           trained_on={"digests": "".join(seen)}))


def test_our_trained_stops_are_priced_beside_the_runtimes_rules(llama_labels, tmp_path, capsys):
    """A stop head, the draft's calibrated confidence and prompt lookup's keep chance each add our rules on them to
    the table: SpecDec++'s stop and the goodput stop on the head, the goodput stop on the calibration, prompt
    lookup's goodput stop; none beats its drafter's oracle. Every rule is priced over the prompts the head did not
    train on. A verifier head, a calibration of the other kind, a head that saw every prompt: one line."""
    from core.shards import SPLITS, prompt_digests, read_manifest
    from decoding import calibrate
    from decoding.traces import filled_splits

    labels = str(llama_labels["labels"])
    digests = [d for split in filled_splits(labels, SPLITS) for d in prompt_digests(labels, split).values()]
    head = tiny_head(read_manifest(labels), tmp_path / "stop.safetensors", seen=digests[:3])
    confidence, lookup = tmp_path / "confidence.json", tmp_path / "lookup.json"
    calibrate.main(["--labels", labels, "--splits", "train", "--out", str(confidence)])
    calibrate.main(["--labels", labels, "--splits", "train", "--prompt_lookup", "1", "4", "--out", str(lookup)])
    out = tmp_path / "advice"
    code, printed, err = advise(["--labels", labels, "--timing", llama_labels["timing"], "--out", out, "--heads", head,
                                 "--calibration", confidence, "--lookup_calibration", lookup], capsys)
    assert code in (0, None), err
    assert any(f"left out 3 of {len(digests)} traces" in line for line in err), err
    saved = json.loads((out / "advice.json").read_text())
    assert saved["inputs"]["traces"] == len(digests) - 3
    ours = Counter((s["rule"], s["drafter"]) for s in saved["settings"] if s["runs_in"] == "specheads")
    assert ours[("specdecpp", "draft model")] == 1 and ours[("goodput", "draft model")] == 2
    assert ours[("prompt_lookup_goodput", "prompt lookup")] == 1

    def ceiling(drafter: str, params: dict) -> float:
        return next(s["speedup"]["value"] for s in saved["settings"] if s["runs_in"] == "ceiling"
                    and s["drafter"] == drafter and s["params"] == params)

    for s in saved["settings"]:  # none beats the oracle over the same proposals
        if s["runs_in"] == "specheads":
            over = {k: s["params"][k] for k in ("n", "m")} if s["drafter"] == "prompt lookup" else {}
            assert s["speedup"]["value"] <= ceiling(s["drafter"], over) + 1e-9, s
    assert "prompt_lookup_goodput" in (out / "advice.md").read_text()

    verifier = tiny_head(read_manifest(labels), tmp_path / "verifier.safetensors", role="verifier")
    knows_all = tiny_head(read_manifest(labels), tmp_path / "seen.safetensors", seen=digests)
    for argv, words in ((["--heads", verifier], "a verifier head"),
                        (["--calibration", lookup], "give it as --lookup_calibration"),
                        (["--lookup_calibration", confidence], "not a prompt-lookup calibration"),
                        (["--heads", knows_all], f"{len(digests)} of prompts a head of --heads has seen")):
        code, _, err = advise(["--labels", labels, "--timing", llama_labels["timing"], "--out", tmp_path / "bad",
                               *argv], capsys)
        errors = [line for line in err if line.startswith("error:")]  # (llama.cpp's loader may log beside it)
        assert code == 2 and len(errors) == 1 and words in errors[0], err
        assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("built", [True, False])
def test_a_pair_file_is_traced_and_timed_here(llama_labels, tmp_path, capsys, built):
    """Without --labels and --timing: the pair's responses to the prompts labeled on llama.cpp into traces/, the
    device timed into timing/ (by llama.cpp's own binaries where built, else through llama-cpp-python, said in a
    line), then the same advice; a second run reuses both."""
    from testing.llama_tools import write_stub_tools

    tools = write_stub_tools(tmp_path / "tools") if built else tmp_path / "unbuilt"
    out = tmp_path / "advice"
    argv = ["--pair", llama_labels["pair"], "--prompts", llama_labels["prompts"], "--traces", 4, "--max_new_tokens",
            8, "--threads", 1, "--tools", tools, "--out", out]
    code, printed, err = advise(argv, capsys)
    assert code in (0, None), err
    if built:  # the device timed after as many cached tokens as the traces decode after, on average
        from evaluation.advise import decoding_context

        bench = [json.loads(line) for line in (tools / "llama-bench.calls").read_text().splitlines()]
        depths = {call[call.index("-d") + 1] for call in bench if "-d" in call}
        assert depths == {str(decoding_context(out / "traces"))}, depths
    saved = json.loads((out / "advice.json").read_text())
    assert saved["inputs"]["traces"] == 4 and saved["inputs"]["sampling"] == "greedy"
    assert saved["inputs"]["timed_with"] == ("llama-bench" if built else "llama-cpp-python")
    assert built != any("has no llama-bench" in line for line in err)
    assert (out / "traces" / "manifest.json").is_file() and (out / "timing" / "timing-llama_cpp-1t.json").is_file()
    stamp = (out / "timing" / "timing-llama_cpp-1t.json").stat().st_mtime_ns
    code, _, err = advise([*argv[:-2], "--timing", out / "timing" / "timing-llama_cpp-1t.json", "--labels",
                           out / "traces", "--out", out], capsys)
    assert code in (0, None), err
    assert (out / "timing" / "timing-llama_cpp-1t.json").stat().st_mtime_ns == stamp


def test_check_runs_llama_cpps_binaries_beside_the_prediction(llama_labels, tmp_path, capsys):
    from testing.llama_tools import write_stub_tools
    from testing.tiny import write_prompts

    tools = write_stub_tools(tmp_path / "tools")
    others = write_prompts(tmp_path / "others.jsonl", n=5, seed=7)
    out = tmp_path / "advice"
    code, printed, err = advise(["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--out", out,
                                 "--check", 3, "--check_prompts", others, "--tools", tools], capsys)
    assert code in (0, None), err
    saved = json.loads((out / "advice.json").read_text())
    assert len(saved["checked"]) >= 2 and all("measured" in c for c in saved["checked"])
    calls = (tools / "llama-completion.calls").read_text().splitlines()
    assert len(calls) == 3  # target-only once per prompt
    assert "Measured (`--check`)" in (out / "advice.md").read_text()
    assert saved["inputs"]["another_set"]["prompts"] == 3 and "another 3 prompts like these" in printed


def test_a_check_times_the_device_again_during_its_runs(llama_labels, tmp_path, capsys):
    """With a timing of llama.cpp's binaries, the check times the device again (the same lengths, cache and prompt)
    before its first prompt, at its middle and after its last, and prices the same counts at the median of those
    costs beside the prediction; a rerun makes neither the runs nor the timings again."""
    from testing.llama_tools import write_stub_tools
    from testing.tiny import write_prompts

    tools = write_stub_tools(tmp_path / "tools")
    timing = _timing_with(llama_labels["timing"], tmp_path, timed_with="llama-bench")
    others = write_prompts(tmp_path / "others.jsonl", n=5, seed=7)
    out = tmp_path / "advice"
    argv = ["--labels", llama_labels["labels"], "--timing", timing, "--out", out, "--check", 3, "--check_prompts",
            others, "--tools", tools]
    code, printed, err = advise(argv, capsys)
    assert code in (0, None), err
    record = out / "check.jsonl"
    lines = [json.loads(line) for line in record.read_text().splitlines()[1:]]
    marks = [i for i, line in enumerate(lines) if "device_timing" in line]
    runs = len(lines) - len(marks)
    # before the first prompt's runs, after the first prompt's (3 // 2 = 1), after the last
    assert marks == [0, 1 + runs // 3, len(lines) - 1], marks
    prompts = list(dict.fromkeys(line["prompt"] for line in lines if "prompt" in line))
    assert [lines[i]["device_timing"] for i in marks] == [f"before {prompts[0]}", f"before {prompts[1]}",
                                                          f"after {prompts[2]}"]
    bench = [json.loads(line) for line in (tools / "llama-bench.calls").read_text().splitlines()]
    assert {call[call.index("-d") + 1] for call in bench if "-d" in call} == {"64"}
    timed = json.loads(timing.read_text())
    target = next(m for m in timed["models"] if m["name"] == "target")
    asked = {int(m) for call in bench if "-embd" in call and call[call.index("-embd") + 1] == "1"
             for m in call[call.index("-p") + 1].split(",")}
    assert asked == {int(m) for m in target["verify_by_tokens"]}
    saved = json.loads((out / "advice.json").read_text())
    for c in saved["checked"]:
        assert c["device_timed_during_check"] == 3 and c["predicted_at_check_costs"] > 0
    # the stub's costs are not the timing file's: the two predictions differ
    assert any(abs(c["predicted_at_check_costs"] - c["predicted"]) > 1e-3 for c in saved["checked"])
    assert "at the check's costs" in (out / "advice.md").read_text() and "at the check's costs" in printed

    def bench_calls() -> int:
        return len((tools / "llama-bench.calls").read_text().splitlines())

    made = bench_calls()
    assert advise(argv, capsys)[0] in (0, None) and bench_calls() == made  # a rerun makes nothing again
    # every run kept but the timings lost: none is made after the runs, and none is called the check's
    record.write_text("\n".join(line for line in record.read_text().splitlines() if "device_timing" not in line))
    assert advise(argv, capsys)[0] in (0, None) and bench_calls() == made
    saved = json.loads((out / "advice.json").read_text())
    assert all(c["device_timed_during_check"] == 0 and c["predicted_at_check_costs"] is None
               for c in saved["checked"])
    assert "at the check's costs" not in (out / "advice.md").read_text()
    # other prompts: their runs, and timings at their own places
    more = write_prompts(tmp_path / "more.jsonl", n=5, seed=8)
    argv[argv.index(others)] = more
    assert advise(argv, capsys)[0] in (0, None) and bench_calls() > made
    lines = [json.loads(line) for line in record.read_text().splitlines()[1:]]
    assert len([line for line in lines if "device_timing" in line]) == 3
    # a timing file of other lengths starts the check again: its costs are not mixed with the others'
    fewer = json.loads(timing.read_text())
    del next(m for m in fewer["models"] if m["name"] == "target")["verify_by_tokens"]["17"]
    timing.write_text(json.dumps(fewer))
    runs_before = len((tools / "llama-completion.calls").read_text().splitlines())
    assert advise(argv, capsys)[0] in (0, None)
    lines = [json.loads(line) for line in record.read_text().splitlines()[1:]]
    assert len([line for line in lines if "device_timing" in line]) == 3
    assert len((tools / "llama-completion.calls").read_text().splitlines()) > runs_before + 3


def test_timings_made_alike_give_each_time_the_median():
    from evaluation.bench_timing_binaries import median_timing

    timings = [{"threads": 2, "models": [{"name": "target", "decode": {"64": {"median_s": s}},
                                          "verify_by_tokens": {"2": {"cache": 64, "median_s": 2 * s}}}]}
               for s in (0.03, 0.05, 0.04)]
    got = median_timing(timings)
    assert got["threads"] == 2 and got["models"][0]["name"] == "target"
    assert got["models"][0]["decode"]["64"]["median_s"] == 0.04
    assert got["models"][0]["verify_by_tokens"]["2"] == {"cache": 64, "median_s": 0.08}


def test_a_rerun_reuses_its_runs_only_when_it_makes_the_same_ones(llama_labels, tmp_path, capsys, monkeypatch):
    """Runs kept from an earlier check pair with new ones only when the runs to make are the same: a check whose
    settings changed starts again, target-only included, so every ratio it reports is of runs made side by side."""
    from evaluation import advise_check
    from testing.llama_tools import write_stub_tools
    from testing.tiny import write_prompts

    tools = write_stub_tools(tmp_path / "tools")
    others = write_prompts(tmp_path / "others.jsonl", n=5, seed=7)
    out = tmp_path / "advice"
    argv = ["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--out", out, "--check", 2,
            "--check_prompts", others, "--tools", tools]
    calls = tools / "llama-completion.calls"

    def target_only_runs() -> int:
        return len(calls.read_text().splitlines()) if calls.is_file() else 0

    assert advise(argv, capsys)[0] in (0, None) and target_only_runs() == 2
    assert advise(argv, capsys)[0] in (0, None) and target_only_runs() == 2  # the same runs: nothing made again
    monkeypatch.setitem(advise_check.MORE, "llama.cpp", ("draft-simple", {"n_max": 8, "p_min": 0.5}))
    assert advise(argv, capsys)[0] in (0, None) and target_only_runs() == 4
    lines = (out / "check.jsonl").read_text().splitlines()
    assert "draft-simple (n_max 8, p_min 0.5)" in json.loads(lines[0])["made_with"]["runs"]


def _timing_with(path, tmp_path, **changes):
    timing = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "shape":
            timing["models"][0]["shape"] = value
        else:
            timing[key] = value
    out = tmp_path / "timing-changed.json"
    out.write_text(json.dumps(timing))
    return out


def test_a_timing_made_far_from_the_traces_context_is_said(llama_labels, tmp_path, capsys):
    """The fixture's costs were timed after 64 cached tokens; traces that decode after about 20 get a line saying
    to time the device there (the draft's step grows with the cache), and the advice still goes on."""
    from evaluation.advise import decoding_context

    context = decoding_context(llama_labels["labels"])
    assert not 2 / 3 <= context / 64 <= 3 / 2
    code, _, err = advise(["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--out",
                           tmp_path / "advice"], capsys)
    assert code in (0, None) and any(f"bench-timing --cache {context}`" in line for line in err), err


@pytest.mark.parametrize("change, words", [
    ({"backend": "transformers"}, "timed backend transformers"),
    ({"device": "NVIDIA H100 80GB HBM3"}, "pass --other_device"),
    ({"shape": "another-draft"}, "time this pair"),
])
def test_a_timing_file_that_cannot_price_these_labels_is_refused(llama_labels, tmp_path, capsys, change, words):
    out = tmp_path / "advice"
    code, _, err = advise(["--labels", llama_labels["labels"], "--timing",
                           _timing_with(llama_labels["timing"], tmp_path, **change), "--out", out], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and words in err[0], err
    assert not out.exists()


def test_advice_for_another_device_is_given_when_asked(llama_labels, tmp_path, capsys):
    out = tmp_path / "advice"
    code, printed, _ = advise(["--labels", llama_labels["labels"], "--timing",
                               _timing_with(llama_labels["timing"], tmp_path, device="NVIDIA H100 80GB HBM3"),
                               "--out", out, "--other_device"], capsys)
    assert code in (0, None) and (out / "advice.md").is_file()


def test_bad_input_is_one_line_and_writes_nothing(llama_labels, label_config, tmp_path, capsys):
    from data_gen.run import run_labels

    hf = label_config(output_dir=str(tmp_path / "hf"), categories=["target"])
    run_labels(hf, quiet=True)
    capsys.readouterr()
    out = tmp_path / "advice"
    cases = [
        (["--labels", hf.output_dir, "--timing", llama_labels["timing"]],
         "timed backend llama_cpp, the labels were made on transformers"),
        (["--labels", tmp_path / "none", "--timing", llama_labels["timing"]], "none"),
        (["--labels", llama_labels["labels"], "--timing", tmp_path / "no.json"], "no such file"),
        (["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--check", 3],
         "--check needs --check_prompts"),
        (["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--check", 3, "--check_prompts",
          llama_labels["dir"] / "none.jsonl"], "prompt file not found"),
        (["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--check", 3, "--check_prompts",
          llama_labels["prompts"], "--tools", llama_labels["dir"] / "unbuilt"], "make llama-tools"),
        (["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--heads"],
         "expected at least one argument"),
        (["--pair", llama_labels["prompts"]], "not a pair file with draft and target"),
        (["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--runtime", "vllm"],
         "label with `backend: transformers` for vLLM"),
        (["--labels", llama_labels["labels"], "--timing", llama_labels["timing"], "--runtime", "transformers"],
         "whose traces price llama.cpp"),
        (["--pair", llama_labels["pair"], "--runtime", "vllm"], "give --labels"),
    ]
    for argv, words in cases:
        code, _, err = advise([*argv, "--out", out], capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("error:") and words in err[0], (argv, err)
        assert not out.exists()


LLAMA_BIN = Path(".llama.cpp/build/bin/llama-speculative-simple")


@pytest.mark.skipif(not LLAMA_BIN.is_file(), reason="llama.cpp's binaries are built by `make llama-tools`")
@pytest.mark.parametrize("rule, params", [("draft-simple", {"n_max": 12, "p_min": 0.75}),
                                          ("ngram-simple", {"n": 6, "m": 32})])
def test_the_flags_advised_are_accepted_by_llama_cpps_own_binary(llama_labels, rule, params):
    """The flags of an advised setting, with the two files put in, run llama.cpp's speculative example."""
    import subprocess

    from evaluation.advice_report import llama_flags
    from evaluation.advice_rules import Setting

    flags = llama_flags(Setting("llama.cpp", "", rule, params, []), threads=1)["flags"]
    for name in ("TARGET", "DRAFT"):
        flags = flags.replace(f"{name}.gguf", str(llama_labels["dir"] / f"{name.lower()}.gguf"))
    done = subprocess.run([str(LLAMA_BIN), *flags.split(), "-p", "def f():", "-n", "4", "--temp", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-600:]

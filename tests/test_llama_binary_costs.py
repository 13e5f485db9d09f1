"""The costs of llama.cpp's own binaries, as ``specheads advise`` prices llama.cpp's rules with them:

- the sampler's time per token (llama.cpp builds each sampled row's candidates over the whole vocabulary) is priced
  per token emitted, by target-only and by a drafting run alike, and the draft's per token it drafts, never in its
  batch re-reads; a model that forgets it predicts another speedup;
- ``bench-timing --backend llama_cpp --tools DIR`` times ``llama-bench``'s forwards (every row out for the target's
  verifications, the last row for the draft's re-reads) and ``llama-completion``'s sampler, through stand-ins of
  the binaries here and through the real ones where ``make llama-tools`` built them;
- the target alone is timed as llama-speculative-simple times a drafting run: its decoding with the sampler.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from decoding.costs import CostModel, read_timing, timing_entry
from decoding.replay import Counts

LLAMA_BENCH = Path(".llama.cpp/build/bin/llama-bench")


def timing(target_sample: float | None, draft_sample: float | None) -> dict:
    draft = timing_entry("draft", "q4", (64, 0.5), 64, {1: 0.04, 2: 0.05}, verify=None, catch_up=0.05,
                         read_by_tokens={"2": {"cache": 64, "median_s": 0.05}, "5": {"cache": 64, "median_s": 0.08}})
    target = timing_entry("target", "q4", (64, 1.0), 64, {1: 0.1, 2: 0.12, 3: 0.14, 8: 0.25}, verify=8,
                          verify_short=3, by_tokens=True)
    for entry, sample in ((draft, draft_sample), (target, target_sample)):
        if sample is not None:
            entry["sample"] = {"tokens": 32, "median_s": sample}
    return {"models": [draft, target], "backend": "llama_cpp"}


def test_the_sampler_is_priced_per_token_emitted_and_per_token_drafted():
    bare = CostModel.from_timing(timing(None, None))
    costs = CostModel.from_timing(timing(0.002, 0.001))
    assert bare.sample_s == 0.0 and costs.sample_s == pytest.approx(0.002)
    assert costs.draft == pytest.approx(0.041) and bare.draft == pytest.approx(0.04)
    # a batch re-read and the catch-up sample nothing: priced from the forwards alone
    assert costs.draft_read(5) == bare.draft_read(5) == pytest.approx(0.08) and costs.catch_up == bare.catch_up
    alone = Counts(n=10, target=10, calls=np.array([0, 10.0]))
    assert costs.speedup(alone) == pytest.approx(1.0) and costs.price(alone) == pytest.approx(10 * 0.102)
    # 10 tokens in 2 rounds of 7 drafted: 14 draft steps, two verifications of 8 tokens, 2 re-reads of 5
    drafting = Counts(n=10, draft=14, target=2, calls=np.array([0, 0, 0, 0, 0, 0, 0, 0, 2.0]),
                      draft_reads=np.array([0, 0, 0, 0, 0, 2.0]))
    price = 14 * 0.041 + 2 * 0.25 + 2 * 0.08 + 10 * 0.002
    assert costs.price(drafting) == pytest.approx(price)
    assert costs.speedup(drafting) == pytest.approx(10 * 0.102 / price)
    forgets = dataclasses.replace(costs, sample_s=0.0)  # a model without the target's sampler
    assert forgets.speedup(drafting) == pytest.approx(10 * 0.1 / (price - 10 * 0.002))
    assert forgets.speedup(drafting) != pytest.approx(costs.speedup(drafting), rel=1e-3)


def test_a_stop_rule_sets_lambda_against_the_forwards_with_the_sampler_aside():
    """A token a round adds pays where it gains more than λ·Δforwards / (1 − λ·s): with the sampler, a longer round
    must gain more per second of forwards than without it."""
    from decoding.rules import GoodputStop

    costs = CostModel.from_timing(timing(0.002, 0.001))
    assert costs.forward_rate(4.0) == pytest.approx(4.0 / (1 - 4.0 * 0.002))
    assert dataclasses.replace(costs, sample_s=0.0).forward_rate(4.0) == 4.0
    assert GoodputStop(costs, 4.0, 8).forward_rate == pytest.approx(costs.forward_rate(4.0))


def test_the_advices_intervals_price_target_only_with_its_sampler_too():
    """Over prompts, target-only is 1.0 and a drafting run's speedup is ``CostModel.speedup``'s: the base of the
    interval pays the sampler as the runs it is set against do."""
    from evaluation.simulate_lookup import priced_interval

    costs = CostModel.from_timing(timing(0.002, 0.001))
    alone = [Counts(n=n, target=n, calls=np.array([0, float(n)])) for n in (10, 20)]
    assert priced_interval(alone, costs).value == pytest.approx(1.0)
    drafting = [Counts(n=10, draft=14, target=2, calls=np.array([0, 0, 0, 0, 0, 0, 0, 0, 2.0]))] * 2
    assert priced_interval(drafting, costs).value == pytest.approx(costs.speedup(drafting[0]))


def test_a_saved_cost_model_keeps_its_sampler():
    costs = CostModel.from_timing(timing(0.002, 0.001))
    assert CostModel.from_dict(json.loads(json.dumps(costs.to_dict()))).sample_s == pytest.approx(0.002)


def test_a_sampler_time_that_is_not_a_time_is_refused(tmp_path):
    from decoding.costs import TimingFileError

    bad = timing(0.002, 0.001)
    bad["models"][1]["sample"]["median_s"] = -1
    path = tmp_path / "timing.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(TimingFileError, match="target's sample is -1"):
        read_timing(path)


@pytest.fixture
def pair_file(tmp_path):
    """A pair file of two GGUF files the stand-ins never read."""
    files = {}
    for role in ("draft", "target"):
        files[role] = tmp_path / f"{role}.gguf"
        files[role].write_bytes(role.encode())
    path = tmp_path / "pair.yaml"
    path.write_text(json.dumps({role: {"path": str(f), "name": f"tiny-{role}"} for role, f in files.items()}))
    return path


def test_bench_timing_times_llama_cpps_own_binaries(pair_file, tmp_path, capsys):
    from evaluation import bench_timing
    from testing.llama_tools import write_stub_tools

    tools = write_stub_tools(tmp_path / "tools")
    out = tmp_path / "timing"
    bench_timing.main(["--backend", "llama_cpp", "--pair", str(pair_file), "--threads", "1", "--tools", str(tools),
                       "--verify_lengths", "24", "33", "--repeats", "2", "--out", str(out)])
    saved = json.loads((out / "timing-llama_cpp-1t.json").read_text())
    assert saved["timed_with"] == "llama-bench" and saved["threads"] == 1
    costs = read_timing(out / "timing-llama_cpp-1t.json")
    # the stand-in's forward of m tokens takes (10 + 2 m) ms, 1.5 times that with every row out; a token 8 ms; its
    # sampler 1 ms a token
    assert costs.verify(1) == pytest.approx(0.008) and costs.verify(33) == pytest.approx(0.114)
    assert costs.verify(9) == pytest.approx(0.042) and costs.draft_read(5) == pytest.approx(0.020)
    assert costs.sample_s == pytest.approx(0.001) and costs.draft == pytest.approx(0.009)
    assert costs.catch_up == pytest.approx(0.014 - 0.008)  # the draft's two-token read, one row out
    calls = [json.loads(line) for line in (tools / "llama-bench.calls").read_text().splitlines()]
    verifying = next(c for c in calls if "33" in c[c.index("-p") + 1].split(","))
    assert verifying[verifying.index("-embd") + 1] == "1" and verifying[verifying.index("-d") + 1] == "256"
    rereading = next(c for c in calls if c[c.index("-m") + 1].endswith("draft.gguf") and "-embd" in c)
    assert rereading[rereading.index("-embd") + 1] == "0"
    sampled = [json.loads(line) for line in (tools / "llama-completion.calls").read_text().splitlines()]
    assert any("--samplers" in c and c[c.index("--top-k") + 1] == "10" for c in sampled)  # the draft's sampler
    assert "sampler per token" in capsys.readouterr().out


def test_tools_without_the_llama_cpp_backend_is_one_line(capsys):
    from specheads.cli import main

    try:
        code = main(["bench-timing", "--tools", "somewhere"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs --backend llama_cpp" in err[0], err


def test_a_missing_llama_bench_is_one_line(pair_file, tmp_path):
    from core.errors import UserError
    from evaluation.bench_timing_binaries import time_binaries

    with pytest.raises(UserError, match="make llama-tools"):
        time_binaries(tmp_path / "none", {"target": pair_file.parent / "target.gguf"}, 1, 16, 16, (2,), (2,))


@pytest.mark.skipif(not LLAMA_BENCH.is_file(), reason="llama.cpp's binaries are built by `make llama-tools`")
def test_the_real_binaries_output_is_read(tiny_pair, tmp_path):
    """llama-bench's JSON lines and llama-completion's sampler count, as this llama.cpp prints them."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make install`")
    from evaluation.bench_timing_binaries import time_binaries
    from testing.tiny_gguf import write_gguf

    paths = {role: write_gguf(path, tmp_path / f"{role}.gguf") for role, path in zip(("draft", "target"), tiny_pair)}
    result = time_binaries(LLAMA_BENCH.parent, paths, 1, 16, 16, (2, 3, 5), (2, 3), verify=3, repeats=1)
    path = tmp_path / "timing.json"
    path.write_text(json.dumps(result))
    costs = read_timing(path)
    assert costs.verify(5) > 0 and costs.draft_read(3) > 0 and 0 < costs.sample_s < 1

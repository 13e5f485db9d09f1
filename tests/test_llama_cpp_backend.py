"""The llama.cpp backend (``core.llama_cpp``) on a tiny GGUF pair written from the tiny Llama checkpoints.

- the GGUF model gives transformers' logits and final-norm hidden states (to the rounding of llama.cpp's float16 KV
  cache), at every row asked, after cropping and re-reading;
- our decoder's greedy target-only equals llama.cpp's own greedy generation (``llama_cpp.Llama``), and every exact
  policy equals target-only greedy on the backend; where a batched verification and a one-token step round a near
  tie differently the count of differing generations is bounded;
- speculative sampling on the backend's distributions outputs the target's (χ² of the second token), a test that
  rejects drafting alone;
- SpecDec++ Lemma 3.1's count identity holds for every stop rule on the backend;
- a GGUF of another vocabulary, a missing file, a head or labels of the other backend are refused in one line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from scipy import stats

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make install` (make test needs it)")

from core.errors import UserError  # noqa: E402
from core.identity import check_same_model  # noqa: E402
from core.models import ModelSpec, check_vocabularies, load_llama_model  # noqa: E402
from core.sampling import Sampling  # noqa: E402
from decoding.policies import build_policy  # noqa: E402
from decoding.state import ModelPair  # noqa: E402
from heads.export import HeadFileError, export_head  # noqa: E402
from heads.exported import ExportedHead  # noqa: E402
from heads.resnet import ResNetHead  # noqa: E402
from evaluation.llama_peer import LlamaPeer  # noqa: E402
from testing.tiny_gguf import write_gguf  # noqa: E402

PROMPTS = [[1, 10, 11, 12], [1, 30, 5], [1, 44, 8, 9, 20]]


@pytest.fixture(scope="module")
def gguf_pair(tiny_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return tuple(write_gguf(path, d / f"{path.name}.gguf") for path in tiny_pair)


@pytest.fixture(scope="module")
def llama_models(gguf_pair, tiny_pair):
    loaded = [load_llama_model(ModelSpec(path=str(g), tokenizer=str(t), name=f"tiny-{t.name}"), threads=1, n_ctx=256)
              for g, t in zip(gguf_pair, tiny_pair)]
    return tuple(m for m, _, _ in loaded), tuple(i for _, _, i in loaded)


@pytest.fixture(scope="module")
def hf_target(tiny_pair):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_pair[1], dtype=torch.float32).eval()


def pair(llama_models, **sampling) -> ModelPair:
    return ModelPair(*llama_models[0], eos_token_ids=[], sampling=Sampling(**sampling))


def generate(policy, pair, prompt, seed=0):
    return policy.generate(pair, prompt, torch.Generator().manual_seed(seed))


def test_the_gguf_model_gives_transformers_numbers(llama_models, hf_target):
    target = llama_models[0][1]
    seq = [1, 5, 9, 12, 30, 7, 8, 22]
    for ask, rows in ((seq, len(seq)), (seq + [3, 4], 3), (seq[:5] + [6], 1), (seq[:5] + [6], 2)):
        hidden, logits = target.read(ask, rows)
        with torch.no_grad():
            out = hf_target(torch.tensor([ask]), output_hidden_states=True)
        assert target.ids == ask
        # float16 keys and values in llama.cpp's cache: about 1e-3 of logits that reach 8
        assert (logits - out.logits[0, -rows:]).abs().max() < 1e-2
        assert (hidden - out.hidden_states[-1][0, -rows:]).abs().max() < 1e-2


def test_our_greedy_target_only_is_llama_cpps_own(llama_models, gguf_pair):
    import llama_cpp

    own = llama_cpp.Llama(str(gguf_pair[1]), n_ctx=256, n_threads=1, verbose=False)
    p = pair(llama_models, temperature=0.0, max_new_tokens=24)
    for prompt in PROMPTS:
        theirs = []
        for token in own.generate(prompt, top_k=1, temp=0.0, reset=True):
            theirs.append(token)
            if len(theirs) == 24:
                break
        assert generate(build_policy("target_only"), p, prompt).tokens == theirs


EXACT = [("sd", {"k": 1}), ("sd", {"k": 4}), ("hf_heuristic", {}), ("confidence", {}), ("svip", {"h": 0.5}),
         ("specdecpp", None)]


@pytest.fixture(scope="module")
def llama_head(llama_models, tmp_path_factory):
    """A random SpecDec++ stop head exported for the tiny GGUF draft (its identity, backend llama_cpp)."""
    draft_identity = llama_models[1][0]
    torch.manual_seed(0)
    head = ResNetHead(hidden_size=draft_identity["hidden_size"], depth=2)
    with torch.no_grad():
        head.out.weight.normal_(0, 1)
    return str(export_head(head, tmp_path_factory.mktemp("heads") / "stop.safetensors", draft=draft_identity,
                           vocab_size=draft_identity["vocab_size"], label={"kind": "test"}, role="stop",
                           threshold={"name": "h", "value": 0.5, "rule": "test"}, metrics={}, position="own"))


def test_every_exact_policy_is_target_greedy_on_the_backend(llama_models, llama_head):
    p = pair(llama_models, temperature=0.0, max_new_tokens=20)
    differ = total = 0
    for name, kwargs in EXACT:
        policy = build_policy(name, **(kwargs if kwargs is not None else {"head": llama_head}))
        for prompt in PROMPTS:
            reference = generate(build_policy("target_only"), p, prompt).tokens
            differ += generate(policy, p, prompt).tokens != reference
            total += 1
    # a verification reads several tokens in one batch where target-only reads one: llama.cpp may round a near
    # tie the other way; none does here, and more than one generation in ten would be a decoder bug
    assert differ <= total // 10, f"{differ} of {total} greedy generations differ from target-only"


def second_token_pvalue(llama_models, policy_name: str, kwargs: dict, n: int = 600) -> float:
    """χ² p-value of the second generated token against the target's marginal Σ_a p(a|x) p(·|x, a), the
    target's numbers read through the backend itself."""
    target = llama_models[0][1]
    prompt = PROMPTS[0]
    p1 = target.read(prompt)[1][0].softmax(-1).double()
    vocab = p1.shape[0]
    p2 = sum(p1[a] * target.read(prompt + [a])[1][0].softmax(-1).double() for a in range(vocab))
    p = pair(llama_models, temperature=1.0, max_new_tokens=2)
    policy = build_policy(policy_name, **kwargs)
    g = torch.Generator().manual_seed(0)
    seconds = torch.tensor([policy.generate(p, prompt, g).tokens[1] for _ in range(n)])
    observed = torch.bincount(seconds, minlength=vocab).double()
    expected = p2 * n
    small = expected < 5  # pooled, as χ² wants ≥ 5 expected per cell
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_speculative_sampling_on_the_backend_outputs_the_target(llama_models):
    assert second_token_pvalue(llama_models, "sd", {"k": 3}) > 1e-3
    # the same test rejects the draft's own distribution (the draft is a perturbed target)
    assert second_token_pvalue(llama_models, "draft_only", {}) < 1e-3


@pytest.mark.parametrize("name, kwargs", [("sd", {"k": 3}), ("confidence", {"threshold": 0.5}),
                                          ("svip", {"h": 1.0}), ("specdecpp", None)])
def test_no_forward_is_unaccounted_on_the_backend(llama_models, llama_head, name, kwargs):
    """SpecDec++ Lemma 3.1: N_draft + N_target = N + N_discarded, for every generation."""
    p = pair(llama_models, temperature=1.0, max_new_tokens=24)
    policy = build_policy(name, **(kwargs if kwargs is not None else {"head": llama_head, "h": 0.4}))
    for seed in range(3):
        for prompt in PROMPTS:
            s = generate(policy, p, prompt, seed).stats
            assert s.draft_calls + s.target_calls == s.new_tokens + s.discarded


def test_a_reader_whose_cache_was_taken_is_refused(llama_models):
    from decoding.backends import CachedLM

    target = llama_models[0][1]
    lm = CachedLM(target, Sampling())
    lm.advance([1, 2, 3])
    target.read([1, 4])  # someone else reads through the same model
    with pytest.raises(RuntimeError, match="another reader"):
        lm.advance([1, 2, 3, 4])


def test_refusals_in_one_line(llama_models, gguf_pair, tiny_pair, tmp_path, llama_head):
    with pytest.raises(UserError, match="model file not found"):
        load_llama_model(ModelSpec(path=str(tmp_path / "missing.gguf")), threads=1)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(UserError, match="llama.cpp cannot load"):
        load_llama_model(ModelSpec(path=str(tmp_path / "junk.gguf"), tokenizer=str(tiny_pair[0])), threads=1)
    wide = write_gguf(tiny_pair[0], tmp_path / "wide.gguf", vocab_size=80)
    _, _, wide_id = load_llama_model(ModelSpec(path=str(wide), tokenizer=str(tiny_pair[0]), name="wide"), threads=1)
    with pytest.raises(UserError, match="vocabularies differ"):
        check_vocabularies(wide_id, llama_models[1][1])
    # a head trained on the transformers backend's labels of the same file, and this backend's head on that one
    transformers_draft = {**llama_models[1][0], "backend": "transformers"}
    head = ExportedHead(llama_head)
    head.check(llama_models[0][0])
    with pytest.raises(HeadFileError, match="labels of the llama_cpp backend, this draft runs on transformers"):
        from heads.export import check_draft

        check_draft(head.meta, draft=transformers_draft, path=llama_head)
    with pytest.raises(Exception, match="backend transformers, not llama_cpp"):
        check_same_model(transformers_draft, llama_models[1][0], "labels")
    assert math.isfinite(head.threshold)


@pytest.fixture
def stub_tools(tmp_path):
    from testing.llama_tools import write_stub_tools

    return write_stub_tools(tmp_path / "tools")


def test_an_eval_on_the_backend_runs_llama_cpps_own_decoding_beside_ours(gguf_pair, tiny_pair, tmp_path,
                                                                         stub_tools, monkeypatch):
    """The eval on backend llama_cpp: our policies, and llama.cpp's target-only, its speculative decoding at its
    defaults and at the grid entry fastest on the tuning prompts (which the eval does not decode), from its binaries
    as its users run them (sampling flags as the mode's, the same threads, its own decoding time); its prompt lookup
    likewise, with no draft model. The simulator replays each prompt-lookup run along its own responses."""
    import json

    import yaml

    from evaluation.__main__ import main
    from testing.tiny import write_eval_config, write_prompts

    from test_eval_latency import timing_file

    from decoding.lookup_stop import LookupCalibration

    prompts = write_prompts(tmp_path / "prompts.jsonl", n=6)
    (tmp_path / "timing.json").write_text(json.dumps(timing_file()))
    LookupCalibration(length=[1.0, 6.0], keep=[0.2, 0.9], n=1).save(tmp_path / "lookup.json")
    lookup = {"n": 1, "m": 4}
    config = write_eval_config(
        tmp_path / "eval.yaml", gguf_pair[0], gguf_pair[1], prompts, tmp_path / "eval", limit=3, backend="llama_cpp", threads=1, untimed_prefill=True, hf_peer={"enabled": False}, max_new_tokens=8,
        modes=[{"name": "greedy", "temperature": 0.0}], loglik=False,
        policies=[{"family": "target_only"}, {"family": "sd", "grid": {"k": [2]}},
                  {"family": "prompt_lookup", "fixed": lookup},
                  {"family": "prompt_lookup_goodput", "fixed": {**lookup, "calibration": str(tmp_path / "lookup.json"),
                                                                "timing": str(tmp_path / "timing.json")}}],
        llama_peer={"enabled": True, "tools": str(stub_tools), "grid": [[0.0, 2], [0.5, 8]], "tune_prompts": [3, 6],
                    "prompt_lookup": True, "prompt_lookup_grid": [[2, 8], [1, 4]]})
    settings = yaml.safe_load(config.read_text())
    for role, checkpoint in zip(("draft", "target"), tiny_pair):
        settings[role]["tokenizer"] = str(checkpoint)
    config.write_text(yaml.safe_dump(settings))
    assert main(["--config", str(config)]) == 0
    records = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    runs = {r["run"] for r in records}
    assert {"llama_target_only", "llama_speculative[p_min=0,n_max=3]", "llama_speculative[p_min=0,n_max=2]",
            "llama_prompt_lookup[n=12,m=48]", "llama_prompt_lookup[n=1,m=4]", "target_only", "sd[k=2]",
            "prompt_lookup", "prompt_lookup_goodput"} <= {r.split("[")[0] if r.startswith("prompt") else r
                                                          for r in runs}, runs
    ours = {r["family"]: r["tokens"] for r in records if r["prompt"] == 0 and r["mode"] == "greedy"}
    assert ours["prompt_lookup"] == ours["prompt_lookup_goodput"] == ours["target_only"]
    tuning = [json.loads(line) for line in (tmp_path / "eval" / "llama_tuning.jsonl").read_text().splitlines()]
    assert sorted({r["prompt"] for r in tuning}) == [3, 4, 5] and len(tuning) == 12
    spec = [json.loads(line) for line in (stub_tools / "llama-speculative-simple.calls").read_text().splitlines()]
    copied = [r for r in records if r["family"] == "llama_prompt_lookup"]  # no draft forward made its candidates
    assert copied and all(r["stats"]["draft_calls"] == 0 and r["stats"]["discarded"] == 3 for r in copied)
    lookup = [c for c in spec if "ngram-simple" in c]
    assert lookup and all("-md" not in c and c[c.index("--spec-type") + 1] == "ngram-simple" for c in lookup)
    for run in ("llama_target_only", "llama_speculative[p_min=0,n_max=3]"):  # its own text, its decoding time
        peer = next(r for r in records if r["run"] == run)
        assert peer["text"] == "return a + b"
    peer = next(r for r in records if r["run"] == "llama_target_only")
    # its decoding time: the forwards and the sampler
    assert peer["stats"]["wall_s"] == pytest.approx(0.105) and peer["stats"]["new_tokens"] == 4
    calls = [json.loads(line) for line in (stub_tools / "llama-completion.calls").read_text().splitlines()]
    assert all(c[c.index("--temp") + 1] == "0.0" and c[c.index("-t") + 1] == "1" for c in calls)
    assert "llama_target_only" in (tmp_path / "eval" / "report.md").read_text()
    # each prompt-lookup run replayed along its own responses: our runs' counts exactly
    from decoding.costs import read_timing
    from evaluation.config import parse
    from evaluation.simulate_lookup import own_response_lines

    by_run = {}
    for r in records:
        by_run.setdefault((r["mode"], r["run"]), []).append(r)
    costs = read_timing(tmp_path / "timing.json")
    ran = json.loads((tmp_path / "eval" / "settings.json").read_text())

    def replayed() -> dict[str, dict]:
        _, rows = own_response_lines(parse(["--config", str(config)])[0], ran, by_run,
                                     lambda mode, run: {"timing": costs, "fit-out": None})  # too few runs to fit
        return {r["family"]: r for r in rows}

    rows = replayed()
    assert set(rows) == {"prompt_lookup", "prompt_lookup_goodput", "llama_prompt_lookup"}
    for family in ("prompt_lookup", "prompt_lookup_goodput"):
        assert rows[family]["measured"]["discarded"] > 0 and rows[family]["speedups"]["timing"] > 0
        assert rows[family]["replayed"] == {k: rows[family]["measured"][k] for k in ("target", "discarded")}
    assert set(rows["prompt_lookup"]["speedups"]) == {"timing"}
    LookupCalibration(length=[1.0, 6.0], keep=[0.3, 0.9], n=1).save(tmp_path / "lookup.json")  # not the run's
    lines, _ = own_response_lines(parse(["--config", str(config)])[0], ran, by_run,
                                  lambda mode, run: {"timing": costs})
    assert any("prompt_lookup_goodput" in line and "lookup.json changed since the run" in line for line in lines)
    emptied = {key: [{**r, "tokens": []} if r["family"] == "prompt_lookup" else r for r in recs]
               for key, recs in by_run.items()}
    lines, _ = own_response_lines(parse(["--config", str(config)])[0], ran, emptied,
                                  lambda mode, run: {"timing": costs})
    assert any("prompt_lookup[" in line and "its responses hold no tokens" in line for line in lines), lines
    monkeypatch.setattr("core.prompts.tokenize_prompt", lambda tokenizer, text, template: [])  # no prompt to copy
    assert replayed()["prompt_lookup"]["replayed"]["discarded"] != rows["prompt_lookup"]["measured"]["discarded"]


def test_the_entry_point_decodes_two_gguf_files_with_a_policy(gguf_pair, tiny_pair, llama_models):
    """``SpeculativeLlama`` (``specheads generate``): a llama-cpp-python user's way to our rules, without the harness;
    greedy SD gives the target's greedy text, and a bad policy setting is one line."""
    from decoding.runtimes.llama_cpp import SpeculativeLlama

    llm = SpeculativeLlama(gguf_pair[1], gguf_pair[0], threads=1, n_ctx=256, tokenizer=str(tiny_pair[1]),
                           policy="sd", k=2)
    text, stats = llm.generate([1, 10, 11], max_new_tokens=10, temperature=0.0)
    same = ModelPair(*llama_models[0], eos_token_ids=llm.eos, sampling=Sampling(temperature=0.0, max_new_tokens=10))
    reference = generate(build_policy("target_only"), same, [1, 10, 11]).tokens
    assert text == llm.tokenizer.decode(reference, skip_special_tokens=True)
    assert stats.new_tokens == len(reference) and stats.draft_calls > 0
    # the command: --tokenizer where transformers cannot read the GGUF files' vocabulary (the tiny files')
    from decoding.runtimes.llama_cpp import main

    text, stats = main(["--target", str(gguf_pair[1]), "--draft", str(gguf_pair[0]), "--tokenizer", str(tiny_pair[1]),
                        "--policy", "sd", "--k", "2", "--prompt", "def f", "--max_new_tokens", "4", "--threads", "1"])
    assert stats.new_tokens > 0 and stats.draft_calls > 0
    with pytest.raises(UserError, match="policy sd: k must be at least 1"):
        SpeculativeLlama(gguf_pair[1], gguf_pair[0], threads=1, n_ctx=256, tokenizer=str(tiny_pair[1]), policy="sd",
                         k=0)


@pytest.mark.parametrize("response_source", ["target", "dataset"])
def test_labels_on_llama_cpp_are_the_transformers_labels(gguf_pair, tiny_pair, prompt_file, tmp_path,
                                                         response_source):
    """The llama.cpp labeler (prompts as sequences of one context, candidates as sequences sharing their prefix) gives
    the transformers labeler's rows, category by category: the same candidates and positions, and numbers within
    llama.cpp's float16 KV rounding; without the tapped layers, which llama.cpp does not give, and refused where a
    head would read them."""
    import dataclasses

    from core.shards import load_split, read_manifest
    from data_gen.run import run_labels
    from pipeline.data import LabelDataModule
    from core.errors import SettingError
    from testing.tiny import label_config

    hf = label_config(*tiny_pair, prompt_file, tmp_path / "hf", max_new_tokens=8, response_source=response_source)
    llama = dataclasses.replace(
        hf, output_dir=str(tmp_path / "llama"), backend="llama_cpp", threads=1,
        draft=ModelSpec(path=str(gguf_pair[0]), tokenizer=str(tiny_pair[0]), name="tiny-draft"),
        target=ModelSpec(path=str(gguf_pair[1]), tokenizer=str(tiny_pair[1]), name="tiny-target"))
    run_labels(hf, quiet=True)
    run_labels(llama, quiet=True)
    manifest = read_manifest(llama.output_dir)
    assert manifest["models"]["draft"]["backend"] == "llama_cpp" and manifest["feature"]["tapped_layers"] is None
    for split in ("train", "val", "test"):
        a = load_split(hf.output_dir, split).to_pandas()
        b = load_split(llama.output_dir, split).to_pandas()
        assert set(a.columns) - set(b.columns) == {"hidden_layers", "hidden_layers_prev"}
        key = ["category", "prompt_id", "position"]
        assert a[key].values.tolist() == b[key].values.tolist()  # the same rows, in the same order
        same = a.token_id.values == b.token_id.values
        assert same.mean() >= 0.9, f"{split}: {(~same).sum()} of {len(same)} candidates differ"  # a near tie may flip
        assert (a.loss_mask.values == b.loss_mask.values)[same].all()
        for column in ("logp_draft", "logp_target", "acceptance", "tv", "entropy_draft", "read_logp_draft",
                       "stale_entropy_target", "hidden", "hidden_prev", "stale_hidden_target"):
            x, y = (torch.tensor(list(f[column].values[same]), dtype=torch.float64) for f in (a, b))
            finite = x.isfinite() & y.isfinite()
            assert (x.isfinite() == y.isfinite()).all(), column
            assert (x[finite] - y[finite]).abs().max() < 1e-2, column
        assert (a.round_index.values == b.round_index.values).all()
    with pytest.raises(SettingError, match="llama.cpp, which gives no layer but the last"):
        _ = LabelDataModule(llama.output_dir, vectors=["layers"]).extra_size


def test_the_labeling_bench_times_both_backends_on_the_same_batches(gguf_pair, tiny_pair, prompt_file, tmp_path,
                                                                    capsys, monkeypatch):
    """The real pair's GGUF files serve both backends; the tiny GGUF files carry no tokenizer transformers converts,
    so its backend reads the checkpoints they were written from."""
    import dataclasses

    import yaml

    from data_gen import bench
    from data_gen.run import load_pair
    from testing.tiny import label_config

    def either(cfg):
        if cfg.backend == "transformers":
            cfg = dataclasses.replace(cfg, draft=ModelSpec(path=str(tiny_pair[0]), name="tiny-draft"),
                                      target=ModelSpec(path=str(tiny_pair[1]), name="tiny-target"))
        return load_pair(cfg)

    monkeypatch.setattr(bench, "load_pair", either)

    cfg = dataclasses.asdict(label_config(*gguf_pair, prompt_file, tmp_path / "unused", categories=["target"],
                                          threads=1))
    for role, folder in zip(("draft", "target"), tiny_pair):
        cfg[role]["tokenizer"] = str(folder)
    (tmp_path / "labels.yaml").write_text(yaml.safe_dump(cfg))
    assert bench.main(["--config", str(tmp_path / "labels.yaml"), "--bench_prompts", "4"]) == 0
    out = capsys.readouterr().out
    for line in ("target.generate, batch 1", "transformers: labeled target positions, batch 4",
                 "llama_cpp: labeled target positions, batch 4", "llama_cpp labeling time: target generation",
                 "x transformers labeling"):
        assert line in out, out


def test_the_audit_recomputes_llama_cpp_labels_and_catches_a_wrong_prefix(gguf_pair, tiny_pair, prompt_file, tmp_path,
                                                                         monkeypatch):
    """Labels made on llama.cpp are audited with the GGUF files, read by llama.cpp one sequence at a time: every row
    placed, the recomputed ones within llama.cpp's float16 rounding, the target's sampled responses drawn by their
    uniforms (``token_draw``); token_mixed rows read at the mixed prefix fail. A prompt-lookup row is a function of
    a prompt and the target's response, which the audit checks so."""
    import dataclasses

    from data_gen import audit, audit_recompute
    from data_gen.run import run_labels
    from testing.tiny import label_config

    base = label_config(*tiny_pair, prompt_file, tmp_path / "labels", max_new_tokens=8)
    cfg = dataclasses.replace(
        base, backend="llama_cpp", threads=1,
        draft=ModelSpec(path=str(gguf_pair[0]), tokenizer=str(tiny_pair[0]), name="tiny-draft"),
        target=ModelSpec(path=str(gguf_pair[1]), tokenizer=str(tiny_pair[1]), name="tiny-target"))
    run_labels(cfg, quiet=True)
    result = audit.audit(cfg.output_dir, rows=30, quiet=True)
    assert result["ok"], {c: r for c, r in result["columns"].items() if not r["ok"]}
    assert result["columns"]["token_draw"]["rows"] > 0 and "hidden_layers" not in result["columns"]
    assert result["columns"]["hidden"]["worst_diff"] < 1e-2
    right = audit_recompute.contexts

    def label_at_the_mixed_prefix(row, seq):
        c = right(row, seq)
        return dataclasses.replace(c, label=c.features)

    monkeypatch.setattr(audit_recompute, "contexts", label_at_the_mixed_prefix)
    broken = audit.audit(cfg.output_dir, rows=30, quiet=True)
    assert not broken["ok"] and "token_mixed" in broken["columns"]["logp_target"]["worst_row"]


@pytest.mark.parametrize("safe", [True, False])
def test_on_a_cpu_where_repacking_crashes_both_our_binding_and_llama_cpps_binaries_keep_the_files_layout(
        stub_tools, monkeypatch, tmp_path, safe):
    """llama.cpp's AMX kernels crash on Q4_K weights: where the CPU has them, the peer's binaries get
    ``--no-repack``, as our binding loads its models without extra buffer types."""
    import json

    from core import llama_cpp
    from evaluation import llama_peer

    monkeypatch.setattr(llama_peer, "repacks_safely", lambda: safe)
    llama_peer.run(llama_peer.LlamaPeer(enabled=True, tools=str(stub_tools)), llama_peer.TARGET_ONLY, {},
                   tmp_path / "t.gguf", tmp_path / "d.gguf", "def f():", Sampling(temperature=0.0, max_new_tokens=4), 0, 1)
    call = json.loads((stub_tools / "llama-completion.calls").read_text().splitlines()[-1])
    assert ("--no-repack" in call) is not safe
    assert isinstance(llama_cpp.repacks_safely(), bool)


SPECULATIVE_BIN = Path(LlamaPeer().tools) / "llama-speculative-simple"


def binary_rounds(target: Path, text: str, n: int, m: int, new_tokens: int) -> list[tuple[int, int, int]]:
    """(kept, drafted, the round's last token) of each round of llama.cpp's own ``ngram-simple``, greedy, from its
    debug log."""
    from evaluation.llama_peer import run_printing

    done = run_printing([str(SPECULATIVE_BIN), "-m", str(target), "-p", text, "-n", str(new_tokens), "-t", "1",
                         "-c", "256", "--temp", "0", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                         str(n), "--spec-ngram-simple-size-m", str(m), "-v"], r"n_accept\s*=")
    found = re.findall(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)", done.stderr)
    return [tuple(map(int, r)) for r in found]


# Each text is read one token a character; its first round tests one clause of the rule, as its comment says
# (llama.cpp's ``common_ngram_simple_draft``), then the generation goes on with whatever the tiny target repeats.
LOOKUP_CASES = [
    ("cab1+xyz.ab2-xyz.ab", 2, 8, 7),  # the latest earlier match ("ab2…"), its continuation up to the text's end
    ("ab0123456789ab", 2, 2, 0),  # a match at the text's first token is never looked at
    ("0123456789xiiii", 1, 4, 1),  # the window one token back overlaps the pattern: the next one back matches
    ("0123456789xyzxyzxyz", 3, 4, 0),  # a match followed by fewer than n tokens proposes nothing
    ("0123456789xyzxyz", 2, 12, 0),  # too short a history for n + m
]


@pytest.mark.skipif(not SPECULATIVE_BIN.is_file(), reason="llama.cpp's binaries are built by `make llama-tools`")
@pytest.mark.parametrize("text, n, m, first", LOOKUP_CASES)
def test_prompt_lookup_proposes_what_llama_cpps_own_binary_does(gguf_pair, llama_models, monkeypatch, text, n, m,
                                                                first):
    """Our prompt-lookup decoder, greedy, drafts and keeps round by round what llama.cpp's ``ngram-simple`` does in
    its own ``llama-speculative-simple`` on the same text (read into ids by llama.cpp's own tokenizer). Rounds are
    compared while the tokens left do not cap a draft (both cap it at the tokens left less one, but the binary
    lifts its cap where that comes to 0)."""
    import llama_cpp

    from decoding.policies import prompt_lookup

    vocab = llama_cpp.Llama(str(gguf_pair[1]), vocab_only=True, verbose=False)
    prompt = vocab.tokenize(text.encode(), add_bos=True, special=True)
    assert len(prompt) == len(text)
    new_tokens = 48
    theirs = binary_rounds(gguf_pair[1], text, n, m, new_tokens)

    drafted = []  # (tokens decoded before the round, candidates proposed)
    propose = prompt_lookup.prompt_lookup_proposal

    def recorded(seq, *args):
        source, candidates = propose(seq, *args)
        drafted.append((len(seq) - len(prompt), len(candidates)))
        return source, candidates

    monkeypatch.setattr(prompt_lookup, "prompt_lookup_proposal", recorded)
    result = generate(build_policy("prompt_lookup", n=n, m=m), pair(llama_models, temperature=0.0,
                                                                       max_new_tokens=new_tokens), prompt)
    kept = iter(result.stats.accepted_lengths)
    ours = []
    for start, count in drafted:
        accepted = next(kept) if count else 0
        ours.append((accepted, count, result.tokens[start + accepted]))
    uncapped = sum(1 for start, _ in drafted if new_tokens - start - 1 >= m)
    assert uncapped >= 5 and theirs[0][1] == first
    assert ours[:uncapped] == theirs[:uncapped]

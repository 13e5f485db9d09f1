"""Prompt lookup's learned stop through the stages: labels that store the target's state along its responses
(``target_states: true``), the stop rows a head trains on (``LabelDataModule(label="lookup")``), ``make train``'s
export of a ``lookup_stop`` head with its λ chosen on the validation responses, and the decoder's goodput stop
reading it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from core.errors import SettingError

LOOKUP_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "train" / "lookup_stop_d0.yaml"


@pytest.fixture(scope="module")
def lookup_labels(tmp_path_factory):
    """Labels of the tiny pair that store the target's states: target prompts (the target's own greedy responses,
    which repeat themselves, so that prompt lookup finds matches) and draft prompts (no target response: no
    states)."""
    import dataclasses

    from data_gen.run import run_labels
    from testing.tiny import label_config, make_pair, write_prompts

    root = tmp_path_factory.mktemp("lookup_labels")
    draft, target = make_pair(root / "models")
    cfg = label_config(draft, target, write_prompts(root / "prompts.jsonl", n=24), root / "labels", max_new_tokens=16,
                       categories=["target", "draft"], target_states=True, split_fractions=(0.5, 0.25, 0.25))
    cfg = dataclasses.replace(cfg, prompts=dataclasses.replace(cfg.prompts, response_field=None),
                              sampling=dataclasses.replace(cfg.sampling, temperature=0.0))
    run_labels(cfg, quiet=True)
    return root / "labels", target


def test_the_labels_store_the_state_that_produced_each_response_token(lookup_labels):
    """Row t of a response's stored states is the target's last hidden state after reading prompt + response[:t]
    (the one that produced token t), and its top-1 probability that of the softmax of its logits (greedy: the raw
    logits, not the point mass greedy samples from); a prompt without a target response stores none."""
    from transformers import AutoModelForCausalLM

    from core.shards import load_sequences, read_manifest

    labels, target_dir = lookup_labels
    assert read_manifest(labels)["feature"]["target_states"] == 32
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    seqs = load_sequences(labels).with_format("numpy")
    checked = 0
    for row in seqs:
        if row["category"] == "draft":
            assert len(row["target_hidden"]) == len(row["target_top1"]) == 0
            continue
        prompt, response = row["prompt_ids"].tolist(), row["response_ids"].tolist()
        stored = row["target_hidden"].reshape(len(response), 32).astype(np.float32)
        with torch.no_grad():
            out = target(torch.tensor([prompt + response]), output_hidden_states=True)
        hidden = out.hidden_states[-1][0, len(prompt) - 1 : len(prompt) - 1 + len(response)]
        top1 = out.logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)].softmax(-1).max(-1).values
        assert np.allclose(stored, hidden.numpy(), atol=2e-2, rtol=1e-2)
        assert np.allclose(row["target_top1"], top1.numpy(), atol=1e-4)
        checked += 1
    assert checked >= 6


def test_target_states_are_a_setting_named_only_where_set(lookup_labels, tmp_path):
    """A run without them keeps the settings of runs made before the setting existed (their resumes still match);
    a run with them and no target response to store them along is refused."""
    from data_gen.errors import LabelingError
    from testing.tiny import label_config

    labels, target = lookup_labels
    plain = label_config(target, target, tmp_path / "p.jsonl", tmp_path / "out")
    assert "target_states" not in plain.settings()
    assert label_config(target, target, tmp_path / "p.jsonl", tmp_path / "out",
                        target_states=True).settings()["target_states"] is True
    with pytest.raises(LabelingError, match="categories needs target or interleaved"):
        label_config(target, target, tmp_path / "p.jsonl", tmp_path / "out", target_states=True,
                     categories=["draft"])


def test_the_stop_rows_read_the_state_where_each_round_starts(lookup_labels):
    """A row is a candidate of ``lookup_rows`` along a stored response; its hidden input the state that produced the
    token its round starts after (zeros, with round index 0, at the response's first token), its scores the match
    length, its index in the round from 1 and that state's top-1 probability."""
    from core.shards import load_sequences
    from decoding.lookup_stop import lookup_rows
    from pipeline.data import LabelDataModule

    labels, _ = lookup_labels
    dm = LabelDataModule(str(labels), label="lookup", lookup_n=1, lookup_m=4)
    assert dm.hidden_size == 32 and dm.extra_size == 0
    rows = dm.rows("train")
    batch = rows[np.arange(len(rows))]
    expected, states, top1 = [], [], []
    for row in load_sequences(labels, "train").with_format("numpy"):
        if row["category"] != "target":
            continue
        response = row["response_ids"].tolist()
        r = lookup_rows(row["prompt_ids"].tolist(), response, 1, 4)
        h = row["target_hidden"].reshape(len(response), 32).astype(np.float32)
        for s, j, length, kept in zip(r.start, r.place, r.length, r.kept):
            expected.append((length, j + 1 if s else 0, kept))
            states.append(h[s - 1] if s else np.zeros(32, np.float32))
            top1.append(row["target_top1"][s - 1] if s else 0.0)
    assert len(expected) == len(rows) > 10
    got = list(zip(batch["match_length"].tolist(), batch["round_index"].tolist(), batch["target"].tolist()))
    assert got == [(float(a), float(b), float(c)) for a, b, c in expected]
    assert torch.allclose(batch["hidden"], torch.from_numpy(np.stack(states)))
    assert np.allclose(batch["target_top1"].numpy(), np.array(top1, np.float32))
    assert 0 < batch["target"].mean() < 1


def test_labels_without_target_states_are_refused_in_one_line(tmp_path, label_config):
    from data_gen.run import run_labels
    from pipeline.data import LabelDataModule

    cfg = label_config(output_dir=tmp_path / "plain")
    run_labels(cfg, quiet=True)
    with pytest.raises(SettingError, match="store no target states, .* label with `target_states: true`"):
        LabelDataModule(str(cfg.output_dir), label="lookup").hidden_size
    with pytest.raises(SettingError, match="no vector feature or category"):
        LabelDataModule(str(cfg.output_dir), label="lookup", vectors=["stale_target"])


def test_make_train_exports_a_lookup_stop_head_that_the_decoder_runs(lookup_labels, tmp_path, tiny_pair, capsys):
    """``specheads train`` on the lookup config: the head trains, its λ is the best of the replays along the
    validation responses at the timing file's costs, the file names the target as the model it reads; prompt
    lookup's goodput stop decodes with it, greedy token for token the target's own response, and refuses a head of
    other n-grams or another target."""
    from test_eval_latency import timing_file
    from transformers import AutoModelForCausalLM

    from core.sampling import Sampling
    from core.shards import read_manifest
    from decoding.lookup_stop import LookupCalibrationError, LookupHead
    from decoding.policies import build_policy
    from decoding.state import ModelPair
    from heads.export import HeadFileError, read_metadata
    from pipeline import train_all

    labels, target_dir = lookup_labels
    config = yaml.safe_load(LOOKUP_CONFIG.read_text())
    config["data"].update(lookup_n=1, lookup_m=4, batch_size=64)
    (tmp_path / "lookup.yaml").write_text(yaml.safe_dump(config))
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps(timing_file()))
    results = train_all.main(["--labels", str(labels), "--configs", str(tmp_path / "lookup.yaml"),
                              "--out", str(tmp_path / "train"), "--checkpoints", str(tmp_path / "ckpt"),
                              "--heads_dir", str(tmp_path / "heads"), "--max_epochs", "2", "--quiet",
                              "--timing", str(timing)])
    (result,) = results
    meta = read_metadata(result.export)
    assert meta["role"] == "lookup_stop" and meta["label"]["kind"] == "lookup" and meta["label"]["n"] == 1
    assert meta["threshold"]["name"] == "lam" and meta["threshold"]["value"] > 0
    assert meta["draft"]["name"] == read_manifest(labels)["models"]["target"]["name"]
    assert "target's last hidden state" in meta["inputs"]["hidden"]
    assert "lookup kept" in (tmp_path / "train" / "metrics.txt").read_text()

    head = LookupHead.load(result.export)
    assert head.rate == meta["threshold"]["value"]
    chances = head.chances(2, 4, None)
    assert chances.shape == (4,) and np.all((chances > 0) & (chances < 1))

    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    pair = ModelPair(target, target, eos_token_ids=[], sampling=Sampling(temperature=0.0, max_new_tokens=24))
    prompt = [1, 10, 11, 12, 10, 11, 12, 10, 11]
    policy = build_policy("prompt_lookup_head", n=1, m=4, head=result.export, timing=str(timing))
    ours = policy.generate(pair, prompt, torch.Generator().manual_seed(0))
    alone = build_policy("target_only").generate(pair, prompt, torch.Generator().manual_seed(0))
    assert ours.tokens == alone.tokens and ours.stats.target_calls <= alone.stats.target_calls
    with pytest.raises(LookupCalibrationError, match="proposals of 1-grams, .* looks up 2-grams"):
        build_policy("prompt_lookup_head", n=2, m=4, head=result.export, timing=str(timing))
    from evaluation import simulate as sim

    sim.main(["--labels", str(labels), "--splits", "test", "--heads", "--timing", str(timing),
              "--lookup_head", str(result.export)])
    printed = capsys.readouterr().out
    assert f"m=4   goodput stop, head (λ {head.rate:.3f}, the head's)" in printed and "n=1  " in printed
    other = AutoModelForCausalLM.from_pretrained(tiny_pair[0]).eval()  # the conftest pair's: other weights
    with pytest.raises(HeadFileError):
        policy.generate(ModelPair(other, other, eos_token_ids=[], sampling=Sampling(temperature=0.0,
                                                                                    max_new_tokens=4)),
                        prompt, torch.Generator().manual_seed(0))


def test_the_lookup_config_parses_through_the_cli(lookup_labels):
    from pipeline.cli import HeadCLI

    cli = HeadCLI(args=["--config", str(LOOKUP_CONFIG), "--data.labels", str(lookup_labels[0])], run=False)
    assert cli.model.head.config["hidden_size"] == 32  # the target's state, linked from the labels
    assert cli.datamodule.label == "lookup" and cli.datamodule.lookup == (4, 48)


@pytest.mark.parametrize("broken", [False, True])
def test_the_audit_recomputes_the_stored_states(tmp_path, tiny_pair, prompt_file, monkeypatch, broken):
    """``specheads audit`` reads each recomputed row's target state where its prefix ends and compares the stored
    one; a labeler that stores each response's states one token late fails it."""
    import data_gen.sequences as stored
    from data_gen.audit import audit
    from data_gen.run import run_labels
    from testing.tiny import label_config

    if broken:
        store = stored.target_state_columns

        def late(states, valid):
            hidden, top1 = states
            return store((torch.roll(hidden, -1, dims=1), torch.roll(top1, -1, dims=1)), valid)
        monkeypatch.setattr(stored, "target_state_columns", late)
    cfg = label_config(*tiny_pair, prompt_file, tmp_path / "labels", max_new_tokens=8, categories=["target"],
                       target_states=True)
    run_labels(cfg, quiet=True)
    report = audit(cfg.output_dir, rows=30, quiet=True)
    states = report["columns"]["target_hidden"]
    assert states["rows"] >= 10 and report["columns"]["target_top1"]["rows"] == states["rows"]
    assert states["ok"] != broken and report["ok"] != broken


def test_the_decoder_gives_the_head_the_state_that_produced_the_last_token(tiny_pair):
    """Each round after the target's first call reads the target's state that produced the last token of the text
    so far (its last hidden state over the text before that token) and its top-1 probability, as the labels store
    them (after a verification and after a step of the target alone); the first reads none."""
    from transformers import AutoModelForCausalLM

    from core.sampling import Sampling
    from decoding.costs import CostModel
    from decoding.lookup_stop import LookupHead
    from decoding.policies import build_policy
    from decoding.state import ModelPair
    from heads.resnet import ResNetHead

    target = AutoModelForCausalLM.from_pretrained(tiny_pair[1]).eval()
    module = ResNetHead(hidden_size=32, depth=0, scores=["log_match_length", "round_index", "target_top1"])
    policy = build_policy("prompt_lookup_head", n=1, m=4, head=LookupHead(module, 32, n=1, m=4),
                          costs=CostModel.by_length(0.0, verify=lambda m: 1.0 + 0.3 * m), lam=1.0)
    rule, seen = policy.length, []
    policy.length = lambda seq, source, proposal, state=None: seen.append((list(seq), state)) or \
        rule(seq, source, proposal, state)
    prompt = [1, 10, 11, 12, 10, 11, 12, 10, 11]
    pair = ModelPair(target, target, eos_token_ids=[], sampling=Sampling(temperature=0.0, max_new_tokens=24))
    policy.generate(pair, prompt, torch.Generator().manual_seed(0))
    assert seen[0][1] is None and len(seen) > 3
    for seq, state in seen[1:]:
        with torch.no_grad():
            out = target(torch.tensor([seq]), output_hidden_states=True)
        assert torch.allclose(state.hidden.float(), out.hidden_states[-1][0, -2], atol=1e-4)
        assert state.top1 == pytest.approx(out.logits[0, -2].softmax(-1).max().item(), abs=1e-5)

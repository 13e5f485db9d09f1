"""Label datasets identified by content: changed prompts or weights at the same path are refused on resume, and
every shard is checked against its recorded sha256 and row count when the dataset is read; a rerun repairs it."""

from __future__ import annotations

import dataclasses
import json
import shutil

import datasets

import numpy as np
import pytest

from core import shards
from core.shards import ShardError, read_manifest
from data_gen.errors import LabelingError
from data_gen.run import run_labels
from testing import tiny


@pytest.fixture
def own_inputs(tiny_pair, prompt_file, tmp_path):
    """A private copy of the tiny draft and the prompts, which a test may rewrite in place."""
    draft = tmp_path / "draft"
    shutil.copytree(tiny_pair[0], draft)
    prompts = tmp_path / "prompts.jsonl"
    shutil.copy(prompt_file, prompts)

    def config(**kw):
        return tiny.label_config(draft, tiny_pair[1], prompts, tmp_path / "labels", max_new_tokens=4, batch_size=4,
                                 **kw)

    return draft, prompts, config


@pytest.fixture
def labeled(own_inputs, tmp_path):
    """A finished label folder of the private inputs: (its config, the folder, its rows without the features)."""
    _, _, config = own_inputs
    run_labels(config(), quiet=True)
    out = tmp_path / "labels"
    return config, out, _rows(out)


def _rows(out):
    return {s: shards.load_split(out, s).to_pandas().drop(columns=["hidden", "hidden_prev"]) for s in shards.SPLITS}


def test_rewritten_prompts_at_the_same_path_are_refused(own_inputs):
    _, prompts, config = own_inputs
    run_labels(config(), quiet=True)
    lines = prompts.read_text().splitlines()
    first = json.loads(lines[0])
    first["prompt"] = first["prompt"] + " extra"
    prompts.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(LabelingError, match=r"inputs\.prompts_sha256 \(content changed\)"):
        run_labels(config(), quiet=True)


def test_other_draft_weights_at_the_same_path_are_refused(own_inputs):
    import torch
    from transformers import AutoModelForCausalLM

    draft, _, config = own_inputs
    run_labels(config(), quiet=True)
    model = AutoModelForCausalLM.from_pretrained(draft)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.01)
    model.save_pretrained(draft)  # same config, same file names and sizes, other weights
    with pytest.raises(LabelingError, match=r"inputs\.draft \(content changed\)"):
        run_labels(config(), quiet=True)


def test_manifest_lists_every_shard_and_reading_checks_them(own_inputs, tmp_path):
    _, _, config = own_inputs
    manifest = run_labels(config(), quiet=True)
    out = tmp_path / "labels"
    arrows = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.arrow"))
    assert sorted(manifest["shards"]) == arrows
    for split, summary in manifest["splits"].items():
        assert summary["rows"] == sum(r["rows"] for n, r in manifest["shards"].items() if n.count("/") == 1
                                      and n.startswith(f"{split}/"))
    assert sum(r["rows"] for n, r in manifest["shards"].items() if "/sequences/" in n) == manifest["prompts"]["count"]
    assert read_manifest(out) == manifest

    # a deleted shard, a shard the manifest does not list, an edited row count: one error naming the file
    shard = out / arrows[0]
    data = shard.read_bytes()
    shard.unlink()
    with pytest.raises(ShardError, match=rf"{shard}: missing"):
        read_manifest(out)
    shard.write_bytes(data)
    stray = out / "train" / "stray.arrow"
    shutil.copy(shard, stray)
    with pytest.raises(ShardError, match=rf"{stray}: not listed in the manifest"):
        read_manifest(out)
    stray.unlink()
    edited = json.loads((out / "manifest.json").read_text())
    edited["splits"]["train"]["rows"] += 1
    (out / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(ShardError, match="split train has"):
        read_manifest(out)
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert read_manifest(out) == manifest


def test_a_truncated_shard_is_named_on_read_and_redone_by_a_rerun(labeled):
    from pipeline.data import LabelDataModule

    config, out, before = labeled
    shard = sorted((out / "train").glob("*.arrow"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ShardError, match=rf"{shard}: its bytes differ"):
        LabelDataModule(str(out), label="soft")
    run_labels(config(), quiet=True)  # reopens the finished run and labels that batch again
    after = _rows(out)
    for s in shards.SPLITS:
        assert after[s].equals(before[s])
    read_manifest(out)


def test_a_shard_without_its_record_counts_as_not_done(labeled):
    """A shard written but not recorded (killed between the two writes) is relabeled, not trusted."""
    config, out, before = labeled
    shard = sorted((out / "val").glob("*.arrow"))[0]
    shard.with_name(shard.name + ".json").unlink()
    (out / "manifest.json").unlink()
    mtime = shard.stat().st_mtime_ns
    run_labels(config(), quiet=True)
    assert shard.stat().st_mtime_ns != mtime
    assert all(_rows(out)[s].equals(before[s]) for s in shards.SPLITS)


def test_the_audit_recomputes_rows_from_the_sequences_and_catches_a_wrong_prefix(labeled, monkeypatch):
    from data_gen import audit, audit_recompute

    _, out, _ = labeled
    result = audit.audit(out, rows=40, quiet=True)
    assert result["ok"], result
    assert result["columns"]["hidden"]["worst_diff"] < 1e-2 and result["columns"]["acceptance"]["worst_diff"] < 1e-4
    assert all(r["rows_past"] == 0 for c, r in result["columns"].items() if c != "token_draw")
    assert result["columns"]["loss_mask"]["rows"] == result["rows_placed"] > result["rows"]  # every row is placed
    assert result["columns"]["token_id"]["rows"] > 0
    # a broken reading of the sequences is caught: token_mixed rows labeled at Z<i instead of the clean X<i
    right = audit_recompute.contexts

    def label_at_the_mixed_prefix(row, seq):
        c = right(row, seq)
        return dataclasses.replace(c, label=c.features)

    monkeypatch.setattr(audit_recompute, "contexts", label_at_the_mixed_prefix)
    broken = audit.audit(out, rows=40, quiet=True)
    assert not broken["ok"] and not broken["columns"]["logp_target"]["ok"]
    assert "token_mixed" in broken["columns"]["logp_target"]["worst_row"]
    assert 0 < broken["columns"]["logp_target"]["rows_past"] < broken["rows"]  # only the token_mixed rows
    monkeypatch.setattr(audit_recompute, "contexts", right)
    assert audit.main([str(out), "--rows", "5"]) == 0
    # read as the decoder reads (one token per forward after the prefix): float weights give the same rows
    assert audit.audit(out, rows=10, access="decoder", quiet=True)["ok"]


def test_the_audit_fails_a_reader_one_position_off(labeled, monkeypatch):
    """Every row read one token later than it sits (its draws unchanged): the statistics of nearly every row move
    past rounding, so the audit fails, by the median and not by a few rows."""
    from data_gen import audit, audit_recompute

    _, out, _ = labeled
    right = audit_recompute.contexts

    def one_position_late(row, seq):
        return dataclasses.replace(right({**row, "position": int(row["position"]) + 1}, seq), draw=right(row, seq).draw)

    monkeypatch.setattr(audit_recompute, "contexts", one_position_late)
    result = audit.audit(out, rows=20, quiet=True)
    assert not result["ok"]
    for col in ("logp_draft", "logp_target", "entropy_target", "hidden_prev"):
        r = result["columns"][col]
        assert not r["ok"] and r["median_diff"] > r["tolerance"] and r["rows_past"] > r["rows"] / 2, (col, r)


def _damage(out, column, edit, category=None):
    """Rewrite one stored value of ``column`` (in the first row of ``category``) with ``edit``, as a labeler with a
    bug would write it: the shard, its record and the manifest's digests agree, so only the value is wrong."""
    manifest = json.loads((out / "manifest.json").read_text())
    shard, i = next((shard, i) for split in shards.SPLITS for shard in shards.shard_paths(out, split)
                    for i, c in enumerate(datasets.Dataset.from_file(str(shard))["category"]) if category in (None, c))
    cols = datasets.Dataset.from_file(str(shard)).to_dict()
    cols[column][i] = edit(cols[column][i])
    shards.write_shard(shard, cols, manifest["feature"]["sizes"])
    rel = shard.relative_to(out).as_posix()
    manifest["shards"][rel] = json.loads(shard.with_name(shard.name + ".json").read_text())
    (out / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("column, edit, category", [
    ("loss_mask", lambda v: not v, "token_mixed"),
    ("loss_mask", lambda v: not v, "target"),
    ("category", lambda v: "draft", "target"),
    ("position", lambda v: v + 1, None),
    ("prompt_id", lambda v: v + 1000, None),
    ("token_id", lambda v: (v + 1) % 50, "draft"),
    ("round_index", lambda v: v % 8 + 1 if v else 0, None),
])
def test_the_audit_catches_a_damaged_stored_value(labeled, column, edit, category, capsys):
    """One wrong value among all rows (a flipped loss_mask, a row moved to another place, category or prompt, a
    wrong token or round index) fails the audit, though the shard's digests agree."""
    from data_gen import audit

    _, out, _ = labeled
    _damage(out, column, edit, category)
    assert read_manifest(out)  # the digests agree: only the audit can tell
    assert audit.main([str(out), "--rows", "4"]) == 1  # every row's place is checked, whichever rows are recomputed
    assert f"MISMATCH in {column}" in capsys.readouterr().out
    r = audit.audit(out, rows=4, quiet=True)["columns"][column]
    assert not r["ok"] and r["rows_past"] == 1, r


def test_the_audit_refuses_too_few_rows_to_judge_rounding(labeled, capsys):
    """Below ``MIN_ROWS`` recomputed rows even a reader that moves every row cannot fail the rule: one line."""
    from data_gen import audit, audit_compare

    _, out, _ = labeled
    assert audit.main([str(out), "--rows", "1"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and f"at least {audit_compare.MIN_ROWS} are needed" in lines[0] and "Traceback" not in err


def test_the_rounding_rule_fails_most_rows_past_the_tolerance_and_a_far_tail():
    """A minority of rows past τ is rounding; most rows past it, or more than a few past 32τ, is not, at any
    sample size from ``MIN_ROWS`` on."""
    from data_gen.audit_compare import FAR, MIN_ROWS, judge

    def rows(n_past, n_far, n=60, tol=0.01):
        d = np.full(n, tol / 10)
        d[:n_past] = 2 * tol
        d[:n_far] = 2 * FAR * tol
        return judge(d, tol)["ok"]

    assert rows(20, 0) and rows(30, 0) and rows(30, 1)  # a third to half past τ, one far row: rounding
    assert not rows(45, 0) and not rows(6, 6)  # three quarters past τ; six far rows of sixty
    assert not rows(MIN_ROWS, 0, n=MIN_ROWS)  # every row past τ fails from MIN_ROWS rows on


@pytest.mark.parametrize("rows", ["0", "-5"])
def test_the_audit_refuses_a_row_count_below_one(labeled, rows, capsys):
    from data_gen import audit

    _, out, _ = labeled
    assert audit.main([str(out), "--rows", rows]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --rows must be at least 1 (rows drawn from each split), got {rows}"]


def test_an_orphaned_rank_stops_before_its_next_batch(monkeypatch, tmp_path):
    """A DDP rank whose launcher died (it is re-parented) labels no further batch."""
    import os
    from types import SimpleNamespace

    from data_gen.errors import LabelingInterrupted
    from data_gen.loop import ShardWriter

    writer = ShardWriter(tmp_path, {"hidden": 4})
    launcher = os.getppid()
    writer.on_predict_start(SimpleNamespace(global_rank=1), None)
    writer.on_predict_batch_start(SimpleNamespace(global_rank=1), None, {}, 0)  # the launcher lives: go on
    monkeypatch.setattr(os, "getppid", lambda: launcher + 1)
    with pytest.raises(LabelingInterrupted, match="rank 1: the process that launched this run is gone"):
        writer.on_predict_batch_start(SimpleNamespace(global_rank=1), None, {}, 1)
    rank0 = ShardWriter(tmp_path, {"hidden": 4})
    rank0.on_predict_start(SimpleNamespace(global_rank=0), None)
    rank0.on_predict_batch_start(SimpleNamespace(global_rank=0), None, {}, 1)  # rank 0 is the launcher itself


@pytest.mark.parametrize("damage", ["missing", "not json"])
def test_the_audit_names_a_missing_or_damaged_run_json(labeled, damage, capsys):
    from data_gen import audit

    _, out, _ = labeled
    if damage == "missing":
        (out / "run.json").unlink()
    else:
        (out / "run.json").write_text("{cut off")
    assert audit.main([str(out), "--rows", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {out}") and "run.json" in err[0], err


def test_the_audit_fails_tokens_drawn_from_another_distribution_in_a_third_of_rows(labeled):
    """A labeler that draws a third of its target and interleaved rows' tokens from the wrong distribution leaves
    the median row right, so a 0/1 median rule passes it; the draw's CDF gap puts those rows far past the tolerance,
    and the far rule fails the column."""
    from data_gen import audit

    _, out, _ = labeled
    manifest = json.loads((out / "manifest.json").read_text())
    seen = 0
    for split in shards.SPLITS:
        for shard in shards.shard_paths(out, split):
            cols = datasets.Dataset.from_file(str(shard)).to_dict()
            for i, c in enumerate(cols["category"]):
                if c in ("target", "interleaved"):
                    seen += 1
                    if seen % 3 == 0:
                        cols["token_id"][i] = (cols["token_id"][i] + 17) % 50
            shards.write_shard(shard, cols, manifest["feature"]["sizes"])
            manifest["shards"][shard.relative_to(out).as_posix()] = json.loads(
                shard.with_name(shard.name + ".json").read_text())
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = audit.audit(out, rows=40, quiet=True)["columns"]["token_draw"]
    assert r["median_diff"] == 0 and not r["ok"], r
    assert r["rows_far"] > r["rows"] / 10, r

"""Label datasets identified by content: changed prompts or weights at the same path are refused on resume, and
every shard is checked against its recorded sha256 and row count when the dataset is read; a rerun repairs it."""

from __future__ import annotations

import json
import shutil

import pytest

from core import shards
from core.shards import ShardError, read_manifest
from data_gen import tiny
from data_gen.run import LabelingError, run_labels


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
        assert summary["rows"] == sum(r["rows"] for n, r in manifest["shards"].items() if n.startswith(split))
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


def test_a_truncated_shard_is_named_on_read_and_redone_by_a_rerun(own_inputs, tmp_path):
    from pipeline.data import LabelDataModule

    _, _, config = own_inputs
    run_labels(config(), quiet=True)
    out = tmp_path / "labels"
    before = _rows(out)
    shard = sorted((out / "train").glob("*.arrow"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ShardError, match=rf"{shard}: its bytes differ"):
        LabelDataModule(str(out), label="soft")
    run_labels(config(), quiet=True)  # reopens the finished run and labels that batch again
    after = _rows(out)
    for s in shards.SPLITS:
        assert after[s].equals(before[s])
    read_manifest(out)


def test_a_shard_without_its_record_counts_as_not_done(own_inputs, tmp_path):
    """A shard written but not recorded (killed between the two writes) is relabeled, not trusted."""
    _, _, config = own_inputs
    run_labels(config(), quiet=True)
    out = tmp_path / "labels"
    before = _rows(out)
    shard = sorted((out / "val").glob("*.arrow"))[0]
    shard.with_name(shard.name + ".json").unlink()
    (out / "manifest.json").unlink()
    mtime = shard.stat().st_mtime_ns
    run_labels(config(), quiet=True)
    assert shard.stat().st_mtime_ns != mtime
    assert all(_rows(out)[s].equals(before[s]) for s in shards.SPLITS)

"""Export to safetensors and back: identical outputs, metadata, and one clear error for every bad file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from heads import build_head
from heads.export import HeadFileError, export_head, feature_position, load_head, read_metadata

DRAFT = {"name": "tiny-draft", "source": "dir:draft", "fingerprint": "abc123", "hidden_size": 16, "vocab_size": 57}
OTHER = {**DRAFT, "name": "other", "fingerprint": "def456"}


def _export(tmp_path, head, draft=DRAFT):
    return export_head(
        head, tmp_path / "head.safetensors", draft=draft, vocab_size=57,
        label={"kind": "soft", "w_acc": 1.0, "w_rej": 6.0}, role="stop",
        threshold={"name": "h", "value": 0.3, "rule": "stop when P(reject) > h"}, metrics={"val/head/auroc": 0.8},
    )


@pytest.mark.parametrize("name,kw", [("sprinter", {}), ("resnet", {"depth": 3}),
                                     ("sprinter", {"scores": ["p_draft", "entropy_draft"]}),
                                     ("resnet", {"depth": 1, "scores": ["logp_draft"]})])
def test_round_trip_gives_identical_outputs(tmp_path, name, kw):
    torch.manual_seed(0)
    head = build_head(name, hidden_size=16, **kw)
    for p in head.parameters():  # non-trivial weights (the ResNet's blocks start at zero)
        torch.nn.init.normal_(p, std=0.3)
    path = _export(tmp_path, head)
    loaded, meta = load_head(path, draft=DRAFT, hidden_size=16)
    x = torch.randn(10, 16)
    s = torch.randn(10, len(kw.get("scores", []))) if kw.get("scores") else None
    assert torch.equal(head(x, s), loaded(x, s))
    assert meta["head"] == {"type": name, "init_args": {"hidden_size": 16, "scores": [], **kw}}
    assert list(meta["inputs"]["scores"]) == kw.get("scores", [])
    assert meta["draft"] == {"name": "tiny-draft", "source": "dir:draft", "fingerprint": "abc123",
                            "quantization": "none", "backend": "transformers"}
    assert meta["threshold"]["value"] == 0.3 and meta["label"]["w_rej"] == 6.0
    assert meta["hidden_size"] == 16 and meta["vocab_size"] == 57


def test_metadata_values_are_strings_with_schema_version(tmp_path):
    from safetensors import safe_open

    path = _export(tmp_path, build_head("sprinter", hidden_size=16))
    with safe_open(str(path), framework="pt") as f:
        raw = f.metadata()
    assert raw["schema_version"] == "2" and len(raw["specheads_sha256"]) == 64
    assert all(isinstance(v, str) for v in raw.values())


def test_hidden_size_mismatch(tmp_path):
    path = _export(tmp_path, build_head("sprinter", hidden_size=16))
    with pytest.raises(ValueError, match="hidden size 16, the draft has 896"):
        load_head(path, hidden_size=896)
    with pytest.raises(HeadFileError, match="hidden size"):
        load_head(path, draft={**DRAFT, "hidden_size": 32})


def test_draft_identity_mismatch(tmp_path):
    path = _export(tmp_path, build_head("sprinter", hidden_size=16))
    with pytest.raises(ValueError, match="trained for draft 'tiny-draft'"):
        load_head(path, draft=OTHER)


def test_not_a_safetensors_file(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00\x01 this is not a safetensors file")
    with pytest.raises(HeadFileError, match="not a readable safetensors file"):
        load_head(bad)


def test_plain_safetensors_without_metadata(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"linear.weight": torch.zeros(1, 16), "linear.bias": torch.zeros(1)}, str(path))
    with pytest.raises(HeadFileError, match="schema version"):
        load_head(path)


def _rewrite(tmp_path, src, meta_edit=None, tensors_edit=None, version="2"):
    """``src`` edited, with the metadata digest recomputed (a deliberate edit, which only the checks behind the
    digest catch)."""
    from safetensors import safe_open

    from heads.export import META_DIGEST_KEY, metadata_digest

    with safe_open(str(src), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(f.metadata()["specheads"])
    if meta_edit:
        meta_edit(meta)
    if tensors_edit:
        tensors_edit(tensors)
    out = tmp_path / "edited.safetensors"
    raw = {"schema_version": version, "specheads": json.dumps(meta)}
    save_file(tensors, str(out), metadata={**raw, META_DIGEST_KEY: metadata_digest(raw)})
    return out


def test_malformed_metadata_and_weights(tmp_path):
    src = _export(tmp_path, build_head("resnet", hidden_size=16, depth=1))
    with pytest.raises(HeadFileError, match="schema version"):
        load_head(_rewrite(tmp_path, src, version="99"))
    with pytest.raises(HeadFileError, match="lacks threshold"):
        load_head(_rewrite(tmp_path, src, meta_edit=lambda m: m.pop("threshold")))
    with pytest.raises(HeadFileError, match="known: resnet, sprinter"):
        load_head(_rewrite(tmp_path, src, meta_edit=lambda m: m["head"].update(type="mlp")))
    with pytest.raises(HeadFileError, match="do not fit"):
        load_head(_rewrite(tmp_path, src, tensors_edit=lambda t: t.pop("out.bias")))
    with pytest.raises(HeadFileError, match="do not fit"):
        load_head(_rewrite(tmp_path, src, meta_edit=lambda m: m["head"]["init_args"].update(depth=2)))
    assert read_metadata(src)["role"] == "stop"


def test_weights_edited_after_export_are_refused(tmp_path):
    """The digest of the tensors recorded at export catches weights changed afterwards; a file without the digest,
    or with non-finite weights under a recomputed digest, is refused too."""
    from heads.export import weights_digest

    src = _export(tmp_path, build_head("sprinter", hidden_size=16))
    assert len(read_metadata(src)["weights_sha256"]) == 64
    with pytest.raises(HeadFileError, match="do not match the digest recorded at export"):
        load_head(_rewrite(tmp_path, src, tensors_edit=lambda t: t["linear.bias"].add_(1e-3)))
    with pytest.raises(HeadFileError, match="lacks weights_sha256"):
        load_head(_rewrite(tmp_path, src, meta_edit=lambda m: m.pop("weights_sha256")))

    def nan_weights(meta):  # a hostile edit that keeps the digest consistent
        from safetensors import safe_open

        with safe_open(str(src), framework="pt") as f:
            tensors = {k: f.get_tensor(k).fill_(float("nan")) for k in f.keys()}
        meta["weights_sha256"] = weights_digest(tensors)

    with pytest.raises(HeadFileError, match="non-finite weights in linear"):
        load_head(_rewrite(tmp_path, src, meta_edit=nan_weights, tensors_edit=lambda t: [v.fill_(float("nan"))
                                                                                          for v in t.values()]))


def test_feature_position_travels_in_the_file(tmp_path):
    """The hidden state a head reads (own position or the previous one) is recorded, read back and checked."""
    head = build_head("sprinter", hidden_size=16)
    assert feature_position(read_metadata(_export(tmp_path, head))) == "own"
    path = export_head(head, tmp_path / "prev.safetensors", draft=DRAFT, vocab_size=57, label={"kind": "sprinter"},
                       role="verifier", threshold={"name": "tau", "value": 0.5, "rule": "r"}, metrics={},
                       position="prev")
    meta = read_metadata(path)
    assert feature_position(meta) == "prev" and "produced q" in meta["inputs"]["hidden"]
    with pytest.raises(HeadFileError, match="unknown feature position 'next'"):
        export_head(head, tmp_path / "bad.safetensors", draft=DRAFT, vocab_size=57, label={}, role="verifier",
                    threshold={}, metrics={}, position="next")


def test_model_identity_is_the_weights_in_memory(tiny_pair, tmp_path):
    """A loaded model is identified by the weights it holds, not by the folder ``config.name_or_path`` names: other
    weights loaded into a model built from the right config are another model; a file added beside the checkpoint,
    or a float32 instead of a bfloat16 load, is the same one."""
    import shutil

    from transformers import AutoModelForCausalLM

    from core.identity import model_identity

    draft_dir, target_dir = tiny_pair
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    mine = model_identity(draft)
    assert mine["name"] == str(draft_dir) and len(mine["weights"]) == 64 and mine["quantization"] == "none"
    copy = tmp_path / "draft"
    shutil.copytree(draft_dir, copy)
    (copy / "README.md").write_text("notes")
    assert model_identity(AutoModelForCausalLM.from_pretrained(copy))["weights"] == mine["weights"]
    bf16 = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.bfloat16)
    assert model_identity(bf16)["weights"] == mine["weights"]
    swapped = AutoModelForCausalLM.from_pretrained(draft_dir)
    swapped.load_state_dict(AutoModelForCausalLM.from_pretrained(target_dir).state_dict())
    assert swapped.config.name_or_path == str(draft_dir)
    assert model_identity(swapped)["weights"] != mine["weights"]
    assert model_identity(object()) == {}

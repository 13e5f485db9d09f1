"""What an exported head may be trusted with: its metadata under a digest, a draft identified by the
weights it holds, labels and heads of one draft, and ``make export-hf`` writing only where it may.

Each bad input is one ``HeadFileError``/``error:`` line, and nothing is written before the input is checked.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from core import identity
from core.identity import IdentityError, check_labels_pair, model_identity, weights_sha256
from core.models import ModelSpec, load_model
from core.quantization import decode_numerics, quantize
from core.runfolder import LEDGER
from decoding.runtimes import hf_export as export_hf
from heads.export import (META_DIGEST_KEY, HeadFileError, export_head, load_head, metadata_digest, read_metadata,
                          weights_digest)
from heads.exported import ExportedHead
from decoding.runtimes.hf import HeadDecoding
from heads.sprinter import SprinterHead

DRAFT = {"name": "tiny-draft", "source": "dir:draft", "fingerprint": "ab" * 32, "weights": "cd" * 32,
         "hidden_size": 16, "vocab_size": 57}


def _export(path, draft=DRAFT, threshold=0.5, hidden=16, head=None):
    head = head or SprinterHead(hidden_size=hidden)
    return export_head(head, path, draft=draft, vocab_size=int(draft.get("vocab_size", 57)), label={"kind": "test"},
                       role="stop", threshold={"name": "h", "value": threshold, "rule": "test"}, metrics={})


def _read(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


@pytest.fixture(scope="module")
def tiny(tiny_pair):
    """The tiny draft loaded as labeling loads it, its record, and a head exported for it."""
    draft, _, record = load_model(ModelSpec(path=str(tiny_pair[0]), name="tiny-draft"))
    return draft, record


# ---------------------------------------------------------------------------------------------------------------
# item 7: the metadata under the file's digest


def test_one_edited_header_byte_is_a_modified_file(tmp_path):
    """Flipping the threshold 0.0 → 0.9 in the header (one byte) is refused wherever the head is read."""
    src = _export(tmp_path / "h.safetensors", threshold=0.0)
    data = src.read_bytes()
    edited = tmp_path / "edited.safetensors"
    edited.write_bytes(data.replace(b'\\"value\\": 0.0', b'\\"value\\": 0.9', 1))
    assert edited.read_bytes() != data and len(edited.read_bytes()) == len(data)
    for load in (read_metadata, load_head, ExportedHead):
        with pytest.raises(HeadFileError, match="metadata does not match the digest recorded at export \\(the file "
                                                "was modified\\)"):
            load(edited)
    assert load_head(src)[1]["threshold"]["value"] == 0.0


def test_a_forged_draft_identity_or_an_added_entry_is_a_modified_file(tmp_path):
    src = _export(tmp_path / "h.safetensors")
    forged = tmp_path / "forged.safetensors"
    forged.write_bytes(src.read_bytes().replace(b"cd" * 32, b"ef" * 32))
    with pytest.raises(HeadFileError, match="was modified"):
        load_head(forged, draft={**DRAFT, "weights": "ef" * 32})
    tensors, raw = _read(src)
    save_file(tensors, str(tmp_path / "added.safetensors"), metadata={**raw, "note": "x"})
    with pytest.raises(HeadFileError, match="was modified"):
        load_head(tmp_path / "added.safetensors")
    old = {k: v for k, v in raw.items() if k != META_DIGEST_KEY}
    save_file(tensors, str(tmp_path / "v1.safetensors"), metadata={**old, "schema_version": "1"})
    with pytest.raises(HeadFileError, match="expected '2': export it again"):
        load_head(tmp_path / "v1.safetensors")
    assert raw[META_DIGEST_KEY] == metadata_digest(raw)


# ---------------------------------------------------------------------------------------------------------------
# item 8: a draft is the weights it holds


def test_the_weights_digest_is_computed_once_per_model_until_a_weight_changes(tiny_pair, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0])
    calls = []
    real = identity._hash_tensor
    monkeypatch.setattr(identity, "_hash_tensor", lambda d, t: calls.append(1) or real(d, t))
    first = weights_sha256(model)
    hashed = len(calls)
    assert hashed > 0 and weights_sha256(model) == first and len(calls) == hashed
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    assert weights_sha256(model) != first


def test_quantization_is_part_of_the_identity_and_decode_numerics_is_not(tiny_pair):
    def int8():
        return quantize(AutoModelForCausalLM.from_pretrained(tiny_pair[0]), "int8-dynamic-per-channel")

    plain = model_identity(AutoModelForCausalLM.from_pretrained(tiny_pair[0]))
    a, b = int8(), int8()
    one = model_identity(a)
    assert one["quantization"] == "int8-dynamic-per-channel" and one["weights"] != plain["weights"]
    assert model_identity(b)["weights"] == one["weights"]  # the same weights quantized the same way
    assert model_identity(decode_numerics(b))["weights"] == one["weights"]


def test_labeling_records_the_identity_the_heads_check(tiny_pair, tiny):
    draft, record = tiny
    assert record["weights"] == model_identity(draft)["weights"] and record["fingerprint"]


def test_a_draft_is_checked_by_its_weights_not_its_folder(tiny_pair, tiny, tmp_path):
    """Other weights loaded into a model built from the right config are refused; the right weights read from a
    folder with an added README pass."""
    draft, record = tiny
    path = _export(tmp_path / "h.safetensors", draft=record, hidden=32)
    HeadDecoding(path, draft)
    swapped = AutoModelForCausalLM.from_pretrained(tiny_pair[0])
    swapped.load_state_dict(AutoModelForCausalLM.from_pretrained(tiny_pair[1]).state_dict())
    with pytest.raises(HeadFileError, match=f"trained for draft 'tiny-draft' \\(weights {record['weights']}\\), not "
                                            f"for '{tiny_pair[0]}'"):
        HeadDecoding(path, swapped)
    copy = tmp_path / "draft"
    shutil.copytree(tiny_pair[0], copy)
    (copy / "README.md").write_text("an added file")
    HeadDecoding(path, AutoModelForCausalLM.from_pretrained(copy))


# ---------------------------------------------------------------------------------------------------------------
# item 6: heads, labels and the decoded pair come from one draft


def test_labels_of_another_pair_are_refused(tiny):
    _, record = tiny
    other = {**record, "weights": "0" * 64}
    models = {"draft": record, "target": {**record, "name": "tiny-target"}}
    check_labels_pair(models, {"draft": record, "target": models["target"]}, "labels")
    with pytest.raises(IdentityError, match="labels was labeled with draft 'tiny-draft', this run decodes "
                                            "'tiny-draft': weights"):
        check_labels_pair(models, {"draft": other, "target": models["target"]}, "labels")
    with pytest.raises(IdentityError, match="labeled with target"):
        check_labels_pair(models, {"draft": record, "target": other}, "labels")
    with pytest.raises(IdentityError, match="quantization int8-dynamic, not none"):
        check_labels_pair({**models, "draft": {**record, "quantization": "int8-dynamic"}},
                          {"draft": record, "target": models["target"]}, "labels")


def test_the_simulator_refuses_a_head_of_another_draft(label_config, tiny_pair, tmp_path):
    from core.shards import read_manifest
    from data_gen.run import run_labels
    from evaluation import simulate

    cfg = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    target = load_model(ModelSpec(path=str(tiny_pair[1]), name="tiny-target"))[2]
    path = _export(tmp_path / "other.safetensors", draft=target, hidden=32)
    with pytest.raises(HeadFileError, match=f"trained for draft 'tiny-target' .*, not for 'tiny-draft' .*, the "
                                            f"draft of the labels in {cfg.output_dir}"):
        simulate.main(["--labels", str(cfg.output_dir), "--heads", str(path), "--c", "0.1"])
    mine = _export(tmp_path / "mine.safetensors", draft=read_manifest(cfg.output_dir)["models"]["draft"], hidden=32)
    assert simulate.main(["--labels", str(cfg.output_dir), "--heads", str(mine), "--c", "0.1"])


def test_the_eval_refuses_labels_of_another_draft_for_its_simulated_selection(label_config, tiny_pair, tmp_path):
    """``select_by: simulated``: a head of another draft than the labels' is refused before the models load, and
    labels of another pair than the one decoded when it loads."""
    from test_eval_run import FAKE_DRAFT, make_cfg, write_test_labels, write_verifier

    from data_gen.run import run_labels
    from evaluation.config import Sweep
    from evaluation.engine import Engine
    from evaluation.run import run_eval

    labels = write_test_labels(tmp_path / "fake_labels", [("draft", True, 0.1)])
    head = write_verifier(tmp_path / "v.safetensors", eta_fp_thm=0.2, draft={**FAKE_DRAFT, "sha256": "1" * 64})
    cfg = make_cfg(tmp_path, select_by="simulated", labels_dir=str(labels),
                   policies=[Sweep("target_only"), Sweep("sprinter", fixed={"head": str(head)})])
    with pytest.raises(HeadFileError, match=f"the draft of the labels in {labels}"):
        run_eval(cfg, engine=None, quiet=True)

    made = label_config(split_fractions=(0.5, 0.25, 0.25))
    run_labels(made, quiet=True)
    spec = {"draft": ModelSpec(path=str(tiny_pair[0]), name="tiny-draft"),
            "target": ModelSpec(path=str(tiny_pair[1]), name="tiny-target")}
    Engine.load(make_cfg(tmp_path, select_by="simulated", labels_dir=str(made.output_dir), device="cpu", **spec))
    swapped = {**spec, "draft": ModelSpec(path=str(tiny_pair[1]), name="other")}
    with pytest.raises(IdentityError, match=f"{made.output_dir} was labeled with draft 'tiny-draft', this run "
                                            "decodes 'other': weights"):
        Engine.load(make_cfg(tmp_path, select_by="simulated", labels_dir=str(made.output_dir), device="cpu",
                             **swapped))


# ---------------------------------------------------------------------------------------------------------------
# item 2, 10, 11: make export-hf


def _cli(capsys, *args) -> str:
    with pytest.raises(SystemExit) as done:
        export_hf.main([str(a) for a in args])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert done.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_export_hf_writes_only_where_it_may(tmp_path, monkeypatch, capsys):
    head = _export(tmp_path / "stop.safetensors")
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("the project's own README\n")
    monkeypatch.chdir(project)
    assert "is the current directory" in _cli(capsys, head, ".")
    assert "is the current directory" in _cli(capsys, head, project)
    assert (project / "README.md").read_text() == "the project's own README\n"
    assert "README.md is a file, not a folder" in _cli(capsys, head, project / "README.md")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert "is not empty (notes.txt) and no `specheads export-hf` wrote it" in _cli(capsys, head, mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

    out = tmp_path / "folder"
    out.mkdir()  # empty: written
    export_hf.main([str(head), str(out)])
    other = _export(tmp_path / "verifier.safetensors", threshold=0.7)
    export_hf.main([str(other), str(out)])  # an earlier export: replaced whole
    assert {p.name for p in out.iterdir()} == {"verifier.safetensors", "README.md", "custom_generate", LEDGER}
    (out / "user.txt").write_text("mine")  # a replaced folder would lose it: refused, kept
    assert "holds user.txt, which no `specheads export-hf` wrote" in _cli(capsys, head, out)
    assert (out / "user.txt").read_text() == "mine" and (out / "verifier.safetensors").is_file()


def test_export_hf_refuses_a_bad_head_before_writing(tmp_path, capsys):
    src = _export(tmp_path / "stop.safetensors")
    tensors, raw = _read(src)
    data = src.read_bytes()
    cases = {"missing": ("nowhere.safetensors", "no such head file")}
    (tmp_path / "truncated.safetensors").write_bytes(data[: len(data) // 2])
    cases["truncated"] = ("truncated.safetensors", "not a readable safetensors file")
    torch.save(tensors, tmp_path / "pickled.safetensors")
    cases["pickled"] = ("pickled.safetensors", "not a readable safetensors file")
    body = bytearray(data)
    body[-3] ^= 0x40
    (tmp_path / "body.safetensors").write_bytes(bytes(body))
    cases["body"] = ("body.safetensors", "weights do not match the digest recorded at export")
    for bad in ("nan", "inf"):  # a consistent file around non-finite weights
        t = {k: v.clone() for k, v in tensors.items()}
        t["linear.bias"].fill_(float(bad))
        meta = {**json.loads(raw["specheads"]), "weights_sha256": weights_digest(t)}
        sealed = {"schema_version": raw["schema_version"], "specheads": json.dumps(meta)}
        sealed[META_DIGEST_KEY] = metadata_digest(sealed)
        save_file(t, str(tmp_path / f"{bad}.safetensors"), metadata=sealed)
        cases[bad] = (f"{bad}.safetensors", "non-finite weights in linear.bias")
    for name, (file, message) in cases.items():
        out = tmp_path / f"out_{name}"
        line = _cli(capsys, tmp_path / file, out)
        assert message in line and not out.exists(), (name, line)


def test_the_folder_names_its_own_head_in_errors(tiny_pair, tiny, tmp_path):
    """The folder's loader checks its bundled bytes and the head's digests, and names the head as the folder's,
    not by the temporary copy it reads (which is gone by the time the draft is checked)."""
    _, record = tiny
    out = export_hf.write_folder(_export(tmp_path / "stop.safetensors", draft=record, hidden=32), tmp_path / "f")
    package = tmp_path / "pkg" / "folder_under_test"
    shutil.copytree(out / "custom_generate", package)
    (package / "__init__.py").write_text("")
    sys.path.insert(0, str(package.parent))
    try:
        runtime = importlib.import_module("folder_under_test.generate")
        bundled = importlib.import_module("folder_under_test.bundled_head")
        head = runtime.load_bundled_head()
        assert str(head.path) == "custom_generate/bundled_head.py (stop.safetensors)"
        swapped = AutoModelForCausalLM.from_pretrained(tiny_pair[1])
        with pytest.raises(ValueError, match=r"^custom_generate/bundled_head.py \(stop.safetensors\): head was "
                                             "trained for draft 'tiny-draft'"):
            runtime.HeadDecoding(head, swapped)
        bundled.DATA = bundled.DATA[:-8] + "AAAAAAA="
        with pytest.raises(ValueError, match="the bundled stop.safetensors does not match its digest"):
            runtime.load_bundled_head()
    finally:
        sys.path.remove(str(package.parent))
        for name in [m for m in sys.modules if m.startswith("folder_under_test")]:
            del sys.modules[name]


def test_notes_beside_a_checkpoint_are_not_part_of_its_fingerprint(tiny_pair, tmp_path):
    """Labeling's record of what it read (``run.json``, the manifest) ignores a README or licence added to the
    folder, and not a changed tokenizer or config file."""
    from core.identity import checkpoint_fingerprint

    copy = tmp_path / "draft"
    shutil.copytree(tiny_pair[0], copy)
    before = checkpoint_fingerprint(copy)
    (copy / "README.md").write_text("notes")
    (copy / "LICENSE").write_text("terms")
    (copy / ".gitattributes").write_text("*.safetensors filter=lfs")
    assert checkpoint_fingerprint(copy) == before == checkpoint_fingerprint(tiny_pair[0])
    (copy / "generation_config.json").write_text("{}")
    assert checkpoint_fingerprint(copy) != before

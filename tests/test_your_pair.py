"""A head for a pair of the user's own, the documented way (``configs/models/your-pair.yaml``): a copy of the template
naming two local folders, included by two label configs as the shipped ones include theirs, is labeled and trained
by the commands ``make labels LABELS_CONFIG=… HELDOUT_CONFIG=…`` and ``make train TRAIN_LABELS=… TEST_LABELS=…``
run (``specheads labels --config``, ``specheads train``); the heads it exports are accepted by the decoder for that
draft (the eval's check, ``evaluation.engine``) and refused for another draft."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from specheads import cli
from testing.tiny import write_prompts

CHECKOUT = Path(__file__).resolve().parents[1]
TEMPLATE = CHECKOUT / "configs" / "models" / "your-pair.yaml"


def label_config(path: Path, pair: str, prompts: Path, out: Path, split_fractions: list[float]) -> Path:
    """A label config of the user's, including the pair file as ``configs/labels/corpus.yaml`` does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "config": pair, "prompts": {"source": str(prompts), "response_field": "answer"},
        "sampling": {"max_new_tokens": 6}, "split_fractions": split_fractions, "output_dir": str(out),
        "batch_size": 4, "dtype": "float32", "accelerator": "cpu", "devices": 1,
    }, sort_keys=False))
    return path


def test_the_template_parses_as_the_pair_of_a_label_config(tmp_path):
    """The template as shipped, included by a label config: its Hub ids are the config's draft and target."""
    from data_gen.__main__ import parser

    config = label_config(tmp_path / "mine.yaml", str(TEMPLATE), tmp_path / "p.jsonl", tmp_path / "l", [1, 0, 0])
    p = parser()
    ns = p.instantiate(p.parse_args(["--config", str(config)]))
    template = yaml.safe_load(TEMPLATE.read_text())
    assert ns.draft.path == template["draft"]["path"] and ns.target.path == template["target"]["path"]
    assert ns.backend == template["backend"] == "transformers"


@pytest.mark.filterwarnings("ignore:'data_gen.__main__' found in sys.modules:RuntimeWarning")  # runpy, as `specheads`
def test_a_pair_file_of_two_local_folders_labels_and_trains_a_head_for_its_draft(tiny_pair, prompt_file, tmp_path,
                                                                                monkeypatch):
    from transformers import AutoModelForCausalLM

    from decoding.state import HEAD_FEATURES
    from heads.export import HeadFileError
    from heads.exported import ExportedHead

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the CLI sets it for the command it runs
    draft_dir, target_dir = tiny_pair
    pair = yaml.safe_load(TEMPLATE.read_text())
    pair["draft"]["path"], pair["target"]["path"] = str(draft_dir), str(target_dir)
    configs = tmp_path / "configs"
    (configs / "models").mkdir(parents=True)
    (configs / "models" / "mine.yaml").write_text(yaml.safe_dump(pair))
    runs = tmp_path / "runs"
    heldout = write_prompts(tmp_path / "heldout.jsonl", n=4, seed=1)
    train_config = label_config(configs / "labels" / "mine.yaml", "../models/mine.yaml", prompt_file,
                                runs / "labels" / "mine", [0.8, 0.2, 0.0])
    test_config = label_config(configs / "labels" / "mine-heldout.yaml", "../models/mine.yaml", heldout,
                               runs / "labels" / "mine-heldout", [0.0, 0.0, 1.0])
    # make labels LABELS_CONFIG=configs/labels/mine.yaml HELDOUT_CONFIG=configs/labels/mine-heldout.yaml
    assert cli.main(["labels", "--config", str(train_config)]) == 0
    assert cli.main(["labels", "--config", str(test_config)]) == 0
    # make train TRAIN_LABELS=runs/labels/mine TEST_LABELS=runs/labels/mine-heldout HEADS_DIR=… (one of its configs)
    heads = tmp_path / "checkpoints" / "heads-mine"
    assert cli.main(["train", "--labels", str(runs / "labels" / "mine"), "--test_labels",
                     str(runs / "labels" / "mine-heldout"), "--configs",
                     str(CHECKOUT / "configs" / "train" / "specdecpp_d3_w6.yaml"),
                     "--heads_dir", str(heads), "--out", str(runs / "train"), "--checkpoints",
                     str(tmp_path / "checkpoints"), "--max_epochs", "1", "--quiet", "--accelerator", "cpu"]) == 0
    exported = sorted(heads.glob("*.safetensors"))
    assert [p.stem for p in exported] == ["specdecpp_d3_w6"]
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    for path in exported:
        ExportedHead(path, computes=HEAD_FEATURES).check(draft, target)  # the eval's check of a head (engine.py)
        with pytest.raises(HeadFileError, match="trained for draft 'my draft'"):
            ExportedHead(path, computes=HEAD_FEATURES).check(target, target)  # another draft: the target's weights

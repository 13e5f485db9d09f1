"""Every stage with the tiny pair forced to bfloat16 on the CPU, as ``dtype: auto`` runs on a CPU with native bf16
(AVX512-BF16, AMX): labels, audit, train, simulate, eval, and the exported folder inside ``generate()``. bf16
matmuls run on any CPU (emulated where not native), and tiny models keep that cheap, so CI on float32 machines
takes the path too."""

from __future__ import annotations

import json

import pytest
import torch

from data_gen.run import run_labels
from testing import tiny

BF16 = "bfloat16"


@pytest.fixture(scope="module")
def bf16_run(tiny_pair, tmp_path_factory):
    """A finished bf16 label folder of the tiny pair and heads trained on it: (root, labels folder, heads folder)."""
    from pipeline import train_all

    root = tmp_path_factory.mktemp("bf16")
    prompts = tiny.write_prompts(root / "prompts.jsonl", n=12)
    cfg = tiny.label_config(*tiny_pair, prompts, root / "labels", max_new_tokens=5, batch_size=4, dtype=BF16,
                            split_fractions=(0.5, 0.25, 0.25))
    run_labels(cfg, quiet=True)
    train_all.main(["--labels", str(root / "labels"), "--out", str(root / "train"), "--checkpoints",
                    str(root / "checkpoints"), "--heads_dir", str(root / "heads"), "--max_epochs", "1", "--quiet"])
    return root, root / "labels", root / "heads"


def test_labels_record_bfloat16(bf16_run):
    _, labels, _ = bf16_run
    manifest = json.loads((labels / "manifest.json").read_text())
    assert json.loads((labels / "run.json").read_text())["dtype"] == BF16
    assert manifest["models"]["draft"]["dtype"] == manifest["models"]["target"]["dtype"] == BF16
    assert all(manifest["splits"][s]["rows"] > 0 for s in ("train", "val", "test"))


def test_the_audit_passes_on_bf16_labels(bf16_run, capsys):
    from data_gen import audit

    _, labels, _ = bf16_run
    assert audit.main([str(labels), "--rows", "6"]) == 0
    assert "every column within its tolerance" in capsys.readouterr().out


def test_trained_heads_simulate_and_export(bf16_run, tiny_pair, tmp_path, capsys):
    from decoding.runtimes import hf_export as export_hf
    from evaluation import simulate

    root, labels, heads = bf16_run
    files = sorted(heads.glob("*.safetensors"))
    assert files
    rows = simulate.main(["--labels", str(labels), "--splits", "val", "test", "--heads", *map(str, files),
                          "--c", "0.2"])
    assert {"oracle", "sd", "specdecpp", "sprinter"} <= {r["family"] for r in rows}
    from transformers import AutoModelForCausalLM

    draft, target = (AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16) for p in tiny_pair)
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    for head in files:
        folder = export_hf.write_folder(head, tmp_path / head.stem)
        for sample in (False, True):
            torch.manual_seed(0)
            out = target.generate(ids, assistant_model=draft, custom_generate=str(folder), trust_remote_code=True,
                                  max_new_tokens=6, do_sample=sample)
            assert out.shape[1] > ids.shape[1]


def test_the_evaluation_runs_in_bf16(bf16_run, tiny_pair):
    from core.models import ModelSpec
    from core.prompts import PromptConfig
    from evaluation.config import EvalConfig, Mode, Sweep
    from evaluation.run import run_eval

    root, labels, heads = bf16_run
    stop, verifier = (next(heads.glob(f"{name}*.safetensors")) for name in ("specdecpp", "sprinter"))
    cfg = EvalConfig(
        draft=ModelSpec(path=str(tiny_pair[0]), name="tiny-draft"),
        target=ModelSpec(path=str(tiny_pair[1]), name="tiny-target"),
        prompts=PromptConfig(source=str(tiny.write_prompts(root / "heldout.jsonl", n=2, seed=1)),
                             response_field="answer"),  # prompts no head trained on
        modes=[Mode("sample", 1.0)],
        policies=[Sweep("target_only"), Sweep("sd", grid={"k": [2]}),
                  Sweep("specdecpp", fixed={"head": str(stop)}), Sweep("sprinter", fixed={"head": str(verifier)})],
        max_new_tokens=5, sweep_prompts=1, dtype=BF16, device="cpu", output_dir=str(root / "eval"),
    )
    out = run_eval(cfg, quiet=True)
    report = json.loads((out / "report.json").read_text())
    families = {row["family"] for m in report["modes"].values() for row in m["table"]}
    assert {"target_only", "sd", "specdecpp", "sprinter"} <= families
    assert any(BF16 in f.read_text() for f in out.glob("*.json"))  # the settings it decoded with

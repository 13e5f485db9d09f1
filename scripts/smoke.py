"""``make smoke``: every stage that exists, on tiny random-init models, in well under 2 minutes.

Outputs stay under ``runs/smoke/`` (ignored): the tiny models, the prompts, and the labeled dataset with its
``manifest.json``, the trained and exported heads, and the evaluation report.

    specheads smoke                  # on the CPU (what ``make test`` runs)
    specheads smoke --device cuda    # labeling, training and decoding on the GPU, then the labels audited
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from core.arguments import CommandParser, description
from core.errors import SettingError
from core.interrupt import run_main
from core.runfolder import RunFolder
from core.models import ModelSpec
from core.prompts import PromptConfig
from data_gen.run import run_labels
from testing.tiny import label_config, make_pair, write_prompts

ROOT = Path("runs/smoke")
PROMPTS = ("prompts.jsonl", "heldout.jsonl")
"""The files a smoke run writes under ROOT itself; each stage's folder is its command's own (``core.runfolder``),
written again by the next run (labels and eval start over), so that nothing a user puts there is deleted."""
CHECKOUT = Path(__file__).resolve().parents[1]


def prepare(root: Path) -> None:
    """Refuse a folder no smoke run wrote (``RunFolder.check``), and claim the prompt files the run writes there."""
    folder = RunFolder(root, "smoke", "--out", PROMPTS)
    folder.check()
    folder.start(PROMPTS)


def stage_labels(root: Path, device: str) -> None:
    draft, target = make_pair(root / "models")
    prompts = write_prompts(root / "prompts.jsonl", n=24)
    # a quarter of the prompts each in val and test, so every category (and so every head's rows) is in each split
    cfg = label_config(draft, target, prompts, root / "labels", split_fractions=(0.5, 0.25, 0.25),
                       accelerator="gpu" if device == "cuda" else "cpu", overwrite=True)
    manifest = run_labels(cfg)
    assert (root / "labels" / "manifest.json").exists()
    assert manifest["splits"]["train"]["rows"] > 0


def stage_train(root: Path, device: str) -> None:
    from heads.export import load_head
    from pipeline import train_all

    results = train_all.main([
        "--labels", str(root / "labels"), "--out", str(root / "train"), "--checkpoints", str(root / "checkpoints"),
        "--heads_dir", str(root / "heads"), "--max_epochs", "3", "--quiet",
        "--configs", *(str(CHECKOUT / c) for c in train_all.DEFAULT_CONFIGS),
        "--accelerator", "gpu" if device == "cuda" else "cpu",
    ])
    draft = json.loads((root / "labels" / "manifest.json").read_text())["models"]["draft"]
    for r in results:
        head, meta = load_head(r.export, draft=draft)
        assert meta["head"]["init_args"]["hidden_size"] == draft["hidden_size"]
    assert (root / "train" / "roc.png").exists()


def stage_eval(root: Path, device: str) -> None:
    """Every policy and the HF peer on the tiny pair with the smoke-trained heads; report under ``eval/``."""
    from evaluation.config import EvalConfig, HFPeer, Mode, Sweep
    from evaluation.run import run_eval

    heads = root / "heads"
    cfg = EvalConfig(
        draft=ModelSpec(path=str(root / "models" / "draft"), name="tiny-draft"),
        target=ModelSpec(path=str(root / "models" / "target"), name="tiny-target"),
        # prompts no head trained on (the eval would leave out the ones they saw)
        prompts=PromptConfig(source=str(write_prompts(root / "heldout.jsonl", n=3, seed=1)), response_field="answer"),
        modes=[Mode("sample", 1.0), Mode("greedy", 0.0, families=["target_only", "sd", "hf_assisted"])],
        policies=[
            Sweep("target_only"), Sweep("draft_only"), Sweep("sd", grid={"k": [2, 4]}),
            Sweep("specdecpp", fixed={"head": str(heads / "specdecpp_d3_w6.safetensors")}, grid={"h": [None, 0.5]}),
            Sweep("sprinter", fixed={"head": str(heads / "sprinter_lam1.safetensors")}, grid={"tau": [None, 0.5]}),
            Sweep("hf_heuristic"), Sweep("confidence"), Sweep("svip", grid={"h": [0.5]}),
            Sweep("fuzzy", grid={"T": [0.5]}),
        ],
        max_new_tokens=6, sweep_prompts=2, hf_peer=HFPeer(confidence_thresholds=[0.6]), select_by="simulated",
        train_dir=str(root / "train"), labels_dir=str(root / "labels"), output_dir=str(root / "eval"), device=device,
        overwrite=True,
    )
    out = run_eval(cfg, quiet=True)
    report = json.loads((out / "report.json").read_text())
    families = {row["family"] for m in report["modes"].values() for row in m["table"]}
    missing = {"target_only", "draft_only", "sd", "specdecpp", "sprinter", "hf_heuristic", "confidence", "svip",
               "fuzzy", "hf_assisted"} - families
    assert not missing, f"policies missing from the report: {missing}"
    assert report["theorem7"]["runs"], f"SPRINTER Theorem 7 not checked: {report['theorem7']['skipped']}"
    for f in ("report.md", "pareto.png", "speedup.png", "quality.png", "roc.png", "selection.json", "loglik.jsonl",
              "forward_timing.json", "traces/sample/00000.safetensors"):
        assert (out / f).exists(), f
    assert report["selection"]["sample"], "the simulator chose no setting"


def stage_audit(root: Path) -> None:
    """Labels written on the GPU, recomputed on the CPU with plain unbatched forwards."""
    from data_gen import audit

    assert audit.main([str(root / "labels"), "--rows", "8"]) == 0, "the GPU's labels disagree with the CPU's"


STAGES = [("labels", stage_labels), ("train", stage_train), ("eval", stage_eval)]


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog="specheads smoke", description=description(__doc__))
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where every stage runs")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SettingError("--device cuda: no CUDA GPU that torch can use on this machine")
    with RunFolder(ROOT, "smoke").hold("a smoke run"):
        return run(args.device)


def run(device: str) -> int:
    prepare(ROOT)
    t0 = time.perf_counter()
    stages = [(name, lambda root, stage=stage: stage(root, device)) for name, stage in STAGES]
    if device == "cuda":
        stages.append(("audit of the GPU's labels on the CPU", stage_audit))
    for name, stage in stages:
        t = time.perf_counter()
        stage(ROOT)
        print(f"smoke: {name} ok ({time.perf_counter() - t:.1f} s)")
    print(f"smoke: all stages ok on {device} in {time.perf_counter() - t0:.1f} s; outputs under {ROOT}/")
    return 0


if __name__ == "__main__":
    run_main(main)

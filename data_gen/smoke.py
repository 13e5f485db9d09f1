"""``make smoke``: every stage that exists, on tiny random-init models, in well under 2 minutes.

Outputs stay under ``runs/smoke/`` (ignored): the tiny models, the prompts, and the labeled dataset with its
``manifest.json``. Later stages add their step to ``STAGES``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from data_gen.labeler import Sampling
from data_gen.models import ModelSpec
from data_gen.prompts import PromptConfig
from data_gen.run import LabelConfig, run_labels
from data_gen.tiny import make_pair, write_prompts

ROOT = Path("runs/smoke")


def stage_labels(root: Path) -> None:
    draft, target = make_pair(root / "models")
    prompts = write_prompts(root / "prompts.jsonl", n=24)
    cfg = LabelConfig(
        draft=ModelSpec(path=str(draft), name="tiny-draft"),
        target=ModelSpec(path=str(target), name="tiny-target"),
        prompts=PromptConfig(source=str(prompts), response_field="answer"),
        sampling=Sampling(max_new_tokens=12),
        output_dir=str(root / "labels"),
        batch_size=4,
    )
    manifest = run_labels(cfg)
    assert (root / "labels" / "manifest.json").exists()
    assert manifest["splits"]["train"]["rows"] > 0


def stage_train(root: Path) -> None:
    from heads.export import load_head
    from pipeline import train_all

    results = train_all.main([
        "--labels", str(root / "labels"), "--out", str(root / "train"), "--checkpoints", str(root / "checkpoints"),
        "--heads-dir", str(root / "heads"), "--max-epochs", "3", "--quiet",
    ])
    draft = json.loads((root / "labels" / "manifest.json").read_text())["models"]["draft"]
    for r in results:
        head, meta = load_head(r.export, draft=draft)
        assert meta["head"]["init_args"]["hidden_size"] == draft["hidden_size"]
    assert (root / "train" / "roc.png").exists()


STAGES = [("labels", stage_labels), ("train", stage_train)]


def main() -> int:
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    t0 = time.perf_counter()
    for name, stage in STAGES:
        t = time.perf_counter()
        stage(ROOT)
        print(f"smoke: {name} ok ({time.perf_counter() - t:.1f} s)")
    print(f"smoke: all stages ok in {time.perf_counter() - t0:.1f} s; outputs under {ROOT}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make smoke``: every stage that exists, on tiny random-init models, in well under 2 minutes.

Outputs stay under ``runs/smoke/`` (ignored): the tiny models, the prompts, and the labeled dataset with its
``manifest.json``. Later stages add their step to ``STAGES``.
"""

from __future__ import annotations

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


STAGES = [("labels", stage_labels)]


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

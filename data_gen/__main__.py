"""``python -m data_gen --config configs/labels/humaneval.yaml [--sampling.max_new_tokens 64 …]``"""

from __future__ import annotations

import sys

from jsonargparse import ActionConfigFile, ArgumentParser

from core.errors import UserError
from data_gen.run import LabelConfig, LabelingInterrupted, run_labels


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m data_gen", description="Label every draft token of a draft/target pair.")
    p.add_argument("--config", action=ActionConfigFile, help="YAML file with the settings below")
    p.add_class_arguments(LabelConfig, None, as_group=False)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    try:
        ns = p.instantiate(p.parse_args(argv))
        cfg = LabelConfig(**{k: v for k, v in vars(ns).items() if k != "config"})
        run_labels(cfg)
    except LabelingInterrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return 130
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

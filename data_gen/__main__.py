"""``specheads labels --config configs/labels/humaneval.yaml [--sampling.max_new_tokens 64 …]``"""

from __future__ import annotations

import sys

from core.arguments import parse_settings, settings_parser
from core.errors import UserError
from core.interrupt import CtrlCGuard, command_failure, interrupted_line


CONFIG = "configs/labels/<file>.yaml"
"""What ``--config`` takes: the settings of a labeling run come from a file (the pair, the prompts)."""


def parser():
    from data_gen.config import LabelConfig

    return settings_parser(LabelConfig, "specheads labels", "Label every draft token of a draft/target pair "
                           "(--out FOLDER: --output_dir). The settings come from a file, --config " + CONFIG
                           + ", and any flag below overrides one of them.")


def main(argv: list[str] | None = None) -> int:
    ctrl_c = CtrlCGuard()
    try:  # the imports too: Ctrl-C while torch and Lightning load is one line as well
        with ctrl_c:
            with ctrl_c.deferred():
                from data_gen.config import LabelConfig
                from data_gen.errors import LabelingInterrupted
                from data_gen.run import run_labels

            p = parser()
            ns = p.instantiate(parse_settings(p, argv, CONFIG))
            cfg = LabelConfig(**{k: v for k, v in vars(ns).items() if k != "config"})
            run_labels(cfg)
    except KeyboardInterrupt:
        return _interrupted()
    except UserError as e:
        if isinstance(e, LabelingInterrupted):  # bound: a UserError comes only once the imports are done
            print(f"interrupted: {e}", file=sys.stderr)
            return 130
        return command_failure(ctrl_c, e, _interrupted)
    except Exception as e:
        return command_failure(ctrl_c, e, _interrupted)
    return 0


def _interrupted(then: BaseException | None = None) -> int:
    print(f"{interrupted_line(then)}; every finished batch is kept: run the same command again to resume",
          file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())

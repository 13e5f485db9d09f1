"""``python -m data_gen --config configs/labels/humaneval.yaml [--sampling.max_new_tokens 64 …]``"""

from __future__ import annotations

import sys

from core.arguments import parse_settings
from core.errors import UserError
from core.interrupt import CtrlCGuard, command_failure, interrupted_line


def parser():
    from jsonargparse import ActionConfigFile, ArgumentParser

    from data_gen.config import LabelConfig

    p = ArgumentParser(prog="python -m data_gen", description="Label every draft token of a draft/target pair (--out FOLDER: --output_dir).",
                       exit_on_error=False)
    p.add_argument("--config", action=ActionConfigFile, help="YAML file with the settings below")
    p.add_class_arguments(LabelConfig, None, as_group=False)
    return p


def main(argv: list[str] | None = None) -> int:
    ctrl_c = CtrlCGuard()
    try:  # the imports too: Ctrl-C while torch and Lightning load is one line as well
        with ctrl_c:
            with ctrl_c.deferred():
                from data_gen.config import LabelConfig
                from data_gen.errors import LabelingInterrupted
                from data_gen.run import run_labels

            p = parser()
            ns = p.instantiate(parse_settings(p, argv))
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

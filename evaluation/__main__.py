"""``python -m evaluation --config configs/eval/humaneval.yaml [--max_new_tokens 64 --prompts.limit 10 …]``"""

from __future__ import annotations

import sys

from core.errors import UserError
from evaluation.config import parse


def main(argv: list[str] | None = None) -> int:
    from evaluation.results import ResultStore
    from evaluation.run import load_prompts, run_eval

    try:
        cfg, report_only = parse(argv)
        if report_only:
            from pathlib import Path

            from evaluation.report import write_report

            out = Path(cfg.output_dir)
            write_report(out, cfg, ResultStore(out / "results.jsonl").records(), load_prompts(cfg.prompts))
        else:
            out = run_eval(cfg)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

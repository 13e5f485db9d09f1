"""``python -m evaluation --config configs/eval/humaneval.yaml [--max_new_tokens 64 --prompts.limit 10 …]``"""

from __future__ import annotations

import sys

from jsonargparse import ActionConfigFile, ArgumentParser

from core.errors import UserError
from evaluation.config import EvalConfig


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m evaluation", description="Run every decoding policy and write the report.")
    p.add_argument("--config", action=ActionConfigFile, help="YAML file with the settings below")
    p.add_class_arguments(EvalConfig, None, as_group=False)
    p.add_argument("--report_only", type=bool, default=False,
                   help="rewrite the report from output_dir/results.jsonl without running anything")
    return p


def parse(argv: list[str] | None = None) -> tuple[EvalConfig, bool]:
    p = parser()
    ns = p.instantiate(p.parse_args(argv))
    report_only = ns.pop("report_only") if hasattr(ns, "pop") else False
    kw = {k: v for k, v in vars(ns).items() if k not in ("config", "report_only")}
    return EvalConfig(**kw), bool(report_only)


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

"""``specheads eval --config configs/eval/humaneval.yaml [--max_new_tokens 64 --prompts.limit 10 …]``"""

from __future__ import annotations

import sys

from core.interrupt import CtrlCGuard, command_failure, interrupted_line


def main(argv: list[str] | None = None) -> int:
    ctrl_c = CtrlCGuard()
    try:  # the imports too: Ctrl-C while torch and transformers load is one line as well
        with ctrl_c:
            with ctrl_c.deferred():
                from evaluation.config import parse
                from evaluation.results import ResultStore
                from evaluation.prompts import load_prompts
                from evaluation.run import run_eval
                from evaluation.rundir import RunDir

            cfg, report_only = parse(argv)
            if report_only:
                from evaluation.report import write_report
                from evaluation.resume import check_report_folder

                out = check_report_folder(cfg)
                records = ResultStore(RunDir(out).results).records()
                # without the prompts a head had seen (``evaluation.prompts.unseen_prompts``)
                decoded = {r["prompt"] for r in records}
                write_report(out, cfg, records, [p for p in load_prompts(cfg.prompts) if p["prompt"] in decoded])
            else:
                out = run_eval(cfg)
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as e:
        return command_failure(ctrl_c, e, _interrupted)
    print(f"report: {RunDir(out).report_md}")
    return 0


def _interrupted(then: BaseException | None = None) -> int:
    print(f"{interrupted_line(then)}; every finished run is kept in results.jsonl: run the same command again to "
          "resume", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())

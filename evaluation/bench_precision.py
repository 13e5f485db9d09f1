"""``make bench-precision``: the real draft at each precision beside the target, on the same prompts: the draft's
decode step, the cost ratio c = t_draft / t_target, and the mean acceptance 1 − TV(p, q) against the target.

    specheads bench-precision                          # the labeling config's pair, 8 HumanEval prompts
    specheads bench-precision --prompts 16 --precision bfloat16 int8-dynamic-per-channel

1 − TV(p, q) = Σ_v min(p(v), q(v)) is the probability that speculative sampling accepts a draft token at
temperature 1. It is read along each prompt's reference solution (teacher-forced, the first ``--positions``
tokens), the same positions for every precision. Times come from ``bench_timing.bench_model`` on the loaded
weights (decode step after a cache of ``--cache`` tokens, a ``--verify``-token forward, a prefill), in this
run, so c is a ratio measured side by side.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

from core.arguments import CommandParser, check_counts, description
from core.interrupt import run_main
from core.label_math import tv_distance, warp_logits
from core.models import ModelSpec, load_model
from core.prompts import PromptConfig, load_prompt_table, tokenize_prompt
from core.quantization import NONE, QUANTIZATIONS
from core.runfolder import OutputFile
from evaluation.bench_timing import DTYPES, bench_model, step_s
from evaluation.timers import write_json

DEFAULT_PRECISIONS = ("float32", "bfloat16", *QUANTIZATIONS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="specheads bench-precision", description=description(__doc__))
    p.add_argument("--config", default="configs/labels/humaneval.yaml", help="a labeling config: its draft and target")
    p.add_argument("--precision", nargs="+", default=list(DEFAULT_PRECISIONS), choices=[*DTYPES, *QUANTIZATIONS],
                   help="the draft's precisions (a dtype, or an int8 quantization of float32 weights)")
    p.add_argument("--target_precision", default="float32", choices=[*DTYPES, *QUANTIZATIONS],
                   help="the target's one precision, the reference of c and 1 - TV (default float32)")
    p.add_argument("--prompts", type=int, default=8, help="HumanEval prompts, spread over the 164")
    p.add_argument("--positions", type=int, default=48, help="reference tokens read per prompt")
    p.add_argument("--cache", type=int, default=128, help="KV-cache length of the timed decode step")
    p.add_argument("--verify", type=int, default=5, help="tokens of the timed verification forward")
    p.add_argument("--prefill", type=int, default=128, help="tokens of the timed prefill")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per figure (median reported)")
    p.add_argument("--out", default="runs/bench/precision.json", help="JSON output")
    a = p.parse_args(argv)
    check_counts({"--prompts": a.prompts, "--positions": a.positions, "--cache": a.cache, "--verify": a.verify,
                  "--prefill": a.prefill, "--repeats": a.repeats})  # one line now, not after the models load
    return a


def at_precision(spec: dict, precision: str) -> tuple[ModelSpec, str]:
    """A model entry of the config at ``precision``: (the entry, the dtype to load it in)."""
    if precision in QUANTIZATIONS:
        return ModelSpec(**{**spec, "quantization": precision}), "float32"
    return ModelSpec(**{**spec, "quantization": NONE}), precision


def sequences(tokenizer, n_prompts: int, positions: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reference ids) of ``n_prompts`` HumanEval problems spread evenly over the set."""
    table = load_prompt_table(PromptConfig(source="humaneval", response_field="canonical_solution"), True)
    step = max(1, len(table) // n_prompts)
    return [(tokenize_prompt(tokenizer, r["text"], False), tokenizer(r["response"], add_special_tokens=False)
             ["input_ids"][:positions]) for r in table[::step][:n_prompts]]


@torch.no_grad()
def distributions(model, seqs) -> list[torch.Tensor]:
    """Log-probs (temperature 1) at each reference position of each sequence: one forward per sequence."""
    out = []
    for prompt, reference in seqs:
        logits = model(torch.tensor([prompt + reference])).logits[0, len(prompt) - 1: len(prompt) + len(reference) - 1]
        out.append(warp_logits(logits))
    return out


def timings(model, a: argparse.Namespace) -> dict:
    return bench_model(model, torch.device("cpu"), a.prefill, [a.cache], a.verify, a.repeats, verify_short=0)


def table(result: dict) -> str:
    t = result["target"]
    lines = [f"target {t['precision']}: decode step {step_s(t) * 1e3:.1f} ms, verify {result['verify']} tokens "
             f"{t['verify']['median_s'] * 1e3:.1f} ms, prefill {result['prefill']} tokens "
             f"{t['prefill']['median_s'] * 1e3:.0f} ms; CPU, {torch.get_num_threads()} threads",
             f"{'draft precision':<40}{'step ms':>9}{'c':>7}{'2-token ms':>12}{'prefill ms':>12}{'1 - TV':>9}"
             f"{'± s.e.':>8}", "-" * 97]
    for d in result["drafts"]:
        lines.append(f"{d['precision']:<40}{step_s(d) * 1e3:>9.1f}{step_s(d) / step_s(t):>7.3f}"
                     f"{d['verify']['median_s'] * 1e3:>12.1f}{d['prefill']['median_s'] * 1e3:>12.0f}"
                     f"{d['acceptance']:>9.4f}{d['acceptance_se']:>8.4f}")
    lines.append(f"1 - TV: mean over {result['positions']} reference positions of {result['prompts']} HumanEval "
                 f"prompts (temperature 1); c: draft step / target step after {result['cache']} tokens; "
                 f"2-token: the draft's forward of the last candidate and the bonus token")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    out = OutputFile(a.out, "bench-precision", "precision file")
    out.check()
    models = yaml.safe_load(Path(a.config).read_text())
    target_spec, target_dtype = at_precision(models["target"], a.target_precision)
    target, tokenizer, _ = load_model(target_spec, target_dtype)
    seqs = sequences(tokenizer, a.prompts, a.positions)
    reference = distributions(target, seqs)
    print(f"target@{a.target_precision}: {sum(len(r) for _, r in seqs)} positions read", file=sys.stderr, flush=True)
    result = {"config": a.config, "prompts": len(seqs), "positions": sum(len(r) for _, r in seqs), "cache": a.cache,
              "verify": a.verify, "prefill": a.prefill,
              "target": {"precision": a.target_precision, **timings(target, a)}, "drafts": []}
    del target
    for precision in a.precision:
        draft, _, _ = load_model(*at_precision(models["draft"], precision))
        acceptance = torch.cat([1 - tv_distance(q, p) for q, p in zip(distributions(draft, seqs), reference)])
        entry = {"precision": precision, "acceptance": acceptance.mean().item(),
                 "acceptance_se": (acceptance.std() / len(acceptance) ** 0.5).item(), **timings(draft, a)}
        result["drafts"].append(entry)
        print(f"draft@{precision}: step {step_s(entry) * 1e3:.1f} ms, 1 - TV {entry['acceptance']:.4f}",
              file=sys.stderr, flush=True)
        del draft
    print(table(result))
    write_json(result, out)
    return result


if __name__ == "__main__":
    run_main(main)

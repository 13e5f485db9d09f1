"""The decoder's graph path checked on one GPU, in one go (``scripts/gpu_check.sh`` runs it on a lent machine):

(a) the tiny pair, eager against CUDA graphs (over the eager layers, ``graphs``, and over compiled ones,
    ``compiled``): every policy, greedy and sampling on the same seeds, token for token;
(b) the decoder's forward (the model, its logits and their warp, as ``CachedLM.advance`` runs it) of the pair's draft
    and target shapes and of a 7B target shape, at every verification length 1 … 21 after 256 cached tokens, eager and
    under both graph decoders, and the bare compiled step of ``scripts.bench_compiled_step`` for the pair's target;
(c) trace-forced decoding (``ModelPair.forced``) of a schedule's policies (``specheads gpu-schedule``) with
    random weights of the pair's shapes, under each graph decoder: wall time per token against what (b)'s costs of
    that decoder charge for the same rounds, and how much of the wall the forwards themselves take;
(d) the same with the 7B target shape and the pair's draft.

    specheads gpu-check --schedule runs/gpu/schedule.json --out runs/gpu-check

Writes ``results.json`` (every figure, rewritten after each part, so a run cut short keeps what it measured),
``report.md`` (the tables), ``timing-<decoder>-<target>.json`` (each graph decoder's costs in ``bench_timing``'s
layout, for ``make simulate ARGS="--timing …"``) and ``profile.txt`` (torch.profiler over one forced generation)
into ``--out``.
"""

from __future__ import annotations

import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from core.arguments import CommandParser
from core.errors import SettingError
from core.interrupt import run_main
from core.runfolder import RunFolder
from core.sampling import Sampling
from decoding.costs import CostModel, catch_up_s, timing_entry
from decoding.policies import build_policy
from decoding.schedule import catch_up, read_schedule
from decoding.state import HEAD_FEATURES, ModelPair, decoder_runner
from decoding.static import RUNNERS
from evaluation.bench_timing import build, model_config
from evaluation.timers import decoder_forward_times
from heads.exported import ExportedHead

SHAPES = {"qwen2.5-coder-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                   num_attention_heads=28, num_key_value_heads=4, vocab_size=151936,
                                   tie_word_embeddings=False)}
"""Target shapes beyond ``bench_timing.BUILTIN``: Qwen2.5-Coder-7B. Its output head has 152,064 rows, padding beyond
the 151,936 tokens it shares with the 0.5B draft; the shape here has the shared 151,936 (0.08 % fewer rows), since a
pair must have one vocabulary (``core.models.check_vocabularies``)."""
PREFIX = 256
LENGTHS = tuple(range(1, 22))
DECODERS = ("graphs", "compiled")
"""The graph decoders timed: CUDA graphs over the eager layers, and over layers compiled first."""
OUTPUTS = ("results.json", "report.md", "profile.txt",
           *(f"timing-{d}-{name}.json" for d in DECODERS for name in ("qwen2.5-1.5b", "qwen2.5-coder-7b")))


def sync() -> None:
    if torch.cuda.is_available():  # the forced runs' parts also run on the CPU (tests/test_static_decoder.py)
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------------------
# (a) the tiny pair, eager against graphs


def tiny_exactness(device: torch.device) -> dict:
    """Tokens of every policy on the tiny pair (float32) eager, on the static cache and under graphs: how many
    generations agree token for token, and the first position where any differs."""
    from transformers import AutoModelForCausalLM

    from heads.export import export_head
    from heads.resnet import ResNetHead
    from testing.tiny import make_pair

    folder = Path(tempfile.mkdtemp())
    models = [AutoModelForCausalLM.from_pretrained(d).eval().to(device) for d in make_pair(folder)]
    torch.manual_seed(0)
    head = ResNetHead(hidden_size=models[0].config.hidden_size, depth=2)
    with torch.no_grad():
        head.out.weight.normal_(0, 1)
    head_file = str(export_head(head, folder / "stop.safetensors", draft={"name": "tiny-draft", "source": "test"},
                                vocab_size=models[0].config.vocab_size, label={"kind": "test"}, role="stop",
                                threshold={"name": "h", "value": 0.5, "rule": "test"}, metrics={}, position="own"))
    policies = {"target_only": {}, "sd k=3": {"k": 3}, "confidence 0.5": {"threshold": 0.5}, "svip 0.5": {"h": 0.5},
                "specdecpp": {"head": head_file},
                "goodput": {"head": head_file, "costs": CostModel.eq51(0.5), "lam": 1.0}}
    out = {}
    for name, kwargs in policies.items():
        family = name.split()[0]
        for temperature in (0.0, 1.0):
            runs = {}
            for decoder in ("eager", "static", *DECODERS):
                pair = ModelPair(*models, eos_token_ids=[], decoder=decoder,
                                 sampling=Sampling(temperature=temperature, max_new_tokens=24))
                policy = build_policy(family, **kwargs)
                runs[decoder] = [policy.generate(pair, prompt, torch.Generator().manual_seed(seed)).tokens
                                 for prompt in ([1, 10, 11, 12], [1, 30, 5]) for seed in range(4)]
            mode = "greedy" if temperature == 0 else "sampling"
            out[f"{name} {mode}"] = {other: sum(a == b for a, b in zip(runs["eager"], runs[other]))
                                     for other in ("static", *DECODERS)} | {"of": len(runs["eager"])}
    return out


# ---------------------------------------------------------------------------------------------------------------
# (b) the decoder's forwards, eager and under graphs


def forward_times(model, decoder: str, repeats: int, lengths=LENGTHS) -> dict[int, float]:
    """The decoder's forward of m new tokens after ``PREFIX`` cached ones, each m of ``lengths``, under ``decoder``
    (``evaluation.timers.decoder_forward_times``), on the runner the forced runs use."""
    if decoder != "eager":  # the one runner, sized for every length, that the forced runs reuse
        decoder_runner(model, decoder, PREFIX + max(LENGTHS) + 1)
    return decoder_forward_times(model, decoder, PREFIX, lengths, repeats)


def compiled_step(model, repeats: int) -> float:
    """``scripts.bench_compiled_step``'s bare step: the model alone under ``torch.compile(mode="reduce-overhead")``."""
    from scripts.bench_compiled_step import time_forwards

    return time_forwards(model, PREFIX, (1,), repeats, compiled=True)[1]


def timing_layout(device: str, decoder: str, draft: dict[int, float], target: dict[int, float], prefill: dict[str, float]) -> dict:
    """Graph costs in ``evaluation.bench_timing``'s JSON layout (``decoding.costs.read_timing`` reads it)."""

    def entry(name: str, times: dict[int, float]) -> dict:
        table = 8 in times
        # the draft's catch-up read, with both rows out: at most a row's logits dearer
        return timing_entry(name, "bfloat16", (PREFIX, prefill[name]), PREFIX, times, 8 if table else 1,
                            3 if table else None, by_tokens=table,
                            catch_up=times[2] if name == "draft" and 2 in times else None)

    return {"device": device, "device_type": "cuda", "decoder": decoder, "prefill": PREFIX,
            "models": [entry("draft", draft), entry("target", target)]}


@torch.no_grad()
def prefill_time(model) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, PREFIX), device=model.device)
    for _ in range(2):
        model(ids)
    sync()
    t = time.perf_counter()
    model(ids)
    sync()
    return time.perf_counter() - t


# ---------------------------------------------------------------------------------------------------------------
# (c, d) trace-forced decoding


def schedule_policy(entry: dict, c: float):
    """A schedule entry's policy, built as an eval builds it. Its head reads a random-weight draft here, which the
    head's record of its draft would (rightly) refuse: the check is skipped, since only the head's cost is timed and
    its decisions are forced."""
    params = dict(entry["params"])
    if "head" in params:
        head = ExportedHead(params["head"], role="stop", computes=HEAD_FEATURES)
        head.check = lambda *args, **kwargs: None
        params["head"] = head
    if entry["family"] == "goodput":
        params["costs"] = CostModel.eq51(c)
    return build_policy(entry["family"], **params)


class TimedForwards:
    """The forwards of generations (``ModelPair.on_forward``: each timed to its end on the device, once the
    generation's clock has started): how much of a forced run's wall they take, against the rest (draws, acceptance
    tests, stop rules, the host's own work). The decoder synchronizes right after each forward anyway (its sampled
    token, its acceptance chances), so the wall it adds is small; it runs as its own pass all the same."""

    def __init__(self):
        self.seconds, self.calls = 0.0, 0

    def record(self, seconds: float) -> None:
        self.seconds += seconds
        self.calls += 1


def forced_decoding(draft, target, schedule: dict, costs: CostModel, prompt_tokens: int,
                    decoder: str = "graphs", split: bool = False) -> dict:
    """Every policy of the schedule decoded (under ``decoder``) with its rounds forced, trace by trace: wall seconds
    and tokens, and the seconds ``costs`` charges for the same rounds. ``split``: a second pass under
    ``TimedForwards`` adds the seconds spent in forwards and outside them."""
    vocab = min(draft.config.vocab_size, target.config.vocab_size)
    g = torch.Generator().manual_seed(1)
    lengths = [t["length"] for t in schedule["traces"]]
    prompts = [torch.randint(0, vocab, (prompt_tokens,), generator=g).tolist() for _ in lengths]
    positions = prompt_tokens + max(lengths) + 1
    for model in (draft, target):  # every graph captured before any clock runs
        decoder_runner(model, decoder, positions).capture(LENGTHS)
    out = {}
    for entry in schedule["policies"]:
        policy = schedule_policy(entry, schedule["c"])
        forced = entry["rounds"] if entry["family"] != "target_only" else [[] for _ in lengths]
        runs = []
        for i, (rounds, prompt) in enumerate(zip(forced, prompts)):
            rounds = [tuple(r) for r in rounds]
            pair = ModelPair(draft, target, eos_token_ids=[], decoder=decoder, forced=rounds,
                             sampling=Sampling(temperature=1.0, max_new_tokens=lengths[i]))
            if i == 0:  # a warm-up of this policy (its head on the device, its first draws)
                policy.generate(pair, prompt, torch.Generator().manual_seed(i))
            result = policy.generate(pair, prompt, torch.Generator().manual_seed(i))
            if len(result.tokens) != lengths[i]:
                raise RuntimeError(f"{entry['name']} made {len(result.tokens)} tokens on trace {i}, not {lengths[i]}")
            runs.append(result.stats.wall_s)
        split_row = {}
        if split:
            timer = TimedForwards()
            walls = [policy.generate(ModelPair(draft, target, eos_token_ids=[], decoder=decoder,
                                               forced=[tuple(r) for r in rounds], on_forward=timer.record,
                                               sampling=Sampling(temperature=1.0, max_new_tokens=n)),
                                     prompt, torch.Generator().manual_seed(i)).stats.wall_s
                     for i, (rounds, prompt, n) in enumerate(zip(forced, prompts, lengths))]
            split_row = {"split_wall_s": sum(walls), "forward_s": timer.seconds, "forwards": timer.calls,
                         "outside_forwards_s": sum(walls) - timer.seconds}
        rounds_of = [[tuple(r) for r in rounds] if rounds else [(0, 0)] * n for rounds, n in zip(forced, lengths)]
        priced = [costs.price_rounds(rounds, catch_up(rounds)) for rounds in rounds_of]
        n_tokens = sum(lengths)
        out[entry["name"]] = {"tokens": n_tokens, "wall_s": sum(runs), "predicted_s": sum(priced),
                              "wall_over_predicted": sum(runs) / sum(priced),
                              "ms_per_token": 1e3 * sum(runs) / n_tokens,
                              "schedule_speedup_at_c": entry.get("predicted_speedup"),
                              "rounds": sum(len(r) for r in forced) or n_tokens,
                              "candidates": sum(n for r in forced for n, _ in r)} | split_row
    base = out["target_only"]
    for row in out.values():
        row["speedup"] = base["wall_s"] / row["wall_s"]
        row["predicted_speedup"] = base["predicted_s"] / row["predicted_s"]
    return out


def profile_policy(draft, target, schedule: dict, entry: dict, prompt_tokens: int, decoder: str) -> str:
    """torch.profiler's table of one forced generation of ``entry`` (its first trace): where the time the cost table
    does not price goes (host-side work, syncs, sampling kernels)."""
    from torch.profiler import ProfilerActivity, profile

    policy = schedule_policy(entry, schedule["c"])
    length = schedule["traces"][0]["length"]
    prompt = torch.randint(0, min(draft.config.vocab_size, target.config.vocab_size), (prompt_tokens,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    pair = ModelPair(draft, target, eos_token_ids=[], decoder=decoder, forced=[tuple(r) for r in entry["rounds"][0]],
                     sampling=Sampling(temperature=1.0, max_new_tokens=length))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        result = policy.generate(pair, prompt, torch.Generator().manual_seed(0))
    return (f"{entry['name']}, trace 0, {decoder}: {len(result.tokens)} tokens in {1e3 * result.stats.wall_s:.1f} ms "
            f"(under the profiler)\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


# ---------------------------------------------------------------------------------------------------------------
# the report


def report(results: dict) -> str:
    lines = [f"# GPU check: {results['device']}", "", f"torch {results['torch']}, transformers "
             f"{results['transformers']}; {results['seconds']:.0f} s in all.", "",
             "## (a) The tiny pair: generations identical to the eager decoder's", "",
             "| policy | static cache | " + " | ".join(DECODERS) + " | of |", "|---|---|" + "---|" * len(DECODERS) + "---|"]
    lines += [f"| {k} | {v['static']} | " + " | ".join(str(v.get(d, "")) for d in DECODERS) + f" | {v['of']} |"
              for k, v in results.get("tiny", {}).items()]
    for name, shapes in results["pairs"].items():
        f = shapes["forwards"]
        columns = [(model, decoder) for model in ("draft", "target") for decoder in f[model]]
        lines += ["", f"## (b) Forward times, {name} (ms, after {PREFIX} tokens; the decoder's forward with its "
                  "logits and warp)", "", "| tokens | " + " | ".join(f"{m} {d}" for m, d in columns) + " |",
                  "|---|" + "---|" * len(columns)]
        for m in LENGTHS:
            cells = [f[model][decoder].get(str(m)) for model, decoder in columns]
            lines.append(f"| {m} | " + " | ".join("" if x is None else f"{1e3 * x:.2f}" for x in cells) + " |")
        lines.append("")
        for decoder in f["target"]:
            lines.append(f"- c {decoder} = {f['draft'][decoder]['1'] / f['target'][decoder]['1']:.3f} per step.")
        for decoder, forced in shapes["forced"].items():
            if "compiled_step_s" in shapes:
                step = forced["target_only"]["ms_per_token"] / 1e3
                lines.append(f"- The decoder's target-only step under {decoder} {1e3 * step:.2f} ms against the bare "
                             f"compiled step's {1e3 * shapes['compiled_step_s']:.2f} ms: "
                             f"{step / shapes['compiled_step_s']:.2f}×.")
            lines += ["", f"## (c) Trace-forced decoding, {name}, {decoder}", "",
                      "| policy | ms/token | predicted ms/token | wall / predicted | speedup | predicted | at the "
                      "schedule's c |", "|---|---|---|---|---|---|---|"]
            for pol, r in forced.items():
                at_c = r["schedule_speedup_at_c"]
                lines.append(f"| {pol} | {r['ms_per_token']:.2f} | {1e3 * r['predicted_s'] / r['tokens']:.2f} | "
                             f"{r['wall_over_predicted']:.3f} | {r['speedup']:.3f} | {r['predicted_speedup']:.3f} | "
                             f"{'' if at_c is None else f'{at_c:.3f}'} |")
            split = {pol: r for pol, r in forced.items() if "forward_s" in r}
            if split:
                lines += ["", f"Where the wall goes ({decoder}, a second pass timing each forward to its end):", "",
                          "| policy | forwards / predicted | outside the forwards, ms a round | forwards a round |",
                          "|---|---|---|---|"]
                lines += [f"| {pol} | {r['forward_s'] / r['predicted_s']:.3f} | "
                          f"{1e3 * r['outside_forwards_s'] / r['rounds']:.3f} | {r['forwards'] / r['rounds']:.2f} |"
                          for pol, r in split.items()]
    return "\n".join(lines) + "\n"


def save(out: Path, results: dict, started: float) -> None:
    """Write what is measured so far (a run cut short by its machine's time limit keeps it)."""
    results["seconds"] = time.perf_counter() - started
    folder = RunFolder(out, "gpu-check")
    folder.write_text(out / "results.json", json.dumps(results, indent=1))
    folder.write_text(out / "report.md", report(results))


def check_folder(out: Path) -> RunFolder:
    """The output folder, checked (``RunFolder``): new, or a GPU check's, whose files a new run replaces."""
    folder = RunFolder(out, "gpu-check", "--out", OUTPUTS)
    folder.check()
    return folder


def main(argv: list[str] | None = None) -> dict:
    p = CommandParser(prog="specheads gpu-check", description=(
        "The decoder's graph path checked on one GPU, in one go (scripts/gpu_check.sh runs it on a lent machine): "
        "(a) the tiny pair, eager against CUDA graphs, token for token; (b) the decoder's forward of the pair's "
        "shapes and a 7B target's at every verification length, eager and under each graph decoder; (c) and (d) "
        "trace-forced decoding of a schedule's policies (specheads gpu-schedule), wall time against what (b)'s "
        "costs charge."))
    p.add_argument("--schedule", required=True, help="a trace-forced schedule (specheads gpu-schedule)")
    p.add_argument("--out", default="runs/gpu-check", help="folder for results.json, report.md, the timing files "
                   "and profile.txt (default runs/gpu-check)")
    p.add_argument("--repeats", type=int, default=10, help="timed repeats of each forward (median)")
    p.add_argument("--prompt_tokens", type=int, default=160, help="prompt length of the forced runs")
    p.add_argument("--skip_7b", action="store_true", help="leave out the 7B target shape")
    p.add_argument("--skip_compile", action="store_true", help="leave out the bare compiled step (about 30 s)")
    p.add_argument("--skip_tiny", action="store_true", help="leave out (a), the tiny pair's exactness")
    p.add_argument("--decoders", nargs="+", choices=DECODERS, default=list(DECODERS), help="the graph decoders timed")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SettingError("this checks CUDA graphs: it needs a CUDA GPU")
    if a.repeats < 1 or a.prompt_tokens < 1:
        raise SettingError("--repeats and --prompt_tokens must be at least 1")
    schedule = read_schedule(a.schedule)
    out = Path(a.out)
    folder = check_folder(out)
    started = time.perf_counter()
    import transformers

    device = torch.device("cuda")
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "transformers": transformers.__version__, "schedule": a.schedule, "c": schedule["c"],
               "prompt_tokens": a.prompt_tokens, "pairs": {}}
    with folder.hold("a GPU check"):
        folder.check()
        folder.start()
        bare_step = None
        if not a.skip_compile:  # first: after the decoder's own compiles it read 38 ms a step, not 3.1 (unexplained)
            print("(b) the bare compiled step", flush=True)
            target = build(model_config("qwen2.5-1.5b"), device, "bfloat16")
            bare_step = compiled_step(target, a.repeats)
            del target
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        if not a.skip_tiny:
            print("(a) the tiny pair, eager against graphs", flush=True)
            results["tiny"] = tiny_exactness(device)
            print(json.dumps(results["tiny"]), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        save(out, results, started)
        draft = build(model_config("qwen2.5-0.5b"), device, "bfloat16")
        targets = {"qwen2.5-1.5b": model_config("qwen2.5-1.5b")}
        if not a.skip_7b:
            from transformers import Qwen2Config

            targets["qwen2.5-coder-7b"] = Qwen2Config(**SHAPES["qwen2.5-coder-7b"], max_position_embeddings=32768)
        decoders = tuple(a.decoders)
        draft_times: dict[str, dict[int, float]] = {}
        for name, config in targets.items():
            pair_shapes = name == "qwen2.5-1.5b"
            print(f"(b) forward times, {name}: eager, {', '.join(decoders)}", flush=True)
            target = build(config, device, "bfloat16")
            for decoder in ("eager", *decoders):
                if decoder not in draft_times:
                    draft_times[decoder] = forward_times(draft, decoder, a.repeats, (1, 2))
            target_times = {decoder: forward_times(target, decoder, a.repeats) for decoder in ("eager", *decoders)}
            shapes = {"forwards": {"draft": {k: {str(m): s for m, s in v.items()} for k, v in draft_times.items()},
                                   "target": {k: {str(m): s for m, s in v.items()} for k, v in target_times.items()}},
                      "forced": {}}
            results["pairs"][name] = shapes
            prefill = {"draft": prefill_time(draft), "target": prefill_time(target)}
            layouts = {decoder: timing_layout(results["device"], decoder, draft_times[decoder], target_times[decoder],
                                              prefill) for decoder in decoders}
            for decoder, layout in layouts.items():
                folder.write_text(out / f"timing-{decoder}-{name}.json", json.dumps(layout, indent=1))
            if pair_shapes and bare_step is not None:
                shapes["compiled_step_s"] = bare_step
            save(out, results, started)
            # the 7B shape's graphs over eager layers were timed on a forced schedule before: its last decoder here
            for decoder in decoders if pair_shapes else decoders[-1:]:
                print(f"(c) trace-forced decoding, {name}, {decoder}", flush=True)
                step = draft_times[decoder][1]
                costs = CostModel.by_length(step, lambda m, t=target_times[decoder]: t[min(m, max(t))],
                                            catch_up_s(layouts[decoder]["models"][0], step), name=decoder)
                shapes["forced"][decoder] = forced_decoding(draft, target, schedule, costs, a.prompt_tokens, decoder,
                                                            split=pair_shapes and decoder == "compiled")
                print(json.dumps(shapes["forced"][decoder]), flush=True)
                save(out, results, started)
            if pair_shapes:
                drafting = [e for e in schedule["policies"] if e["family"] != "target_only"]
                if drafting:
                    folder.write_text(out / "profile.txt", profile_policy(draft, target, schedule, drafting[0],
                                                                     a.prompt_tokens, decoders[-1]))
            for runner in target.__dict__.pop(RUNNERS, {}).values():
                runner.release()
            del target
            gc.collect()  # the model and its runners refer to each other: freed by the collector, then returned
            torch.cuda.empty_cache()
        save(out, results, started)
    print(report(results))
    print(f"wrote {out}/results.json, report.md and the graph timings ({results['seconds']:.0f} s)")
    return results


if __name__ == "__main__":
    run_main(main)

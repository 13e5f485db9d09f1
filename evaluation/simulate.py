"""``specheads simulate``: stop and verification policies replayed over label traces, without decoding.

SpecDec++ §5: the verification rate N_target/N and the discard rate N_discarded/N do not depend on the hardware;
the latency follows from them and the per-forward times (Eq. 5.1), so the speedup over target-only at a cost ratio
c = t_draft / t_target is 1 / (N_target/N + c·N_draft/N).

Traces (``evaluation.traces``: the label shards' ``target`` rows, or the decoder's replay of an evaluation's
target-only responses) follow a target-sampled response. The replay of one policy (round lengths of its rule, exact
expected counts, the oracle) is ``decoding.simulate``; this module runs it over every policy and setting, sets it
against finished evaluations, and prints the table. What it leaves out, and why it is used anyway, is in
``evaluation/DESIGN.md`` ("The trace simulator").

The oracle knows the acceptance draws and the cost model (``decoding.replay.oracle_counts``): it is computed for
each cost model a speedup is given at, and is the ceiling of every stop rule under that model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.arguments import CommandParser, description
from core.errors import SettingError, UserError
from core.interrupt import run_main
from core.shards import SPLITS, read_manifest
from decoding.costs import read_timing
from decoding.policies import POLICIES, head_family, simulated
from decoding import rules
from decoding.estimates import CalibratedConfidence
from decoding.lookup_stop import LookupCalibration, LookupHead
from decoding.replay import check_cost_ratios, goodput_rate
from decoding.simulate import cached_head, head_logits, replayable, simulate
from decoding.traces import Trace, filled_splits, load_label_traces, unseen
from decoding.costs import CostModel
from evaluation.simulate_lookup import own_response_lines, prompt_lookup_lines
from evaluation.traces import read_recorded
from heads.export import HeadFileError, check_draft, check_labels, read_metadata, seen_prompts


class SimulationError(UserError):
    """An eval folder without what the simulator needs to check it."""


def default_grid(heads: list[str]) -> list[tuple[str, dict]]:
    """Every policy and a grid of its setting: the stop heads and verifiers among ``heads`` at their own and a few
    other thresholds."""
    grid = [("sd", {"k": k}) for k in range(1, 11)]
    grid += [("confidence", {"threshold": t}) for t in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)]
    grid += [("svip", {"h": h}) for h in (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)]
    for path in heads:
        family = head_family(cached_head(path).role)
        grid += [(family, {"head": path, POLICIES[family].setting: v}) for v in (None, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)]
    return grid


def goodput_grid(traces: list[Trace], heads: list[str], costs: CostModel,
                 calibration: str | None = None) -> list[tuple[str, dict]]:
    """The goodput stop under ``costs`` on each source of estimates: each stop head among ``heads``, and the draft's
    confidence calibrated by the file ``calibration`` (``make calibrate``), each at the rate λ whose replay over the
    traces does best (``decoding.replay.goodput_rate``: the fixed point of λ ← the rate the rule achieves at λ)."""
    sources = []  # (the policy's estimate argument, log â on each trace, whether the stop reads the candidate)
    for path in heads:
        head = cached_head(path)
        if head.role == "stop":
            sources.append(({"head": path}, [rules.log_accept(head_logits(head, t)) for t in traces],
                            head.position == "own"))
    if calibration is not None:
        calibrated = CalibratedConfidence.load(calibration)
        sources.append(({"calibration": calibration}, [calibrated.log_accept(t.logp_draft) for t in traces], False))
    acceptance = [t.acceptance for t in traces]
    return [("goodput", {**source, "costs": costs, "lam": goodput_rate(acceptance, log_accepts, costs, own)["at"]})
            for source, log_accepts, own in sources]


def describe(family: str, params: dict) -> str:
    def show(key, value) -> str:
        if key in ("head", "calibration"):
            return Path(value).stem
        if key == "costs":
            return value.name
        return "file" if value is None else f"{value:g}"

    shown = {k: show(k, v) for k, v in params.items()}
    return family + (f"[{','.join(f'{k}={v}' for k, v in shown.items())}]" if shown else "")


def table(traces: list[Trace], grid: list[tuple[str, dict]], costs: list[float],
          priced: CostModel | None = None) -> tuple[str, list[dict]]:
    """Every policy of ``grid`` at every cost ratio of ``costs``, beside the oracle for that ratio, and under
    ``priced`` (a timing file's costs by verification length, the goodput stop's own model) beside the oracle for
    it. Rows: each policy's counts; the oracle's row holds its counts at each c (``oracles``, by c; ``priced``: for
    ``priced``) and, under ``counts``, at the first c."""
    oracles = {c: simulate(traces, "oracle", costs=CostModel.eq51(c)) for c in costs}
    oracle = oracles[costs[0]]
    rows = [{"policy": "oracle (Thm 4.1)", "family": "oracle", "params": {}, "counts": oracle, "oracles": oracles}]
    if priced is not None:
        rows[0]["priced"] = simulate(traces, "oracle", costs=priced)
    for family, params in grid:
        rows.append({"policy": describe(family, params), "family": family, "params": params,
                     "counts": simulate(traces, family, **params)})
    head = f"{'policy':<52}{'N_t/N':>7}{'N_d/N':>7}{'N_x/N':>7}" + "".join(
        f"{f'c={c:.3g}':>9}{'share':>7}" for c in costs) + (f"{priced.name[:8]:>9}{'share':>7}" if priced else "")
    lines = [f"{len(traces)} traces, {int(oracle.n)} positions; speedup over target-only at each c (and under the "
             f"timing's costs by length, where given), and its share of the oracle's gain (speedup − 1)/(oracle − 1), "
             f"the oracle for those costs (its rates: at the first c); SPRINTER is approximate", head, "-" * len(head)]

    def shown(speedup: float, best: float) -> str:
        return f"{speedup:>9.3f}{(speedup - 1) / (best - 1) if best > 1 else float('nan'):>7.2f}"

    for r in rows:
        k = r["counts"]
        line = f"{r['policy'][:51]:<52}{k.target / k.n:>7.3f}{k.draft / k.n:>7.3f}{k.discarded / k.n:>7.3f}"
        for c in costs:
            at = CostModel.eq51(c)
            line += shown(at.speedup(oracles[c] if r["family"] == "oracle" else k), at.speedup(oracles[c]))
        if priced is not None:
            counts = rows[0]["priced"] if r["family"] == "oracle" else k
            # SPRINTER's counts have no verification lengths to price
            line += "" if counts.calls is None else shown(priced.speedup(counts), priced.speedup(rows[0]["priced"]))
        lines.append(line)
    return "\n".join(lines), rows


def best_settings(rows: list[dict], c: float) -> dict[str, dict]:
    """The fastest setting of each exact family at c (an approximate one's is chosen by quality, not here)."""
    best: dict[str, dict] = {}
    at = CostModel.eq51(c)
    for r in rows:
        if r["family"] == "oracle" or not POLICIES[r["family"]].exact:
            continue
        source = r["params"].get("head", r["params"].get("calibration"))  # a family's runs on each estimate
        key = r["family"] + (f":{Path(source).stem}" if source is not None else "")
        key += f"@{r['params']['costs'].name}" if "costs" in r["params"] else ""  # a rule derived for those costs
        if key not in best or at.speedup(r["counts"]) > at.speedup(best[key]["counts"]):
            best[key] = r
    return best


def simulated_choice(labels: str | Path, sweeps: list, fit: CostModel, tokens: int,
                     exclude: set[str] = frozenset(), label_traces: tuple | None = None) -> dict[str, dict]:
    """family → the setting of ``sweeps`` (``evaluation.config.Sweep``; the families of
    ``decoding.policies.simulated(exact=True)`` with more than one setting) with the highest predicted speedup for ``tokens``-token
    responses, with every setting's prediction: over every labeled prompt, heads over the prompts they did not
    train on (their scores on training prompts are optimistic); never the prompts whose digests are in ``exclude``
    (those an eval decodes). ``label_traces``: ``selection_traces(labels, exclude)`` when the caller has read them."""
    sweeps = [s for s in sweeps if s.family in simulated(exact=True) and len(s.settings()) > 1]
    if not sweeps:
        return {}
    every, held_out = label_traces or selection_traces(labels, exclude)
    out = {}
    for s in sweeps:
        def traces(params):  # a head's own: the prompts it has not seen
            return traces_for(s.family, every, held_out, {**s.fixed, **params}.get("head"))

        scored = [(fit.predicted_speedup(simulate(traces(params), s.family, **{**s.fixed, **params}), tokens), i,
                   params) for i, params in enumerate(s.settings())]
        best = max(scored, key=lambda x: (x[0], -x[1]))
        out[s.family] = {"params": best[2], "predicted_speedup": best[0], "traces": len(traces(best[2])),
                         "grid": [{"params": params, "predicted_speedup": v} for v, _, params in scored]}
    return out


def selection_traces(labels: str | Path, exclude: set[str] = frozenset()) -> tuple[list[Trace], list[Trace]]:
    """What ``simulated_choice`` replays: every labeled prompt's trace, and the held-out ones (for heads), less the
    prompts whose digests are in ``exclude``."""
    def traces(splits: tuple[str, ...]) -> list[Trace]:  # none from a split the labels left empty
        filled = tuple(filled_splits(labels, splits))
        return unseen(load_label_traces(labels, filled), exclude) if filled else []

    held_out = traces(("val", "test"))
    every = traces(("train",)) + held_out
    if not every:
        raise SimulationError(f"{labels}: every labeled prompt is one the eval decodes; choose settings on labels "
                              "of other prompts (labels_dir)")
    return every, held_out


def traces_for(family: str, every: list[Trace], held_out: list[Trace], head: str | None = None) -> list[Trace]:
    """The label traces a family is replayed on: a head's only on the prompts it has not seen (those its file
    records, ``heads.export.seen_prompts``; the labels' val and test prompts for a head without that record)."""
    if POLICIES[family].head_role is None:
        return every
    meta = read_metadata(head) if head is not None else {}
    known = all(t.prompt_digest is not None for t in every)  # labels without sequences cannot be compared
    return unseen(every, seen_prompts(meta)) if "trained_on" in meta and known else held_out


FIT_WITHOUT_RUN = "fit-out"
"""The cost model ``validate`` predicts a run with that is not fitted on it: the runs' fit without that run."""


def validate(labels: str | Path, config: str, priced: CostModel | None = None) -> tuple[str, list[dict], float]:
    """Predicted against measured, per run of a finished ``make eval`` (its config) in each mode its decoder traces
    were recorded in: N_target/N, N_draft/N and the speedup over target-only with its paired bootstrap interval.
    Rates come from the label traces ``make eval`` chose settings on (every labeled prompt; heads on the held-out
    ones) and from the decoder traces of the eval's own prompts (``evaluation.traces``). Speedups turn them into
    latency with each cost model the eval has (``evaluation.latency``): the pair's timed forwards (``forwards``,
    what the choice used), its runs' fit (``fit``) and, so that no prediction is fitted on what it predicts, the
    runs' fit without the run at hand (``FIT_WITHOUT_RUN``), and ``priced`` (``--timing``) where given. Prompt
    lookup's runs are replayed along their own responses (``own_response_lines``). Returns the text, the rows and
    the cost ratio c of the costs the choice used (the runs' fit's when the forwards were not timed)."""
    from core.cache import file_sha256
    from core.intervals import speedup_interval
    from evaluation.config import parse
    from evaluation.latency import fit_records, selection_fit
    from evaluation.results import ResultStore
    from evaluation.rundir import RunDir

    cfg, _ = parse(["--config", config])
    if not RunDir(cfg.output_dir).results.exists():
        raise SimulationError(f"{RunDir(cfg.output_dir).results} not found: run `make eval` with {config} first")
    records = ResultStore(RunDir(cfg.output_dir).results).records()
    settings = RunDir(cfg.output_dir).settings
    ran = json.loads(settings.read_text()) if settings.exists() else None  # the settings the runs were made at
    recorded_heads = (ran or {}).get("heads", {})
    known = cfg.latency_fits(records)
    fits = {name: f for name, f in known.items() if f is not None and name != "timing"}
    if not fits:
        raise SimulationError(f"{cfg.output_dir} holds too few finished runs to fit the latency model")
    models = [*fits, *([FIT_WITHOUT_RUN] if "fit" in fits else []), *(["timing"] if priced is not None else [])]
    selection = RunDir(cfg.output_dir).selection  # the prompts its choice left out: those it decoded
    chosen_from = json.loads(selection.read_text()).get("inputs", {}) if selection.exists() else {}
    decoded = {d for inputs in chosen_from.values() for d in inputs.get("decoded_prompts", [])}
    every, held_out = selection_traces(labels, decoded)
    fixed = {p.family: p.fixed for p in cfg.policies}
    by_run: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        by_run.setdefault((r["mode"], r["run"]), []).append(r)
    if priced is not None and cfg.untimed_prefill:  # the runs' walls hold no prefill
        priced = priced.without_prefill()
    rows, lines = [], []

    def models_of(mode: str, run: str) -> dict[str, CostModel]:
        out = dict(fits)
        if "fit" in fits:
            out[FIT_WITHOUT_RUN] = fit_records([r for r in records if (r["mode"], r["run"]) != (mode, run)])
        return {**out, **({"timing": priced} if priced is not None else {})}

    head = f"{'mode / run':<44}{'N_t/N meas':>11}{'label':>7}{'decod':>7}{'N_d/N meas':>11}{'label':>7}{'decod':>7}" \
           f"{'speedup meas [95 %]':>22}" + "".join(f"{f'{src}·{name}':>17}{'error':>8}" for name in models
                                                   for src in ("label", "decod"))
    recorded_by_mode: dict[str, dict[int, Trace]] = {}
    for (mode, run), recs in by_run.items():
        family = recs[0]["family"]
        if mode not in recorded_by_mode:
            recorded_by_mode[mode] = {t.prompt_id: t for t in read_recorded(cfg.output_dir, mode)}
        recorded = recorded_by_mode[mode]
        baseline = {r["prompt"]: r["stats"] for r in by_run.get((mode, "target_only"), [])}
        recs = sorted((r for r in recs if r["prompt"] in baseline and r["prompt"] in recorded),
                      key=lambda r: r["prompt"])
        if family not in simulated() or len(recs) < 2:
            continue
        params = {**fixed.get(family, {}), **recs[0]["params"]}
        if "head" in params and not replayable(params["head"]):
            lines.append(f"{(mode + ' ' + run)[:43]:<44}not replayed: its head reads features the traces do not hold")
            continue
        if "head" in params and recorded_heads.get(str(params["head"])) != file_sha256(Path(params["head"])):
            why = "changed since the run" if str(params["head"]) in recorded_heads else "is not recorded with the run"
            lines.append(f"{(mode + ' ' + run)[:43]:<44}not replayed: its head file {why}")
            continue
        tokens = round(sum(r["stats"]["new_tokens"] for r in recs) / len(recs))
        counts = {"label": simulate(traces_for(family, every, held_out, params.get("head")), family, **params),
                  "decod": simulate([recorded[r["prompt"]] for r in recs], family, **params)}
        n = sum(r["stats"]["new_tokens"] for r in recs)
        iv = speedup_interval([r["stats"] for r in recs], [baseline[r["prompt"]] for r in recs])
        measured = {"target": sum(r["stats"]["target_calls"] for r in recs) / n,
                    "draft": sum(r["stats"]["draft_calls"] for r in recs) / n,
                    "speedup": iv.value, "speedup_ci": [iv.low, iv.high]}
        rates = {src: {"target": c.target / c.n, "draft": c.draft / c.n} for src, c in counts.items()}
        run_fits = models_of(mode, run)
        speedups = {f"{src}·{name}": fit.predicted_speedup(c, tokens) for name, fit in run_fits.items()
                    if fit is not None for src, c in counts.items()}
        rows.append({"mode": mode, "run": run, "family": family, "prompts": len(recs), "measured": measured,
                     "rates": rates, "speedups": speedups,
                     "fit_runs": {name: fit.n_runs for name, fit in run_fits.items() if fit is not None},
                     "errors": {k: v / measured["speedup"] - 1 for k, v in speedups.items()}})
        line = (f"{(mode + ' ' + run)[:43]:<44}{measured['target']:>11.3f}{rates['label']['target']:>7.3f}"
                f"{rates['decod']['target']:>7.3f}{measured['draft']:>11.3f}{rates['label']['draft']:>7.3f}"
                f"{rates['decod']['draft']:>7.3f}{f'{iv.value:.3f} [{iv.low:.2f}, {iv.high:.2f}]':>22}")
        lines.append(line + "".join(f"{v:>17.3f}{rows[-1]['errors'][k]:>+8.1%}" for k, v in speedups.items()))
    lookup, lookup_rows = own_response_lines(cfg, ran, by_run, models_of)
    if not rows and not lookup:
        raise SimulationError(f"{cfg.output_dir} has no decoder traces beside finished runs, and no prompt-lookup "
                              f"runs (run `make eval` with this config to the end: it records them after the runs)")
    if rows:
        lines += _oracle_lines(rows, by_run, recorded_by_mode, every, fits, models)
    costs = [f"{name}: t_draft {f.t_draft * 1e3:.1f} ms, t_target {f.t_target * 1e3:.1f} ms per call"
             + (f" ({f.t_target_step * 1e3:.1f} ms per target-only step)" if f.t_target_step is not None else "")
             + (f", by length: a draft step {f.draft_step * 1e3:.1f} ms, a verification of m tokens "
                + ", ".join(f"{m}: {v * 1e3:.0f}" for m, v in sorted(f.verify_s.items())) + " ms"
                if f.verify_s else "")
             + f", intercepts {f.intercept:.2f} + {f.draft_intercept:.2f} s/run"
             + (f", R² {f.r2:.2f} over {f.n_runs} runs" if name == "fit" else "") for name, f in fits.items()]
    title = (f"predicted vs measured ({cfg.output_dir}; rates from label traces: {len(every)} prompts ({len(held_out)} "
             f"held out for heads), from decoder traces: the eval's prompts; speedups at each cost model, error = "
             f"predicted / measured − 1)\ncost models: " + "; ".join(costs)
             + (f"; {FIT_WITHOUT_RUN}: the runs' fit without the run it predicts" if FIT_WITHOUT_RUN in models else "")
             + ("; timing: --timing's costs by length" if priced is not None else ""))
    costs_of_choice = selection_fit(known, simulated=True)
    table = [head, "-" * len(head), *lines] if rows else []
    return "\n".join([title, *table, *lookup]), rows + lookup_rows, costs_of_choice.t_draft / costs_of_choice.t_target


def _oracle_lines(rows: list[dict], by_run: dict, recorded_by_mode: dict, every: list[Trace], fits: dict,
                  models: list[str]) -> list[str]:
    """``validate``'s oracle row per mode (over the same traces, computed for each cost model: the ceiling of every
    stop rule under it) and each run's share of its gain: (measured − 1) / (oracle − 1), set on ``rows``. The rates
    shown are the oracle's under the first cost model."""
    lines = []
    label_oracle = {name: simulate(every, "oracle", costs=fit) for name, fit in fits.items()}
    for mode, recorded in recorded_by_mode.items():
        base = [r for r in by_run.get((mode, "target_only"), []) if r["prompt"] in recorded]
        if not base:
            continue
        tokens = round(sum(r["stats"]["new_tokens"] for r in base) / len(base))
        decoded = [recorded[r["prompt"]] for r in base]
        oracle = {name: {"label": label_oracle[name], "decod": simulate(decoded, "oracle", costs=fit)}
                  for name, fit in fits.items()}
        speedups = {f"{src}·{name}": fits[name].predicted_speedup(c, tokens) for name, by_src in oracle.items()
                    for src, c in by_src.items()}
        rate = {src: (c.target / c.n, c.draft / c.n) for src, c in next(iter(oracle.values())).items()}
        line = (f"{(mode + ' oracle (Thm 4.1)')[:43]:<44}{'':>11}{rate['label'][0]:>7.3f}{rate['decod'][0]:>7.3f}"
                f"{'':>11}{rate['label'][1]:>7.3f}{rate['decod'][1]:>7.3f}{'':>22}")
        lines.append(line + "".join(f"{speedups[f'{src}·{name}']:>17.3f}{'':>8}" if f"{src}·{name}" in speedups
                                    else f"{'':>25}" for name in models for src in ("label", "decod")))
        shares = []
        for row in (r for r in rows if r["mode"] == mode):
            row["oracle_share"] = {k: (row["measured"]["speedup"] - 1) / (v - 1) for k, v in speedups.items() if v > 1}
            shares.append(f"{row['run']} " + " / ".join(f"{row['oracle_share'].get(f'{src}·{name}', float('nan')):.2f}"
                                                        for name in fits for src in ("label", "decod")))
        lines.append(f"{mode}: share of the oracle's gain, (measured − 1) / (oracle predicted − 1), oracle at "
                     + " / ".join(f"{src}·{name}" for name in fits for src in ("label", "decod")) + ": "
                     + "; ".join(shares))
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="specheads simulate", description=description(__doc__))
    p.add_argument("--labels", default="runs/labels/humaneval-heldout", help="a label folder (its `target` rows are traces)")
    p.add_argument("--splits", nargs="+", default=["val", "test"], choices=SPLITS,
                   help="splits whose prompts are replayed (default: the ones no head trained on)")
    p.add_argument("--heads", nargs="*", default=None,
                   help="exported heads to replay (default: every checkpoints/heads/*.safetensors)")
    p.add_argument("--c", type=float, nargs="+", default=[0.1, 0.2],
                   help="cost ratios t_draft / t_target to predict at")
    p.add_argument("--timing", default=None,
                   help="a bench_timing JSON: adds its c (--timing_draft / --timing_target), a column priced by its "
                        "costs by verification length, and the goodput stop of each stop head under them")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="a calibrated confidence (`make calibrate`): with --timing, adds the goodput stop on it")
    p.add_argument("--lookup_calibration", default=None, metavar="FILE",
                   help="prompt lookup's keep chance (`specheads calibrate --prompt_lookup`): with --timing, adds "
                        "prompt lookup's goodput stop")
    p.add_argument("--lookup_head", default=None, metavar="FILE",
                   help="a prompt-lookup stop head (`specheads train --configs configs/train/lookup_stop_d0.yaml`): "
                        "with --timing, adds prompt lookup's goodput stop on its chances, along labels that store "
                        "the target's states (`target_states: true`)")
    p.add_argument("--goodput_flat", action="store_true",
                   help="also the goodput stop of each stop head (and --calibration) under a flat cost at each --c "
                        "(every verification costs one target forward, a draft step c): SpecDec++'s cost model, "
                        "where the rule is a threshold rule whose h follows from the costs")
    p.add_argument("--timing_draft", default="draft", help="the draft's entry in --timing (default draft)")
    p.add_argument("--timing_target", default="target", help="the target's entry in --timing (default target)")
    p.add_argument("--eval", default=None, metavar="CONFIG",
                   help="an eval config whose finished runs to check the predictions against (adds its fitted c)")
    return p.parse_args(argv)


def _for_labels(head: str, manifest: dict, labels: str) -> bool:
    """Whether the head was trained for the draft of the labels (``check_labels`` passes)."""
    try:
        check_labels(head, manifest, labels)
    except HeadFileError:
        return False
    return True


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse_args(argv)
    check_cost_ratios(a.c, "--c")
    if a.calibration and not (a.timing or a.goodput_flat):
        raise SettingError("--calibration adds the goodput stop, which prices rounds by a timing file or at a flat "
                           "cost: give --timing or --goodput_flat")
    if (a.lookup_calibration or a.lookup_head) and not a.timing:
        raise SettingError(f"--{'lookup_calibration' if a.lookup_calibration else 'lookup_head'} adds prompt lookup's "
                           "goodput stop, which prices rounds by a timing file: give --timing")
    calibrated = CalibratedConfidence.load(a.calibration) if a.calibration else None  # a bad file: one line now
    lookup = LookupCalibration.load(a.lookup_calibration) if a.lookup_calibration else None
    lookup_head = LookupHead.load(a.lookup_head) if a.lookup_head else None
    costs = list(a.c)
    priced = None
    if a.timing:
        fit = read_timing(a.timing, a.timing_draft, a.timing_target)
        costs.append(fit.t_draft / fit.t_target)
        priced = fit
    manifest = read_manifest(a.labels)
    if lookup is not None:  # responses of another target say nothing of this one's keep chance
        lookup.check_target(manifest["models"]["target"], f"the target of the labels in {a.labels}")
    if lookup_head is not None:  # nor do another target's states
        check_draft(lookup_head.exported.meta, draft=manifest["models"]["target"], path=a.lookup_head)
    if calibrated is not None:  # replayed over labels of another draft, its estimates would predict nothing
        calibrated.check_draft(manifest["models"]["draft"], f"the draft of the labels in {a.labels}")
    if a.heads is None:  # every exported head the traces can replay, trained for the labels' draft
        found = sorted(str(p) for p in Path("checkpoints/heads").glob("*.safetensors"))
        heads = [h for h in found if replayable(h)]
        if len(heads) < len(found):
            print(f"not replayed (their heads read features the traces do not hold): "
                  f"{', '.join(Path(h).stem for h in found if h not in heads)}", file=sys.stderr)
        other = [h for h in heads if not _for_labels(h, manifest, a.labels)]
        if other:
            print(f"not replayed (their heads were trained for another draft than the labels'): "
                  f"{', '.join(Path(h).stem for h in other)}", file=sys.stderr)
        heads = [h for h in heads if h not in other]
    else:
        heads = a.heads
        for head in heads:  # a head replayed over labels of another draft would predict nothing about either
            check_labels(head, manifest, a.labels)
    traces = load_label_traces(a.labels, tuple(a.splits))
    seen = set().union(*(seen_prompts(read_metadata(h)) for h in [*heads, *filter(None, [a.lookup_head])]))
    kept = unseen(traces, seen)
    if len(kept) < len(traces):  # a head's speed on prompts it saw is optimistic: no policy is replayed on them
        print(f"left out {len(traces) - len(kept)} of {len(traces)} traces: prompts a head trained on or had its "
              f"threshold chosen on", file=sys.stderr)
    if not kept:
        raise SimulationError(f"every trace of {a.labels} ({', '.join(a.splits)}) is of a prompt a head has seen; "
                              "replay held-out labels (--labels) or name other heads (--heads)")
    traces = kept
    checks = None
    if a.eval:
        checks, _, measured_c = validate(a.labels, a.eval, priced)
        costs.append(measured_c)
    grid = default_grid(heads) + (goodput_grid(traces, heads, priced, a.calibration) if priced is not None else [])
    if a.goodput_flat:
        grid += [g for c in a.c for g in goodput_grid(traces, heads, CostModel.eq51(c), a.calibration)]
    text, rows = table(traces, grid, costs, priced)
    print(text)
    if checks:
        print(checks)
    print(prompt_lookup_lines(a.labels, tuple(a.splits), traces, costs, priced, lookup, lookup_head))
    for c in costs:
        picks = best_settings(rows, c)
        print(f"fastest at c = {c:.3g}: " + "; ".join(f"{r['policy']} {CostModel.eq51(c).speedup(r['counts']):.3f}x"
                                                    for r in picks.values()))
    return rows


if __name__ == "__main__":
    run_main(main)

"""``python -m evaluation.simulate``: stop and verification policies replayed over label traces, without decoding.

SpecDec++ §5: the verification rate N_target/N and the discard rate N_discarded/N do not depend on the hardware;
the latency follows from them and the per-forward times (Eq. 5.1), so the speedup over target-only at a cost ratio
c = t_draft / t_target is 1 / (N_target/N + c·N_draft/N).

Traces are the label shards' ``target`` rows: along each target-sampled response, at every position i, a candidate
Y_i drawn from q at the clean prefix X<i, with min(1, p/q)(Y_i), the draft's scores of it and both hidden states.
Every stop rule here decides from the candidate's features alone, so the round that starts at position s has a
fixed length n(s), and the expected counts follow exactly from a backward recursion over s: the round keeps
candidate j with probability a_{s+j} = min(1, p/q) until the first rejection. What this leaves out, and why it is
used anyway, is in ``evaluation/DESIGN.md`` ("The trace simulator").

The oracle (SpecDec++ Theorem 4.1) knows the acceptance draws: it drafts exactly the candidates that will be
accepted and stops before the first rejection, so it discards nothing: the ceiling for every stop rule.
"""

from __future__ import annotations

import argparse
import math
import sys
import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from core.shards import SPLITS, load_split, read_manifest
from heads.features import draft_scores
from heads.exported import ExportedHead

TRACE_CATEGORY = "target"
MAX_K = 20


@dataclass
class Trace:
    """One target-sampled response: per position, the candidate's acceptance probability and draft-side features."""

    prompt_id: int
    acceptance: np.ndarray
    """min(1, p/q) of the candidate at each position."""
    logp_draft: np.ndarray
    """log q of the candidate at its prefix."""
    entropy_draft: np.ndarray
    """H(q) at that prefix, nats."""
    hidden: torch.Tensor
    """(L, d) the draft's state after reading the candidate (feature position ``own``)."""
    hidden_prev: torch.Tensor
    """(L, d) the state that produced q for it (``prev``)."""
    logits: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """Each replayed head's logits on this trace, by head file (computed once, whatever the threshold)."""

    def __len__(self) -> int:
        return len(self.acceptance)


def load_traces(folder: str | Path, splits: tuple[str, ...] = ("val", "test")) -> list[Trace]:
    """The ``target`` traces of ``splits`` (default the prompts no head trained on), one per prompt."""
    columns = ["prompt_id", "position", "category", "loss_mask", "acceptance", "logp_draft", "entropy_draft",
               "hidden", "hidden_prev"]
    read_manifest(folder)  # the shards are the ones the manifest lists, intact
    traces = []
    for split in splits:
        ds = load_split(folder, split)
        meta = ds.select_columns(["category", "loss_mask"]).with_format("numpy")[:]
        keep = np.flatnonzero((meta["category"] == TRACE_CATEGORY) & meta["loss_mask"])
        rows = ds.select(keep).select_columns(columns).with_format("numpy")[:]
        for pid in np.unique(rows["prompt_id"]):
            idx = np.flatnonzero(rows["prompt_id"] == pid)
            idx = idx[np.argsort(rows["position"][idx])]
            traces.append(Trace(
                prompt_id=int(pid), acceptance=rows["acceptance"][idx].astype(np.float64),
                logp_draft=rows["logp_draft"][idx].astype(np.float64),
                entropy_draft=rows["entropy_draft"][idx].astype(np.float64),
                hidden=torch.from_numpy(np.stack(rows["hidden"][idx])),
                hidden_prev=torch.from_numpy(np.stack(rows["hidden_prev"][idx]))))
    if not traces:
        raise SystemExit(f"error: {folder} has no {TRACE_CATEGORY!r} rows in {', '.join(splits)}")
    return traces


# ---------------------------------------------------------------------------------------------------------------
# stop rules as round lengths


def round_lengths(stops: np.ndarray, reads_candidate: bool, max_k: int) -> np.ndarray:
    """n(s) for every start s of one trace from per-position stop signals of a stateless rule: the round drafts
    candidates s, s+1, … and stops after the first one whose signal fires (one more when the rule read the
    candidate's own forward, as Algorithm 1 submits it), at most ``max_k``, and leaves room for the target token."""
    length = len(stops)
    out = np.zeros(length, dtype=np.int64)
    for s in range(length):
        cap = min(max_k, length - s - 1)
        n = 0
        while n < cap:
            n += 1
            if stops[s + n - 1]:
                n = min(n + 1, cap) if reads_candidate else n
                break
        out[s] = n
    return out


def head_round_lengths(log_accept: np.ndarray, h: float, reads_candidate: bool, max_k: int) -> np.ndarray:
    """n(s) for SpecDec++'s rule: stop once 1 − ∏ sigmoid(f) over the round's candidates exceeds h."""
    length = len(log_accept)
    out = np.zeros(length, dtype=np.int64)
    for s in range(length):
        cap = min(max_k, length - s - 1)
        n, total = 0, 0.0
        while n < cap:
            n += 1
            total += log_accept[s + n - 1]
            if 1.0 - math.exp(total) > h:
                n = min(n + 1, cap) if reads_candidate else n
                break
        out[s] = n
    return out


@dataclass
class Counts:
    """Expected counts over traces (N: tokens produced)."""

    n: float = 0.0
    draft: float = 0.0
    target: float = 0.0
    discarded: float = 0.0

    def __iadd__(self, other: "Counts") -> "Counts":
        self.n += other.n
        self.draft += other.draft
        self.target += other.target
        self.discarded += other.discarded
        return self

    def speedup(self, c: float, intercept: float = 0.0) -> float:
        """Target-only latency over this policy's, in target forwards: Eq. 5.1 at c = t_draft / t_target,
        plus a per-token overhead ``intercept`` (in target forwards) on both sides."""
        return (self.n * (1 + intercept)) / (self.target + c * self.draft + self.n * intercept)


def expected_counts(acceptance: np.ndarray, lengths: np.ndarray) -> Counts:
    """Exact expected counts of speculative sampling over one trace with round lengths n(s)."""
    length = len(acceptance)
    draft, target, discarded = (np.zeros(length + 2) for _ in range(3))  # index ≥ length: nothing left
    for s in range(length - 1, -1, -1):
        n = int(lengths[s])
        reach = 1.0  # probability that candidates s..s+j-1 were all accepted
        d = t = x = 0.0
        for j in range(n):
            p_reject = reach * (1.0 - acceptance[s + j])
            nxt = min(s + j + 1, length)
            d, t, x = d + p_reject * draft[nxt], t + p_reject * target[nxt], x + p_reject * (discarded[nxt] + n - j)
            reach *= acceptance[s + j]
        nxt = min(s + n + 1, length)
        draft[s] = n + d + reach * draft[nxt]
        target[s] = 1 + t + reach * target[nxt]
        discarded[s] = x + reach * discarded[nxt]
    return Counts(n=length, draft=draft[0], target=target[0], discarded=discarded[0])


def oracle_counts(acceptance: np.ndarray) -> Counts:
    """SpecDec++ Theorem 4.1's oracle: drafts while the candidate will be accepted, stops before a rejection. Each
    position then costs a draft forward if accepted and a target call if rejected (plus the call that verifies
    the accepted run at the end of the trace, which the bonus token pays for)."""
    a = acceptance
    return Counts(n=len(a), draft=float(a.sum()), target=float((1 - a).sum()), discarded=0.0)


def sprinter_counts(accepts: np.ndarray) -> Counts:
    """SPRINTER (Algorithm 2): one draft forward per token; the target runs at each token the verifier rejects."""
    return Counts(n=len(accepts), draft=float(len(accepts)), target=float((~accepts).sum()), discarded=0.0)


# ---------------------------------------------------------------------------------------------------------------
# policies


cached_head = functools.lru_cache(maxsize=None)(ExportedHead)
"""An exported head by file, loaded once per process."""


def sd_round_lengths(length: int, k: int) -> np.ndarray:
    """n(s) of fixed-K SD: K candidates, fewer where the round's target token would not fit."""
    return np.minimum(k, np.maximum(length - np.arange(length) - 1, 0))


def head_logits(head: ExportedHead, trace: Trace) -> np.ndarray:
    """The head's logit at every position of the trace (one batched forward, remembered on the trace)."""
    key = str(head.path)
    if key not in trace.logits:
        hidden = trace.hidden if head.position == "own" else trace.hidden_prev
        scores = draft_scores(head.scores, torch.from_numpy(trace.logp_draft), torch.from_numpy(trace.entropy_draft))
        with torch.no_grad():
            out = head.module(hidden.float(), scores) if head.scores else head.module(hidden.float())
        trace.logits[key] = out.double().numpy()
    return trace.logits[key]


def simulate(traces: list[Trace], family: str, max_k: int = MAX_K, **params) -> Counts:
    """Expected counts of one policy (``sd`` k, ``confidence`` threshold, ``svip`` h, ``specdecpp`` head + h,
    ``sprinter`` head + tau, ``oracle``) summed over the traces."""
    total = Counts()
    for tr in traces:
        if family == "oracle":
            total += oracle_counts(tr.acceptance)
            continue
        if family == "sd":
            lengths = sd_round_lengths(len(tr), params["k"])
        elif family == "confidence":
            lengths = round_lengths(np.exp(tr.logp_draft) < params["threshold"], False, max_k)
        elif family == "svip":
            lengths = round_lengths(np.sqrt(np.maximum(tr.entropy_draft, 0)) > params["h"], False, max_k)
        elif family in ("specdecpp", "sprinter"):
            head = cached_head(params["head"])
            logits = head_logits(head, tr)
            threshold = params.get("h" if family == "specdecpp" else "tau")
            threshold = head.threshold if threshold is None else threshold
            if family == "sprinter":
                total += sprinter_counts(1 / (1 + np.exp(-logits)) >= threshold)
                continue
            log_accept = -np.logaddexp(0.0, -logits)
            lengths = head_round_lengths(log_accept, threshold, head.position == "own", max_k)
        else:
            raise ValueError(f"the simulator has no policy {family!r}")
        total += expected_counts(tr.acceptance, lengths)
    return total


def default_grid(heads: list[str]) -> list[tuple[str, dict]]:
    """Every policy and a grid of its setting: the stop heads and verifiers among ``heads`` at their own and a few
    other thresholds."""
    grid = [("sd", {"k": k}) for k in range(1, 11)]
    grid += [("confidence", {"threshold": t}) for t in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)]
    grid += [("svip", {"h": h}) for h in (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)]
    for path in heads:
        role = cached_head(path).role
        family, name = ("specdecpp", "h") if role == "stop" else ("sprinter", "tau")
        grid += [(family, {"head": path, name: v}) for v in (None, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)]
    return grid


def describe(family: str, params: dict) -> str:
    shown = {k: (Path(v).stem if k == "head" else ("file" if v is None else f"{v:g}")) for k, v in params.items()}
    return family + (f"[{','.join(f'{k}={v}' for k, v in shown.items())}]" if shown else "")


def table(traces: list[Trace], grid: list[tuple[str, dict]], costs: list[float]) -> tuple[str, list[dict]]:
    oracle = simulate(traces, "oracle")
    rows = [{"policy": "oracle (Thm 4.1)", "family": "oracle", "params": {}, "counts": oracle}]
    for family, params in grid:
        rows.append({"policy": describe(family, params), "family": family, "params": params,
                     "counts": simulate(traces, family, **params)})
    head = f"{'policy':<52}{'N_t/N':>7}{'N_d/N':>7}{'N_x/N':>7}" + "".join(
        f"{f'c={c:.3g}':>9}{'share':>7}" for c in costs)
    lines = [f"{len(traces)} traces, {int(oracle.n)} positions; speedup over target-only at each c, and its share "
             f"of the oracle's gain (speedup − 1)/(oracle − 1); SPRINTER is approximate", head, "-" * len(head)]
    for r in rows:
        k = r["counts"]
        line = f"{r['policy'][:51]:<52}{k.target / k.n:>7.3f}{k.draft / k.n:>7.3f}{k.discarded / k.n:>7.3f}"
        for c in costs:
            s, best = k.speedup(c), oracle.speedup(c)
            line += f"{s:>9.3f}{(s - 1) / (best - 1) if best > 1 else float('nan'):>7.2f}"
        lines.append(line)
    return "\n".join(lines), rows


def best_settings(rows: list[dict], c: float) -> dict[str, dict]:
    """The fastest setting of each exact family at c (SPRINTER's is chosen by quality, not here)."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["family"] in ("oracle", "sprinter"):
            continue
        key = r["family"] + (f":{Path(r['params']['head']).stem}" if "head" in r["params"] else "")
        if key not in best or r["counts"].speedup(c) > best[key]["counts"].speedup(c):
            best[key] = r
    return best


SIMULATED = ("sd", "confidence", "svip", "specdecpp", "sprinter")


def validate(traces: list[Trace], config: str) -> tuple[str, list[dict]]:
    """Predicted against measured, per run of a finished ``make eval`` (its config): N_target/N, N_draft/N and the
    speedup over target-only. Both speedups use the eval's own latency fit (Eq. 5.1 with its per-run intercept);
    the measured one is the wall-time ratio on the prompts both runs decoded."""
    from evaluation.__main__ import parse
    from evaluation.latency import fit_records
    from evaluation.results import ResultStore

    cfg, _ = parse(["--config", config])
    records = ResultStore(Path(cfg.output_dir) / "results.jsonl").records()
    fit = fit_records([r for r in records if r["stats"].get("draft_calls") is not None])
    if fit is None:
        raise SystemExit(f"error: {cfg.output_dir} holds too few finished runs to fit the latency model")
    fixed = {p.family: p.fixed for p in cfg.policies}
    by_run: dict[str, list[dict]] = {}
    for r in records:
        by_run.setdefault(r["run"], []).append(r)
    baseline = {r["prompt"]: r["stats"] for r in by_run.get("target_only", [])}
    rows, lines = [], []
    head = f"{'run':<58}{'N_t/N meas':>11}{'pred':>7}{'N_d/N meas':>11}{'pred':>7}{'speedup meas':>13}{'pred':>7}" \
           f"{'error':>8}"
    for run, recs in by_run.items():
        family = recs[0]["family"]
        recs = [r for r in recs if r["prompt"] in baseline]
        if family not in SIMULATED or not recs:
            continue
        counts = simulate(traces, family, **{**fixed.get(family, {}), **recs[0]["params"]})
        n = sum(r["stats"]["new_tokens"] for r in recs)
        measured = {"target": sum(r["stats"]["target_calls"] for r in recs) / n,
                    "draft": sum(r["stats"]["draft_calls"] for r in recs) / n,
                    "speedup": sum(baseline[r["prompt"]]["wall_s"] for r in recs) / sum(r["stats"]["wall_s"] for r in recs)}
        per_run = n / len(recs)
        predicted_wall = fit.predict(counts.draft / counts.n * per_run, counts.target / counts.n * per_run)
        predicted = {"target": counts.target / counts.n, "draft": counts.draft / counts.n,
                     "speedup": float(fit.predict(0, per_run) / predicted_wall)}
        error = predicted["speedup"] / measured["speedup"] - 1
        rows.append({"run": run, "family": family, "prompts": len(recs), "measured": measured, "predicted": predicted,
                     "speedup_error": error})
        lines.append(f"{run[:57]:<58}{measured['target']:>11.3f}{predicted['target']:>7.3f}{measured['draft']:>11.3f}"
                     f"{predicted['draft']:>7.3f}{measured['speedup']:>13.3f}{predicted['speedup']:>7.3f}"
                     f"{error:>+8.1%}")
    title = (f"predicted vs measured ({cfg.output_dir}; latency fit t_draft {fit.t_draft * 1e3:.1f} ms, t_target "
             f"{fit.t_target * 1e3:.1f} ms, intercept {fit.intercept:.2f} s/run, c = {fit.t_draft / fit.t_target:.3f})")
    return "\n".join([title, head, "-" * len(head), *lines]), rows, fit.t_draft / fit.t_target


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m evaluation.simulate", description=__doc__.split("\n")[0])
    p.add_argument("--labels", default="runs/labels/humaneval", help="a label folder (its `target` rows are traces)")
    p.add_argument("--splits", nargs="+", default=["val", "test"], choices=SPLITS,
                   help="splits whose prompts are replayed (default: the ones no head trained on)")
    p.add_argument("--heads", nargs="*", default=None,
                   help="exported heads to replay (default: every checkpoints/heads/*.safetensors)")
    p.add_argument("--c", type=float, nargs="+", default=[0.1, 0.2],
                   help="cost ratios t_draft / t_target to predict at")
    p.add_argument("--timing", default=None, help="a bench_timing JSON: adds its c (--timing-draft / --timing-target)")
    p.add_argument("--timing-draft", default="draft")
    p.add_argument("--timing-target", default="target")
    p.add_argument("--eval", default=None, metavar="CONFIG",
                   help="an eval config whose finished runs to check the predictions against (adds its fitted c)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    import json

    from evaluation.latency import timing_fit

    a = parse_args(argv)
    costs = list(a.c)
    if a.timing:
        fit = timing_fit(json.loads(Path(a.timing).read_text()), a.timing_draft, a.timing_target)
        costs.append(fit.t_draft / fit.t_target)
    heads = a.heads if a.heads is not None else sorted(str(p) for p in Path("checkpoints/heads").glob("*.safetensors"))
    traces = load_traces(a.labels, tuple(a.splits))
    checks = None
    if a.eval:
        checks, _, measured_c = validate(traces, a.eval)
        costs.append(measured_c)
    text, rows = table(traces, default_grid(heads), costs)
    print(text)
    if checks:
        print(checks)
    for c in costs:
        picks = best_settings(rows, c)
        print(f"fastest at c = {c:.3g}: " + "; ".join(f"{r['policy']} {r['counts'].speedup(c):.3f}x"
                                                    for r in picks.values()))
    return rows


if __name__ == "__main__":
    main()
    sys.exit(0)

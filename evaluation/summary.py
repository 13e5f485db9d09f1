"""From per-run records to per-policy figures: totals, rates, per-prompt speedups, agreement with target-only,
and SPRINTER's Theorem 7 check. The choice of K, h, τ from them is ``evaluation.selection``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import UserError
from core.label_math import ROWS_FOR_LABEL
from decoding.policies import POLICIES
from decoding.costs import CostModel
from evaluation import llama_peer

@dataclass
class Totals:
    """Sums over a set of prompts of one (mode, run)."""

    run: str
    family: str
    params: dict
    prompts: list[int]
    wall_s: float
    new_tokens: int
    target_calls: int | None
    draft_calls: int | None
    discarded: int | None
    accepted_lengths: list[int] | None
    passed: list[bool | None]
    draft_catch_up: int | None = None
    """Tokens the draft read beyond one a forward (``DecodeStats.draft_catch_up``); None where a run has no count."""
    target_reads: dict[int, int] | None = None
    """The target's forwards by the tokens each read (``DecodeStats.target_reads``); None where a run has none."""

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def s_per_token(self) -> float:
        return self.wall_s / self.new_tokens if self.new_tokens else float("inf")

    @property
    def verification_rate(self) -> float | None:
        return None if self.target_calls is None or not self.new_tokens else self.target_calls / self.new_tokens

    @property
    def discard_rate(self) -> float | None:
        return None if self.discarded is None or not self.new_tokens else self.discarded / self.new_tokens

    @property
    def mean_accepted(self) -> float | None:
        return float(np.mean(self.accepted_lengths)) if self.accepted_lengths else None

    @property
    def drafted(self) -> int | None:
        """Draft tokens proposed: the ones kept (``accepted_lengths``) plus the ones discarded."""
        if self.accepted_lengths is None or self.discarded is None:
            return None
        return sum(self.accepted_lengths) + self.discarded

    @property
    def draft_kept_rate(self) -> float | None:
        """Draft tokens kept / draft tokens proposed. SPRINTER tests every draft token on its own, so for it this
        estimates Theorem 7's acceptance rate; SD discards the tail of a round untested."""
        return sum(self.accepted_lengths) / self.drafted if self.drafted else None

    @property
    def unused_forwards(self) -> int | None:
        """N_draft + N_target − N − N_discarded: forwards whose output no token came from. SpecDec++ Lemma 3.1
        makes it 0 for every policy that verifies rounds with the target, except one per generation that ends on
        an accepted EOS candidate (that target call adds no token); a draft forward whose q is thrown away adds
        one. Not defined for a policy whose tokens may skip the target (SPRINTER: ``lemma31`` in its
        registration)."""
        policy = POLICIES.get(self.family)  # None for a peer's run
        if (policy is not None and not policy.lemma31) or self.family == llama_peer.PROMPT_LOOKUP \
                or None in (self.draft_calls, self.target_calls, self.discarded):
            return None
        return self.draft_calls + self.target_calls - self.new_tokens - self.discarded

    @property
    def pass_at_1(self) -> float | None:
        known = [p for p in self.passed if p is not None]
        return sum(known) / len(known) if known else None

    def predicted_s_per_token(self, fit: CostModel | None) -> float | None:
        """Eq. 5.1 over these runs' counts with the draft's catch-up; None where the fit prices a catch-up that runs
        which drafted did not count (records made before runs kept the count): a prediction without it would be
        cheaper than its neighbours' for no reason of its own."""
        if fit is None or self.draft_calls is None or self.target_calls is None or not self.new_tokens:
            return None
        if self.draft_catch_up is None and self.draft_calls and fit.draft_catch_up:
            return None
        calls = None
        if self.target_reads is not None:  # each forward at its own length; the rest read a prompt: one step each
            calls = np.zeros(max(self.target_reads, default=1) + 1)
            for m, n in self.target_reads.items():
                calls[m] += n
            calls[1] += self.target_calls - sum(self.target_reads.values())
        return float(fit.predict(self.draft_calls, self.target_calls, len(self.prompts), calls=calls,
                                 catch_up=self.draft_catch_up or 0)) / self.new_tokens


def _sum(values):
    return None if any(v is None for v in values) else sum(values)


def index(records: list[dict]) -> dict[tuple[str, str], dict[int, dict]]:
    """(mode, run) → {prompt: record}."""
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for r in records:
        out.setdefault((r["mode"], r["run"]), {})[int(r["prompt"])] = r
    return out


def totals(by_prompt: dict[int, dict], prompts: list[int] | None = None) -> Totals | None:
    """Totals over ``prompts`` (all recorded ones when None); None when one of them is missing."""
    ids = sorted(by_prompt) if prompts is None else list(prompts)
    if not ids or any(p not in by_prompt for p in ids):
        return None
    recs = [by_prompt[p] for p in ids]
    stats = [r["stats"] for r in recs]
    lengths = [s.get("accepted_lengths") for s in stats]
    reads = [s.get("target_reads") for s in stats]
    target_reads = None
    if all(r is not None for r in reads):
        target_reads = {}
        for r in reads:
            for m, n in r.items():
                target_reads[int(m)] = target_reads.get(int(m), 0) + int(n)
    return Totals(
        run=recs[0]["run"], family=recs[0]["family"], params=recs[0]["params"], prompts=ids,
        wall_s=sum(s["wall_s"] for s in stats), new_tokens=sum(s["new_tokens"] for s in stats),
        target_calls=_sum([s.get("target_calls") for s in stats]), draft_calls=_sum([s.get("draft_calls") for s in stats]),
        discarded=_sum([s.get("discarded") for s in stats]),
        accepted_lengths=None if any(v is None for v in lengths) else [a for v in lengths for a in v],
        passed=[r.get("passed") for r in recs],
        draft_catch_up=_sum([s.get("draft_catch_up") for s in stats]),
        target_reads=target_reads,
    )


def per_prompt_speedup(run: dict[int, dict], base: dict[int, dict]) -> dict[int, float]:
    """Per prompt: tokens/s of ``run`` over tokens/s of ``base`` (prompts both finished, with tokens)."""
    out = {}
    for p, r in run.items():
        b = base.get(p)
        if b is None or not r["stats"]["new_tokens"] or not b["stats"]["new_tokens"]:
            continue
        rate = r["stats"]["new_tokens"] / r["stats"]["wall_s"]
        base_rate = b["stats"]["new_tokens"] / b["stats"]["wall_s"]
        out[p] = rate / base_rate
    return out


def agreement(run: dict[int, dict], base: dict[int, dict]) -> dict | None:
    """Greedy decoding, where an exact policy must repeat target-only token for token: on the prompts both
    finished, the share whose tokens are identical and the mean share of ``base``'s tokens before the first
    difference (numerics, e.g. bf16 batched verification against one-token steps, can flip a near-tie)."""
    ids = sorted(set(run) & set(base))
    if not ids:
        return None
    same, prefix = 0, []
    for p in ids:
        a, b = run[p]["tokens"], base[p]["tokens"]
        same += a == b
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n / len(b) if b else 1.0)
    return {"identical": same / len(ids), "common_prefix": float(np.mean(prefix)), "n": len(ids)}


def label_tv(labels_dir: str | Path) -> dict:
    """Mean TV(p, q) over the test split's draft tokens (``loss_mask``) of the SPRINTER prefix categories (the
    verifier's rows, ``ROWS_FOR_LABEL``), with the sampling and the draft the labels were made with (manifest)."""
    from core.shards import load_split, read_manifest

    manifest = read_manifest(labels_dir)
    categories = ROWS_FOR_LABEL["sprinter"]
    cols = load_split(labels_dir, "test").select_columns(["category", "loss_mask", "tv"]).with_format("numpy")[:]
    rows = cols["loss_mask"].astype(bool) & np.isin(cols["category"].astype(str), categories)
    if not rows.any():
        raise ValueError(f"{labels_dir}: no draft-token rows of the categories {', '.join(categories)} in test")
    return {"mean_tv": float(cols["tv"][rows].mean()), "rows": int(rows.sum()), "sampling": manifest["sampling"],
            "draft": manifest["models"]["draft"]}


def theorem7_kept_rate(eta_fp: float, tv: float) -> float:
    """SPRINTER Theorem 7: a draft token is kept with probability 1 − (1 − η_FP)·TV(p, q)."""
    return 1 - (1 - eta_fp) * tv


def _theorem7_prediction(head: str, labels: dict) -> dict:
    """Theorem 7's kept rate for one exported verifier at its exported τ, from its test η_FP (both forms)."""
    from heads.export import HeadFileError, check_draft, read_metadata

    meta = read_metadata(head)
    check_draft(meta, draft=labels["draft"], path=head)
    metrics = meta["metrics"]  # pipeline.metrics.SplitMetrics on the test split, exported by train_all
    eta_fp, eta_fp_weighted = metrics.get("test/head/eta_fp_thm"), metrics.get("test/head/eta_fp_thm_weighted")
    if eta_fp is None:
        raise HeadFileError(f"{head} has no test η_FP against q/p > 1 (trained before it was measured: run "
                            "`make train` again)")
    tv = labels["mean_tv"]
    return {"exported_tau": float(meta["threshold"]["value"]), "eta_fp": eta_fp, "eta_fp_weighted": eta_fp_weighted,
            "predicted": theorem7_kept_rate(eta_fp, tv),
            "predicted_weighted": None if eta_fp_weighted is None else theorem7_kept_rate(eta_fp_weighted, tv)}


def sprinter_theorem7(records: list[dict], modes: list, fixed_head: str | None, labels_dir: str | None) -> dict:
    """Per SPRINTER run: its measured rate of kept draft tokens (``draft_kept_rate``) against Theorem 7's
    prediction for its head (``heads``: the run's ``head`` parameter, else ``fixed_head``), with TV(p, q) averaged
    over the labels' test rows and η_FP from the head file's test metrics, valid at its exported τ only:
    P(P̂ ≥ τ | q/p > 1) as the theorem states it (``predicted``), and weighted by the excess mass
    (``predicted_weighted``, exact for a head whose acceptance varies token to token; see
    ``pipeline.metrics.ExcessMassAcceptRate``). Only modes sampled like the labels take part (TV depends on the
    warping). ``skipped`` says why nothing could be checked, ``not_checked`` why some runs were not."""
    out = {"labels_dir": labels_dir, "heads": {}, "runs": [], "skipped": None, "not_checked": []}
    runs = index([r for r in records if r["family"] == "sprinter"])
    if not runs or labels_dir is None:
        return {**out, "skipped": "no SPRINTER runs" if not runs else "needs `labels_dir`"}
    try:
        labels = label_tv(labels_dir)
    except (OSError, ValueError, UserError) as e:  # no labels there, damaged ones, or none of the verifier's rows
        return {**out, "skipped": str(e)}
    out.update(mean_tv=labels["mean_tv"], tv_rows=labels["rows"])
    sampled_like_labels = {m.name for m in modes if m.samples_like(labels["sampling"])}
    problems = {}
    for (mode, run), by_prompt in sorted(runs.items()):
        t = totals(by_prompt)
        if mode not in sampled_like_labels or t is None or t.draft_kept_rate is None:
            continue
        head = t.params.get("head", fixed_head)
        if head is None:
            problems[run] = f"{run} names no head file"
            continue
        if head not in out["heads"] and head not in problems:
            try:
                out["heads"][head] = _theorem7_prediction(head, labels)
            except (OSError, ValueError) as e:  # a missing or malformed head file, a head of another draft
                problems[head] = str(e)
        if head in problems:
            continue
        run_tau = t.params.get("tau")
        exported_tau = out["heads"][head]["exported_tau"]
        out["runs"].append({"mode": mode, "run": run, "head": head, "tau": exported_tau if run_tau is None else run_tau,
                            "at_exported_tau": run_tau is None or math.isclose(run_tau, exported_tau, abs_tol=1e-9),
                            "kept_rate": t.draft_kept_rate, "drafted": t.drafted})
    out["not_checked"] = list(problems.values())
    if not out["runs"]:
        out["skipped"] = "; ".join(problems.values()) or \
            f"no SPRINTER run in a mode sampled like the labels ({labels['sampling']})"
    out["runs"].sort(key=lambda r: (r["head"], not r["at_exported_tau"]))  # per head, predicted runs first
    return out


CONTENDED_LOAD = 1.0
"""How far the 1-minute load may exceed the eval's threads before a run counts as timed on a shared CPU: the eval's
own Python and tokenizer work adds a little over its compute threads."""


def contention(records: list[dict]) -> dict | None:
    """How many runs were timed while other work shared the CPU (their 1-minute load above the eval's threads +
    ``CONTENDED_LOAD``), among the runs that recorded a load (CPU runs); None when none did (a GPU eval, another
    platform, or records written before the load was kept)."""
    loads = [(r["load_1min"], r["threads"]) for r in records if "load_1min" in r]
    if not loads:
        return None
    return {"runs": len(loads), "contended": sum(load > threads + CONTENDED_LOAD for load, threads in loads),
            "max_load": max(load for load, _ in loads), "threads": max(threads for _, threads in loads)}


def spread(values: list[float]) -> dict:
    """Mean, std, and quartiles of per-prompt values."""
    if not values:
        return {"mean": math.nan, "std": math.nan, "q25": math.nan, "median": math.nan, "q75": math.nan, "n": 0}
    a = np.asarray(values, float)
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
            "q25": float(np.quantile(a, 0.25)), "median": float(np.median(a)), "q75": float(np.quantile(a, 0.75)),
            "n": len(a)}

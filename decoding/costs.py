"""The cost model of SpecDec++ Eq. 5.1: T_total ≈ t_draft·N_draft + t_target·N_target.

SpecDec++ §5.2 fits the two per-forward times by linear regression over measured runs and reports R²; with
them (or with per-forward times measured on another device by ``bench_timing``) the latency of any run can be
predicted from its counts alone, so CPU-measured acceptance traces transfer to a GPU. Fitting it to runs is
``evaluation.latency``; this module holds the model and the costs a timing file gives (``timing_fit``), which
``pipeline`` also reads to choose a stop head's exported threshold at the exporting device's costs.

From timed forwards (``timing_fit``) the model is Eq. 5.1 with the costs Eq. 5.1 leaves out. A verification of
n candidates is one target forward of m = n + 1 tokens, which costs v0 + v1·m: on a CPU a forward of a few tokens
leaves the one-token step's fast path (the 1.5B float32 target: 0.46 s for one token, 0.89 s for 4, 1.31 s for 9),
on a GPU v1 is near 0. Each candidate is verified once, so Σ m = N_draft + N_target and the model stays linear:
t_draft = draft step + v1, t_target = v0 + v1 per call of a run that drafts, the one-token step per call of a run
that does not (target-only), and each model's prefill (beyond one step) once per run.

A line through two lengths does not describe every device: on 2 CPU cores the 1.5B target takes 0.50 s for one
token, 1.07 s for two, 1.34 s for three and 1.84 s for ten, so v0 + v1·m through 3 and 10 tokens charges a two-token
verification 1.27 s, a fifth too much, and a rule whose rounds often stop after one candidate looks slower than it
is. When the timing holds a verification of several lengths (``verify_by_tokens``), the fit keeps that table, and a
prediction that knows how many verifications had each length (the trace simulator's) charges each its own cost,
interpolated between the lengths timed: Σ_m calls(m)·T(m) + draft step·N_draft.

A draft forward does not always read one token: after a fully accepted round it reads the last candidate and the
bonus token (``decoding.replay.Counts.catch_up``). On a GPU that costs a step; on a CPU it costs nearly two (llama.cpp
at one thread: 27.6 ms more on a 36 ms step, 14 % of SD's wall at K = 1, which the simulator did not see). A timing
file with the draft's ``catch_up`` (a forward of two new tokens with one row out, as the decoder reads them) charges
each token beyond one its share (``LatencyFit.draft_catch_up``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.device import same_device
from core.errors import UserError
from decoding.replay import RoundCosts


class TimingFileError(UserError):
    """A timing file that cannot be read as ``bench_timing`` JSON, or lacks the models asked for."""


@dataclass
class LatencyFit:
    """Per-forward times (seconds) fitted from runs, with the fit's quality."""

    t_draft: float
    """Seconds per draft forward (one token with KV cache)."""
    t_target: float
    """Seconds per target forward (a verification of a few tokens costs about one decode step)."""
    intercept: float
    """Per-run overhead (prefill beyond one forward, Python bookkeeping); 0 when fitted without one."""
    r2: float
    """Coefficient of determination of the fit over the runs."""
    n_runs: int
    """Runs the fit used."""
    draft_intercept: float = 0.0
    """Per-run overhead of runs that use the draft (its prefill beyond one step); 0 in a regression fit, where
    ``intercept`` absorbs it."""
    t_target_step: float | None = None
    """Seconds per target forward in a run that drafts nothing (a one-token step); None: ``t_target``."""
    verify_s: dict[int, float] | None = None
    """Seconds of a target forward of m tokens (a verification of m − 1 candidates), timed at a few m; None: only
    the line ``t_target`` + ``t_draft`` (module docstring)."""
    draft_step: float | None = None
    """Seconds of one draft forward alone (``t_draft`` also carries the verification's per-token slope); with
    ``verify_s``."""
    draft_catch_up: float = 0.0
    """Seconds a draft forward adds for each token it reads beyond one (``decoding.replay.Counts.catch_up``): the
    timed forward of two new tokens with one row out, less the step; 0 where the timing file has none."""

    def predict(self, n_draft, n_target, runs: int | np.ndarray = 1, calls: np.ndarray | None = None,
                catch_up=0.0):
        """Eq. 5.1 (plus ``intercept`` per run, and ``draft_intercept`` per run that drafted). ``calls[m]``: the
        target calls of a run that drafted, by the tokens each verified (they sum to ``n_target``); with
        ``verify_s`` each call is charged the forward of its own length. ``catch_up``: tokens the draft read beyond
        one per forward, each charged ``draft_catch_up``."""
        extra = self.draft_catch_up * np.asarray(catch_up, float)
        if calls is not None and self.verify_s is not None and np.asarray(n_draft) > 0:
            verify = sum(float(n) * self.verify_time(m) for m, n in enumerate(calls) if n)
            return self.draft_step * n_draft + verify + (self.intercept + self.draft_intercept) * runs + extra
        n_draft, runs = np.asarray(n_draft), np.asarray(runs)
        drafted = n_draft > 0
        t_target = np.where(drafted, self.t_target, self.t_target if self.t_target_step is None else self.t_target_step)
        return self.t_draft * n_draft + t_target * np.asarray(n_target) + self.intercept * runs \
            + self.draft_intercept * runs * drafted + extra

    def verify_time(self, tokens: int) -> float:
        """``verify_s`` at ``tokens``: interpolated between the lengths timed, the one-token step at one, and
        beyond the longest on the line through the last two, never below the longest (a cheaper longest length is
        the kernels' blocking, not a trend)."""
        step = self.t_target if self.t_target_step is None else self.t_target_step
        m, s = zip(*sorted({1: step, **self.verify_s}.items()))
        if tokens <= m[-1]:
            return float(np.interp(tokens, m, s))
        return s[-1] + max(0.0, (s[-1] - s[-2]) / (m[-1] - m[-2])) * (tokens - m[-1])

    def round_costs(self) -> RoundCosts:
        """The costs ``predict`` charges a run that drafts, per draft forward and per verification of m tokens
        (what the oracle is computed for): with ``verify_s``, the draft step and each length's own forward; else
        ``t_draft`` and ``t_target`` whatever the length."""
        if self.verify_s is not None:
            return RoundCosts(draft=self.draft_step, verify=self.verify_time, name="by length",
                              catch_up=self.draft_catch_up)
        return RoundCosts(draft=self.t_draft, verify=lambda m: self.t_target, name="per call",
                          catch_up=self.draft_catch_up)

    def to_dict(self) -> dict:
        return asdict(self)


def timing_fit(timing: dict, draft: str = "draft", target: str = "target") -> LatencyFit:
    """Per-forward costs from a ``bench_timing`` JSON (module docstring): decode steps at the shortest cache length
    measured, the target's verify slope, and both prefills; a name is an entry's (its first precision) or
    ``name@precision``."""
    d, t = find_entry(timing, draft), find_entry(timing, target)
    d_step, t_step = step_s(d), step_s(t)
    v0, v1 = verify_costs(t)
    table = verify_table(t)
    return LatencyFit(t_draft=d_step + v1, t_target=v0 + v1, t_target_step=t_step,
                      intercept=max(0.0, t["prefill"]["median_s"] - t_step),
                      draft_intercept=max(0.0, d["prefill"]["median_s"] - d_step), r2=float("nan"), n_runs=0,
                      verify_s=table,
                      draft_step=d_step if table else None,
                      draft_catch_up=catch_up_s(d, d_step))


def catch_up_s(entry: dict, step: float) -> float:
    """Seconds a forward adds per token read beyond one, from an entry's ``catch_up`` (a forward of several new
    tokens with one row out); 0 where the entry has none (files timed before it was)."""
    timed = entry.get("catch_up")
    if not timed:
        return 0.0
    return max(0.0, (float(timed["median_s"]) - step) / (int(timed["tokens"]) - 1))


def verify_table(entry: dict) -> dict[int, float] | None:
    """m → seconds of a target forward of m tokens, from a timing entry's ``verify_by_tokens`` and its two verify
    lengths (timed in the same turns); None without a table. Kept as timed, not smoothed (``evaluation/DESIGN.md``,
    "Costs": the cost is not monotone in the length on a CPU)."""
    table = entry.get("verify_by_tokens")
    if not table:
        return None
    out = {int(m): float(v["median_s"]) for m, v in table.items()}
    for key in ("verify", "verify_short"):
        if key in entry:
            out.setdefault(int(entry[key]["tokens"]), float(entry[key]["median_s"]))
    return dict(sorted(out.items()))


def verify_costs(entry: dict) -> tuple[float, float]:
    """(v0, v1): a verification forward of m tokens costs v0 + v1·m, from the entry's two verify lengths; a file
    with one length gives the line through the one-token step (v0 + v1 = the step)."""
    long, short = entry["verify"], entry.get("verify_short")
    if short is None or short["tokens"] >= long["tokens"]:
        short = {"tokens": 1, "median_s": step_s(entry)}
    if long["tokens"] <= short["tokens"]:
        return step_s(entry), 0.0
    v1 = max(0.0, (long["median_s"] - short["median_s"]) / (long["tokens"] - short["tokens"]))
    return max(0.0, short["median_s"] - v1 * short["tokens"]), v1


def step_s(entry: dict) -> float:
    """An entry's decode step in seconds, at the shortest cache length measured."""
    decode = entry["decode"]
    return float(decode[min(decode, key=int)]["median_s"])


def find_entry(timing: dict, name: str) -> dict:
    """The entry ``name`` (``draft``: its first precision) or ``name@precision`` of a timing JSON."""
    label, _, precision = name.partition("@")
    for m in timing["models"]:
        if m["name"] == label and precision in ("", m.get("precision", "")):
            return m
    raise KeyError(f"timing file has no model {name!r}; it has "
                   f"{sorted(m['name'] + '@' + m.get('precision', '?') for m in timing['models'])}")


def timing_device(path: str | Path) -> str | None:
    """The device a ``bench_timing`` file says it was timed on; None where it does not say (``read_timing`` names
    what is wrong with a file where its costs are read)."""
    try:
        return json.loads(Path(path).read_text()).get("device")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None


def other_device(path: str | Path, here: str) -> str | None:
    """A one-line note when the ``bench_timing`` file at ``path`` was timed on another device than ``here``
    (``core.device.describe_device``): its costs by verification length, which a goodput stop prices rounds with,
    may not hold here. None when it was timed here."""
    recorded = timing_device(path)
    if same_device(recorded, here):
        return None
    return (f"{path} was timed on {recorded or 'an unnamed device'}, not on this {here}: the goodput stop prices "
            f"rounds with its costs; run `make bench-timing` here for this device's")


def read_timing(path: str | Path, draft: str = "draft", target: str = "target") -> LatencyFit:
    """``timing_fit`` of the ``bench_timing`` JSON file at ``path``, or one clear error."""
    try:
        timing = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TimingFileError(f"timing file {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TimingFileError(f"timing file {path}: not a bench_timing JSON file ({e})") from None
    try:
        fit = timing_fit(timing, draft, target)
    except KeyError as e:
        missing = str(e.args[0]) if e.args else ""
        if missing.startswith("timing file has no model"):  # find_entry's, naming the models the file has
            raise TimingFileError(f"{path}: {missing}") from None
        raise TimingFileError(f"timing file {path}: not a bench_timing JSON file (no {missing!r})") from None
    except (TypeError, AttributeError, ValueError, IndexError) as e:
        raise TimingFileError(f"timing file {path}: not a bench_timing JSON file ({e!r})") from None
    for name in (draft, target):
        bad = unusable_times(find_entry(timing, name))
        if bad:
            raise TimingFileError(f"timing file {path}: {name}'s {bad}")
    return fit


def unusable_times(entry: dict) -> str | None:
    """The first time of a timing entry (its prefill, decode steps and verifications) that is not a finite number
    of seconds above 0, in words naming the field; None when every one can price a forward."""
    fields = {"prefill": entry["prefill"], **{f"decode step after {c}": v for c, v in entry["decode"].items()},
              **{k: entry[k] for k in ("verify", "verify_short", "catch_up") if k in entry},
              **{f"verification of {m} tokens": v for m, v in entry.get("verify_by_tokens", {}).items()}}
    for name, timed in fields.items():
        value = timed["median_s"]
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            return f"{name} is {value} s: a time must be a finite number of seconds above 0"
    return None

"""The one cost model of decoding (``CostModel``): SpecDec++ Eq. 5.1, T_total ≈ t_draft·N_draft + t_target·N_target,
with the costs Eq. 5.1 leaves out, and the timing files it is read from.

SpecDec++ §5.2 fits the two per-forward times by linear regression over measured runs and reports R²; with them
(or with per-forward times measured on another device by ``bench_timing``) the latency of any run can be predicted
from its counts alone, so CPU-measured acceptance traces transfer to a GPU. Fitting it to runs is
``evaluation.latency``; this module holds the model and reads a timing file into it (``read_timing``), which
``pipeline`` also reads to choose a stop head's exported threshold at the exporting device's costs.

From timed forwards the model is Eq. 5.1 with the costs Eq. 5.1 leaves out. A verification of n candidates is one
target forward of m = n + 1 tokens, which costs v0 + v1·m: on a CPU a forward of a few tokens leaves the one-token
step's fast path, on a GPU v1 is near 0. Each candidate is verified once, so Σ m = N_draft + N_target and the
model stays linear: t_draft = draft step + v1, t_target = v0 + v1 per call of a run that drafts, the one-token step
per call of a run that does not (target-only), and each model's prefill (beyond one step) once per run.

On a CPU the cost is not linear in the length (``evaluation/DESIGN.md``), so where the timing holds a verification
of several lengths (``verify_by_tokens``) the model keeps that table, and a prediction that knows how many
verifications had each length charges each its own cost: Σ_m calls(m)·T(m) + draft step·N_draft. After a fully
accepted round the draft reads two tokens (``decoding.replay.Counts.catch_up``); each token beyond one is charged
``CostModel.draft_catch_up``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from core.errors import UserError
from core.identity import TRANSFORMERS


class TimingFileError(UserError):
    """A timing file that cannot be read as ``bench_timing`` JSON, or lacks the models asked for."""


VERIFY_TABLE_TOKENS = 128
"""The longest verification a model built from a cost function (``CostModel.by_length``) tabulates; beyond it the
line through the last two lengths prices it (``CostModel.verify_time``)."""


@dataclass
class CostModel:
    """What decoding costs on one device: every reader of costs (the decoder's goodput stop, the simulator and its
    oracle, the eval's per-run predictions, a stop head's exported threshold, the GPU check, an exported folder)
    asks this one model. In seconds, or in target forwards for the ratio c of SpecDec++ Eq. 5.1 (``eq51``).

    It prices a round of n candidates as n draft forwards and one target forward of n + 1 tokens (``round_seconds``),
    each token a draft forward reads beyond one as ``draft_catch_up``, and counts without round lengths (a run's
    totals, SPRINTER's replay) on the line Eq. 5.1 draws: ``t_draft`` a draft forward, ``t_target`` a target call
    (module docstring). Built from a timing file (``from_timing``, ``load``), fitted to runs
    (``evaluation.latency.fit_latency``), from a cost ratio (``eq51``) or from a cost by length (``by_length``)."""

    t_draft: float
    """Seconds per draft forward on the line (with the verification's per-token slope: Σ m = N_draft + N_target)."""
    t_target: float
    """Seconds per target call of a run that drafts, on the line."""
    intercept: float = 0.0
    """Per-run overhead (prefill beyond one forward, Python bookkeeping); 0 when fitted without one."""
    r2: float = float("nan")
    """Coefficient of determination of a fit over runs (NaN: not fitted)."""
    n_runs: int = 0
    """Runs a fit used."""
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
    round_overhead: float = 0.0
    """Seconds a round that drafts pays beyond its forwards (the host's synchronisations between the draft's steps
    and the verification, which a timing of bare forwards does not see); target-only's one-token steps pay none.
    From a timing file's ``round_overhead`` (its median), else its draft's ``generate_call`` (a transformers
    ``generate()`` call's setup, which its assisted generation pays each round), 0 where it has neither."""
    name: str = ""
    """How the model prices a round, for tables: ``by length``, ``per call``, ``c=…``."""
    device: str | None = None
    """The device the costs were timed on (``core.device.describe_device``), where they were."""
    backend: str | None = None
    """The runtime that ran the forwards timed (``core.backends``), where they were timed."""
    threads: int | None = None
    """The threads a backend with threads of its own ran them on; None where they were torch's."""
    decoder: str | None = None
    """The decoder whose forwards were timed (eager, static, graphs, compiled: ``decoding.state.DECODERS``)."""
    draft_read_s: dict[int, float] | None = None
    """Seconds of a draft forward that reads m tokens (one row out), timed at a few m: what a runtime pays where its
    draft re-reads each verified batch (llama.cpp's ``draft-simple``, ``decoding.runtime_replay``); None: the step
    plus ``draft_catch_up`` per token beyond one."""
    sample_s: float = 0.0
    """Seconds the runtime's sampler spends on each token the target emits, beyond the forwards (llama.cpp builds
    each sampled row's candidates over the whole vocabulary): target-only pays it per token, a round per token it
    keeps plus the one it adds, so per token either way. 0 where the forwards timed include the sampling (our
    decoder's warp)."""
    draft_sample_s: float = 0.0
    """The part of ``draft_step`` that is the draft's sampler (a draft step samples its token, a batch re-read
    does not); 0 where the forwards timed include the sampling."""
    prefill_token_s: float = 0.0
    """Seconds per prompt token of the target's prefill (the timed prefill over its tokens): what a call of a
    runtime whose time includes its prompt (transformers' ``generate()``) pays before its first token."""
    draft_prefill_token_s: float = 0.0
    """The same of the draft, paid by a call that drafts."""

    @classmethod
    def eq51(cls, c: float) -> "CostModel":
        """SpecDec++ Eq. 5.1 in target forwards: every target call costs 1, a draft forward c."""
        return cls(t_draft=float(c), t_target=1.0, name=f"c={c:g}")

    @classmethod
    def by_length(cls, draft: float, verify: Callable[[int], float] | Mapping[int, float] | Sequence[float],
                  catch_up: float = 0.0, name: str = "by length") -> "CostModel":
        """A draft forward of ``draft`` seconds and a target forward of m tokens of ``verify(m)``: a function
        (tabulated up to ``VERIFY_TABLE_TOKENS``), a mapping m → seconds, or a sequence indexed by m (index 0
        unused)."""
        if isinstance(verify, Mapping):
            table = {int(m): float(v) for m, v in verify.items()}
        elif callable(verify):
            table = {m: float(verify(m)) for m in range(1, VERIFY_TABLE_TOKENS + 1)}
        else:
            table = {m: float(verify[m]) for m in range(1, len(verify))}
        return cls(t_draft=float(draft), t_target=table[1], t_target_step=table[1], verify_s=table,
                   draft_step=float(draft), draft_catch_up=float(catch_up), name=name)

    # -------------------------------------------------------------- a round
    @property
    def draft(self) -> float:
        """Seconds a round pays per candidate drafted: the draft step where verifications are priced by length,
        else the line's ``t_draft``."""
        return self.draft_step if self.verify_s is not None else self.t_draft

    @property
    def catch_up(self) -> float:
        return self.draft_catch_up

    def verify(self, tokens: int) -> float:
        """Seconds of a target call that verifies ``tokens`` tokens (``tokens`` − 1 candidates), with the round's
        overhead where it verifies a candidate."""
        forward = self.verify_time(tokens) if self.verify_s is not None else self.t_target
        return forward + (self.round_overhead if tokens > 1 else 0.0)

    def draft_read(self, tokens: int) -> float:
        """Seconds of a draft forward that reads ``tokens`` tokens with one row out."""
        if self.draft_read_s is None:
            return self.draft - self.draft_sample_s + self.catch_up * max(0, tokens - 1)
        return on_table(self.draft_read_s, tokens)

    def verify_table(self, max_tokens: int) -> np.ndarray:
        """``verify(m)`` at index m for m = 1 … ``max_tokens`` (index 0 unused)."""
        return np.array([0.0] + [float(self.verify(m)) for m in range(1, max_tokens + 1)])

    def round_seconds(self, candidates: np.ndarray) -> np.ndarray:
        """Seconds of a round of n candidates, for each n of ``candidates``: n draft forwards and a verification
        of n + 1 tokens (its catch-up aside)."""
        n = np.asarray(candidates)
        return self.draft * n + self.verify_table(int(n.max(initial=0)) + 1)[n + 1]

    def without_prefill(self) -> "CostModel":
        """These costs for runs whose clock starts after the prompt is read: no per-run prefill."""
        return replace(self, intercept=0.0, draft_intercept=0.0)

    def target_only_rate(self) -> float:
        """Target-only decoding's tokens per unit of cost, 1 / (verify(1) + its sampler): the goodput stop's λ when
        none is given."""
        return 1.0 / (float(self.verify(1)) + self.sample_s)

    def prefill(self, tokens: int, drafting: bool) -> float:
        """Seconds a call pays to read a prompt of ``tokens`` tokens: the target's prefill, and the draft's where
        it drafts (both proportional to the prompt, as the prefills timed)."""
        return tokens * (self.prefill_token_s + (self.draft_prefill_token_s if drafting else 0.0))

    def forward_rate(self, rate: float) -> float:
        """λ as a stop rule sets it against a round's forwards alone: a token the round adds also costs the sampler
        (``sample_s``), so it pays where it gains more than λ·Δforwards / (1 − λ·``sample_s``); λ itself without a
        sampler."""
        return rate / (1.0 - rate * self.sample_s) if self.sample_s else rate

    # -------------------------------------------------------------- counts and rounds
    def price(self, counts) -> float:
        """The expected cost of ``counts`` (``decoding.replay.Counts``): each call at its own length's price where
        the counts know their lengths, else on the line; the draft's batch reads (``draft_reads``) at theirs; the
        sampler per token emitted."""
        reads = 0.0 if counts.draft_reads is None else sum(
            float(k) * self.draft_read(m) for m, k in enumerate(counts.draft_reads) if k)
        besides = self.catch_up * counts.catch_up + reads + self.sample_s * counts.n
        if counts.calls is None:
            return float(self.t_draft * counts.draft + self.t_target * counts.target + besides)
        table = self.verify_table(max(len(counts.calls) - 1, 1))
        return float(self.draft * counts.draft + counts.calls @ table[:len(counts.calls)] + besides)

    def speedup(self, counts) -> float:
        """Target-only's cost over ``counts``'s."""
        return counts.n / self.target_only_rate() / self.price(counts)

    def price_rounds(self, rounds: list[tuple[int, int]], catch_up: int = 0) -> float:
        """Seconds of the rounds (n candidates, k kept) of one generation: n draft steps and one target forward of
        n + 1 tokens each, the sampler for the k + 1 tokens each adds, and ``catch_up`` tokens the draft read beyond
        one (``decoding.schedule.catch_up``)."""
        return float(sum(self.draft * n + self.verify(n + 1) + self.sample_s * (k + 1) for n, k in rounds)
                     + self.catch_up * catch_up)

    def predict(self, n_draft, n_target, runs: int | np.ndarray = 1, calls: np.ndarray | None = None,
                catch_up=0.0):
        """Eq. 5.1 (plus ``intercept`` per run, and ``draft_intercept`` per run that drafted). ``calls[m]``: the
        target calls of one or more runs, by the tokens each verified (they sum to ``n_target``); with ``verify_s``
        each call is charged the forward of its own length, whether a draft model or another drafter (prompt lookup,
        no draft forward) proposed its candidates. ``catch_up``: tokens the draft read beyond one per forward, each
        charged ``draft_catch_up``."""
        extra = self.draft_catch_up * np.asarray(catch_up, float)
        if calls is not None and self.verify_s is not None:
            verify = sum(float(n) * self.verify(m) for m, n in enumerate(calls) if n)
            drafted = float(np.asarray(n_draft) > 0)
            return self.draft_step * n_draft + verify + (self.intercept + self.draft_intercept * drafted) * runs + extra
        n_draft, runs = np.asarray(n_draft), np.asarray(runs)
        drafted = n_draft > 0
        t_target = np.where(drafted, self.t_target + self.round_overhead,
                            self.t_target if self.t_target_step is None else self.t_target_step)
        return self.t_draft * n_draft + t_target * np.asarray(n_target) + self.intercept * runs \
            + self.draft_intercept * runs * drafted + extra

    def predicted_speedup(self, counts, tokens: int) -> float:
        """Target-only's latency over that of ``counts``'s policy for one response of ``tokens`` tokens at its
        rates, per-run costs included."""
        scale = tokens / counts.n
        calls = None if counts.calls is None else counts.calls * scale
        sampler = self.sample_s * tokens  # the same on both sides: a token is sampled once either way
        return float((self.predict(0, tokens) + sampler)
                     / (self.predict(counts.draft * scale, counts.target * scale, calls=calls,
                                     catch_up=counts.catch_up * scale) + sampler))

    def verify_time(self, tokens: int) -> float:
        """``verify_s`` at ``tokens``: interpolated between the lengths timed, the one-token step at one, and
        beyond the longest on the line through the last two, never below the longest (a cheaper longest length is
        the kernels' blocking, not a trend)."""
        step = self.t_target if self.t_target_step is None else self.t_target_step
        return on_table({1: step, **self.verify_s}, tokens)

    # -------------------------------------------------------------- files
    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, saved: dict) -> "CostModel":
        """A model ``to_dict`` wrote (``save``); a table's lengths come back as ints."""
        if saved.get("schema_version") != SCHEMA_VERSION:
            raise TimingFileError(f"a cost model of schema {saved.get('schema_version')}, not {SCHEMA_VERSION}: "
                                  "export it again")
        fields = {k: v for k, v in saved.items() if k != "schema_version"}
        for key in ("verify_s", "draft_read_s"):
            if fields.get(key) is not None:
                fields[key] = {int(m): float(v) for m, v in fields[key].items()}
        return cls(**fields)

    @classmethod
    def from_timing(cls, timing: dict, draft: str = "draft", target: str = "target") -> "CostModel":
        """The costs of a ``bench_timing`` JSON (module docstring): decode steps at the shortest cache length
        measured, the target's verify slope, and both prefills; a name is an entry's (its first precision) or
        ``name@precision``."""
        d, t = find_entry(timing, draft), find_entry(timing, target)
        d_forward, t_step = step_s(d), step_s(t)
        d_step = d_forward + sampler_s(d)  # a draft step samples its token; a batch re-read does not
        v0, v1 = verify_costs(t)
        table = verify_table(t)
        return cls(t_draft=d_step + v1, t_target=v0 + v1, t_target_step=t_step,
                   intercept=max(0.0, t["prefill"]["median_s"] - t_step),
                   draft_intercept=max(0.0, d["prefill"]["median_s"] - d_forward),
                   verify_s=table, draft_step=d_step if table else None, draft_catch_up=catch_up_s(d, d_forward),
                   round_overhead=float(timing.get("round_overhead", d.get("generate_call", {})).get("median_s", 0.0)),
                   name="by length" if table else "per call", device=timing.get("device"),
                   backend=timing.get("backend", TRANSFORMERS), threads=timing.get("threads"),
                   decoder=timing.get("decoder", "eager"), draft_read_s=read_table(d, d_forward),
                   sample_s=sampler_s(t), draft_sample_s=sampler_s(d),
                   prefill_token_s=t["prefill"]["median_s"] / t["prefill"]["tokens"],
                   draft_prefill_token_s=d["prefill"]["median_s"] / d["prefill"]["tokens"])


def on_table(table: Mapping[int, float], tokens: int) -> float:
    """Seconds of a forward of ``tokens`` tokens from ``table`` (m → seconds): interpolated between the lengths
    timed, and beyond the longest on the line through the last two, never below the longest (a cheaper longest
    length is the kernels' blocking, not a trend)."""
    m, s = zip(*sorted(table.items()))
    if tokens <= m[-1]:
        return float(np.interp(tokens, m, s))
    if len(m) == 1:
        return float(s[0])
    return s[-1] + max(0.0, (s[-1] - s[-2]) / (m[-1] - m[-2])) * (tokens - m[-1])


SCHEMA_VERSION = 1
"""Of a cost model saved as JSON (``CostModel.to_dict``)."""


def timing_entry(name: str, precision: str, prefill: tuple[int, float], cache: int, seconds: dict[int, float],
                 verify: int | None, verify_short: int | None = None, by_tokens: bool = False,
                 catch_up: float | None = None, **extra) -> dict:
    """One model's entry of a timing file, the layout ``read_timing`` reads, from the seconds of its forwards of m
    new tokens after ``cache`` cached ones (``seconds[1]``: its decode step): ``verify`` (and ``verify_short``)
    tokens as its verifications (None: it verifies nothing, a draft), every length of ``seconds`` beyond one as its
    ``verify_by_tokens`` table where ``by_tokens``, ``catch_up`` the seconds of its two-token catch-up read;
    ``prefill``: (tokens, seconds); ``extra``: fields of the entry's own (``shape``, ``threads``)."""
    entry = {"name": name, "precision": precision, **extra, "prefill": {"tokens": prefill[0], "median_s": prefill[1]},
             "decode": {str(cache): {"median_s": seconds[1]}}}
    if verify is not None:
        entry["verify"] = {"tokens": verify, "cache": cache, "median_s": seconds[verify]}
    if verify_short is not None:
        entry["verify_short"] = {"tokens": verify_short, "cache": cache, "median_s": seconds[verify_short]}
    if by_tokens:
        entry["verify_by_tokens"] = {str(m): {"cache": cache, "median_s": s} for m, s in sorted(seconds.items())
                                     if m > 1}
    if catch_up is not None:
        entry["catch_up"] = {"tokens": 2, "cache": cache, "median_s": catch_up}
    return entry


def sampler_s(entry: dict) -> float:
    """Seconds an entry's sampler spends per token beyond its forward (``evaluation.bench_timing_binaries`` times
    llama.cpp's); 0 where its forwards were timed with their warp."""
    return float(entry.get("sample", {}).get("median_s", 0.0))


def catch_up_s(entry: dict, step: float) -> float:
    """Seconds a forward adds per token read beyond one, from an entry's ``catch_up`` (a forward of several new
    tokens with one row out)."""
    timed = entry["catch_up"]
    return max(0.0, (float(timed["median_s"]) - step) / (int(timed["tokens"]) - 1))


def read_table(entry: dict, step: float) -> dict[int, float] | None:
    """m → seconds of a forward of m new tokens with one row out, from an entry's ``read_by_tokens`` (``bench-timing
    --backend llama_cpp`` times the draft's), its step and its catch-up read; None where it has no such table (its
    verifications compute every row's logits, a batch re-read only the last)."""
    table = entry.get("read_by_tokens")
    if not table:
        return None
    return dict(sorted({1: step, **{int(m): float(v["median_s"]) for m, v in table.items()}}.items()))


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


def read_timing(path: str | Path, draft: str = "draft", target: str = "target") -> CostModel:
    """``CostModel.from_timing`` of the ``bench_timing`` JSON file at ``path``, or one clear error."""
    try:
        timing = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TimingFileError(f"timing file {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TimingFileError(f"timing file {path}: not a bench_timing JSON file ({e})") from None
    if isinstance(timing, dict) and timing.get("interrupted"):
        raise TimingFileError(f"timing file {path}: an interrupted run's, with only some models timed; time the "
                              "device again with `specheads bench-timing`")
    try:
        for name in (draft, target):
            try:
                entry = find_entry(timing, name)
            except KeyError as e:
                if not str(e.args[0]).startswith("timing file has no model"):
                    raise
                precision = name.partition("@")[2]  # find_entry's line names the models the file has
                raise TimingFileError(f"timing file {path}: {str(e.args[0]).removeprefix('timing file ')}: time it "
                                      f"with `specheads bench-timing{' --precision ' + precision if precision else ''}`"
                                      ) from None
            bad = unusable_times(entry)
            if bad:
                raise TimingFileError(f"timing file {path}: {name}'s {bad}")
        fit = CostModel.from_timing(timing, draft, target)
    except KeyError as e:
        missing = str(e.args[0]) if e.args else ""
        if missing == "catch_up":  # the last field the layout gained
            raise TimingFileError(f"timing file {path}: of an older layout, without the draft's catch-up read; "
                                  f"time the device again with `specheads bench-timing` (--backend "
                                  f"{timing.get('backend', 'transformers')})") from None
        raise TimingFileError(f"timing file {path}: not a bench_timing JSON file (no {missing!r})") from None
    except (TypeError, AttributeError, ValueError, IndexError) as e:
        raise TimingFileError(f"timing file {path}: not a bench_timing JSON file ({e!r})") from None
    return fit


def unusable_times(entry: dict) -> str | None:
    """The first time of a timing entry (its prefill, decode steps and verifications) that is not a finite number
    of seconds above 0 (its sampler's may be 0), in words naming the field; None when every one can price a
    forward."""
    fields = {"prefill": entry["prefill"], **{f"decode step after {c}": v for c, v in entry["decode"].items()},
              **{k: entry[k] for k in ("verify", "verify_short", "catch_up", *MAY_BE_ZERO) if k in entry},
              **{f"verification of {m} tokens": v for m, v in entry.get("verify_by_tokens", {}).items()},
              **{f"one-row read of {m} tokens": v for m, v in entry.get("read_by_tokens", {}).items()}}
    for name, timed in fields.items():
        value = timed["median_s"]
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            if name in MAY_BE_ZERO and value == 0:
                continue
            return f"{name} is {value!r} s: a time must be a finite number of seconds above 0"
    tokens = entry["prefill"].get("tokens")
    if not (isinstance(tokens, int) and tokens >= 1):
        return f"prefill is of {tokens!r} tokens: a prefill reads at least 1"
    return None


MAY_BE_ZERO = ("sample", "generate_call")
"""Entry fields that may be 0: what ``bench-timing --generate`` finds generate() adds to a step and to a call."""

"""Every drafter and stop rule ``specheads advise`` prices, at every setting of its grid, replayed over the advice
traces (``evaluation.advise_traces``) at one device's costs: llama.cpp's own ``draft-simple`` and ``ngram-simple``
(``decoding.runtime_replay``, ``decoding.replay.prompt_lookup_counts``) on traces made in llama.cpp, transformers'
assisted generation (``decoding.runtime_replay.assisted_counts``) and vLLM's draft-model proposer (our ``sd``) on
traces made in transformers, our decoder's rules (``decoding.simulate``),
and the two oracles, each setting with its predicted speedup over target-only and a bootstrap interval over the
prompts. A setting says whether a runtime its users run executes it today (llama.cpp's), or only our decoder
(``specheads generate``), or no decoder at all (an oracle, a ceiling)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from core.intervals import Interval
from decoding.costs import CostModel
from decoding.lookup_stop import LookupCalibration
from decoding.replay import Counts, LookupTrace, prompt_lookup_counts, prompt_lookup_oracle_counts
from decoding.runtime_replay import (ASSISTED_DEFAULTS, DRAFT_TOP_K, assisted_counts, continue_chance,
                                     draft_simple_counts)
from decoding.simulate import simulate
from evaluation.advise_traces import AdviceTrace
from evaluation.simulate_lookup import priced_interval, total

LLAMA_CPP = "llama.cpp"
TRANSFORMERS = "transformers"
VLLM = "vLLM"
OURS = "specheads"
CEILING = "ceiling"
RUNTIMES = (LLAMA_CPP, TRANSFORMERS, VLLM, OURS, CEILING)
"""Who runs a setting: llama.cpp's own binaries and server, transformers' ``generate()``, vLLM's engine, our
decoder only, or nothing (an oracle)."""
RUNTIME_OF_BACKEND = {"llama_cpp": LLAMA_CPP, "transformers": TRANSFORMERS}
"""The runtime whose own rules are advised on traces and costs of a backend (``core.backends``)."""
DRAFT_PROBABILITY_TOP_K = {LLAMA_CPP: DRAFT_TOP_K, TRANSFORMERS: None, VLLM: None}
"""The logits each runtime's draft probability is a softmax over: llama.cpp's draft sampler's top k, transformers'
whole vocabulary (its ``ConfidenceCriteria``); vLLM's draft-model proposer reads none (it never stops a round)."""

DRAFT_SIMPLE_DEFAULTS = {"n_max": 3, "p_min": 0.0}
"""llama.cpp's defaults for ``draft-simple`` (``common/common.h``)."""
DRAFT_SIMPLE_GRID = [{"n_max": n, "p_min": p} for p in (0.0, 0.5, 0.75, 0.9, 0.95)
                     for n in (1, 2, 3, 4, 6, 8, 12, 16)]
"""The draft-simple settings replayed: every n_max at every p_min."""
NGRAM_SIMPLE_DEFAULTS = {"n": 12, "m": 48}
"""llama.cpp's defaults for ``ngram-simple`` (``--spec-ngram-simple-size-n``, ``-size-m``)."""
NGRAM_SIMPLE_GRID = [{"n": n, "m": m} for n, m in ((12, 48), (8, 32), (6, 32), (4, 48), (4, 32), (4, 16), (3, 32),
                                                     (3, 16), (2, 8))]
"""The ngram-simple settings replayed: its defaults, then shorter n-grams and copies."""
ASSISTED_GRID = [{"schedule": schedule, "k": k, "threshold": t} for schedule in ("constant", "heuristic_transient")
                 for t in (0.0, 0.2, 0.4, 0.6, 0.8) for k in (1, 2, 3, 4, 6, 8, 12, 20)]
"""transformers' assisted-generation settings replayed: ``num_assistant_tokens_schedule`` (``heuristic_transient``
starts each ``generate()`` call at K, as the replay of one call does; ``heuristic`` carries K over from the last
call), ``num_assistant_tokens``, ``assistant_confidence_threshold`` (0: off)."""
VLLM_GRID = [{"num_speculative_tokens": k} for k in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)]
"""vLLM's draft-model proposer (``speculative_config`` with ``method: draft_model``) at each length: it drafts that
many tokens a round, each the draft's own sample (greedy: its top token), and verifies them by speculative sampling
(its rejection sampler keeps a token with min(1, p/q) and resamples the residual), the rounds our ``sd`` replays. It
has no default: ``num_speculative_tokens`` is required."""
OUR_GRID = [("sd", {"k": k}) for k in (1, 2, 3, 4, 6, 8, 12, 16)] + [("confidence", {"threshold": t})
                                                                     for t in (0.3, 0.5, 0.7, 0.9)]
"""Our decoder's rules: the confidence stop only over sampled traces (under greedy sampling the draft's warped
probability of its own token is 1, and the stop never fires)."""


@dataclass(eq=False)
class Setting:
    """One rule at one setting, priced over the traces."""

    runtime: str
    """Who runs it (``RUNTIMES``)."""
    drafter: str
    """``draft model``, ``prompt lookup`` or ``none``."""
    rule: str
    """The runtime's name for it: ``draft-simple``, ``ngram-simple``, ``target only``, our policy families,
    ``oracle``."""
    params: dict
    counts: list[Counts] = field(repr=False)
    """Per trace."""
    speedup: Interval | None = None
    """Predicted tokens/s over target-only, with its 95 % bootstrap interval over the prompts."""
    default: bool = False
    """The runtime's own default setting of this rule."""

    @property
    def label(self) -> str:
        shown = ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in self.params.items())
        return f"{self.rule}" + (f" ({shown})" if shown else "")

    def rates(self) -> tuple[float, float]:
        """(target calls, drafted-and-discarded tokens) per token, over every trace."""
        all_of = total(self.counts)
        return all_of.target / all_of.n, all_of.discarded / all_of.n


def price(settings: list[Setting], costs: CostModel, prompts: list[int] | None = None) -> list[Setting]:
    """Each setting's speedup; ``prompts``: the traces' prompt lengths, where each run pays its prefill (a
    ``generate()`` call's time includes it)."""
    for s in settings:
        s.speedup = priced_interval(s.counts, costs, prompts=prompts)
    return settings


def target_only(runtime: str, traces: list[AdviceTrace]) -> Setting:
    return Setting(runtime, "none", "target only", {},
                   [Counts(n=len(t.response), target=len(t.response), calls=np.array([0.0, len(t.response)]))
                    for t in traces])


def runtime_settings(runtime: str, traces: list[AdviceTrace], max_new_tokens: int,
                     quiet: bool = False) -> list[Setting]:
    """The runtime's own rules at every setting of their grids, and its target alone."""
    rules = {LLAMA_CPP: llama_settings, TRANSFORMERS: transformers_settings, VLLM: vllm_settings}[runtime]
    return [target_only(runtime, traces)] + rules(traces, max_new_tokens, quiet)


def transformers_settings(traces: list[AdviceTrace], max_new_tokens: int, quiet: bool = False) -> list[Setting]:
    """transformers' assisted generation at every setting of ``ASSISTED_GRID``."""
    every = np.sort(np.concatenate([t.top_prob for t in traces]))

    def clears(threshold: float) -> float:  # the chance a drafted token's probability reaches the threshold
        return 1.0 - np.searchsorted(every, threshold, side="left") / len(every)

    return [Setting(TRANSFORMERS, "draft model", "assisted", dict(params),
                    [assisted_counts(t.match, t.top_prob, params["k"], params["schedule"], params["threshold"],
                                     clears, max_new_tokens) for t in traces], default=params == ASSISTED_DEFAULTS)
            for params in tqdm(ASSISTED_GRID, desc="advise: transformers assisted generation", disable=quiet)]


def vllm_settings(traces: list[AdviceTrace], max_new_tokens: int, quiet: bool = False) -> list[Setting]:
    """vLLM's draft-model proposer at every length of ``VLLM_GRID``: our ``sd`` replayed, a round of that length
    each time (every ``generate`` request is capped by its ``max_tokens``, as the trace is)."""
    return [Setting(VLLM, "draft model", "draft_model", dict(params),
                    [simulate([t.trace], "sd", k=params["num_speculative_tokens"]) for t in traces])
            for params in tqdm(VLLM_GRID, desc="advise: vLLM draft-model proposer", disable=quiet)]


def llama_settings(traces: list[AdviceTrace], max_new_tokens: int, quiet: bool = False) -> list[Setting]:
    """llama.cpp's own rules at every setting of their grids."""
    out = []
    tops = [t.top_prob for t in traces]
    for params in tqdm(DRAFT_SIMPLE_GRID, desc="advise: llama.cpp draft-simple", disable=quiet):
        goes_on = continue_chance(tops, params["p_min"])
        out.append(Setting(LLAMA_CPP, "draft model", "draft-simple", dict(params),
                           [draft_simple_counts(t.match, t.top_prob, params["n_max"], params["p_min"], goes_on,
                                                max_new_tokens) for t in traces],
                           default=params == DRAFT_SIMPLE_DEFAULTS))
    for params in tqdm(NGRAM_SIMPLE_GRID, desc="advise: llama.cpp ngram-simple", disable=quiet):
        out.append(Setting(LLAMA_CPP, "prompt lookup", "ngram-simple", dict(params),
                           [prompt_lookup_counts(t.prompt, t.response, params["n"], params["m"], max_new_tokens)
                            for t in traces], default=params == NGRAM_SIMPLE_DEFAULTS))
    return out


def our_settings(traces: list[AdviceTrace], greedy: bool, quiet: bool = False) -> list[Setting]:
    """Our decoder's rules over the draft model at every setting of ``OUR_GRID``."""
    grid = [(family, params) for family, params in OUR_GRID if not (greedy and family == "confidence")]
    return [Setting(OURS, "draft model", family, dict(params), [simulate([t.trace], family, **params) for t in traces])
            for family, params in tqdm(grid, desc="advise: our rules", disable=quiet)]


TRAINED_RULES = ("specdecpp", "goodput", "prompt_lookup_goodput")
"""Our rules that read a trained estimate (``our_trained_settings``)."""


def our_trained_settings(traces: list[AdviceTrace], costs: CostModel, heads: list[str], calibration: str | None,
                         lookup: LookupCalibration | None, max_new_tokens: int) -> list[Setting]:
    """Our rules that read a trained estimate: SpecDec++'s stop on each stop head of ``heads`` at its exported
    threshold, the goodput stop on each of them and on the draft's confidence calibrated by ``calibration`` (each
    at the λ its replay over the traces does best at, ``evaluation.simulate.goodput_grid``), and prompt lookup's
    goodput stop on ``lookup``'s keep chance (``LookupCalibration.stop``, as the policy runs it)."""
    from decoding.simulate import cached_head
    from evaluation.simulate import goodput_grid

    every = [t.trace for t in traces]
    out = []
    for path in heads:
        name = Path(path).stem
        out.append(Setting(OURS, "draft model", "specdecpp", {"head": name, "h": cached_head(path).threshold},
                           [simulate([t], "specdecpp", head=path) for t in every]))
    for family, params in goodput_grid(every, heads, costs, calibration):
        source = {k: Path(params[k]).stem for k in ("head", "calibration") if k in params}
        out.append(Setting(OURS, "draft model", "goodput", {**source, "lam": round(params["lam"], 2)},
                           [simulate([t], family, **params) for t in every]))
    if lookup is not None:
        rule = lookup.stop(costs)
        out.append(Setting(OURS, "prompt lookup", "prompt_lookup_goodput",
                           {"n": lookup.n, "m": lookup.m, "lam": round(rule.rate, 2)},
                           [prompt_lookup_counts(t.prompt, t.response, lookup.n, lookup.m, max_new_tokens, length=rule)
                            for t in traces]))
    return out


def ceilings(traces: list[AdviceTrace], costs: CostModel, lookups: list[dict], max_new_tokens: int) -> list[Setting]:
    """The oracle over the draft model's candidates (it knows each one's fate and stops where the costs say), and
    over prompt lookup's proposals at each (n, m) of ``lookups``."""
    out = [Setting(CEILING, "draft model", "oracle", {}, [simulate([t.trace], "oracle", costs=costs) for t in traces])]
    for n, m in dict.fromkeys((int(at["n"]), int(at["m"])) for at in lookups):
        out.append(Setting(CEILING, "prompt lookup", "oracle", {"n": n, "m": m},
                           [prompt_lookup_oracle_counts(t.prompt, t.response, n, m, max_new_tokens, costs,
                                                        trace=LookupTrace(t.prompt, t.response, n, m, max_new_tokens))
                            for t in traces]))
    return out


def budget(sampling: dict, runtime: str = LLAMA_CPP) -> int:
    """The tokens the runtime is asked for on a trace of ``sampling``'s length: llama.cpp (``-n``) one more, as the
    eval decodes 256 where the labels hold 255 (llama.cpp caps a round by the tokens left less one); transformers'
    ``max_new_tokens`` the trace's own."""
    return int(sampling["max_new_tokens"]) + (1 if runtime == LLAMA_CPP else 0)


def best(settings: list[Setting], runtime: str, drafter: str | None = None) -> Setting | None:
    """The setting of ``runtime`` (and ``drafter``) with the highest predicted speedup."""
    pool = [s for s in settings if s.runtime == runtime and (drafter is None or s.drafter == drafter)
            and s.drafter != "none"]
    return max(pool, key=lambda s: s.speedup.value) if pool else None

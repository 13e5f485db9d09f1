"""A fake engine for the evaluation harness: policies with known counts and a wall time from Eq. 5.1.

Every policy "generates" ``max_new_tokens`` ids; its counts follow from its setting, and its wall time is
exactly ``T_DRAFT · N_draft + T_TARGET · N_target``, so the best K, h and τ are known in advance.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from core.sampling import Sampling
from decoding.state import DecodeStats
from evaluation.engine import Engine

T_DRAFT, T_TARGET = 0.01, 0.05
ACCEPT = 3  # tokens each SD round accepts (when K ≥ 3)


@dataclass
class FakeResult:
    tokens: list[int]
    stats: DecodeStats


@dataclass
class FakePair:
    sampling: Sampling
    device: str = "cpu"


class FakePolicy:
    def __init__(self, name: str, calls: list, **kw):
        self.name, self.kw, self.calls = name, kw, calls

    def generate(self, pair, prompt_ids, generator):
        self.calls.append((self.name, dict(self.kw), tuple(prompt_ids)))
        n = pair.sampling.max_new_tokens
        k = {"sd": self.kw.get("k"), "specdecpp": 4, "goodput": 4, "sprinter": 8, "fuzzy": 6, "hf_heuristic": 5,
             "confidence": 4, "svip": 4}.get(self.name)
        catch_up = 0
        if self.name == "target_only":
            nt, nd, disc, lens = n, 0, 0, []
        elif self.name == "draft_only":
            nt, nd, disc, lens = 0, n, 0, []
        else:
            acc = min(k, ACCEPT if self.name != "sprinter" else 7)
            rounds = math.ceil(n / (acc + 1))
            nt, nd, disc, lens = rounds, rounds * k, rounds * (k - acc), [acc] * rounds
            catch_up = (rounds - 1) * (acc == k)  # each round after a fully accepted one reads one token more
        wall = T_DRAFT * nd + T_TARGET * nt
        tokens = [(i + len(prompt_ids)) % 7 + 3 for i in range(n)]
        if self.name == "draft_only":  # an approximate policy's output differs from the target's
            tokens = [t + 1 for t in tokens]
        if self.name == "specdecpp":  # another sample of the target's distribution than target-only's
            tokens = [t + 2 for t in tokens]
        return FakeResult(tokens, DecodeStats(wall, n, nt, nd, disc, lens, catch_up))


class FakeTokenizer:
    def __call__(self, text, **kw):
        return {"input_ids": [len(w) for w in text.split()]}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids)


def fake_loglik(prompt_ids: list[int], tokens: list[int]) -> float:
    """A stand-in for the target's mean log-likelihood: a function of the tokens alone."""
    return -sum(tokens) / len(tokens) / 10


def fake_engine(calls: list | None = None, fail_after: int | None = None, hf: bool = True,
                loglik=None) -> Engine:
    calls = [] if calls is None else calls

    def build(name, **kw):
        if fail_after is not None and len(calls) >= fail_after:
            raise KeyboardInterrupt("simulated interrupt")
        return FakePolicy(name, calls, **kw)

    seconds_per_token = {"hf_target_only": 0.05, "hf_specdecpp": 0.025, "hf_goodput": 0.024, "hf_sprinter": 0.02}

    def hf_generate(ids, sampling, seed, run):
        calls.append(("hf", run.family, dict(run.settings), tuple(ids)))
        n = sampling.max_new_tokens
        return [3] * n, {"wall_s": seconds_per_token.get(run.family, 0.03) * n, "new_tokens": n,
                         "target_calls": n // 2, "draft_calls": n, "discarded": None, "accepted_lengths": None}

    return Engine(tokenizer=FakeTokenizer(), make_pair=lambda s: FakePair(s), build_policy=build,
                  models={"draft": {"fingerprint": "fake-draft"}, "target": {"fingerprint": "fake-target"}},
                  hf_generate=hf_generate if hf else None, loglik=loglik)


def write_prompt_file(path, n: int = 4):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": " ".join(["def"] * (i + 2)), "answer": "w3 w4 w5"}) + "\n")
    return path

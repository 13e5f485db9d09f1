"""The goodput stop for prompt lookup (``decoding.policies.prompt_lookup``): how many of a proposal's candidates to
submit, from a calibrated chance that the target keeps each one and the device's verification costs.

A prompt-lookup round knows every candidate before it verifies any (they are copied, not drafted), so the rule
chooses the round's length L at once: with c_j the chance that candidate j is kept given that the ones before it
were, a round of L candidates yields E(L) = 1 + Σ_{i ≤ L} ∏_{j ≤ i} c_j tokens at verify(L + 1) seconds, and the
rule submits the L that maximises E(L) − λ·verify(L + 1), λ the long-run tokens per second (as ``GoodputStop``
prices a round; ``decoding.replay.lookup_goodput_rate`` finds λ over traces). L = 0 is a target step alone.

The chance is read from one feature a stop rule has for free, the match's length (``decoding.rules.match_length``:
how far back the text so far repeats the text the proposal is copied from; each kept candidate lengthens it by
one), mapped to the target's keep rate by isotonic regression on label rows (``lookup_rows``) of the target's own
responses: rows at every position of a response, so the fit sees matches of every age, not only those a rule's
rounds start at.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from core.errors import UserError
from core.runfolder import write_text
from decoding import rules
from decoding.costs import CostModel
from heads.export import LOOKUP_HEAD_ROLE
from heads.features import scores_from_columns

class LookupCalibrationError(UserError):
    """A file that is not a saved prompt-lookup calibration, or one fitted for other proposals."""


@dataclass
class LookupCalibration:
    """P(the target keeps a prompt-lookup candidate | it kept the ones before it in the round) by the candidate's
    match length: the piecewise-linear map through the knots (``length``, ``keep``) that sklearn's isotonic
    regression fits, clipped beyond them."""

    length: np.ndarray
    keep: np.ndarray
    n: int
    """The n-gram the proposals looked up (a match is never shorter)."""
    rows: int = 0
    rate: float | None = None
    """λ (tokens per second) at which the goodput stop did best over the responses fitted on, at the costs of
    ``fitted["timing"]`` (``decoding.replay.lookup_goodput_rate``); None where fitted without costs."""
    fitted: dict | None = None
    """What the rows came from: the ``target`` whose responses they are and the ``sampling`` they were made at,
    the longest copy ``m``, and the timing file λ was found at."""

    def __post_init__(self) -> None:
        self.length, self.keep = np.asarray(self.length, float), np.asarray(self.keep, float)
        if self.length.ndim != 1 or self.length.shape != self.keep.shape or not len(self.length):
            raise ValueError(f"length and keep must be lists of equal length >= 1, got {self.length.shape} and "
                             f"{self.keep.shape}")
        if np.any(np.diff(self.length) < 0) or not np.all((self.keep >= 0) & (self.keep <= 1)):
            raise ValueError("length must be non-decreasing and keep probabilities in [0, 1]")

    @classmethod
    def fit(cls, lengths: np.ndarray, kept: np.ndarray, n: int) -> "LookupCalibration":
        """Fit on rows: each candidate's match length and whether the target kept it."""
        from sklearn.isotonic import IsotonicRegression

        if not len(kept):
            raise LookupCalibrationError("no prompt-lookup rows to fit on: the responses never repeat an n-gram of "
                                         "their prompt (edit requests do; `specheads edit-prompts`)")
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
        iso.fit(np.asarray(lengths, float), np.asarray(kept, float))
        return cls(length=iso.X_thresholds_, keep=iso.y_thresholds_, n=int(n), rows=len(kept))

    @property
    def m(self) -> int:
        """The longest copy the rows were made at (the fit's record, else llama.cpp's default, 48)."""
        return int((self.fitted or {}).get("m", 48))

    def stop(self, costs: CostModel, lam: float | None = None, m: int | None = None) -> "LookupGoodput":
        """The goodput stop on this calibration, its rounds priced at ``costs``, at ``lam`` tokens per second, else
        the calibration's own λ (found at the costs of ``fitted["device"]``: a warning where ``costs`` are another
        device's), else target-only's rate; proposals copied up to ``m`` (default: the calibration's)."""
        found_at = (self.fitted or {}).get("device")
        if lam is None and self.rate is not None and found_at and costs.device and found_at != costs.device:
            warnings.warn(f"the calibration's λ was found at the costs of {found_at}, these rounds are priced at "
                          f"{costs.device}'s: give lam, or calibrate with this device's timing file", stacklevel=3)
        lam = float(lam if lam is not None else self.rate if self.rate is not None else costs.target_only_rate())
        if not lam > 0:
            raise ValueError(f"lam must be positive tokens per second, got {lam}")
        return LookupGoodput(self, costs, lam, self.m if m is None else m)

    def check_target_model(self, target) -> None:
        """Refuse a loaded target of another identity than the one whose responses the calibration was fitted on."""
        from core.identity import model_identity

        self.check_target(model_identity(target), "this decoding's target")

    def chances(self, length: int, count: int, state: RoundState | None = None) -> np.ndarray:
        """The keep chances of ``count`` candidates whose first has a match of ``length`` (the target's ``state``
        is not read)."""
        return self.keep_chance(np.minimum(length + np.arange(count), rules.MATCH_CAP))

    def keep_chance(self, lengths: np.ndarray) -> np.ndarray:
        """The keep chance of candidates with matches of ``lengths``."""
        return np.interp(lengths, self.length, self.keep)

    def to_dict(self) -> dict:
        return {"estimate": "prompt_lookup_keep", "n": self.n, "rows": self.rows, "rate": self.rate,
                "length": self.length.tolist(), "keep": self.keep.tolist(),
                **({"fitted": self.fitted} if self.fitted else {})}

    def save(self, path: str | Path) -> None:
        write_text(Path(path), json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "LookupCalibration":
        """The calibration ``save`` wrote, or one ``LookupCalibrationError`` naming the file."""
        if not Path(path).is_file():
            raise LookupCalibrationError(f"{path}: no such file (`specheads calibrate --prompt_lookup` writes one)")
        try:
            saved = json.loads(Path(path).read_text())
            if saved.get("estimate") != "prompt_lookup_keep":
                raise ValueError(f"it holds {saved.get('estimate')!r}")
            rate = saved.get("rate")
            return cls(length=saved["length"], keep=saved["keep"], n=int(saved["n"]), rows=int(saved["rows"]),
                       rate=None if rate is None else float(rate), fitted=saved.get("fitted"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise LookupCalibrationError(f"{path}: not a prompt-lookup calibration (`specheads calibrate "
                                         f"--prompt_lookup`; {e})") from None

    @staticmethod
    def holds_one(path: str | Path) -> bool:
        """Whether the JSON file at ``path`` is a saved prompt-lookup calibration (not a draft's calibrated
        confidence); a file that cannot be read is left to its loader's error."""
        try:
            return json.loads(Path(path).read_text()).get("estimate") == "prompt_lookup_keep"
        except (OSError, ValueError, AttributeError):
            return False

    def check_target(self, target: dict, whose: str) -> None:
        """Refuse, in one line, a calibration fitted on responses of another target (or backend) than ``target``
        (an identity record); a file that records none passes."""
        from core.identity import check_same_model

        recorded = (self.fitted or {}).get("target")
        if recorded:
            check_same_model(recorded, target, f"the calibration was fitted on responses of target "
                                               f"{recorded.get('name')!r}, {whose} is another")

    def check_n(self, n: int) -> None:
        if n != self.n:
            raise LookupCalibrationError(f"the calibration was fitted on proposals of {self.n}-grams, this prompt "
                                         f"lookup looks up {n}-grams: fit one at n = {n}")


class LookupRows(NamedTuple):
    """Prompt lookup's label rows along responses (``lookup_rows``), one entry per candidate."""

    length: np.ndarray
    """The candidate's match length (the round's, plus the kept candidates before it), as ``chances`` reads it."""
    kept: np.ndarray
    """Whether the response repeats the candidate (greedy: the target keeps it)."""
    start: np.ndarray
    """The response index its round starts at: a stop rule there holds the target's state that produced response
    token ``start − 1`` (none at 0)."""
    place: np.ndarray
    """The candidate's index in its round, from 0."""

    @classmethod
    def join(cls, parts: list["LookupRows"]) -> "LookupRows":
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0, np.int64)
                     for f in cls._fields))


def lookup_rows(prompt: list[int], response: list[int], n: int, m: int) -> LookupRows:
    """Label rows of prompt lookup along a response of the target's: at every position where a proposal exists,
    each of its candidates up to and including the first the response does not repeat."""
    parts = []
    seq = list(prompt)
    for s in range(len(response)):
        source, proposal = rules.ngram_simple_match(seq, n, m)
        if proposal:
            base, repeated = rules.match_length(seq, source), rules.kept_count(proposal, response, s)
            j = np.arange(min(repeated + 1, len(proposal), len(response) - s))
            parts.append(LookupRows(np.minimum(base + j, rules.MATCH_CAP), j < repeated, np.full(len(j), s), j))
        seq.append(response[s])
    rows = LookupRows.join(parts)
    return rows._replace(kept=rows.kept.astype(bool))


def best_length(chances: np.ndarray, verify: np.ndarray, rate: float) -> int:
    """The L ≤ len(``chances``) that maximises E(L) − ``rate``·verify(L + 1) (module docstring); ``verify`` indexed by
    the tokens verified. The shortest among equals."""
    expected = np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(chances))))
    return int(np.argmax(expected - rate * verify[1:len(chances) + 2]))


class LookupGoodput:
    """The rule as a callable of a round: ``(seq, source, proposal, state)`` → how many candidates to submit, the
    keep chances from ``estimate`` (a ``LookupCalibration`` or a ``LookupHead``)."""

    def __init__(self, estimate: "LookupCalibration | LookupHead", costs: CostModel, rate: float, m: int):
        self.estimate, self.rate = estimate, float(rate)
        self.forward_rate = costs.forward_rate(self.rate)  # λ against the forwards, each token's sampler aside
        self.verify = costs.verify_table(m + 1)
        if costs.verify_s is not None and max(costs.verify_s) < m + 1:
            warnings.warn(f"the costs were timed up to verifications of {max(costs.verify_s)} tokens, the rule prices "
                          f"up to {m + 1} on the line beyond: time them (bench-timing --verify_lengths … {m + 1})",
                          stacklevel=2)

    def __call__(self, seq: list[int], source: int, proposal: list[int], state: RoundState | None = None) -> int:
        chances = self.estimate.chances(rules.match_length(seq, source), len(proposal), state)
        return best_length(chances, self.verify, self.forward_rate)

    def along(self, state_at: Callable[[int], RoundState | None] | None,
              prompt_length: int) -> Callable[[list[int], int, list[int]], int]:
        """The rule along one stored response (``decoding.replay.prompt_lookup_counts``' ``length``): each round
        reads the target's state at its response index from ``state_at`` (``decoding.traces.round_states``), none
        where that is None."""
        if state_at is None:
            return self
        return lambda seq, source, proposal: self(seq, source, proposal, state_at(len(seq) - prompt_length))


class RoundState(NamedTuple):
    """What a prompt-lookup round starts from, for free: the target's hidden state (d,) that produced the last
    token, and that distribution's top-1 probability (none before the target's first call)."""

    hidden: torch.Tensor
    top1: float


LOOKUP_HEAD_SCORES = ("log_match_length", "round_index", "target_top1")
"""The scores a prompt-lookup stop head may read beside the target's state (``pipeline.lookup_data``)."""


class LookupHead:
    """Keep chances of prompt-lookup candidates from a stop head trained on the target's state where the round
    starts (``LabelDataModule(label="lookup")``, ``make train``): the head's sigmoid of each candidate, the state
    shared, zeros before the target's first call, as the rows it trained on hold. ``load`` reads an exported one."""

    def __init__(self, module: torch.nn.Module, hidden_size: int, n: int, m: int, rate: float | None = None,
                 exported=None):
        # on the CPU once: a round's few candidates are read there, beside the decoder's state
        self.module, self.hidden_size, self.n, self.m = module.eval().cpu(), int(hidden_size), int(n), int(m)
        self.scores = list(getattr(module, "scores", []))
        self.rate = rate
        """λ chosen on the validation traces at export, or None."""
        self.exported = exported
        """The ``heads.exported.ExportedHead`` it was loaded from, if any."""

    @classmethod
    def load(cls, path: str | Path) -> "LookupHead":
        from heads.exported import ExportedHead

        head = ExportedHead(path, role=LOOKUP_HEAD_ROLE, computes=LOOKUP_HEAD_SCORES)
        label, rate = head.meta["label"], head.meta["threshold"].get("value")
        return cls(head.module, head.meta["hidden_size"], label["n"], label["m"],
                   None if rate is None else float(rate), exported=head)

    def check_n(self, n: int) -> None:
        if n != self.n:
            raise LookupCalibrationError(f"the head was trained on proposals of {self.n}-grams, this prompt lookup "
                                         f"looks up {n}-grams")

    def check_target_model(self, target) -> None:
        """Refuse a target the head was not trained on (its states differ): ``heads.export.check_model``."""
        if self.exported is not None:
            self.exported.check(target)

    @torch.no_grad()
    def chances(self, length: int, count: int, state: RoundState | None = None) -> np.ndarray:
        j = torch.arange(count, dtype=torch.float32)
        held = state is not None
        columns = {"match_length": (length + j).clamp(max=rules.MATCH_CAP),
                   "round_index": (j + 1) * held, "target_top1": torch.full((count,), state.top1 if held else 0.)}
        hidden = (state.hidden.float().cpu() if held else torch.zeros(self.hidden_size)).expand(count, -1)
        logits = (self.module(hidden, scores_from_columns(self.scores, columns)) if self.scores
                  else self.module(hidden))
        return torch.sigmoid(logits).numpy().astype(float)

    def stop(self, costs: CostModel, lam: float | None = None, m: int | None = None) -> LookupGoodput:
        """The goodput stop on this head's chances at ``lam``, else the λ chosen at export, else target-only's rate."""
        lam = float(lam if lam is not None else self.rate if self.rate is not None else costs.target_only_rate())
        if not lam > 0:
            raise ValueError(f"lam must be positive tokens per second, got {lam}")
        return LookupGoodput(self, costs, lam, self.m if m is None else m)

"""The speculative decoder: one generation state (two KV-cached models) and the steps every policy is made of.

A policy is one class with ``name`` and ``generate(pair, prompt_ids, generator)``; it drives a ``Decoding``,
which owns the sequence, both models' caches and the bookkeeping, and offers the steps every policy is made of:
the draft's next distribution, a round of drafting under a stop rule, and the target's verification of a round
(exact speculative sampling, or a policy's own acceptance rule). See ``decoding/DESIGN.md``.

Counting (SpecDec++ §3, Eq. 5.1): every forward pass of a model is one call (a prefill too). A round drafts
candidates and ends with one target call, which keeps the accepted prefix of the candidates and adds one target
token (the resample at the first rejection, or the bonus when all are accepted); ``discarded`` counts the
candidates thrown away. A round never drafts past ``max_new_tokens`` (its target token must still fit) and stops
drafting at an EOS candidate, so no generated token is ever cut off afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from core.label_math import entropy, residual_distribution
from core.models import check_vocabularies, vocab_size
from core.sampling import Sampling, sample_token, uniform
from decoding import rules
from decoding.backends import CachedLM, keeps_own_cache, model_device
from decoding.schedule import ForcedRounds, FreeRounds
from decoding.static import StaticLM, static_lm
from heads.features import DRAFT_SCORES, VECTORS

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class DecodeStats:
    """What one generation cost; the rates are SpecDec++'s Eq. 5.1 quantities."""

    wall_s: float
    """Wall time of the whole generation (CUDA synchronized when on GPU)."""
    new_tokens: int
    """N: tokens generated (excluding the prompt)."""
    target_calls: int
    """N_target: target forward passes (the prefill counts as one)."""
    draft_calls: int
    """N_draft: draft forward passes (the prefill counts as one)."""
    discarded: int
    """N_discarded: draft tokens proposed and thrown away."""
    accepted_lengths: list[int] = field(default_factory=list)
    """Per verification round, how many draft tokens were kept."""
    draft_catch_up: int | None = None
    """Tokens the draft's forwards read beyond one each, its reading of the prompt aside: after a round whose every
    candidate was kept it reads the last candidate and the bonus token (``decoding.replay.Counts.catch_up``). A
    forward from the sequence's start is all prompt here, so a decoding whose first rounds draft nothing (no policy
    does) would count the tokens of those rounds it reads with the prompt as prompt."""
    target_reads: dict[int, int] | None = None
    """The target's forwards by the tokens each read, its reading of the prompt aside (a verification of n
    candidates reads n + 1); None where some forward gave fewer rows than it read (SPRINTER's check of its pending
    tokens), which a verification's cost by length would overprice."""

    @property
    def verification_rate(self) -> float:
        """N_target / N."""
        return self.target_calls / self.new_tokens if self.new_tokens else 0.0

    @property
    def discard_rate(self) -> float:
        """N_discarded / N."""
        return self.discarded / self.new_tokens if self.new_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class DecodeResult:
    tokens: list[int]
    """Generated ids only: ends after an EOS id (included) or at ``max_new_tokens``."""
    stats: DecodeStats


@dataclass
class ModelPair:
    """The two models of speculative decoding, sharing one vocabulary and one sampling setting."""

    draft: PreTrainedModel
    target: PreTrainedModel
    eos_token_ids: list[int]
    """Generation stops after any of these ids (empty: only at ``max_new_tokens``)."""
    sampling: Sampling = field(default_factory=Sampling)
    """Warping (temperature 0 = greedy) applied to both models, so p and q are the sampled distributions."""
    decoder: str = "eager"
    """How the models run (``DECODERS``): ``eager`` over transformers' dynamic cache, ``static`` over a preallocated
    cache, ``graphs`` over that cache with each short forward replayed as a CUDA graph, ``compiled`` as ``graphs``
    with every decoder layer compiled first (off a GPU: the static cache through the compiled layers, no graphs;
    ``decoding.static``)."""
    untimed_prefill: bool = False
    """Each model a generation reads first reads the prompt but its last token before the generation's clock starts,
    uncounted (as llama.cpp's own tools time decoding: prefill excluded); the first call of each then reads the
    prompt's last token. False: the prompt is read in the first call of each model, and timed."""
    on_forward: Callable[[float], None] | None = None
    """Called with the seconds of each forward a generation runs once its clock has started, synchronised on the
    device first (the GPU check's split of a run's wall into forwards and the rest); None: no forward is timed
    apart, and none waits for the device."""
    forced: list[tuple[int, int]] | None = None
    """Trace-forced decoding (``decoding.schedule``): every generation on this pair drafts and keeps exactly these
    rounds, (candidates, kept) each, whatever the models draw; its clock starts after both models read the prompt.
    Every forward, draw, stop rule and acceptance test still runs as it would (their cost is what is timed); only
    their decisions are replaced. None: decode."""

    def __post_init__(self) -> None:
        check_vocabularies(*({"name": name, "vocab_size": vocab_size(m)} for name, m in
                             (("draft", self.draft), ("target", self.target))))
        self.eos_token_ids = [int(t) for t in self.eos_token_ids]
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder {self.decoder!r} is not one of {', '.join(DECODERS)}")
        if self.decoder != "eager" and any(keeps_own_cache(m) for m in (self.draft, self.target)):
            raise ValueError(f"decoder {self.decoder} runs transformers models: a llama.cpp model keeps its own cache "
                             "(decoder: eager)")
        if self.decoder == "graphs" and self.device.type != "cuda":
            raise ValueError(f"decoder graphs replays CUDA graphs: the models are on {self.device}, not a CUDA GPU")
        if self.forced:
            made = sum(kept + 1 for _, kept in self.forced)
            if self.eos_token_ids or made != self.sampling.max_new_tokens:
                raise ValueError(f"forced rounds make {made} tokens: they need max_new_tokens = {made} and no EOS ids "
                                 f"(got {self.sampling.max_new_tokens} and {self.eos_token_ids})")

    @property
    def device(self) -> torch.device:
        return model_device(self.target)


DECODERS = ("eager", "static", "graphs", "compiled")
"""``ModelPair.decoder``'s values."""


def decoder_runner(model, decoder: str, positions: int, layers: tuple[int, ...] = ()) -> StaticLM | None:
    """The static-cache runner ``decoder`` runs ``model`` on, with room for ``positions`` (None: ``eager``, over
    transformers' dynamic cache). ``compiled`` replays graphs where the model is on a CUDA GPU."""
    if decoder == "eager":
        return None
    compiled = decoder == "compiled"
    graphs = decoder == "graphs" or (compiled and model_device(model).type == "cuda")
    return static_lm(model, positions, layers, graphs, compiled)


def default_decoder(device: torch.device | str) -> str:
    """The decoder a device runs by default: CUDA graphs on a GPU, where eager forwards are bound by kernel launches
    (``decoding.static``); eager on the CPU, where a forward's own arithmetic dominates."""
    return "graphs" if torch.device(device).type == "cuda" else "eager"


HEAD_FEATURES = (*DRAFT_SCORES, *VECTORS)
"""Every feature a head may read that this decoder feeds (``Decoding.head_context``, ``heads.features``)."""


class Policy(Protocol):
    name: str

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult: ...


# ---------------------------------------------------------------------------------------------------------------
# one generation


@dataclass
class DraftStep:
    """One draft forward's outputs for the next candidate: what every rule may read when it has just sampled it."""

    hidden: torch.Tensor
    """The draft's hidden state (d,) that produced ``logq``: the previous token's, read before the candidate
    (SPRINTER §3.2: "the last embedding of the previous token")."""
    logq: torch.Tensor
    """q, the warped log-probs (V,) the candidate is sampled from."""
    logits: torch.Tensor
    """The raw logits (V,) behind ``logq`` (the confidence distribution under greedy decoding,
    ``Decoding.draft_confidence``)."""
    layers: torch.Tensor | None = None
    """The draft's tapped layers at ``hidden``'s position, when the decoding taps them
    (``Decoding(draft_layers=…)``)."""


class StopRule(Protocol):
    """Decides after each drafted candidate whether the round stops drafting (the candidate is kept).

    ``step`` is the draft forward the candidate was sampled from. ``dec.draft_confidence(step)``, which a rule
    computes where it reads it, is the draft's confidence distribution there: q itself, the distribution the
    candidate was drawn from (temperature, top-k and top-p applied), which is what the labels hold and so what a
    calibration and a head's draft scores were fitted on (``data_gen/SCHEMA.md``);
    under greedy decoding, where q is a one-hot and would make confidence and entropy rules vacuous, softmax of the
    raw logits (temperature 1).

    ``reads_candidate``: the rule reads the draft's forward over the candidate itself (SpecDec++'s e_i at Y_i's own
    position). That forward also yields q for the next candidate, so when such a rule stops, the round still
    samples one more candidate from it and submits it (SpecDec++ Algorithm 1): no draft forward is thrown away.
    """

    reads_candidate: bool

    def reset(self) -> None: ...

    def __call__(self, dec: Decoding, candidates: list[int], step: DraftStep) -> bool: ...


AcceptRule = Callable[["Decoding", torch.Tensor, torch.Tensor, int], bool]
"""(dec, q, p, token) -> keep the candidate? ``q`` and ``p`` (V,) are the draft's and the target's log-probs at its
position."""
RejectRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(q, p) -> log-probs that the replacement token is drawn from."""


class Decoding:
    """The state of one generation: the sequence, the two cached models, the random source and the counts."""

    def __init__(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator,
                 draft_layers: tuple[int, ...] = (), reads: tuple[str, ...] = ("draft", "target")):
        """``reads``: the models the policy runs (``ModelPair.untimed_prefill`` reads the prompt into those)."""
        if not prompt_ids:
            raise ValueError("the prompt must hold at least one token")
        self.pair = pair
        self.generator = generator
        self.seq = [int(t) for t in prompt_ids]
        self.n_prompt = len(self.seq)
        self.max_new_tokens = pair.sampling.max_new_tokens
        self.eos = set(pair.eos_token_ids)
        static = {}
        if pair.decoder != "eager":  # room for the prompt, the response and the draft's reading of its last token
            positions = self.n_prompt + self.max_new_tokens + 1
            # only for the models the policy runs: a goodput stop that cannot pay captures nothing for the draft
            static = {role: decoder_runner(getattr(pair, role), pair.decoder, positions,
                                           draft_layers if role == "draft" else ())
                      for role in reads}
        self.draft = CachedLM(pair.draft, pair.sampling, draft_layers, static.get("draft"))
        self.target = CachedLM(pair.target, pair.sampling, static=static.get("target"))
        self.rounds = ForcedRounds(pair.forced) if pair.forced else FreeRounds()
        """What decides a round's length and the candidates it keeps: the policy's rule and the draws, or the
        schedule of a forced run (``ModelPair.forced``)."""
        self.stale: tuple[int, torch.Tensor, torch.Tensor] | None = None
        """What the last target call left (``head_context``): the index in ``seq`` of the token it sampled, the
        target's hidden state that produced that token's distribution, and that distribution (log-probs)."""
        self.stale_logits: torch.Tensor | None = None
        """The raw logits (V,) of ``stale``'s distribution (before warping)."""
        self._stale_scores: tuple[torch.Tensor, torch.Tensor] | None = None
        self._target_rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self.discarded = 0
        self.accepted_lengths: list[int] = []
        self._cuda = pair.device.type == "cuda"
        if pair.forced is not None:  # a forced run's time is the generation's alone: the prompt is read first
            self.draft.advance(self.seq)
            self.target.advance(self.seq)
        elif pair.untimed_prefill and len(self.seq) > 1:
            for lm in (getattr(self, role) for role in reads):
                lm.advance(self.seq[:-1])
                lm.calls = 0  # (a read from the start is no catch-up: ``beyond_one`` stays 0)
        self._sync()
        self.draft.on_forward = self.target.on_forward = pair.on_forward  # the generation's forwards, from here
        self._t0 = time.perf_counter()

    # -- state ------------------------------------------------------------------------------------------------
    @property
    def tokens(self) -> list[int]:
        return self.seq[self.n_prompt:]

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.seq) + self.n_prompt

    @property
    def done(self) -> bool:
        return self.remaining <= 0 or (len(self.seq) > self.n_prompt and self.seq[-1] in self.eos)

    def extend(self, tokens: list[int]) -> None:
        """Append generated tokens (never past max_new_tokens, never after an EOS)."""
        for t in tokens:
            if self.done:
                raise RuntimeError("a policy generated past the end of the sequence")
            self.seq.append(int(t))

    # -- randomness: every draw comes from the generator, in float64 (``core.sampling``) -------------------------
    def uniform(self) -> float:
        return uniform(self.generator).item()

    def sample(self, logprobs: torch.Tensor) -> int:
        return sample_token(logprobs, self.generator)

    # -- steps --------------------------------------------------------------------------------------------------
    def draft_step(self, candidates: list[int] = ()) -> DraftStep:
        """The draft's forward for the next token after seq + candidates (cached when already read)."""
        hidden, logq = self.draft.advance(self.seq + list(candidates))
        taps = self.draft.last_taps[-1] if self.draft.layers else None
        return DraftStep(hidden=hidden[-1], logq=logq[-1], logits=self.draft.last_logits, layers=taps)

    def draft_dist(self, candidates: list[int] = ()) -> torch.Tensor:
        """q(· | seq + candidates), the draft's next-token log-probs (V,)."""
        return self.draft_step(candidates).logq

    def confidence(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probs of a model's confidence distribution (see ``StopRule``) from its raw logits."""
        temperature = self.pair.sampling.temperature or 1.0
        return (logits.float() / temperature).log_softmax(-1)

    def draft_confidence(self, step: DraftStep) -> torch.Tensor:
        """The draft's confidence log-probs where ``step.logq`` was drawn (see ``StopRule``): ``logq`` itself when the
        decoding samples, top-k and top-p included, the q the labels hold; under greedy decoding the raw logits'
        softmax (``confidence``)."""
        if self.pair.sampling.temperature > 0:
            return step.logq
        return self.confidence(step.logits)

    def draft_feature(self, candidates: list[int]) -> torch.Tensor:
        """The draft's hidden state of the last candidate, read at its own position (d,): one draft forward, which
        also gives q for the token after it (its tapped layers: ``draft.last_taps[-1]``)."""
        return self.draft.advance(self.seq + list(candidates))[0][-1]

    def target_dist(self, candidates: list[int] = (), rows: int = 1) -> torch.Tensor:
        """p at the last ``rows`` positions of seq + candidates, (rows, V); one target call."""
        hidden, logps = self.target.advance(self.seq + list(candidates), rows=rows)
        self._target_rows = (hidden[-rows:], logps, self.target.row_logits)
        return logps

    def target_sampled(self, row: int) -> None:
        """Note that the token appended next to ``seq`` is drawn at row ``row`` of the last ``target_dist`` call
        (the bonus token, a correction, or a candidate the target judged), for ``head_context``."""
        hidden, logps, logits = self._target_rows
        self.stale = (len(self.seq), hidden[row], logps[row])
        self.stale_logits = logits[row]
        self._stale_scores = None

    def head_context(self, candidates: list[int], layers: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The label columns (``data_gen/SCHEMA.md``) a head may read beyond the draft's scores, for the last of
        ``candidates`` (drafted after ``seq``): its index k after the token the last target call sampled, its index
        in the response, the target's entropy, top-1 probability and hidden state there, and the draft's tapped
        layers ``layers``. Before the first target call the stale columns are zero, as on a label row with k = 0."""
        at = len(self.seq) + len(candidates) - 1
        context = {"response_index": torch.tensor(float(at - self.n_prompt))}
        if self.stale is None:
            d = self.pair.target.config.hidden_size
            context.update(round_index=torch.tensor(0.0), stale_entropy_target=torch.tensor(0.0),
                           stale_top1_target=torch.tensor(0.0), stale_target=torch.zeros(d))
        else:
            sampled_at, hidden, logp = self.stale
            if self._stale_scores is None:  # once per target call, and only where a head reads them
                self._stale_scores = (entropy(logp), logp.max().exp())
            stale_entropy, stale_top1 = self._stale_scores
            context.update(round_index=torch.tensor(float(at - sampled_at)), stale_entropy_target=stale_entropy,
                           stale_top1_target=stale_top1, stale_target=hidden)
        if layers is not None:
            context["layers"] = layers
        return context

    def draft_round(self, max_k: int, stop: StopRule | None = None) -> tuple[list[int], list[torch.Tensor]]:
        """Draft up to ``max_k`` candidates (fewer when ``stop`` says so, at an EOS, or where the round's target
        token would not fit); return them and the draft distributions they were sampled from.

        Every draft forward of the round has its q sampled and submitted: a rule that read the last candidate's
        own forward (``StopRule.reads_candidate``) gets one more candidate drawn from it after it stops."""
        cap = min(max_k, self.remaining - 1)
        stop = self.rounds.stop(stop)
        if stop is not None:
            stop.reset()
        candidates: list[int] = []
        logqs: list[torch.Tensor] = []
        stopping = False
        while len(candidates) < cap:
            step = self.draft_step(candidates)
            y = self.sample(step.logq)
            candidates.append(y)
            logqs.append(step.logq)
            if stopping or y in self.eos or len(candidates) == cap:
                break
            if stop is not None and stop(self, candidates, step):
                if not stop.reads_candidate:
                    break
                stopping = True  # the rule's forward gave q for the next candidate: draw it, then verify
        return candidates, logqs

    def verify(self, candidates: list[int], logqs: list[torch.Tensor], accept: AcceptRule | None = None,
               on_reject: RejectRule = residual_distribution) -> int:
        """One target call over the candidates: keep them up to the first rejection (``accept``; None: speculative
        sampling's min(1, p/q), ``decoding.rules.speculative_keeps``), then add one target token (drawn from
        ``on_reject(q, p)`` at the rejection, or from p after the last candidate); return the number of candidates
        kept. With the defaults this is exact speculative sampling (Leviathan et al. 2023, Alg. 1)."""
        logps = self.target_dist(candidates, rows=len(candidates) + 1)
        # exact speculative sampling: min(1, p/q) of every candidate read in one transfer, one draw per candidate tested
        chances = rules.acceptance_chances(candidates, logqs, logps) if accept is None else None
        kept = self.rounds.keeps(len(candidates))
        n = 0
        while n < len(candidates):
            if chances is not None:
                keep = self.uniform() < chances[n]
            else:
                keep = accept(self, logqs[n], logps[n], candidates[n])
            if not (keep if kept is None else n < kept):
                break
            n += 1
        new = candidates[:n]
        if n < len(candidates):
            new.append(self.sample(on_reject(logqs[n], logps[n])))
        elif not (candidates and candidates[-1] in self.eos):
            new.append(self.sample(logps[n]))  # bonus token
        self.record_round(n, len(candidates) - n)
        self.extend(new[:n])
        if len(new) > n:  # the target drew the last token: what it left for the next round's head features
            self.target_sampled(n)
            self.extend(new[n:])
        return n

    def record_round(self, kept: int, discarded: int) -> None:
        self.accepted_lengths.append(kept)
        self.discarded += discarded

    # -- the end --------------------------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.pair.device)

    def result(self) -> DecodeResult:
        self.rounds.check_done()
        self._sync()
        stats = DecodeStats(
            wall_s=time.perf_counter() - self._t0,
            new_tokens=len(self.tokens),
            target_calls=self.target.calls,
            draft_calls=self.draft.calls,
            discarded=self.discarded,
            accepted_lengths=list(self.accepted_lengths),
            draft_catch_up=self.draft.beyond_one,
            target_reads=None if self.target.partial_reads else dict(sorted(self.target.reads.items())),
        )
        return DecodeResult(tokens=list(self.tokens), stats=stats)

"""SPRINTER (Zhou et al., Algorithm 2): sequential approximate verification by a small trained verifier.

The draft proposes one token at a time; the verifier decides on it from the draft's hidden state and the token's
draft scores. Its feature is, by default, the paper's (§3.2, "the last embedding of the previous token"): the
hidden state whose forward produced q for the token, so a decision costs no forward. A head trained on the
token's own position (``own``) needs the draft to read the token first, a forward that is wasted whenever the
target then replaces it. While the verifier accepts, drafting goes on with no target call. At the first token it
rejects, the target runs once on the pending tokens and checks that last token only: keep it with probability
min(1, p/q), else draw from norm((p − q)+). The tokens the verifier accepted are never checked.

Theorem 1 (output (1 − η_FP)·p + η_FP·q) and Theorem 7 (a draft token is kept with probability
1 − (1 − η_FP)·TV(p, q)) hold when the verifier accepts every token with q > p at one constant rate η_FP (its
rate on tokens with q ≤ p does not matter: those are kept by the target anyway). A learned head accepts y with a
probability a(y) that varies from token to token; the output is then
P(y) = p(y) + a(y)·(q(y) − p(y))+ − η_w·(p(y) − q(y))+, with η_w = Σ_y a(y)·(q(y) − p(y))+ / TV(p, q), and the kept
rate is 1 − (1 − η_w)·TV. ``pipeline/metrics.py`` measures η_w as ``eta_fp_thm_weighted``.

Counts: a round ends with the target call (``accepted_lengths`` gets the tokens kept, ``discarded`` the rejected
token when it is resampled); a last round the verifier accepts to the end of the sequence has no target call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from decoding import rules
from decoding.policies.registry import register
from decoding.state import HEAD_FEATURES, DecodeResult, Decoding, ModelPair
from heads.exported import ExportedHead


class Verifier(Protocol):
    """Accept the last token of ``ids``? ``hidden`` is the draft's hidden state at the verifier's ``position``
    attribute (``prev``, the default: the one that produced q for the token; ``own``: after reading it),
    ``confidence`` the draft's confidence log-probs (V,) at the token's position (``Decoding.draft_confidence``);
    None for a head that reads no draft scores."""

    def __call__(self, hidden: torch.Tensor, ids: list[int], generator: torch.Generator,
                 confidence: torch.Tensor | None) -> bool: ...


class HeadVerifier:
    """An exported SPRINTER head: accept when sigmoid(logit) ≥ τ."""

    def __init__(self, head: ExportedHead, tau: float):
        self.head, self.tau = head, tau
        self.position = head.position

    def __call__(self, hidden: torch.Tensor, ids: list[int], generator: torch.Generator,
                 confidence: torch.Tensor | None, context: dict | None = None) -> bool:
        return bool(rules.verifier_accepts(self.head.logit(hidden, confidence, ids[-1], context), self.tau))


@register("sprinter", exact=False, setting="tau", head_role="verifier", simulable=True, lemma31=False)
class Sprinter:
    def __init__(self, head: str | Path | None = None, tau: float | None = None, verifier: Verifier | None = None):
        """
        Args:
            head: path of an exported verifier head (role "verifier").
            tau: acceptance threshold on sigmoid(logit); None takes the one chosen at export.
            verifier: any ``Verifier`` instead of a head file (tests use verifiers of known error rates).
        """
        if (head is None) == (verifier is None):
            raise ValueError("give exactly one of head and verifier")
        self.head = None
        if head is not None:
            self.head = ExportedHead(head, role="verifier", computes=HEAD_FEATURES)
            tau = self.head.threshold if tau is None else float(tau)
            if not 0 <= tau <= 1:
                raise ValueError(f"tau must be in [0, 1], got {tau}")
            verifier = HeadVerifier(self.head, tau)
        self.tau = tau
        self.verifier = verifier
        self.position = getattr(verifier, "position", "prev")  # a plain callable reads the paper's feature
        # a log-softmax over the vocabulary per token: only for verifiers that may read it
        self.needs_confidence = self.head is None or bool(self.head.scores)

    def generate(self, pair: ModelPair, prompt_ids: list[int], generator: torch.Generator) -> DecodeResult:
        if self.head is not None:
            self.head.check(pair.draft, pair.target)
        tapped = self.head.draft_layers if self.head is not None else ()
        dec = Decoding(pair, prompt_ids, generator, tapped)
        while not dec.done:
            pending: list[int] = []  # accepted by the verifier, not seen by the target
            rejected = None
            while len(pending) < dec.remaining:
                step = dec.draft_step(pending)
                y = dec.sample(step.logq)
                confidence = dec.draft_confidence(step) if self.needs_confidence else None
                hidden = step.hidden if self.position == "prev" else dec.draft_feature(pending + [y])
                context = {}
                if self.head is not None and self.head.needs_context:
                    layers = (step.layers if self.position == "prev" else dec.draft.last_taps[-1]) if tapped else None
                    context = {"context": dec.head_context(pending + [y], layers)}
                if not self.verifier(hidden, dec.seq + pending + [y], generator, confidence, **context):
                    rejected = (y, step.logq)
                    break
                pending.append(y)
                if y in dec.eos:
                    break
            if rejected is None:  # the verifier accepted up to the end of the sequence
                dec.record_round(len(pending), 0)
                dec.extend(pending)
                continue
            y, logq = rejected
            logp = dec.target_dist(pending)[-1]  # one target call: p at the rejected token's position
            token, accepted = rules.check_token(y, logq, logp, dec.uniform, dec.sample)
            dec.record_round(len(pending) + accepted, 0 if accepted else 1)
            dec.extend(pending)
            dec.target_sampled(-1)
            dec.extend([token])
        return dec.result()

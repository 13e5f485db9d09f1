"""Label one batch of prompts on llama.cpp: the rows of ``data_gen.labeler.Labeler``, from the GGUF files as shipped.

The same categories, the same draws (each prompt's uniforms, ``prompt_uniforms``) and the same schema, computed with
the kernels a llama.cpp decoder runs. What differs is how the batch is laid out:

- No padding: every prompt is a sequence of its own in one llama.cpp context (``LlamaCppModel.decode``). The target
  samples every prompt's response at once, one ``llama_decode`` of one token per unfinished prompt a step.
- The draft reads one prompt at a time. Its candidate pass (Y_i read right after X<i) uses sequences instead of a
  4D mask: candidate i is sequence i + 1, and each token of the context belongs to sequence 0 and to every
  candidate's sequence after it. llama.cpp stores such a token once (the draft's sequences share cells) and lets a
  token attend to its own sequence's cells up to its position, so the context takes one forward and all of its
  candidates one more.
- A response ends at llama.cpp's end-of-generation ids (the eos ids the run passes: ``eos_token_ids`` of a llama.cpp
  model), as its decoder stops.
- llama.cpp gives the final norm's output and no earlier layer: the rows have no tapped layers (``hidden_layers``,
  ``hidden_layers_prev``); the manifest says so (``tapped_layers`` none) and a head that reads them is refused.
- A draft's own completion (``draft`` rows) is read in its generation steps, not again in one forward.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch

from core import label_math as lm
from core.backends import runtime_of
from core.llama_cpp import LlamaCppModel
from core.sampling import Sampling
from data_gen.labeler import (MAX_ROUND_INDEX, U_C, U_MIX, U_STALE, U_X, U_Y, Prompt, batch_category,
                              concat_rows, make_rows, prompt_uniforms, read_scores, round_index,
                              stale_columns)
from data_gen.sequences import SEQUENCES, sequences

STALE_REACH = MAX_ROUND_INDEX + 1
"""How far before its row a row's stale target state lies at most: the target's states are kept from there."""


class States:
    """A model's raw outputs at consecutive positions ``start`` … of one sequence: hidden states (T, d) and logits
    (T, V); the row at position j is the state after reading token j."""

    def __init__(self, start: int, hidden: list[torch.Tensor], logits: list[torch.Tensor]):
        self.start, self.hidden, self.logits = start, list(hidden), list(logits)
        self._stacked: tuple[torch.Tensor, torch.Tensor] | None = None

    def append(self, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        self.hidden.append(hidden)
        self.logits.append(logits)
        self._stacked = None

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, logits) at ``positions`` (...), clamped to those held (a padding row's position may lie outside)."""
        if self._stacked is None:  # stacked once for every lookup until the next append
            self._stacked = torch.stack(self.hidden), torch.stack(self.logits)
        i = (positions - self.start).clamp(0, len(self.hidden) - 1)
        return self._stacked[0][i], self._stacked[1][i]


class LlamaLabeler:
    """Turns a batch of prompts into label rows (a dict of column tensors), as ``Labeler`` does, on llama.cpp."""

    def __init__(self, draft: LlamaCppModel, target: LlamaCppModel, sampling: Sampling, *, seed: int,
                 eos_token_ids: list[int], pad_token_id: int, mixing_ratio: float = 0.15, target_states: bool = False):
        n = sampling.max_new_tokens
        if draft.sequences < n + 1:
            raise ValueError(f"the draft's context holds {draft.sequences} sequences; labeling {n} tokens a prompt "
                             f"needs {n + 1}")
        self.draft, self.target, self.s = draft, target, sampling
        self.seed, self.eos, self.pad = seed, torch.tensor(eos_token_ids), pad_token_id
        self.mixing_ratio, self.target_states = mixing_ratio, target_states
        self.timing: dict[str, float] | None = None
        """As ``Labeler.timing``: seconds of ``target_generation`` and ``draft_reading``, when a dict."""

    @contextlib.contextmanager
    def _timed(self, stage: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            if self.timing is not None:
                self.timing[stage] = self.timing.get(stage, 0.0) + time.perf_counter() - t

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        return lm.warp_logits(logits, self.s.temperature, self.s.top_k, self.s.top_p)

    def _uniform(self, *shape: int) -> torch.Tensor:
        """Warped log-probs of padding rows: a uniform distribution, so that their (dropped) numbers stay finite."""
        v = self.target.config.vocab_size
        return torch.full((*shape, v), -math.log(v))

    # ------------------------------------------------------------------ public
    def label(self, prompts: list[Prompt], device=None) -> dict:
        category = batch_category(prompts)
        u = prompt_uniforms(prompts, self.seed, self.s.max_new_tokens)
        if category == "original":
            return self._label_original(prompts, u)
        if category == "draft":
            return self._label_draft(prompts, u)
        return self._label_response(prompts, u, category)

    # ------------------------------------------------------------- the models
    def _read_prompts(self, model: LlamaCppModel, prompts, keep_from: list[int]) -> list[States]:
        """Empty ``model``'s cache and read every prompt as its own sequence, keeping the states of prompt b from
        position ``keep_from[b]``."""
        model.remove(-1, 0)
        tokens, positions, seqs, outputs = [], [], [], []
        for b, p in enumerate(prompts):
            tokens += p.input_ids
            positions += range(len(p.input_ids))
            seqs += [[b]] * len(p.input_ids)
            outputs += [j >= keep_from[b] for j in range(len(p.input_ids))]
        hidden, logits = model.decode(tokens, positions, seqs, outputs)
        states, row = [], 0
        for b, p in enumerate(prompts):
            kept = len(p.input_ids) - keep_from[b]
            states.append(States(keep_from[b], hidden[row : row + kept], logits[row : row + kept]))
            row += kept
        return states

    def _extend(self, model: LlamaCppModel, states: list[States], tokens: list[list[int]]) -> None:
        """Read ``tokens[b]`` in sequence b right after the positions ``states[b]`` ends at, appending their states."""
        flat, positions, seqs = [], [], []
        for b, (st, ts) in enumerate(zip(states, tokens)):
            end = st.start + len(st.hidden)
            flat += ts
            positions += range(end, end + len(ts))
            seqs += [[b]] * len(ts)
        if not flat:
            return
        hidden, logits = model.decode(flat, positions, seqs, [True] * len(flat))
        row = 0
        for st, ts in zip(states, tokens):
            for _ in ts:
                st.append(hidden[row], logits[row])
                row += 1

    def _generate(self, model: LlamaCppModel, prompts, u: torch.Tensor):
        """Sample a response from ``model`` for every prompt at once, the t-th token of prompt b from ``u[b, t]``
        (as ``Labeler._generate``): the response (B, N), its valid tokens (B, N), the warped log-probs it was drawn
        from (B, N, V), and each prompt's ``States`` from ``STALE_REACH`` positions before its end on, over every
        response token read (the last valid one is not: nothing is sampled after it)."""
        b_count, n = len(prompts), self.s.max_new_tokens
        states = self._read_prompts(model, prompts, [max(0, len(p.input_ids) - STALE_REACH) for p in prompts])
        x = torch.full((b_count, n), self.pad, dtype=torch.long)
        valid = torch.zeros((b_count, n), dtype=torch.bool)
        done = torch.zeros(b_count, dtype=torch.bool)
        steps = []
        for t in range(n):
            logp = self.warp(torch.stack([st.logits[-1] for st in states]))
            steps.append(logp)
            tok = lm.sample_from_logprobs(logp, u[:, t])
            x[:, t] = torch.where(done, self.pad, tok)
            valid[:, t] = ~done
            done = done | torch.isin(tok, self.eos)
            if bool(done.all()) or t == n - 1:
                break
            self._extend(model, states, [[int(x[b, t])] if not done[b] else [] for b in range(b_count)])
        width = len(steps)
        return x[:, :width], valid[:, :width], torch.stack(steps, dim=1), states

    def _read_target(self, prompts, responses: list[list[int]]) -> list[States]:
        """The target's states over each prompt + response, from ``STALE_REACH`` positions before the response."""
        states = self._read_prompts(self.target, prompts, [max(0, len(p.input_ids) - STALE_REACH) for p in prompts])
        self._extend(self.target, states, responses)
        return states

    def _read_draft(self, tokens: list[int], start: int, rows_from: int, slots: list[int]):
        """The draft reads ``tokens`` at positions ``start`` … (the cache keeps what lies before ``start``), each in
        sequence 0 and in the sequence of every candidate slot s whose position ``slots[s]`` lies after it; returns
        the (hidden, logits) of positions ``rows_from`` … ``start + len(tokens) − 1``."""
        with self._timed("draft_reading"):
            self.draft.remove(-1, start)
            positions = list(range(start, start + len(tokens)))
            seqs = [[0, *(1 + s for s, a in enumerate(slots) if a > j)] for j in positions]
            return self.draft.decode(tokens, positions, seqs, [j >= rows_from for j in positions])

    def _read_candidates(self, candidates: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """The draft's hidden state after reading candidate s at position ``slots[s]``, right after the context
        before it (``_read_draft`` put it in the candidate's sequence)."""
        with self._timed("draft_reading"):
            hidden, _ = self.draft.decode(candidates.tolist(), list(slots), [[1 + s] for s in range(len(slots))],
                                          [True] * len(slots))
            return hidden

    # ------------------------------------------------------------ the labels
    def _stale(self, states: list[States], a: torch.Tensor, prompt_lens: torch.Tensor, u: torch.Tensor) -> dict:
        """The stale columns of rows at unpadded index ``a`` (B, N) (``labeler.stale_columns``) from the target's
        ``states`` over each row's label sequence."""
        k = round_index(u, a)
        at = (a - k - 1).clamp(min=0)
        hidden, logits = zip(*(st.at(at[b]) for b, st in enumerate(states)))
        return stale_columns(k, a - prompt_lens.unsqueeze(1), torch.stack(hidden), self.warp(torch.stack(logits)))

    def _label_original(self, prompts, u):
        """``original`` rows: candidates at the last m positions of each prompt, as ``Labeler._label_original``
        (slot k of m replaces the token m − k from the prompt's end; its draws are indexed by that distance)."""
        lens = torch.tensor([len(p.input_ids) for p in prompts])
        b_count = len(prompts)
        m = max(1, min(self.s.max_new_tokens, int(lens.max()) - 1))
        a = lens.unsqueeze(1) - m + torch.arange(m)  # (B, m) the index each slot replaces; < 1 where invalid
        valid = a >= 1
        a_safe = a.clamp(min=1)
        keep_from = [max(0, int(lens[b]) - m - STALE_REACH) for b in range(b_count)]
        target_states = self._read_prompts(self.target, prompts, keep_from)
        logp = self.warp(torch.stack([st.at(a_safe[b] - 1)[1] for b, st in enumerate(target_states)]))
        logp[~valid] = self._uniform()
        logq, h_prev = self._uniform(b_count, m), torch.zeros(b_count, m, self.draft.config.hidden_size)
        y, feats = torch.zeros(b_count, m, dtype=torch.long), torch.zeros_like(h_prev)
        u_y = u[:, U_Y, :m].flip(-1)
        for b, p in enumerate(prompts):
            slots = a[b][valid[b]].tolist()
            if not slots:
                continue
            hidden, logits = self._read_draft(p.input_ids, 0, slots[0] - 1, slots)
            rows = valid[b].nonzero().squeeze(1)
            h_prev[b, rows], logq[b, rows] = hidden[: len(slots)], self.warp(logits[: len(slots)])
            y[b, rows] = lm.sample_from_logprobs(logq[b, rows], u_y[b, rows])
            feats[b, rows] = self._read_candidates(y[b, rows], slots)
        stats = lm.token_stats(logq, logp, y)
        extra = {"read_margin_draft": lm.top2_margin(logq),
                 **self._stale(target_states, a_safe, lens, u[:, U_STALE, :m].flip(-1))}
        rows = make_rows(prompts, "original", stats, y, feats, h_prev, valid, valid, a_safe, extra)
        return {**rows, SEQUENCES: sequences(prompts)}

    def _label_draft(self, prompts, u):
        """``draft`` rows: the draft's own completion Z; Z_i is the candidate at Z<i, scored by both models there."""
        with self._timed("draft_reading"):
            z, valid, logq, states = self._generate(self.draft, prompts, u[:, U_Y])
            # the last valid token of each completion, never read while sampling: its row's feature is the state
            # after it
            self._extend(self.draft, states, [[int(z[b, int(valid[b].sum()) - 1])] for b in range(len(prompts))])
        n = z.shape[1]
        lens = torch.tensor([len(p.input_ids) for p in prompts])
        a = lens.unsqueeze(1) + torch.arange(n)
        h_own = torch.stack([st.at(a[b])[0] for b, st in enumerate(states)])
        h_prev = torch.stack([st.at(a[b] - 1)[0] for b, st in enumerate(states)])
        target_states = self._read_target(prompts, [z[b][valid[b]].tolist() for b in range(len(prompts))])
        logp = self.warp(torch.stack([st.at(a[b] - 1)[1] for b, st in enumerate(target_states)]))
        stats = lm.token_stats(logq, logp, z)
        extra = {"read_margin_draft": lm.top2_margin(logq), **self._stale(target_states, a, lens, u[:, U_STALE, :n])}
        rows = make_rows(prompts, "draft", stats, z, h_own, h_prev, valid, valid, a, extra)
        return {**rows, SEQUENCES: sequences(prompts, z, valid)}

    def _response(self, prompts, u):
        """The target's response X to each prompt (sampled, or a dataset answer teacher-forced), its valid tokens,
        the warped p(·|X<i) and the target's ``States`` over prompt + X."""
        if prompts[0].response_ids is not None:
            n = self.s.max_new_tokens
            resp = [p.response_ids[:n] for p in prompts]
            width = max(len(r) for r in resp)
            x = torch.full((len(prompts), width), self.pad, dtype=torch.long)
            valid = torch.zeros_like(x, dtype=torch.bool)
            for b, r in enumerate(resp):
                x[b, : len(r)], valid[b, : len(r)] = torch.tensor(r, dtype=torch.long), True
            states = self._read_target(prompts, resp)
            lens = torch.tensor([len(p.input_ids) for p in prompts])
            a = lens.unsqueeze(1) + torch.arange(width)
            logp = self.warp(torch.stack([st.at(a[b] - 1)[1] for b, st in enumerate(states)]))
            return x, valid, logp, states
        with self._timed("target_generation"):
            return self._generate(self.target, prompts, u[:, U_X])

    def _label_response(self, prompts, u, category):
        """``target`` or ``interleaved`` rows, and the ``token_mixed`` rows of the same prompts."""
        x, valid, logp, target_states = self._response(prompts, u)
        b_count, n = x.shape
        d = self.draft.config.hidden_size
        lens = torch.tensor([len(p.input_ids) for p in prompts])
        a = lens.unsqueeze(1) + torch.arange(n)
        logq, logq_z = self._uniform(b_count, n), self._uniform(b_count, n)
        h_prev_x, h_z, h_prev_z = (torch.zeros(b_count, n, d) for _ in range(3))
        y, c = torch.zeros(b_count, n, dtype=torch.long), torch.zeros(b_count, n, dtype=torch.long)
        feats_y, feats_c = torch.zeros(b_count, n, d), torch.zeros(b_count, n, d)
        from_target = lm.mixing_mask(u[:, U_MIX, :n], self.mixing_ratio)
        z = x.clone()
        for b, p in enumerate(prompts):
            n_b, p_len = int(valid[b].sum()), len(p.input_ids)
            slots = list(range(p_len, p_len + n_b))
            # the prompt and X, each token also in the sequences of the candidates after it; rows from X's first
            # (an interleaved prompt's candidates come after Z, which replaces X: they share the prompt alone)
            hidden, logits = self._read_draft(p.input_ids + x[b, :n_b].tolist(), 0, p_len - 1, slots)
            h_prev_x[b, :n_b], logq[b, :n_b] = hidden[:n_b], self.warp(logits[:n_b])
            y[b, :n_b] = lm.sample_from_logprobs(logq[b, :n_b], u[b, U_Y, :n_b])
            if category == "target":
                feats_y[b, :n_b] = self._read_candidates(y[b, :n_b], slots)
            # SpecDec++ token mixing: Z takes X_i with probability r, else Y_i; the label stays on the clean X<i
            z[b, :n_b] = torch.where(from_target[b, :n_b], x[b, :n_b], y[b, :n_b])
            hz, lz = self._read_draft(z[b, :n_b].tolist(), p_len, p_len, slots if category == "interleaved" else [])
            h_z[b, :n_b] = hz
            h_prev_z[b, :n_b] = torch.cat([hidden[:1], hz[:-1]])
            logq_z[b, :n_b] = self.warp(torch.cat([logits[:1], lz[:-1]]))
            if category == "interleaved":  # fresh candidates at the mixed prefix
                c[b, :n_b] = lm.sample_from_logprobs(logq_z[b, :n_b], u[b, U_C, :n_b])
                feats_c[b, :n_b] = self._read_candidates(c[b, :n_b], slots)
        stale_x = self._stale(target_states, a, lens, u[:, U_STALE, :n])  # rows labeled on X (target, token_mixed)
        dists = lm.distribution_stats(logq, logp)
        rows = []
        if category == "target":
            stats = lm.token_stats(logq, logp, y, dists)
            extra = {"read_margin_draft": lm.top2_margin(logq), **stale_x}
            rows.append(make_rows(prompts, "target", stats, y, feats_y, h_prev_x, valid, valid, a, extra))
        stats = {**lm.token_stats(logq, logp, z, dists), **read_scores(logq_z, z)}  # the head reads q at Z<i
        extra = {"read_margin_draft": lm.top2_margin(logq_z), **stale_x}
        rows.append(make_rows(prompts, lm.TOKEN_MIXED, stats, z, h_z, h_prev_z, valid, valid & ~from_target, a,
                              extra))
        if category == "interleaved":  # the fresh candidates, scored by both models at the mixed prefix
            z_states = self._read_target(prompts, [z[b][valid[b]].tolist() for b in range(b_count)])
            logp_z = self.warp(torch.stack([st.at(a[b] - 1)[1] for b, st in enumerate(z_states)]))
            stats = lm.token_stats(logq_z, logp_z, c)
            extra = {"read_margin_draft": lm.top2_margin(logq_z), **self._stale(z_states, a, lens, u[:, U_STALE, :n])}
            rows.append(make_rows(prompts, "interleaved", stats, c, feats_c, h_prev_z, valid, valid, a, extra))
        states = None
        if self.target_states:  # the target's state along each response (``data_gen.sequences.target_state_columns``)
            hidden, logits = (torch.stack(t) for t in zip(*(st.at(a[b] - 1) for b, st in enumerate(target_states))))
            states = hidden, lm.confidence_top1(logits, self.s.temperature)
        return {**concat_rows(rows), SEQUENCES: sequences(prompts, x, valid, z, states)}


def is_llama(model) -> bool:
    """Whether ``model`` runs on llama.cpp, which this labeler drives (the transformers one drives the rest)."""
    return runtime_of(model).keeps_own_cache

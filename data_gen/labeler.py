"""Label one batch of prompts: the algorithm, independent of Lightning, files and model loading.

Every batch holds prompts of one prefix category (``label_math.CATEGORIES``, SPRINTER §3.2). In each category a
row is a candidate drawn from q at a prefix, with both models' scores of it at that same prefix:

1. ``original``: rows at the last positions j of the prompt: Y_j ~ q(·|prompt<j), scored by p(·|prompt<j).
2. ``draft``: the draft samples its own completion Z autoregressively; each Z_i is the candidate at Z<i, and one
   parallel target pass over prompt+Z scores it.
3. ``target``: the target samples a response X (or a dataset answer is teacher-forced); one draft forward over
   prompt+X gives q(·|X<i) and the candidates Y_i ~ q(·|X<i). Their own-position features come from a "candidate
   pass": Y_1..Y_N run against the cached prompt+X under a 4D mask that lets Y_i see X<i only.
4. ``interleaved``: Z mixes X and Y (SpecDec++ token mixing, target share r); fresh candidates C_i ~ q(·|Z<i)
   are scored by one parallel target pass over prompt+Z and read by a candidate pass over the cached prompt+Z.

Prompts with a target response (``target``, ``interleaved``) also give ``token_mixed`` rows for the SpecDec++ stop
head (§4.4): each draft token Z_i read in context Z<i, labeled on the clean prefix X<i; rows where Z_i is a target
token carry ``loss_mask = False``.

Every row carries two features: ``hidden``, the draft's hidden state after reading the token (SpecDec++ Eq. 4.1),
and ``hidden_prev``, the one before it, which produced q for the token (SPRINTER §3.2); the same two positions of
an early and a middle draft layer (``hidden_layers``, ``hidden_layers_prev``); and what a decoder would still hold
from the target's last call, drawn ``round_index`` positions back (``stale_*``, ``Labeler._stale``). Every random
draw of a prompt comes from its own generator (seed, prompt id), so a prompt's rows do not depend on the batch it
lands in.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from core import label_math as lm
from core.adapter import CausalLM, tap_layers
from core.quantization import prompt_scales
from core.sampling import Sampling, prompt_generator
from data_gen.sequences import SEQUENCES, sequences


@dataclass
class Prompt:
    prompt_id: int
    input_ids: list[int]
    category: str
    response_ids: list[int] | None = None  # a dataset answer, teacher-forced instead of sampling


U_X, U_Y, U_MIX, U_C, U_STALE = range(5)
"""Rows of a prompt's uniforms (``Labeler.label``)."""

MAX_ROUND_INDEX = 8
"""A row's candidate index in its drafting round is drawn uniformly from 1..MAX_ROUND_INDEX (the eval's largest
fixed K): the target's last call is that many positions back."""


def batch_category(prompts: list[Prompt]) -> str:
    """The one category of a batch's prompts."""
    categories = {p.category for p in prompts}
    if len(categories) != 1:
        raise ValueError(f"a batch must hold one category, got {sorted(categories)}")
    return categories.pop()


def prompt_uniforms(prompts: list[Prompt], seed: int, n: int) -> torch.Tensor:
    """(B, 5, n) uniforms, a fixed count per prompt from its own generator, so that a prompt's draws do not depend
    on its batch: rows ``U_X`` (the target's response X), ``U_Y`` (the draft's tokens Y, or its own completion),
    ``U_MIX`` (the mixing mask), ``U_C`` (candidates after Z<i), ``U_STALE`` (each row's round index)."""
    return torch.stack([torch.rand(5, n, generator=prompt_generator(seed, p.prompt_id), dtype=torch.float64)
                        for p in prompts])


def _prompt_scales(model: CausalLM, mask: torch.Tensor, prompt_width: int):
    """``core.quantization.prompt_scales`` for a forward whose first ``prompt_width`` columns are the prompt (per-token
    scales everywhere when it is 0)."""
    if prompt_width <= 0:
        return contextlib.nullcontext()
    return prompt_scales(getattr(model, "model", None), mask, prompt_width)


def _left_pad(seqs: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[b, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _float_mask(allowed: torch.Tensor, dtype) -> torch.Tensor:
    """Boolean (B, Q, K) -> additive 4D mask (B, 1, Q, K) that both eager and SDPA attention accept."""
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min).unsqueeze(1)


class Labeler:
    """Turns a batch of prompts into label rows (a dict of column tensors)."""

    def __init__(
        self,
        draft: CausalLM,
        target: CausalLM,
        sampling: Sampling,
        *,
        seed: int,
        eos_token_ids: list[int],
        pad_token_id: int,
        mixing_ratio: float = 0.15,
        mask_dtype=torch.float32,
        target_states: bool = False,
    ):
        self.draft, self.target, self.s = draft, target, sampling
        self.target_states = target_states
        """Whether the sequences of responses store the target's state along them (``data_gen.sequences.target_state_columns``)."""
        self.seed, self.eos, self.pad = seed, torch.tensor(eos_token_ids), pad_token_id
        self.mixing_ratio = mixing_ratio
        self.mask_dtype = mask_dtype
        self.layers = tap_layers(draft.num_layers())
        self.timing: dict[str, float] | None = None
        """When a dict, the seconds of each stage are added to it (``make bench-labels``): ``target_generation``
        (sampling the target's responses) and ``draft_reading`` (every draft forward, its own completions included); the rest of ``label`` is
        scoring (the target's parallel forwards and the label math)."""

    @contextlib.contextmanager
    def _timed(self, stage: str):
        if self.timing is None:
            yield
            return
        sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
        sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.timing[stage] = self.timing.get(stage, 0.0) + time.perf_counter() - t

    def _draft(self, ids, mask, pos, cache, prompt_width: int = 0):
        """The draft's forward: (last hidden state, the tapped layers' outputs, cache); ``prompt_width`` as
        ``_forward``."""
        with self._timed("draft_reading"), _prompt_scales(self.draft, mask, prompt_width):
            return self.draft.forward_tapped(ids, mask, pos, cache, self.layers)

    @staticmethod
    def _forward(model: CausalLM, ids, mask, pos, cache, prompt_width: int = 0):
        """``model``'s forward over (B, T) tokens that start with the prompt's ``prompt_width`` padded columns when it
        is positive: an int8 model then reads them with one activation scale per prompt, as the decoder's prefill,
        and every later token with its own, as the decoder's one-token steps (``core.quantization``)."""
        with _prompt_scales(model, mask, prompt_width):
            return model.forward(ids, mask, pos, cache)

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        return lm.warp_logits(logits, self.s.temperature, self.s.top_k, self.s.top_p)

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def label(self, prompts: list[Prompt], device) -> dict[str, torch.Tensor]:
        category = batch_category(prompts)
        u = prompt_uniforms(prompts, self.seed, self.s.max_new_tokens).to(device)
        ids, mask = _left_pad([p.input_ids for p in prompts], self.pad, device)
        if category == "original":
            return self._label_original(prompts, ids, mask, u)
        if category == "draft":
            return self._label_draft(prompts, ids, mask, u)
        return self._label_response(prompts, ids, mask, u, category)

    # --------------------------------------------------------------- original
    def _label_original(self, prompts, ids, mask, u):
        b, width = ids.shape
        lens = mask.sum(-1)
        if width < 2:  # a one-token prompt has no original-prefix rows; keep the shapes valid
            pad = torch.full((b, 1), self.pad, dtype=ids.dtype, device=ids.device)
            ids, mask, width = torch.cat([pad, ids], 1), torch.cat([torch.zeros_like(pad), mask], 1), 2
        m = max(1, min(self.s.max_new_tokens, int(lens.max()) - 1))
        pos = _positions(mask)
        # candidate slot k replaces the token at padded index a = width - m + k, read from context < a
        a = torch.arange(width - m, width, device=ids.device).expand(b, m)
        valid = (m - torch.arange(m, device=ids.device)).unsqueeze(0) <= (lens - 1).unsqueeze(1)

        h_t, _ = self._forward(self.target, ids, mask, pos, None, width)
        logp = self.warp(self.target.logits(h_t[:, width - m - 1 : width - 1]))
        cache = self.draft.new_cache()
        h_d, taps_d, cache = self._draft(ids, mask, pos, cache, width)
        h_prev = h_d[:, width - m - 1 : width - 1]
        logq = self.warp(self.draft.logits(h_prev))
        # uniforms indexed by distance from the prompt's end, so a row's draw does not depend on the batch's m
        y = lm.sample_from_logprobs(logq, u[:, U_Y, :m].flip(-1))
        feats, taps = self._candidate_pass(cache, mask, y, a, pos.gather(1, a))
        stats = lm.token_stats(logq, logp, y)
        extra = self._extra(taps, taps_d[:, width - m - 1 : width - 1], logq,
                            self._stale(h_t, mask, a, width, u[:, U_STALE, :m].flip(-1)))
        rows = make_rows(prompts, "original", stats, y, feats, h_prev, valid, valid, a - (width - lens).unsqueeze(1),
                          extra)
        return {**rows, SEQUENCES: sequences(prompts)}

    # --------------------------------------------------------------- response
    def _generate(self, model: CausalLM, ids, mask, u):
        """Sample a response from ``model`` with a KV cache, the t-th token from the uniforms ``u`` (B,N)[:, t];
        return it (B,N), valid (B,N), the warped log-probs it was drawn from (B,N,V) and the model's last hidden
        states over prompt + response (B, P+N−1, d), the one at index j producing the distribution of token j+1."""
        b, n = ids.shape[0], self.s.max_new_tokens
        eos = self.eos.to(ids.device)
        cache = model.new_cache()
        h, cache = self._forward(model, ids, mask, _positions(mask), cache, ids.shape[1])
        hidden = [h]
        next_pos = mask.sum(-1, keepdim=True)
        x = torch.full((b, n), self.pad, dtype=torch.long, device=ids.device)
        valid = torch.zeros((b, n), dtype=torch.bool, device=ids.device)
        steps = []
        done = torch.zeros(b, dtype=torch.bool, device=ids.device)
        for t in range(n):
            logp = self.warp(model.logits(h[:, -1]))
            steps.append(logp)
            tok = lm.sample_from_logprobs(logp, u[:, t])
            x[:, t] = torch.where(done, self.pad, tok)
            valid[:, t] = ~done
            done = done | torch.isin(tok, eos)
            if bool(done.all()) or t == n - 1:
                break
            mask = torch.cat([mask, (~done).long().unsqueeze(1)], dim=1)
            h, cache = model.forward(x[:, t : t + 1], mask, next_pos + t, cache)
            hidden.append(h)
        logp_steps = torch.stack(steps, dim=1)
        width = logp_steps.shape[1]
        return x[:, :width], valid[:, :width], logp_steps, torch.cat(hidden, dim=1)

    def _teacher_force(self, prompts, ids, mask):
        """Use the dataset's answers as X: one target forward over prompt+X gives p(·|X<i) (and its hidden states,
        as ``_generate``)."""
        n = self.s.max_new_tokens
        resp = [p.response_ids[:n] for p in prompts]
        width = max(len(r) for r in resp)
        x = torch.full((len(prompts), width), self.pad, dtype=torch.long, device=ids.device)
        valid = torch.zeros_like(x, dtype=torch.bool)
        for b, r in enumerate(resp):
            x[b, : len(r)] = torch.tensor(r, dtype=torch.long)
            valid[b, : len(r)] = True
        full_mask = torch.cat([mask, valid.long()], dim=1)
        p_len = ids.shape[1]
        h, _ = self._forward(self.target, torch.cat([ids, x], 1), full_mask, _positions(full_mask), None, p_len)
        return x, valid, self.warp(self.target.logits(h[:, p_len - 1 : p_len - 1 + width])), h

    def _label_draft(self, prompts, ids, mask, u):
        """``draft`` rows: the draft's own completion Z; Z_i is the candidate at Z<i, scored by both models there."""
        p_len = ids.shape[1]
        with self._timed("draft_reading"):
            z, valid, logq, _ = self._generate(self.draft, ids, mask, u[:, U_Y])
        n = z.shape[1]
        full_mask = torch.cat([mask, valid.long()], dim=1)
        pos = _positions(full_mask)
        seq = torch.cat([ids, z], 1)
        h_d, taps_d, _ = self._draft(seq, full_mask, pos, None, p_len)
        h_t, _ = self._forward(self.target, seq, full_mask, pos, None, p_len)
        logp = self.warp(self.target.logits(h_t[:, p_len - 1 : p_len - 1 + n]))
        stats = lm.token_stats(logq, logp, z)
        a = self._response_index(ids, n)
        extra = self._extra(taps_d[:, p_len:], taps_d[:, p_len - 1 : p_len - 1 + n], logq,
                            self._stale(h_t, full_mask, a, p_len, u[:, U_STALE, :n]))
        rows = make_rows(prompts, "draft", stats, z, h_d[:, p_len:], h_d[:, p_len - 1 : p_len - 1 + n], valid, valid,
                          self._offsets(mask, n), extra)
        return {**rows, SEQUENCES: sequences(prompts, z, valid)}

    def _label_response(self, prompts, ids, mask, u, category):
        """``target`` or ``interleaved`` rows, and the ``token_mixed`` rows of the same prompts."""
        p_len = ids.shape[1]
        if prompts[0].response_ids is not None:
            x, valid, logp, h_x = self._teacher_force(prompts, ids, mask)
        else:
            with self._timed("target_generation"):
                x, valid, logp, h_x = self._generate(self.target, ids, mask, u[:, U_X])
        n = x.shape[1]
        full_mask = torch.cat([mask, valid.long()], dim=1)
        pos = _positions(full_mask)
        resp_pos = pos[:, p_len:]
        offsets = self._offsets(mask, n)
        a = self._response_index(ids, n)
        stale_x = self._stale(h_x, full_mask, a, p_len, u[:, U_STALE, :n])  # rows labeled on X (target, token_mixed)
        cache = self.draft.new_cache()
        h_d, taps_d, cache = self._draft(torch.cat([ids, x], 1), full_mask, pos, cache, p_len)
        h_prev_x = h_d[:, p_len - 1 : p_len - 1 + n]
        logq = self.warp(self.draft.logits(h_prev_x))
        y = lm.sample_from_logprobs(logq, u[:, U_Y, :n])
        rows = []
        dists = lm.distribution_stats(logq, logp)  # the same positions for the target rows and the token-mixed ones
        if category == "target":
            feats, taps = self._candidate_pass(cache, full_mask, y, a, resp_pos)
            stats = lm.token_stats(logq, logp, y, dists)
            extra = self._extra(taps, taps_d[:, p_len - 1 : p_len - 1 + n], logq, stale_x)
            rows.append(make_rows(prompts, "target", stats, y, feats, h_prev_x, valid, valid, offsets, extra))

        # SpecDec++ token mixing: Z takes X_i with probability r, else Y_i; the label stays on the clean X<i
        from_target = lm.mixing_mask(u[:, U_MIX, :n], self.mixing_ratio)
        z = torch.where(from_target, x, y)
        if cache is not None:  # (stub models keep no cache)
            cache.crop(p_len - cache.get_seq_length())  # a negative count removes what follows the prompt
        h_z, taps_z, cache = self._draft(z, full_mask, resp_pos, cache)
        h_prev_z = torch.cat([h_d[:, p_len - 1 : p_len], h_z[:, :-1]], dim=1)
        taps_prev_z = torch.cat([taps_d[:, p_len - 1 : p_len], taps_z[:, :-1]], dim=1)
        logq_z = self.warp(self.draft.logits(h_prev_z))
        stats = {**lm.token_stats(logq, logp, z, dists), **read_scores(logq_z, z)}  # the head reads q at Z<i, as decoding
        extra = self._extra(taps_z, taps_prev_z, logq_z, stale_x)
        rows.append(make_rows(prompts, lm.TOKEN_MIXED, stats, z, h_z, h_prev_z, valid, valid & ~from_target, offsets,
                               extra))

        if category == "interleaved":  # fresh candidates at the mixed prefix, scored by both models there
            h_t, _ = self._forward(self.target, torch.cat([ids, z], 1), full_mask, pos, None, p_len)
            logp_z = self.warp(self.target.logits(h_t[:, p_len - 1 : p_len - 1 + n]))
            c = lm.sample_from_logprobs(logq_z, u[:, U_C, :n])
            feats, taps = self._candidate_pass(cache, full_mask, c, a, resp_pos)
            stats = lm.token_stats(logq_z, logp_z, c)
            extra = self._extra(taps, taps_prev_z, logq_z, self._stale(h_t, full_mask, a, p_len, u[:, U_STALE, :n]))
            rows.append(make_rows(prompts, "interleaved", stats, c, feats, h_prev_z, valid, valid, offsets, extra))
        states = None
        if self.target_states:  # (the logits of every response row: only where they are stored)
            h_states = h_x[:, p_len - 1 : p_len - 1 + n]
            states = (h_states, lm.confidence_top1(self.target.logits(h_states), self.s.temperature))
        return {**concat_rows(rows), SEQUENCES: sequences(prompts, x, valid, z, states)}

    @staticmethod
    def _offsets(mask, n):
        """Index of each response token in the unpadded sequence prompt+response, (B, n)."""
        return mask.sum(-1, keepdim=True) + torch.arange(n, device=mask.device)

    @staticmethod
    def _response_index(ids, n):
        """Padded index of each response token, (B, n)."""
        p_len = ids.shape[1]
        return torch.arange(p_len, p_len + n, device=ids.device).expand(ids.shape[0], n)

    def _stale(self, h_target, mask, a, prompt_end, u):
        """What a decoder still holds from the target's last call when it decides on the candidate at padded index
        ``a`` (B,N) (``stale_columns``): ``h_target`` (B,T,d) is the target's hidden state over the row's label
        sequence (index j produces the distribution of token j + 1). Also the candidate's index in the response
        (negative inside the prompt)."""
        start = mask.long().argmax(-1, keepdim=True).to(a.device)  # first unpadded index (responses pad on the right)
        k = round_index(u, a - start)
        at = (a - k - 1).clamp(min=0)
        hidden = h_target.gather(1, at.unsqueeze(-1).expand(*at.shape, h_target.shape[-1]))
        return stale_columns(k, a - prompt_end, hidden, self.warp(self.target.logits(hidden)))

    @staticmethod
    def _extra(taps_own, taps_prev, logq_read, stale):
        """The optional feature columns of rows (``data_gen/SCHEMA.md``): tapped layers at both feature positions, the
        draft's top-2 margin where the features read the token, and the stale target state."""
        return {"hidden_layers": taps_own, "hidden_layers_prev": taps_prev,
                "read_margin_draft": lm.top2_margin(logq_read), **stale}

    # ----------------------------------------------------------------- shared
    def _candidate_pass(self, cache, key_mask, cand, cand_index, cand_pos):
        """Hidden states (and tapped layers) of candidate tokens, each read right after the cached context before its
        own index.

        cand (B,M) replaces the token at padded index cand_index (B,M); it sees cached keys k < cand_index that
        are not padding, and itself. One forward for all M candidates.
        """
        b, m = cand.shape
        k_len = key_mask.shape[1]
        keys = torch.arange(k_len, device=cand.device)
        see_cache = (keys.view(1, 1, -1) < cand_index.unsqueeze(-1)) & key_mask.bool().unsqueeze(1)
        see_self = torch.eye(m, dtype=torch.bool, device=cand.device).expand(b, m, m)
        allowed = torch.cat([see_cache, see_self], dim=-1)
        h, taps, _ = self._draft(cand, _float_mask(allowed, self.mask_dtype), cand_pos, cache)
        return h, taps


def make_rows(prompts, category, stats, tokens, feats, feats_prev, valid, loss_mask, positions, extra):
    """Flatten (B, N) tensors to rows of one category, keeping valid positions; vectors are stored as float16."""
    keep = valid.cpu()
    stats = {**read_scores_of_label(stats), **stats}
    cols = {k: v.cpu()[keep] for k, v in stats.items()}
    b, n = valid.shape
    cols["prompt_id"] = torch.tensor([p.prompt_id for p in prompts]).unsqueeze(1).expand(b, n)[keep]
    cols["position"] = positions.cpu()[keep]
    cols["token_id"] = tokens.cpu()[keep]
    cols["loss_mask"] = loss_mask.cpu()[keep]
    cols["hidden"] = feats.cpu()[keep].to(torch.float16)
    cols["hidden_prev"] = feats_prev.cpu()[keep].to(torch.float16)
    for name, v in extra.items():
        v = v.cpu()[keep]
        cols[name] = v.to(torch.float16) if v.dim() == 2 else v
    cols["category"] = [category] * int(keep.sum())
    return cols


def round_index(u: torch.Tensor, room: torch.Tensor) -> torch.Tensor:
    """Each row's candidate index k in its drafting round, drawn from its uniform ``u`` on 1..MAX_ROUND_INDEX and cut
    so that the target's last call, k + 1 positions before the candidate, stays inside the sequence (``room``: the
    candidate's unpadded index); k = 0 only where no earlier state exists (the prompt's second token)."""
    return torch.minimum((u * MAX_ROUND_INDEX).long() + 1, room - 1)


def stale_columns(k: torch.Tensor, response_index: torch.Tensor, hidden: torch.Tensor, logp: torch.Tensor) -> dict:
    """The stale columns of rows whose target's last call is ``k`` (``round_index``) positions back: the call ended
    by sampling the token at a − k from the target's distribution there, ``logp`` (warped), computed from its hidden
    state ``hidden`` at a − k − 1; rows with k = 0 hold no such state (columns 0)."""
    held = k >= 1
    return {"round_index": k.clamp(min=0), "response_index": response_index,
            "stale_entropy_target": lm.entropy(logp) * held, "stale_top1_target": logp.max(-1).values.exp() * held,
            "stale_hidden_target": hidden * held.unsqueeze(-1)}


def read_scores(logq: torch.Tensor, token: torch.Tensor) -> dict:
    """The draft's scores of ``token`` where the features read it: log q(token) and H(q) under ``logq`` (..., V)."""
    return {"read_logp_draft": logq.gather(-1, token.unsqueeze(-1)).squeeze(-1), "read_entropy_draft": lm.entropy(logq)}


def read_scores_of_label(stats: dict) -> dict:
    """Where the label's prefix is the one the features read (every row but ``token_mixed``), the same numbers."""
    return {"read_logp_draft": stats["logp_draft"], "read_entropy_draft": stats["entropy_draft"]}


def concat_rows(parts: list[dict]) -> dict:
    """One dict of columns from several (tensors concatenated, lists joined), in order."""
    return {k: torch.cat([p[k] for p in parts]) if torch.is_tensor(parts[0][k]) else sum((p[k] for p in parts), [])
            for k in parts[0]}

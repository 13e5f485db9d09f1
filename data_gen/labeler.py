"""Label one batch of prompts: the algorithm, independent of Lightning, files and model loading.

Every batch holds prompts of one prefix category (see ``label_math.CATEGORIES``). For a prompt:

1. ``original``: no response. Rows sit at the last positions j of the prompt: the draft samples a candidate
   Y_j ~ q(·|prompt<j) and the target scores it, p(Y_j|prompt<j).
2. otherwise the target samples a response X (or a dataset answer is teacher-forced); one draft forward over
   prompt+X gives q(·|X<i) and the candidates Y_i ~ q(·|X<i).
   - ``target``: the feature of Y_i is read in the clean context (prompt, X<i, Y_i) for every i at once, with a
     "candidate pass": Y_1..Y_N run against the cached prompt+X under a 4D mask that lets Y_i see X<i only;
   - ``draft`` / ``interleaved``: the response Z takes Y_i everywhere (draft) or mixes X_i with share r
     (SpecDec++ token mixing); one draft forward over prompt+Z gives the features; rows where Z_i is a target
     token carry ``loss_mask = False``.

Labels come from the clean prefix X<i (SpecDec++ §4.4), or, with ``mixed_context_labels``, from both models run
on prompt+Z, so label and feature share one context. Every random draw of a prompt comes from its own
generator (seed, prompt id), so a prompt's rows do not depend on the batch it lands in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from data_gen import label_math as lm


class CausalLM(Protocol):
    """The two calls labeling needs from a model; ``HFCausalLM`` adapts a transformers model."""

    def forward(self, input_ids, attention_mask, position_ids, cache): ...  # -> (last hidden (B,T,d), cache)

    def logits(self, hidden): ...  # (B,T,d) -> (B,T,V)

    def new_cache(self): ...


class HFCausalLM:
    """A transformers causal LM seen as (base model -> last hidden state, output head -> logits).

    Splitting the two lets labeling run the vocabulary projection only where a distribution is needed.
    The hidden state is the base model's output (after the final norm), i.e. what the LM head reads.
    """

    def __init__(self, model):
        self.model = model
        self.base = model.get_decoder()
        self.head = model.get_output_embeddings()

    def forward(self, input_ids, attention_mask, position_ids, cache):
        out = self.base(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
        )
        return out.last_hidden_state, out.past_key_values

    def logits(self, hidden):
        return self.head(hidden)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)


@dataclass
class Sampling:
    """How the target samples its responses; the same warping defines both models' label distributions."""

    temperature: float = 1.0
    """Softmax temperature (0 = greedy)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    max_new_tokens: int = 128
    """Response length cap; also the number of rows taken from an ``original`` prompt."""

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError(f"bad sampling settings: {self}")


@dataclass
class Prompt:
    prompt_id: int
    input_ids: list[int]
    category: str
    response_ids: list[int] | None = None  # a dataset answer, teacher-forced instead of sampling


def prompt_generator(seed: int, prompt_id: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + prompt_id) % (2**63))


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
        mixed_context_labels: bool = False,
        mask_dtype=torch.float32,
    ):
        self.draft, self.target, self.s = draft, target, sampling
        self.seed, self.eos, self.pad = seed, torch.tensor(eos_token_ids), pad_token_id
        self.mixing_ratio, self.mixed_context_labels = mixing_ratio, mixed_context_labels
        self.mask_dtype = mask_dtype

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        return lm.warp_logits(logits, self.s.temperature, self.s.top_k, self.s.top_p)

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def label(self, prompts: list[Prompt], device) -> dict[str, torch.Tensor]:
        categories = {p.category for p in prompts}
        if len(categories) != 1:
            raise ValueError(f"a batch must hold one category, got {sorted(categories)}")
        n = self.s.max_new_tokens
        draws = []  # per prompt: uniforms for X, for Y, for the mixing mask, fixed count => batch-independent
        for p in prompts:
            g = prompt_generator(self.seed, p.prompt_id)
            draws.append(torch.rand(3, n, generator=g, dtype=torch.float64))
        u = torch.stack(draws).to(device)  # (B, 3, N)
        ids, mask = _left_pad([p.input_ids for p in prompts], self.pad, device)
        if categories == {"original"}:
            cols = self._label_original(prompts, ids, mask, u)
        else:
            cols = self._label_response(prompts, ids, mask, u, categories.pop())
        return cols

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

        h_t, _ = self.target.forward(ids, mask, pos, None)
        logp = self.warp(self.target.logits(h_t[:, width - m - 1 : width - 1]))
        cache = self.draft.new_cache()
        h_d, cache = self.draft.forward(ids, mask, pos, cache)
        logq = self.warp(self.draft.logits(h_d[:, width - m - 1 : width - 1]))
        # uniforms indexed by distance from the prompt's end, so a row's draw does not depend on the batch's m
        y = lm.sample_from_logprobs(logq, u[:, 1, :m].flip(-1))
        feats = self._candidate_pass(cache, mask, y, a, pos.gather(1, a))
        stats = lm.token_stats(logq, logp, y)
        return self._rows(prompts, stats, y, feats, valid, valid, a - (width - lens).unsqueeze(1))

    # --------------------------------------------------------------- response
    def _generate(self, ids, mask, u):
        """Sample X from the target with a KV cache; return X (B,N), valid (B,N), warped log-probs (B,N,V)."""
        b, n = ids.shape[0], self.s.max_new_tokens
        eos = self.eos.to(ids.device)
        cache = self.target.new_cache()
        h, cache = self.target.forward(ids, mask, _positions(mask), cache)
        next_pos = mask.sum(-1, keepdim=True)
        x = torch.full((b, n), self.pad, dtype=torch.long, device=ids.device)
        valid = torch.zeros((b, n), dtype=torch.bool, device=ids.device)
        steps = []
        done = torch.zeros(b, dtype=torch.bool, device=ids.device)
        for t in range(n):
            logp = self.warp(self.target.logits(h[:, -1]))
            steps.append(logp)
            tok = lm.sample_from_logprobs(logp, u[:, 0, t])
            x[:, t] = torch.where(done, self.pad, tok)
            valid[:, t] = ~done
            done = done | torch.isin(tok, eos)
            if bool(done.all()) or t == n - 1:
                break
            mask = torch.cat([mask, (~done).long().unsqueeze(1)], dim=1)
            h, cache = self.target.forward(x[:, t : t + 1], mask, next_pos + t, cache)
        logp_steps = torch.stack(steps, dim=1)
        width = logp_steps.shape[1]
        return x[:, :width], valid[:, :width], logp_steps

    def _teacher_force(self, prompts, ids, mask):
        """Use the dataset's answers as X: one target forward over prompt+X gives p(·|X<i)."""
        n = self.s.max_new_tokens
        resp = [p.response_ids[:n] for p in prompts]
        width = max(len(r) for r in resp)
        x = torch.full((len(prompts), width), self.pad, dtype=torch.long, device=ids.device)
        valid = torch.zeros_like(x, dtype=torch.bool)
        for b, r in enumerate(resp):
            x[b, : len(r)] = torch.tensor(r, dtype=torch.long)
            valid[b, : len(r)] = True
        full_mask = torch.cat([mask, valid.long()], dim=1)
        h, _ = self.target.forward(torch.cat([ids, x], 1), full_mask, _positions(full_mask), None)
        p_len = ids.shape[1]
        return x, valid, self.warp(self.target.logits(h[:, p_len - 1 : p_len - 1 + width]))

    def _label_response(self, prompts, ids, mask, u, category):
        p_len = ids.shape[1]
        if prompts[0].response_ids is not None:
            x, valid, logp = self._teacher_force(prompts, ids, mask)
        else:
            x, valid, logp = self._generate(ids, mask, u)
        n = x.shape[1]
        full_mask = torch.cat([mask, valid.long()], dim=1)
        pos = _positions(full_mask)
        cache = self.draft.new_cache()
        h_d, cache = self.draft.forward(torch.cat([ids, x], 1), full_mask, pos, cache)
        logq = self.warp(self.draft.logits(h_d[:, p_len - 1 : p_len - 1 + n]))
        y = lm.sample_from_logprobs(logq, u[:, 1, :n])
        resp_pos = pos[:, p_len:]
        offsets = mask.sum(-1, keepdim=True) + torch.arange(n, device=ids.device)  # index in the unpadded sequence

        if category == "target":
            a = torch.arange(p_len, p_len + n, device=ids.device).expand(len(prompts), n)
            feats = self._candidate_pass(cache, full_mask, y, a, resp_pos)
            stats = lm.token_stats(logq, logp, y)
            return self._rows(prompts, stats, y, feats, valid, valid, offsets)

        from_target = torch.zeros_like(valid)
        if category == "interleaved":
            from_target = u[:, 2, :n] < self.mixing_ratio
        z = torch.where(from_target, x, y)
        if cache is not None and cache.get_seq_length() > p_len:
            cache.crop(p_len - cache.get_seq_length())  # a negative count removes tokens
        h_z, _ = self.draft.forward(z, full_mask, resp_pos, cache)
        if self.mixed_context_labels:  # both distributions conditioned on the mixed prefix Z<i
            h_prev = torch.cat([h_d[:, p_len - 1 : p_len], h_z[:, :-1]], dim=1)
            logq = self.warp(self.draft.logits(h_prev))
            h_t, _ = self.target.forward(torch.cat([ids, z], 1), full_mask, pos, None)
            logp = self.warp(self.target.logits(h_t[:, p_len - 1 : p_len - 1 + n]))
        stats = lm.token_stats(logq, logp, z)
        return self._rows(prompts, stats, z, h_z, valid, valid & ~from_target, offsets)

    # ----------------------------------------------------------------- shared
    def _candidate_pass(self, cache, key_mask, cand, cand_index, cand_pos):
        """Hidden states of candidate tokens, each read right after the cached context before its own index.

        cand (B,M) replaces the token at padded index cand_index (B,M); it sees cached keys k < cand_index that
        are not padding, and itself. One forward for all M candidates.
        """
        b, m = cand.shape
        k_len = key_mask.shape[1]
        keys = torch.arange(k_len, device=cand.device)
        see_cache = (keys.view(1, 1, -1) < cand_index.unsqueeze(-1)) & key_mask.bool().unsqueeze(1)
        see_self = torch.eye(m, dtype=torch.bool, device=cand.device).expand(b, m, m)
        allowed = torch.cat([see_cache, see_self], dim=-1)
        h, _ = self.draft.forward(cand, _float_mask(allowed, self.mask_dtype), cand_pos, cache)
        return h

    def _rows(self, prompts, stats, tokens, feats, valid, loss_mask, positions):
        """Flatten (B, N) tensors to rows, keeping valid positions."""
        keep = valid.cpu()
        cols = {k: v.cpu()[keep] for k, v in stats.items()}
        b, n = valid.shape
        cols["prompt_id"] = torch.tensor([p.prompt_id for p in prompts]).unsqueeze(1).expand(b, n)[keep]
        cols["position"] = positions.cpu()[keep]
        cols["token_id"] = tokens.cpu()[keep]
        cols["loss_mask"] = loss_mask.cpu()[keep]
        cols["hidden"] = feats.cpu()[keep].to(torch.float16)
        cats = [p.category for p in prompts]
        cols["category"] = [cats[i] for i in keep.nonzero()[:, 0].tolist()]
        return cols

"""One label row recomputed the plainest way: its prefixes from the stored sequences, the columns its place and its
prompt's random draws fix, and the columns the models give, read one unpadded sequence at a time."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from core import label_math as lm
from core.adapter import tap
from core.errors import UserError
from core.quantization import decode_numerics, prompt_scales
from core.sampling import Sampling, prompt_generator
from data_gen.audit_compare import DRAW_COLUMN
from data_gen.labeler import MAX_ROUND_INDEX, U_C, U_MIX, U_STALE, U_X, U_Y

PROMPT_ROWS = {"original": {"original"}, "draft": {"draft"}, "target": {"target", lm.TOKEN_MIXED},
               "interleaved": {"interleaved", lm.TOKEN_MIXED}}
"""The row categories a prompt of each category gives (``data_gen.labeler``)."""


@dataclass
class Contexts:
    """What one row reads: the label's prefix (both models' distributions), the features' prefix, the token, and
    the index of the prompt's random draws the row used."""

    label: list[int]
    features: list[int]
    token: int
    prompt_length: int
    draw: int


def misplaced(row: dict, seq: dict, max_new_tokens: int) -> str | None:
    """Why a row cannot sit where its ``category`` and ``position`` put it in its prompt's sequences, or None."""
    pos, category, n_prompt = int(row["position"]), row["category"], len(seq["prompt_ids"])
    if category not in PROMPT_ROWS.get(seq["category"], ()):
        return "category"
    if category == "original":  # the last rows of the prompt, each read after at least one token
        return None if 1 <= pos < n_prompt and n_prompt - 1 - pos < max_new_tokens else "position"
    end = n_prompt + len(seq["mixed_ids"] if category in ("interleaved", lm.TOKEN_MIXED) else seq["response_ids"])
    return None if n_prompt <= pos < end else "position"


def contexts(row: dict, seq: dict) -> Contexts:
    """A row's prefixes from its prompt's stored sequences (``data_gen.sequences.sequences``)."""
    prompt, response, mixed = seq["prompt_ids"], seq["response_ids"], seq["mixed_ids"]
    pos, category = int(row["position"]), row["category"]
    # an original row's draws are indexed by its distance from the prompt's end, a response row's by its index
    draw = len(prompt) - 1 - pos if category == "original" else pos - len(prompt)
    if category == "original":
        label = features = prompt[:pos]
    elif category in ("draft", "target"):
        label = features = (prompt + response)[:pos]
    elif category == "interleaved":
        label = features = (prompt + mixed)[:pos]
    elif category == lm.TOKEN_MIXED:
        label, features = (prompt + response)[:pos], (prompt + mixed)[:pos]
    else:
        raise UserError(f"row of unknown category {category!r}")
    return Contexts(label, features, int(row["token_id"]), len(prompt), draw)


ACCESS = ("plain", "decoder")
"""How the audit reads a sequence. Both read the row's whole prompt in one forward, as labeling and the decoder's
prefill read it, and the tokens after it (or after the part of it the sequence shares) from the KV cache: ``plain``
in one more forward, an int8 model with the labeler's numerics (``core.quantization.decode_numerics``, which
``Reader`` applies to the model it is given); ``decoder`` one token per forward, an int8 model through PyTorch's own
int8 kernels, as the evaluation's decoder reads. The two agree for float weights; for an int8 model ``decoder``
measures how far the labeled features are from what decoding reads."""


class Reader:
    """Reads one unpadded sequence per call: the last positions' normed hidden states, logits and the outputs of the
    tapped layers."""

    def __init__(self, model, access: str = "plain", layers: tuple[int, ...] = ()):
        if access not in ACCESS:
            raise UserError(f"unknown access {access!r}; choose one of {', '.join(ACCESS)}")
        self.model = decode_numerics(model) if access == "plain" else model
        self.base = self.model.get_decoder()
        self.access, self.layers = access, tuple(layers)
        self._prompt: tuple | None = None  # the last prompt read: (its ids, hidden states, taps, KV cache)

    def _read_prompt(self, prompt: list[int]):
        """The prompt's forward, kept for the next call on the same prompt (a row reads its prompt 2–3 times)."""
        if self._prompt is None or self._prompt[0] != prompt:
            with prompt_scales(self.model, torch.ones(1, len(prompt), dtype=torch.long), len(prompt)):
                out = self.base(input_ids=torch.tensor([prompt]), use_cache=True, output_hidden_states=True)
            self._prompt = (list(prompt), out.last_hidden_state[0], tap(out.hidden_states, self.layers)[0],
                            out.past_key_values)
        _, hidden, taps, cache = self._prompt
        return hidden, taps, copy.deepcopy(cache)  # the caller extends and crops its copy

    @torch.inference_mode()
    def __call__(self, ids: list[int], last: int, prompt: list[int]) -> tuple[torch.Tensor, ...]:
        """The last ``last`` positions of ``ids``, a sequence that starts with the row's ``prompt`` or a part of it."""
        shared = next((i for i, (a, b) in enumerate(zip(ids, prompt)) if a != b), min(len(ids), len(prompt)))
        prompt_hidden, prompt_taps, cache = self._read_prompt(prompt)
        hidden, taps = [prompt_hidden[:shared]], [prompt_taps[:shared]]
        if shared < len(prompt):
            cache.crop(shared - len(prompt))  # a negative count removes that many tokens from the end
        rest = ids[shared:]
        for chunk in ([rest] if self.access == "plain" else [[t] for t in rest]) if rest else []:
            out = self.base(input_ids=torch.tensor([chunk]), past_key_values=cache, use_cache=True,
                            output_hidden_states=True)
            cache = out.past_key_values
            hidden.append(out.last_hidden_state[0])
            taps.append(tap(out.hidden_states, self.layers)[0])
        hidden, taps = torch.cat(hidden)[-last:], torch.cat(taps)[-last:]
        head = self.model.get_output_embeddings()  # per position, as the decoder computes one distribution a call
        # the head reads the hidden states in the model's dtype (bfloat16 under `dtype: auto` on a bf16 CPU), as
        # the labeler and the decoder do; only the results are widened
        return hidden.float(), torch.cat([head(h.unsqueeze(0)) for h in hidden]).float(), taps


class LlamaReader:
    """``Reader``'s reads of a model on llama.cpp (``core.llama_cpp``): the sequence's last positions' normed hidden
    states and logits, its prompt kept in the model's cache between calls on one prompt. llama.cpp computes a token
    alike in any batch, so ``plain`` and ``decoder`` read the same; it taps no earlier layers."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids: list[int], last: int, prompt: list[int]) -> tuple[torch.Tensor, ...]:
        hidden, logits = self.model.read(ids, rows=last)
        return hidden.float(), logits.float(), hidden.new_zeros((last, 0))


@dataclass
class Labeling:
    """What a row's random draws depend on besides its prompt: the run's settings (``run.json``)."""

    seed: int
    max_new_tokens: int
    mixing_ratio: float
    sampled_response: bool
    """The target's responses were sampled (``response_source: target``), not teacher-forced answers."""

    def draws(self, prompt_id: int) -> torch.Tensor:
        """The prompt's uniforms, (5, max_new_tokens), as ``Labeler.label`` draws them."""
        g = prompt_generator(self.seed, prompt_id)
        return torch.rand(5, self.max_new_tokens, generator=g, dtype=torch.float64)


def fixed(row: dict, seq: dict, u: torch.Tensor, labeling: Labeling) -> dict:
    """The columns a row's place and its prompt's draws ``u`` fix, without a model: ``response_index``,
    ``round_index``, ``loss_mask``, the ``token_id`` of rows whose token is in the sequences; and which of the
    label prefix's distributions (``q``, ``p`` or None) the token was drawn from, with which uniform."""
    ctx = contexts(row, seq)
    i = ctx.draw
    # the target's last call: round_index positions back, drawn uniform on 1..MAX_ROUND_INDEX, cut so that it stays
    # inside the sequence (0 at the prompt's second token: no earlier target state)
    out = {"response_index": len(ctx.label) - ctx.prompt_length, "loss_mask": True, "draw": ("q", U_Y, i),
           "round_index": max(0, min(int(u[U_STALE, i] * MAX_ROUND_INDEX) + 1, len(ctx.label) - 1))}
    if row["category"] == "interleaved":
        out["draw"] = ("q", U_C, i)
    elif row["category"] == "draft":
        out["token_id"] = seq["response_ids"][i]  # Z_i, the draft's own completion
    elif row["category"] == lm.TOKEN_MIXED:
        from_target = bool(lm.mixing_mask(u[U_MIX, i], labeling.mixing_ratio))
        out["loss_mask"] = not from_target  # a target token is no draft sample
        out["token_id"] = seq["mixed_ids"][i]  # Z_i: X_i where the mixing took the target's token, else Y_i
        if from_target:  # X_i, drawn from p unless it is a teacher-forced answer
            out["draw"] = ("p", U_X, i) if labeling.sampled_response else None
    return out


def draw_gap(logprobs: torch.Tensor, u: float, token: int) -> float:
    """How much probability mass of ``logprobs`` lies between the uniform ``u`` and ``token``'s interval of its CDF
    (``lm.sample_from_logprobs`` draws ``token`` from ``u`` exactly when this is 0): a lower bound on the total
    variation between ``logprobs`` and any distribution that draws ``token`` from ``u``."""
    cdf = logprobs.double().exp().cumsum(-1)
    cdf = cdf / cdf[-1]
    lo, hi = (float(cdf[token - 1]) if token else 0.0), float(cdf[token])
    return max(lo - u, u - hi, 0.0)


def recompute(row: dict, seq: dict, draft: Reader, target: Reader, sampling: Sampling,
              draw: tuple | None = None) -> dict:
    """Every column of one row that the models give, read the plain way; with ``draw`` (``fixed``'s: the
    distribution, the stream and index of the prompt's uniforms ``draw[3]``) also the token that uniform draws
    (``token_draw``)."""
    ctx = contexts(row, seq)

    def warp(logits):
        return lm.warp_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)

    token = torch.tensor(ctx.token)
    _, q_logits, _ = draft(ctx.label, 1, seq["prompt_ids"])
    p_hidden, p_logits, _ = target(ctx.label, 1, seq["prompt_ids"])
    q, p = warp(q_logits[0]), warp(p_logits[0])
    out = {k: v.item() if v.dim() == 0 else v for k, v in lm.token_stats(q, p, token).items()}
    # the target's state after the label prefix, and its top-1: a stored target state's, where the prefix is the
    # response's (``data_gen.sequences.target_state_columns``)
    out.update(target_hidden=p_hidden[0].numpy(),
               target_top1=lm.confidence_top1(p_logits[0], sampling.temperature).item())
    if draw is not None:
        dist, stream, i, u = draw
        out[DRAW_COLUMN] = draw_gap(q if dist == "q" else p, float(u[stream, i]), ctx.token)
    hidden, logits, taps = draft(ctx.features + [ctx.token], 2, seq["prompt_ids"])
    read = warp(logits[0])
    if taps.shape[-1]:  # a draft read on llama.cpp taps none (its labels hold no such columns)
        out.update(hidden_layers=taps[1].numpy(), hidden_layers_prev=taps[0].numpy())
    out.update(hidden=hidden[1].numpy(), hidden_prev=hidden[0].numpy(), read_logp_draft=read[ctx.token].item(),
               read_entropy_draft=lm.entropy(read).item(), read_margin_draft=lm.top2_margin(read).item(),
               response_index=len(ctx.label) - ctx.prompt_length)
    # the target's last call: round_index positions back on the label's prefix (its drawn value is checked by
    # ``fixed``)
    k = int(row["round_index"])
    drawable = (k == 0) if len(ctx.label) == 1 else 1 <= k <= min(MAX_ROUND_INDEX, len(ctx.label) - 1)
    out["round_index"] = k if drawable else -1  # a k the labeler cannot draw is a mismatch of the column
    if k == 0 or not drawable:  # no earlier target state (a row at the prompt's second token)
        out.update(stale_hidden_target=np.zeros_like(row["stale_hidden_target"]), stale_entropy_target=0.0,
                   stale_top1_target=0.0)
        return out
    stale_hidden, stale_logits, _ = target(ctx.label[: len(ctx.label) - k], 1, seq["prompt_ids"])
    stale = warp(stale_logits[0])
    out.update(stale_hidden_target=stale_hidden[0].numpy(), stale_entropy_target=lm.entropy(stale).item(),
               stale_top1_target=stale.max().exp().item())
    return out

"""The model adapter: a causal LM seen as (base model -> last hidden state, output head -> logits).

Splitting the two lets labeling and decoding run the vocabulary projection only where a distribution is needed.
The hidden state is the base model's output after the final norm, what the LM head reads (and what heads read).
"""

from __future__ import annotations

from typing import Protocol


class CausalLM(Protocol):
    """The calls labeling and decoding need from a model; ``HFCausalLM`` adapts a transformers model."""

    def forward(self, input_ids, attention_mask, position_ids, cache): ...  # -> (last hidden (B,T,d), cache)

    def forward_tapped(self, input_ids, attention_mask, position_ids, cache, layers): ...
    # -> (last hidden (B,T,d), the outputs of ``layers`` (B,T,len(layers)·d) each scaled to unit RMS, cache)

    def num_layers(self) -> int: ...

    def logits(self, hidden): ...  # (B,T,V) from (B,T,d)

    def new_cache(self): ...


class HFCausalLM:
    """A transformers causal LM split into its base model and its output head."""

    def __init__(self, model):
        self.model = model
        self.base = model.get_decoder()
        self.head = model.get_output_embeddings()

    def _base(self, input_ids, attention_mask, position_ids, cache, every_layer: bool = False):
        return self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=cache is not None, output_hidden_states=every_layer)

    def forward(self, input_ids, attention_mask, position_ids, cache):
        out = self._base(input_ids, attention_mask, position_ids, cache)
        return out.last_hidden_state, out.past_key_values

    def forward_tapped(self, input_ids, attention_mask, position_ids, cache, layers):
        out = self._base(input_ids, attention_mask, position_ids, cache, every_layer=True)
        return out.last_hidden_state, tap(out.hidden_states, layers), out.past_key_values

    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def logits(self, hidden):
        return self.head(hidden)

    def new_cache(self):
        from transformers import DynamicCache, PretrainedConfig

        config = getattr(self.model, "config", None)
        return DynamicCache(config=config) if isinstance(config, PretrainedConfig) else DynamicCache()


TAPPED_DEPTHS = (1 / 4, 1 / 2)
"""Where the tapped draft layers sit, as fractions of its depth: an early and a middle one (EAGLE-3 reads low, mid and
high layers; the high one is the last hidden state)."""


def tap_layers(num_layers: int) -> tuple[int, ...]:
    """The draft layers whose outputs the ``hidden_layers`` label columns hold (``TAPPED_DEPTHS``)."""
    return tuple(max(1, int(num_layers * d)) for d in TAPPED_DEPTHS)


def tap(hidden_states, layers) -> "torch.Tensor":
    """The residual stream after each of ``layers`` (``hidden_states[i]`` is the output of layer i), each divided by
    its root mean square: the stream's scale grows with depth, and a head should see every layer on one scale."""
    import torch

    taps = [hidden_states[i].float() for i in layers]
    if not taps:
        return hidden_states[-1].new_zeros((*hidden_states[-1].shape[:-1], 0), dtype=torch.float32)
    return torch.cat([t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) for t in taps], dim=-1)

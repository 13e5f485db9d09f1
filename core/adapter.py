"""The model adapter: a causal LM seen as (base model -> last hidden state, output head -> logits).

Splitting the two lets labeling and decoding run the vocabulary projection only where a distribution is needed.
The hidden state is the base model's output after the final norm, what the LM head reads (and what heads read).
"""

from __future__ import annotations

from typing import Protocol


class CausalLM(Protocol):
    """The calls labeling and decoding need from a model; ``HFCausalLM`` adapts a transformers model."""

    def forward(self, input_ids, attention_mask, position_ids, cache): ...  # -> (last hidden (B,T,d), cache)

    def logits(self, hidden): ...  # (B,T,d) -> (B,T,V)

    def new_cache(self): ...


class HFCausalLM:
    """A transformers causal LM split into its base model and its output head."""

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
        from transformers import DynamicCache, PretrainedConfig

        config = getattr(self.model, "config", None)
        return DynamicCache(config=config) if isinstance(config, PretrainedConfig) else DynamicCache()

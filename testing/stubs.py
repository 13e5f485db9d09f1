"""Stub models with hand-written logits: every number a label row stores is known exactly.

A stub's next-token distribution depends only on the previous token: ``table[prev]`` holds log-probabilities
over a vocabulary of ``V`` ids. Its "hidden state" is the one-hot vector of the token it just read, so a row's
feature must be the one-hot of the row's own token.
"""

from __future__ import annotations

import math

import torch

NEG = -1e4  # log-probability of an impossible token (exp underflows to exactly 0 in float32)


class StubLM:
    def __init__(self, table: torch.Tensor):
        self.table = table  # (V, V): row = previous token, column = next token, log-probabilities
        self.vocab = table.shape[0]

    def forward(self, input_ids, attention_mask, position_ids, cache):
        return torch.nn.functional.one_hot(input_ids, self.vocab).float(), cache

    def forward_tapped(self, input_ids, attention_mask, position_ids, cache, layers):
        hidden, cache = self.forward(input_ids, attention_mask, position_ids, cache)
        return hidden, hidden.repeat(*([1] * (hidden.dim() - 1)), len(layers)), cache

    def num_layers(self) -> int:
        return 4

    def logits(self, hidden):
        return hidden @ self.table

    def new_cache(self):
        return None


def shift_table(vocab: int, probs: dict[int, float]) -> torch.Tensor:
    """table[prev, (prev + k) % vocab] = log probs[k]; every other next token impossible."""
    t = torch.full((vocab, vocab), NEG)
    for prev in range(vocab):
        for k, p in probs.items():
            t[prev, (prev + k) % vocab] = math.log(p) if p > 0 else NEG
    return t

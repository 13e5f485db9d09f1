"""The models the decoder reads: ``CachedLM``, one model and its KV cache, read through one class per backend behind
one interface (``ModelReader``), so that the decoder never asks which backend it holds:

- ``EagerReader``: a transformers model over its dynamic cache (``core.adapter.HFCausalLM``), with tapped layers;
- ``StaticReader``: a transformers model over our static cache (``decoding.static.StaticLM``: static, CUDA graphs,
  compiled layers);
- ``LlamaReader``: a GGUF file run by llama.cpp (``core.llama_cpp.LlamaCppModel``), which keeps its own cache and
  returns the rows asked for only.

``open_reader`` picks the class for a model; ``model_device`` and ``keeps_own_cache`` answer the two questions the
decoder's pair asks of a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from core.adapter import HFCausalLM
from core.backends import runtime_of
from core.label_math import warp_logits
from core.llama_cpp import LlamaCppModel
from core.sampling import Sampling
from decoding.static import StaticLM


class ModelReader(Protocol):
    device: torch.device

    def crop(self, kept: int, held: int) -> None:
        """Keep the cache of the first ``kept`` of the ``held`` tokens read."""

    def read(self, seq: list[int], start: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Read ``seq[start:]`` after the ``start`` tokens cached: the hidden states of the tokens read (T, d), the
        raw logits (rows, V) after each of the last ``rows`` prefixes of ``seq``, and the tapped layers' outputs
        (T, len(layers)·d) where the reader taps any (else None)."""


class EagerReader:
    """A transformers model over transformers' dynamic cache; ``layers``: those whose outputs each read keeps."""

    def __init__(self, model, layers: tuple[int, ...] = ()):
        self.lm = HFCausalLM(model)
        self.layers = tuple(layers)
        self.cache = self.lm.new_cache()
        self.device = model_device(model)

    def crop(self, kept: int, held: int) -> None:
        remove = self.cache.get_seq_length() - kept
        if remove > 0:
            self.cache.crop(-remove)

    def read(self, seq: list[int], start: int, rows: int):
        new = seq[start:]
        x = torch.tensor([new], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(new), device=self.device).unsqueeze(0)
        taps = None
        if self.layers:
            hidden, taps, _ = self.lm.forward_tapped(x, None, positions, self.cache, self.layers)
            taps, hidden = taps[0], hidden[0]
        else:
            hidden = self.lm.forward(x, None, positions, self.cache)[0][0]
        return hidden, self.lm.logits(hidden[-rows:]), taps


class StaticReader:
    """A transformers model over ``static`` (``decoding.static.StaticLM``): cropping only moves the position the
    next forward writes at."""

    def __init__(self, model, static: StaticLM):
        self.lm = HFCausalLM(model)
        self.static = static
        self.device = model_device(model)

    def crop(self, kept: int, held: int) -> None:
        pass

    def read(self, seq: list[int], start: int, rows: int):
        hidden, taps = self.static.forward(seq[start:], start)
        return hidden, self.lm.logits(hidden[-rows:]), taps


class LlamaReader:
    """A llama.cpp model, claimed by ``owner`` (one reader of its cache at a time)."""

    def __init__(self, model: LlamaCppModel, owner: object):
        self.model = model
        self.owner = owner
        self.device = model.device
        model.claim(owner)

    def crop(self, kept: int, held: int) -> None:
        self.model.crop(kept)

    def read(self, seq: list[int], start: int, rows: int):
        if self.model.owner is not self.owner:
            raise RuntimeError(f"{self.model.name}: another reader has taken this llama.cpp model's cache")
        hidden, logits = self.model.read(seq, rows, reader=self.owner)
        return hidden, logits, None


def open_reader(model, owner: object, layers: tuple[int, ...] = (), static: StaticLM | None = None) -> ModelReader:
    """The reader of ``model`` for ``owner`` (a ``CachedLM``): over ``static`` where given, tapping ``layers``."""
    if keeps_own_cache(model):
        if layers or static is not None:
            raise ValueError("a llama.cpp model has no tapped layers and no static cache of ours")
        return LlamaReader(model, owner)
    return EagerReader(model, layers) if static is None else StaticReader(model, static)


def keeps_own_cache(model) -> bool:
    """Whether ``model`` is run by a runtime that keeps its own cache (llama.cpp), which none of our decoders but
    the eager one can drive."""
    return runtime_of(model).keeps_own_cache


def model_device(model) -> torch.device:
    """Where a model's forwards run: its parameters' device (a llama.cpp model runs on the CPU)."""
    return model.device if keeps_own_cache(model) else next(model.parameters()).device


class CachedLM:
    """A causal LM and its KV cache over ``ids`` (the tokens it has read so far).

    ``advance(seq)`` brings the cache to cover ``seq``: it keeps the longest common prefix of ``ids`` and ``seq``
    (cropping the rest, which is how rejected candidates leave the cache) and reads what is missing in one forward.
    The model is read through its backend's reader (``decoding.backends``: transformers' dynamic cache, our static
    cache ``static``, or llama.cpp's own cache), which this class never tells apart.
    """

    def __init__(self, model, sampling: Sampling, layers: tuple[int, ...] = (), static: StaticLM | None = None):
        self.model = model
        self.reader = open_reader(model, self, layers, static)
        self.on_forward: Callable[[float], None] | None = None
        """Called with each forward's seconds (``ModelPair.on_forward``)."""
        self.sampling = sampling
        self.layers = tuple(layers)
        """Layers whose outputs each forward also keeps (``last_taps``; none: a plain forward)."""
        self.last_taps: torch.Tensor | None = None
        """The tapped layers' outputs (T, len(layers)·d) of the tokens the last forward read (``core.adapter.tap``)."""
        self.device = self.reader.device
        self.ids: list[int] = []
        self.calls = 0
        self.beyond_one = 0
        """Tokens the counted forwards read beyond one each, forwards from the sequence's start (a prompt) aside."""
        self.reads: dict[int, int] = {}
        """The counted forwards by the tokens each read, forwards from the sequence's start aside: what a cost by
        length (``decoding.costs.CostModel.predict``) prices, where each gave every token's row (``partial_reads``
        counts those that did not)."""
        self.partial_reads = 0
        self._last: tuple | None = None  # after all of ``ids``: hidden, log-probs, logits, taps
        self.last_logits: torch.Tensor | None = None
        """Raw logits (V,) of the next token after all of ``ids`` (before warping)."""
        self.row_logits: torch.Tensor | None = None
        """Raw logits (rows, V) of the rows the last ``advance`` returned."""

    def _crop(self, n: int) -> None:
        if n < len(self.ids):
            self.reader.crop(n, len(self.ids))
            del self.ids[n:]
            self._last = self.last_logits = None

    @torch.no_grad()
    def advance(self, seq: list[int], rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Read ``seq``; return hidden states of the tokens read now (T, d) and the warped log-probs (rows, V)
        of the next token after each of the last ``rows`` prefixes of ``seq`` (the last row: after all of it).

        With ``rows == 1`` and ``seq`` already read, the last forward's outputs come back without a new call.
        """
        common = 0
        for a, b in zip(self.ids, seq):
            if a != b:
                break
            common += 1
        if rows == 1 and common == len(seq) == len(self.ids) and self._last is not None:
            hidden, logprobs, self.last_logits, taps = self._last
            self.last_taps, self.row_logits = taps, self.last_logits[None]
            return hidden, logprobs
        self._crop(min(common, len(seq) - rows))
        new = seq[len(self.ids):]
        start = len(self.ids)
        t = time.perf_counter()
        hidden, logits, self.last_taps = self.reader.read(seq, start, rows)
        if self.on_forward is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.on_forward(time.perf_counter() - t)
        s = self.sampling
        logprobs = warp_logits(logits, s.temperature, s.top_k, s.top_p)
        self.ids.extend(new)
        self.calls += 1
        if start > 0:
            self.beyond_one += len(new) - 1
            self.reads[len(new)] = self.reads.get(len(new), 0) + 1
            self.partial_reads += rows < len(new)
        self.last_logits, self.row_logits = logits[-1], logits
        self._last = (hidden[-1:], logprobs[-1:], self.last_logits,
                      self.last_taps[-1:] if self.layers else None)
        return hidden, logprobs

"""One model over a static KV cache, its short forwards replayed as CUDA graphs: the decoder's GPU path
(``decoding/DESIGN.md``, "The GPU path", says why and how).

The cache is allocated once, ``capacity`` positions per layer (``PositionedLayer``); a forward writes its keys and
values at the positions it is given and attends through a mask built from them, so a forward of n tokens is one
fixed sequence of kernels, captured once per n up to ``max_graph_tokens`` and replayed; longer forwards run eagerly
through the same cache, and rejected positions are dropped by moving where the next forward writes. With
``compiled`` each decoder layer runs through ``torch.compile`` before capture, one compiled code for all layers.
Off the GPU the same cache runs eagerly (``graphs=False``), which the CPU tests compare with
``decoding.backends.CachedLM``.
"""

from __future__ import annotations

import math
import weakref

import torch

from core.adapter import HFCausalLM

COMPILE_BACKEND = "inductor"
"""``torch.compile``'s backend for ``compiled`` layers (the tests set ``aot_eager``: the same tracing, no code
generation, seconds instead of minutes on the CPU)."""
COMPILE_SETTINGS = {"allow_unspec_int_on_nn_module": True, "recompile_limit": 64}
"""Dynamo settings while a compiled layer is traced: the layer's number (``self.layer_idx``) is a symbolic int, so
every layer shares one compiled code; every model, length class and layer 0 add an entry to that code's cache."""
MAX_GRAPH_TOKENS = 32
"""Forwards of at most this many tokens are captured (the longest verification of max_k = 20 is 21 tokens)."""
CAPACITY_STEP = 256
"""Cache capacities are rounded up to a multiple of this, so that prompts of similar length share one cache."""


def _cache_classes():
    from transformers.cache_utils import Cache, StaticLayer

    class PositionedLayer(StaticLayer):
        """A static cache layer over one layer's slice of the stacked keys and values (``StackedCache``)."""

        def __init__(self, owner: "StaticLM", keys: torch.Tensor, values: torch.Tensor):
            super().__init__(max_cache_len=keys.shape[2])
            self.owner = weakref.proxy(owner)  # no reference loop: a released runner's memory goes at once
            self.keys, self.values = keys, values
            self.device = keys.device
            self.is_initialized = True

        def get_seq_length(self) -> int:
            return self.owner.length

    class StackedCache(Cache):
        """Every layer's keys and values in one tensor each, (layers, 1, kv heads, positions, head dim). A forward
        writes its keys and values at the positions its owner set for that forward (``StaticLM.write_at``), not at a
        running count: the decoder moves backwards over rejected candidates, and a captured graph must read where to
        write from a buffer it was captured with. The layer is picked by indexing the stacked tensors, so a compiled
        layer's code is the same for every layer."""

        def __init__(self, owner: "StaticLM", keys: torch.Tensor, values: torch.Tensor):
            super().__init__(layers=[PositionedLayer(owner, k, v) for k, v in zip(keys, values)])
            self.owner = weakref.proxy(owner)
            self.stacked_keys, self.stacked_values = keys, values

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            at = self.owner.write_at
            keys, values = self.stacked_keys[layer_idx], self.stacked_values[layer_idx]
            keys.index_copy_(2, at, key_states.to(keys.dtype))
            values.index_copy_(2, at, value_states.to(values.dtype))
            return keys, values

    return StackedCache


class StaticLM:
    """A causal LM over a preallocated KV cache of ``capacity`` positions; ``forward(ids, start)`` reads ``ids`` at
    positions start, start + 1, … and returns their hidden states (and tapped layers). With ``graphs`` (CUDA only),
    forwards of at most ``max_graph_tokens`` tokens are captured once per length and replayed."""

    def __init__(self, model, capacity: int, layers: tuple[int, ...] = (), graphs: bool = False,
                 max_graph_tokens: int = MAX_GRAPH_TOKENS, compiled: bool = False):
        self.lm = HFCausalLM(model)
        self.layers = tuple(layers)
        self.device = next(model.parameters()).device
        if graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not {self.device}")
        self.graphs = graphs
        self.capacity = int(capacity)
        self.max_graph_tokens = int(max_graph_tokens)
        config = model.config
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(model.parameters()).dtype
        # the positions past ``capacity`` are scratch: a capture's warm-up forwards write there, never over a sequence
        total = self.capacity + self.max_graph_tokens
        shape = (config.num_hidden_layers, 1, kv_heads, total, head_dim)
        self.cache = _cache_classes()(self, torch.zeros(shape, dtype=dtype, device=self.device),
                                      torch.zeros(shape, dtype=dtype, device=self.device))
        self.compiled = None
        """Each decoder layer's call under ``torch.compile`` (``compiled``), swapped in while this runner's forward
        runs: the model itself stays as it was for any other decoder."""
        if compiled:
            self.compiled = [(layer, torch.compile(layer._call_impl, backend=COMPILE_BACKEND, fullgraph=True))
                             for layer in self.lm.base.layers]
        self.key_positions = torch.arange(total, device=self.device)
        self.mask_dtype = dtype
        self.write_at = self.key_positions[:0]
        """The positions the running forward writes (set before each forward, or captured with its graph)."""
        self.length = 0
        """Positions of the sequence the cache holds now (for ``get_seq_length``; the decoder keeps its own ids)."""
        self.io = torch.zeros((2, self.max_graph_tokens), dtype=torch.long, device=self.device)
        """A replayed forward's tokens (row 0) and positions (row 1)."""
        self.captured: dict[int, tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self.pool = torch.cuda.graph_pool_handle() if graphs else None

    def _run(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward itself: ``ids`` (1, n) at ``positions`` (n,); each token attends to every position up to its
        own, so whatever a rejected candidate left further on is never read."""
        self.write_at = positions
        if self.compiled is not None:
            with torch._dynamo.config.patch(**COMPILE_SETTINGS):
                before = [layer._compiled_call_impl for layer, _ in self.compiled]
                try:
                    for layer, call in self.compiled:
                        layer._compiled_call_impl = call
                    return self._forward(ids, positions)
                finally:  # as they were: a layer the user compiled stays so
                    for (layer, _), call in zip(self.compiled, before):
                        layer._compiled_call_impl = call
        return self._forward(ids, positions)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        allowed = self.key_positions[None, :] <= positions[:, None]
        mask = torch.zeros(allowed.shape, dtype=self.mask_dtype, device=self.device)
        mask = mask.masked_fill(~allowed, torch.finfo(self.mask_dtype).min)[None, None]
        if self.layers:
            hidden, taps, _ = self.lm.forward_tapped(ids, mask, positions[None], self.cache, self.layers)
            return hidden[0], taps[0]
        hidden, _ = self.lm.forward(ids, mask, positions[None], self.cache)
        return hidden[0], None

    @torch.no_grad()  # an inference forward, whoever asks for the capture: no autograd state in the graph
    def _capture(self, n: int) -> tuple[torch.cuda.CUDAGraph, tuple]:
        ids, positions = self.io[0, :n][None], self.io[1, :n]
        self.io[0, :n] = 0
        self.io[1, :n] = torch.arange(self.capacity, self.capacity + n, device=self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-ups (cuBLAS workspaces, lazy buffers) before capture, as torch asks
            for _ in range(2):
                self._run(ids, positions)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._run(ids, positions)
        self.captured[n] = (graph, out)
        return self.captured[n]

    def release(self) -> None:
        """Free the cache and the graphs now (their memory goes back to torch's allocator)."""
        self.captured.clear()
        self.cache = None

    def capture(self, lengths) -> None:
        """Capture the forwards of these lengths now (else each is captured when first run)."""
        for n in lengths:
            if self.graphs and n <= self.max_graph_tokens and n not in self.captured:
                self._capture(n)

    @torch.no_grad()
    def forward(self, ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hidden states (n, d) of ``ids`` read at positions start … start + n − 1 (the cache keeps positions below
        ``start`` as they are), and the tapped layers' outputs (n, len(layers)·d) or None."""
        n = len(ids)
        if start + n > self.capacity:
            raise ValueError(f"a forward to position {start + n} past the static cache's {self.capacity}")
        self.length = start + n
        if self.graphs and n <= self.max_graph_tokens:
            graph, out = self.captured.get(n) or self._capture(n)
            host = torch.tensor([ids, range(start, start + n)], dtype=torch.long).pin_memory()
            self.io[:, :n].copy_(host, non_blocking=True)  # the host allocator keeps ``host`` until the copy ran
            graph.replay()
            # the outputs are the graph's own buffers, rewritten by its next replay: callers keep copies
            return tuple(None if t is None else t.clone() for t in out)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        return self._run(x, torch.arange(start, start + n, device=self.device))


RUNNERS = "_static_lm_runners"
"""The attribute a model keeps its ``StaticLM``s under (by taps and graph setting): they live and go with it."""


def static_lm(model, positions: int, layers: tuple[int, ...] = (), graphs: bool = False,
              compiled: bool = False) -> StaticLM:
    """The ``StaticLM`` of ``model`` (one per model, taps, graph and compile setting, kept while the model lives, so
    that its graphs are captured once for every generation) with room for at least ``positions`` positions; a larger
    request replaces it by one with the capacity rounded up to ``CAPACITY_STEP``. A new one with graphs captures every
    length up to ``MAX_GRAPH_TOKENS`` at once (a few seconds; with ``compiled``, the compiles too), so that no capture
    lands inside a timed generation."""
    runners = model.__dict__.setdefault(RUNNERS, {})  # not a submodule: past nn.Module's __setattr__
    key = (tuple(layers), bool(graphs), bool(compiled))
    runner = runners.get(key)
    if runner is None or runner.capacity < positions:
        if runner is not None:
            runner.release()  # its cache and graphs are freed before the larger ones are made
        runners.pop(key, None)
        capacity = CAPACITY_STEP * math.ceil(positions / CAPACITY_STEP)
        runners[key] = StaticLM(model, capacity, layers, graphs, compiled=compiled)
        runners[key].capture(range(1, MAX_GRAPH_TOKENS + 1))
    return runners[key]

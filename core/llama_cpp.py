"""A GGUF model run by llama.cpp (through llama-cpp-python's low-level API): the kernels CPU users run.

``LlamaCppModel`` holds one model and one context. The decoder reads through one sequence of its KV cache:
``read(seq, rows)`` brings that sequence to cover ``seq`` the way the decoder's ``CachedLM`` does: it keeps the longest common prefix, removes
the rest from the cache (``llama_memory_seq_rm``, no copy), and reads what is missing in one batch; it returns the
raw logits of the last ``rows`` positions and the final-norm hidden state of the same positions, both from that
one forward (the context runs with ``embeddings`` on and no pooling, so llama.cpp keeps its ``result_norm`` beside
the logits). Only the rows asked are computed past the last layer: a prompt's prefill pays for one output row.
Labeling reads many sequences at once (``decode``, ``remove``; ``data_gen.llama_labeler``).

The model is read from the GGUF file as shipped (no conversion): the quantized weights are the ones llama.cpp's
users run. See core/DESIGN.md, "The llama.cpp backend".
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.errors import UserError

MAX_SEQUENCES = 256
"""llama.cpp's limit on the sequences of one context (``LLAMA_MAX_SEQ``)."""

_initialized = False


def _lib():
    """llama-cpp-python's bindings, initialised once; llama.cpp's log is dropped unless ``LLAMA_CPP_LOG=1``."""
    global _initialized
    try:
        import llama_cpp
    except ImportError:
        raise UserError("backend llama_cpp needs llama-cpp-python: run `make install` (it builds llama-cpp-python "
                        "from source once)") from None
    if not _initialized:
        # llama-cpp-python prints llama.cpp's log through this logger; its warnings too, unless asked (a shipped
        # file's vocabulary quirks, at every load)
        quiet = not os.environ.get("LLAMA_CPP_LOG")
        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL + 1 if quiet else logging.DEBUG)
        llama_cpp.llama_backend_init()
        _initialized = True
    return llama_cpp


def repacks_safely() -> bool:
    """Whether llama.cpp may repack a model's weights into the CPU's extra buffer types. Not on a CPU with AMX:
    there its AMX matrix multiply crashes on Q4_K weights (a segfault in ``ggml_backend_amx_mul_mat``, an open
    llama.cpp bug), so the weights keep the file's layout, as llama.cpp's own ``--no-repack`` keeps them."""
    return "AMX_INT8 = 1" not in _lib().llama_print_system_info().decode()


@dataclass
class LlamaConfig:
    """What the decoder and the heads read of a model's config (as of a transformers config)."""

    hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    num_hidden_layers: int


class LlamaCppModel:
    """One GGUF model in a llama.cpp context of ``n_ctx`` positions, run on ``threads`` CPU threads."""

    backend = "llama_cpp"
    device = torch.device("cpu")

    def __init__(self, path: str | Path, *, threads: int, n_ctx: int = 4096, name: str | None = None,
                 sequences: int = 1, shared_cells: bool = False):
        lib = _lib()
        path = Path(path)
        if not path.is_file():
            raise UserError(f"model file not found: {path}")
        if threads < 1:
            raise UserError(f"threads must be at least 1, got {threads}")
        if not 1 <= sequences <= MAX_SEQUENCES:
            raise ValueError(f"sequences must be within 1 … {MAX_SEQUENCES}, got {sequences}")
        self.path = path
        self.name = name or path.name
        self.threads = threads
        self._lib = lib
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = repacks_safely()
        self._model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise UserError(f"llama.cpp cannot load {path}: not a GGUF model it reads (LLAMA_CPP_LOG=1 shows why)")
        cp = lib.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = min(512, n_ctx)
        cp.n_seq_max = sequences
        # ``shared_cells``: one cache for every sequence, where a token can belong to several (``decode``), stored
        # once; else each sequence has n_ctx / sequences cells of its own, and a token attends over its own only
        cp.kv_unified = shared_cells
        cp.n_threads = cp.n_threads_batch = threads
        cp.embeddings = True
        cp.pooling_type = lib.LLAMA_POOLING_TYPE_NONE
        cp.no_perf = True
        self._ctx = lib.llama_init_from_model(self._model, cp)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise UserError(f"llama.cpp cannot make a context of {n_ctx} positions for {path}")
        self._memory = lib.llama_get_memory(self._ctx)
        vocab = lib.llama_model_get_vocab(self._model)
        self.n_ctx = lib.llama_n_ctx(self._ctx)
        self.config = LlamaConfig(hidden_size=lib.llama_model_n_embd(self._model),
                                  vocab_size=lib.llama_vocab_n_tokens(vocab),
                                  max_position_embeddings=min(self.n_ctx, lib.llama_model_n_ctx_train(self._model)),
                                  num_hidden_layers=lib.llama_model_n_layer(self._model))
        self.eog_ids = [t for t in range(self.config.vocab_size) if lib.llama_vocab_is_eog(vocab, t)]
        """The ids that end a generation in llama.cpp (``llama_vocab_is_eog``): its users' stopping set."""
        self.description = self._desc()
        self.sequences = sequences
        self._batch = lib.llama_batch_init(self.n_ctx, 0, sequences)
        self._embeddings = True
        self.ids: list[int] = []
        """The tokens the KV cache holds, in order from position 0."""
        self.owner: object | None = None
        """Who reads through this model now (``claim``): one reader at a time, since the cache is one sequence."""

    def _desc(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self._lib.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode()

    def to(self, device) -> "LlamaCppModel":
        """On the CPU, where llama.cpp runs it; any other device is refused."""
        if torch.device(device).type != "cpu":
            raise UserError(f"{self.name}: llama.cpp runs on the CPU, not on {device}")
        return self

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (None when the file has no such key)."""
        buf = ctypes.create_string_buffer(512)
        n = self._lib.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    def claim(self, owner: object) -> None:
        """Start a new reader over an empty cache (a generation, a trace): the previous reader's cache is gone."""
        self.reset()
        self.owner = owner

    def reset(self) -> None:
        self._lib.llama_memory_clear(self._memory, True)
        self.ids = []

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions of the cache."""
        if n < len(self.ids):
            self._lib.llama_memory_seq_rm(self._memory, 0, n, -1)
            del self.ids[n:]

    def read(self, seq: list[int], rows: int = 1, reader: object | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the cache to cover ``seq`` (keeping the common prefix, reading the rest in one batch, or two when
        tokens before the rows asked are read too: those without outputs); return the
        hidden states (rows, d) and raw logits (rows, V) of the next token after each of the last ``rows``
        prefixes of ``seq``. At least ``rows`` tokens are read, so a prefix already in the cache is read again when
        its rows are asked. A ``reader`` other than the one that claimed the cache takes it over (``owner``)."""
        self.owner = reader if reader is self.owner else None
        if not 1 <= rows <= len(seq):
            raise ValueError(f"rows must be within 1 … {len(seq)}, got {rows}")
        if len(seq) > self.n_ctx:
            raise UserError(f"{self.name}: a sequence of {len(seq)} tokens does not fit its context of {self.n_ctx}")
        common = 0
        for a, b in zip(self.ids, seq):
            if a != b:
                break
            common += 1
        self.crop(min(common, len(seq) - rows))
        start = len(self.ids)
        new = seq[start:]
        # llama.cpp computes every token's output when embeddings are on: the tokens before the rows asked are read
        # first with them off, so a prompt's prefill pays for its last row's logits only
        if len(new) > rows:
            self._decode(new[:-rows], start, outputs=False)
        self._decode(new[-rows:], start + len(new) - rows, outputs=True)
        vocab, d = self.config.vocab_size, self.config.hidden_size
        logits = np.ctypeslib.as_array(self._lib.llama_get_logits(self._ctx), shape=(rows, vocab))
        hidden = np.ctypeslib.as_array(self._lib.llama_get_embeddings(self._ctx), shape=(rows, d))
        return torch.from_numpy(hidden.copy()), torch.from_numpy(logits.copy())

    def _decode(self, tokens: list[int], start: int, outputs: bool) -> None:
        """One ``llama_decode`` of ``tokens`` at positions from ``start``: every row's logits and hidden state kept
        (``outputs``), or none."""
        if outputs != self._embeddings:
            self._lib.llama_set_embeddings(self._ctx, outputs)
            self._embeddings = outputs
        b = self._batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = outputs
        status = self._lib.llama_decode(self._ctx, b)
        if status != 0:
            self.crop(start)  # a failed batch may have written part of its positions
            raise RuntimeError(f"llama_decode of {len(tokens)} tokens failed with status {status}")
        self.ids.extend(int(t) for t in tokens)

    def read_last(self, tokens: list[int]) -> None:
        """Read ``tokens`` after the cache in one ``llama_decode`` with the last row's logits only and no hidden
        states: how llama.cpp's own draft reads a verified batch (its context computes no embeddings), which
        ``read`` cannot (with embeddings on, llama.cpp computes every row)."""
        if self._embeddings:
            self._lib.llama_set_embeddings(self._ctx, False)
            self._embeddings = False
        start, b = len(self.ids), self._batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, i == len(tokens) - 1
            b.seq_id[i][0] = 0
        status = self._lib.llama_decode(self._ctx, b)
        if status != 0:
            self.crop(start)
            raise RuntimeError(f"llama_decode of {len(tokens)} tokens failed with status {status}")
        self.ids.extend(int(t) for t in tokens)

    def decode(self, tokens: list[int], positions: list[int], seqs: list[list[int]],
               outputs: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens at their ``positions``, each stored for the sequences it lists in ``seqs``: a token attends to the
        cache cells of its own (first) sequence at positions up to its own, so with ``shared_cells`` several
        sequences share a prefix by listing it once for all. Returns the hidden states and raw logits of the tokens
        with ``outputs``, in order. The tokens without outputs are read first, in a batch of their own with outputs
        off (with embeddings on, llama.cpp computes every token's logits), so each must come before every output
        token of its sequences. For many sequences in one context (``sequences``: labeling); ``read`` keeps the
        one-sequence cache the decoder reads through, and ``ids`` tracks that one only."""
        if not (len(tokens) == len(positions) == len(seqs) == len(outputs)) or not any(outputs):
            raise ValueError("decode needs one position, sequence list and output flag per token, and an output")
        if len(tokens) > self.n_ctx:
            raise UserError(f"{self.name}: a batch of {len(tokens)} tokens does not fit its context of {self.n_ctx}")
        quiet = [i for i, o in enumerate(outputs) if not o]
        out = [i for i, o in enumerate(outputs) if o]
        for rows, embeddings in ((quiet, False), (out, True)):
            if rows:
                self._decode_seqs([tokens[i] for i in rows], [positions[i] for i in rows], [seqs[i] for i in rows],
                                  embeddings)
        vocab, d = self.config.vocab_size, self.config.hidden_size
        logits = np.ctypeslib.as_array(self._lib.llama_get_logits(self._ctx), shape=(len(out), vocab))
        hidden = np.ctypeslib.as_array(self._lib.llama_get_embeddings(self._ctx), shape=(len(out), d))
        return torch.from_numpy(hidden.copy()), torch.from_numpy(logits.copy())

    def _decode_seqs(self, tokens, positions, seqs, embeddings: bool) -> None:
        if embeddings != self._embeddings:
            self._lib.llama_set_embeddings(self._ctx, embeddings)
            self._embeddings = embeddings
        b = self._batch
        b.n_tokens = len(tokens)
        for i, (t, p, ss) in enumerate(zip(tokens, positions, seqs)):
            b.token[i], b.pos[i], b.logits[i], b.n_seq_id[i] = t, p, embeddings, len(ss)
            for j, s in enumerate(ss):
                b.seq_id[i][j] = s
        status = self._lib.llama_decode(self._ctx, b)
        if status != 0:
            raise RuntimeError(f"llama_decode of {len(tokens)} tokens failed with status {status}")

    def remove(self, seq: int, start: int) -> None:
        """Remove sequence ``seq``'s cells from position ``start`` on (every sequence's when ``seq`` is −1)."""
        self._lib.llama_memory_seq_rm(self._memory, seq, start, -1)
        if seq in (0, -1):
            del self.ids[start:]

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._ctx)
            self._lib.llama_model_free(self._model)
            self._ctx = self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the library may be gone already
            pass

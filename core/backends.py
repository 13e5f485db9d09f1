"""The runtimes a pair is loaded on (``backend:`` in a pair file), one class each behind one interface, so that a
stage asks what a backend can do and never which one it holds:

- ``Transformers``: transformers models on torch's device and threads, any decoder (``decoding.backends`` reads
  them eagerly or over a static cache) and transformers' own ``generate()`` as a peer;
- ``LlamaCpp``: GGUF files run by llama.cpp (``core.llama_cpp``) on the CPU, on threads of its own; it keeps its own
  cache, so only the eager decoder reads it, and llama.cpp's own binaries are its peer.

``backend(name)`` is the one place a name becomes a backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.errors import UserError
from core.identity import TRANSFORMERS
from core.llama_cpp import MAX_SEQUENCES, LlamaCppModel
from core.models import (ModelSpec, check_vocabularies, llama_tokenizer, load_llama_model, load_model,
                         load_tokenizer)
from core.quantization import decode_numerics


@dataclass
class Context:
    """What a llama.cpp context must hold for the work a stage loads it for: ``tokens`` cells over ``sequences``
    sequences (cells shared between them where ``shared_cells``), and at most ``window`` positions a sequence
    (None: the model's own). Transformers' caches grow as they are read and take none of it."""

    tokens: int = 4096
    sequences: int = 1
    shared_cells: bool = False
    window: int | None = None


@dataclass
class LoadedPair:
    draft: object
    target: object
    tokenizer: object
    """The target's tokenizer (one vocabulary with the draft's, checked)."""
    models: dict
    """``{"draft": identity, "target": identity}`` (``core.identity``)."""


class Transformers:
    name = "transformers"
    keeps_own_cache = False
    """Whether the model keeps its cache inside the runtime (so only the eager decoder reads it, and transformers'
    ``generate()`` cannot run it)."""
    cpu_only = False
    own_threads = False
    """Whether the models run on threads of the backend's own (a device is timed at each thread count), not
    torch's."""
    max_sequences: int | None = None
    """The most sequences one context holds (None: no limit of the backend's own)."""
    taps_layers = True
    """Whether a forward gives the outputs of any layer (llama.cpp gives the last hidden state only)."""
    named_in_records = False
    """Whether a run's record names the backend and its threads: the default backend is recorded by leaving both
    out, so that its records compare equal whatever else a backend adds."""

    def threads(self, requested: int | None) -> int | None:
        """The threads the models run on when ``requested`` (None: the backend's default); None where they are
        torch's, which the device description reads itself."""
        return None

    def quantizes_activations(self, identity: dict) -> bool:
        """Whether the model of ``identity`` multiplies its weights with activations quantized to 8 bits: a
        dynamically quantized model (``quantization``)."""
        return identity.get("quantization", "none") != "none"

    def rounds_in(self, identity: dict) -> torch.dtype:
        """The coarsest float dtype a read of the model of ``identity`` rounds to: its own."""
        from core.models import DTYPES

        return DTYPES[identity["dtype"]]

    def load(self, spec: ModelSpec, dtype: str, threads: int | None, context: Context,
             step_numerics: bool = False):
        """(model, tokenizer, identity); ``step_numerics``: every token computed as the decoder's one-token steps
        compute it (``core.quantization.decode_numerics``), so that a labeled row does not depend on its batch."""
        model, tok, identity = load_model(spec, dtype)
        return (decode_numerics(model) if step_numerics else model), tok, identity

    def tokenizer(self, spec: ModelSpec):
        return load_tokenizer(spec)

    def load_pair(self, draft: ModelSpec, target: ModelSpec, dtype: str, threads: int | None = None,
                  draft_context: Context | None = None, target_context: Context | None = None,
                  step_numerics: bool = False) -> LoadedPair:
        """Both models, one vocabulary checked."""
        d, d_tok, d_id = self.load(draft, dtype, threads, draft_context or Context(), step_numerics)
        t, t_tok, t_id = self.load(target, dtype, threads, target_context or Context(), step_numerics)
        check_vocabularies(d_id, t_id, same_tokens=d_tok.get_vocab() == t_tok.get_vocab())
        return LoadedPair(d, t, t_tok, {"draft": d_id, "target": t_id})


class LlamaCpp(Transformers):
    name = "llama_cpp"
    keeps_own_cache = True
    cpu_only = True
    own_threads = True
    taps_layers = False
    max_sequences = MAX_SEQUENCES
    named_in_records = True

    def threads(self, requested: int | None) -> int:
        return requested or torch.get_num_threads()

    def quantizes_activations(self, identity: dict) -> bool:
        """A k-quant GGUF file's weights (its ``dtype`` is llama.cpp's description of the file) multiply activations
        quantized to 8 bits."""
        return "_K" in str(identity.get("dtype", ""))

    def rounds_in(self, identity: dict) -> torch.dtype:
        """llama.cpp computes in float32 and keeps its KV cache in float16."""
        return torch.float16

    def load(self, spec: ModelSpec, dtype: str, threads: int | None, context: Context,
             step_numerics: bool = False):
        """The GGUF file's own weights (``dtype`` is the transformers backend's); llama.cpp computes a token alike
        in any batch."""
        model, tok, identity = load_llama_model(spec, self.threads(threads), context.tokens, context.sequences,
                                                context.shared_cells)
        if context.window is not None:
            model.config.max_position_embeddings = min(model.config.max_position_embeddings, context.window)
        return model, tok, identity

    def tokenizer(self, spec: ModelSpec):
        return llama_tokenizer(spec)


BACKENDS = {b.name: b for b in (Transformers(), LlamaCpp())}
"""Every backend by its name in a pair file; the first is the default."""


def backend(name: str) -> Transformers:
    """The backend ``name`` names, or one line naming those there are."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}") from None


def backend_of(identity: dict) -> Transformers:
    """The backend a model's identity (``core.identity``) says ran it; the default where it names none."""
    return backend(identity.get("backend", TRANSFORMERS))


def runtime_of(model) -> Transformers:
    """The backend a loaded model runs on."""
    return BACKENDS["llama_cpp"] if isinstance(model, LlamaCppModel) else BACKENDS[TRANSFORMERS]

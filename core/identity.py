"""The identity of a model, written once for labeling (``run.json``, the manifest) and for the heads' checks.

A loaded model is identified by its weights as it holds them in memory (``weights_sha256``), never by the folder it
was read from: other weights loaded into a model built from the right config are another model, and a file added
beside the checkpoint (a README) changes nothing. Its ``quantization`` is part of the identity (its hidden states
differ). Before loading, labeling also records what the weights are read from: the ``sha256`` of a GGUF file, the
``fingerprint`` of a local checkpoint's files, or a hub ``revision``; those compare records with records (a manifest
with a head file) when one of them was written before weights were digested.
"""

from __future__ import annotations

import hashlib
import weakref
from pathlib import Path

import torch

from core.cache import file_sha256
from core.errors import UserError
from core.quantization import NONE, DecodeScaledLinear, quantization_of

IDENTITY_FILE = "identity.json"
TRANSFORMERS = "transformers"
"""The default backend (``core.backends.BACKENDS``)."""
"""Written beside a checkpoint converted from a GGUF file (``core.models``): the GGUF's sha256."""

DIGEST_KEYS = ("weights", "sha256", "fingerprint", "revision")
"""The keys of an identity that name a model's content, in the order they are trusted: the weights' digest
first (two identities that both carry it are compared on it alone)."""

CANONICAL_FLOAT = torch.bfloat16
"""The precision floating weights are digested at: a checkpoint loaded in float32 or in bfloat16 is one model (a
float16 load rounds differently and is another)."""


class IdentityError(UserError, ValueError):
    """Two things that must come from one model come from different ones."""


def _describes(f: Path) -> bool:
    """Whether a checkpoint folder's file may hold part of the model, rather than notes beside it (a README, a
    licence, hidden files such as ``.gitattributes``)."""
    name = f.name.lower()
    return not (name.startswith((".", "readme", "license", "licence")) or name.endswith(".md"))


def checkpoint_fingerprint(path: str | Path) -> str:
    """The ``fingerprint`` of a local transformers checkpoint: the name and sha256 of every file in its folder
    that may hold part of the model (weights, config, tokenizer, generation config; not a README or licence),
    remembered by ``file_sha256``, so a large model is hashed once."""
    digest = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if p.is_file() and _describes(p)):
        digest.update(f"{f.name}:{file_sha256(f)}".encode())
    return digest.hexdigest()


def _hash_tensor(digest, t: torch.Tensor) -> None:
    if t.is_quantized:  # an int8 weight: its integers, then how they map to reals
        if t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            scales = [t.q_per_channel_scales(), t.q_per_channel_zero_points()]
        else:
            scales = [torch.tensor([t.q_scale()]), torch.tensor([t.q_zero_point()])]
        digest.update(f"{t.qscheme()}:".encode())
        for part in (t.int_repr(), *scales):
            _hash_tensor(digest, part)
        return
    if t.is_floating_point():
        t = t.to(CANONICAL_FLOAT)
    t = t.detach().contiguous().cpu()
    digest.update(f"{t.dtype}:{tuple(t.shape)}:".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy())  # the buffer itself: no copy


def _stamp(model: torch.nn.Module) -> tuple:
    """What changes when any of the model's weights is replaced or written to in place (cheap to read)."""
    tensors = [(t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers())]
    packed = [id(m._packed_params) for m in model.modules()
              if isinstance(getattr(m, "_packed_params", None), torch.ScriptObject)]
    return tuple(tensors), tuple(packed)


_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → (stamp, digest)


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 of the weights a loaded model holds: every entry of its state dict in name order, floating tensors at
    ``CANONICAL_FLOAT`` precision, int8 weights as their integers with their scales and zero points, a tied weight
    once (the second name as an alias). Remembered per model object until a weight changes, so a large model is
    hashed once per process."""
    stamp = _stamp(model)
    known = _DIGESTS.get(model)
    if known is not None and known[0] == stamp:
        return known[1]
    # ``decode_numerics`` wraps an int8 layer without changing it: its state is named as the unwrapped layer's
    wrapped = [f"{n}.layer." for n, m in model.named_modules() if isinstance(m, DecodeScaledLinear)]
    state = {}
    for name, value in model.state_dict().items():
        prefix = next((w for w in wrapped if name.startswith(w)), None)
        state[name if prefix is None else prefix.removesuffix("layer.") + name[len(prefix):]] = value
    digest, seen = hashlib.sha256(), {}
    for name in sorted(state):
        values = state[name] if isinstance(state[name], tuple) else (state[name],)
        for value in values:
            digest.update(f"{name}:".encode())
            if not isinstance(value, torch.Tensor):  # the dtype an int8 layer records
                digest.update(repr(value).encode())
                continue
            key = None if value.is_quantized else (value.device, value.data_ptr(), value.dtype, tuple(value.shape))
            if key in seen:
                digest.update(f"={seen[key]}".encode())
                continue
            if key is not None:
                seen[key] = name
            _hash_tensor(digest, value)
    _DIGESTS[model] = (stamp, digest.hexdigest())
    return _DIGESTS[model][1]


def model_identity(model) -> dict:
    """A loaded model's identity, in ``record_identity``'s keys: its name (``config.name_or_path``, for messages
    only), the digest of its ``weights`` and its ``quantization`` (``core.quantization.quantization_of``, read
    from its modules, so also one a user quantized by hand). Nothing but the name for an object that is not a
    ``torch.nn.Module``. A llama.cpp model (``core.llama_cpp``) tells the identity it was loaded with.
    """
    if isinstance(getattr(model, "identity", None), dict):  # a runtime's model that tells its own
        return dict(model.identity)
    where = str(getattr(getattr(model, "config", None), "name_or_path", "") or "")
    identity = {"name": where} if where else {}
    if isinstance(model, torch.nn.Module):
        identity.update(weights=weights_sha256(model), quantization=quantization_of(model))
    return identity


def record_identity(entry: dict) -> dict:
    """The identity in a record of a model (a manifest's ``models.draft``, a head file's ``draft``, a
    ``model_identity``): name, source, its digests, its quantization (``none`` for records written before
    quantization existed) and the backend that runs it (``core.backends.BACKENDS``; ``transformers`` for records
    written before there was another)."""
    identity = {k: entry[k] for k in ("name", "source", *DIGEST_KEYS) if entry.get(k) is not None}
    return {**identity, "quantization": entry.get("quantization", NONE), "backend": entry.get("backend", TRANSFORMERS)}


def identity_mismatch(recorded: dict, actual: dict) -> tuple[str, str, str] | None:
    """``(key, recorded value, actual value)`` of the first thing that makes two identities different models
    (the backend, whose kernels give other numbers; the quantization; then the weights' digest when both carry it, else every digest both carry); None when they are
    one model. ``IdentityError`` when they share no digest to tell."""
    mine, theirs = record_identity(recorded), record_identity(actual)
    if mine["backend"] != theirs["backend"]:
        return "backend", mine["backend"], theirs["backend"]
    if mine["quantization"] != theirs["quantization"]:
        return "quantization", mine["quantization"], theirs["quantization"]
    keys = [k for k in DIGEST_KEYS if k in mine and k in theirs]
    keys = keys[:1] if keys[:1] == ["weights"] else keys
    if not keys:
        raise IdentityError(f"cannot compare model identities {mine} and {theirs}: no digest in common")
    return next(((k, mine[k], theirs[k]) for k in keys if mine[k] != theirs[k]), None)


def check_same_model(recorded: dict, actual: dict, what: str) -> None:
    """Refuse, in one line, when ``recorded`` and ``actual`` are not one model; ``what`` names the two, e.g.
    ``"runs/labels/x was labeled with draft 'a', this run decodes 'b'"``."""
    differs = identity_mismatch(recorded, actual)
    if differs is not None:
        key, mine, theirs = differs
        raise IdentityError(f"{what}: {key} {mine}, not {theirs}")


def check_labels_pair(models: dict, pair: dict, labels: str | Path) -> None:
    """Refuse labels (a manifest's ``models``) made with another draft or target than the ``pair`` being decoded
    ({"draft": identity, "target": identity})."""
    for role in ("draft", "target"):
        check_same_model(models[role], pair[role], f"{labels} was labeled with {role} {models[role].get('name')!r}, "
                                                   f"this run decodes {pair[role].get('name')!r}")


PROMPT_DIGEST_CHARS = 16
"""Hex characters kept of a prompt's sha256: 64 bits, so that a head's record of tens of thousands of training prompts
stays small while two different prompts share a digest with probability ~n²/2^65."""


def prompt_digest(input_ids) -> str:
    """A prompt's identity as the models read it: the sha256 of its token ids (the tokenized text, chat template
    included), so labeling, training and decoding compare the same thing."""
    ids = ",".join(str(int(t)) for t in input_ids)
    return hashlib.sha256(ids.encode()).hexdigest()[:PROMPT_DIGEST_CHARS]

"""The identity of a model checkpoint, written once for labeling (the manifest) and for the heads' checks.

A checkpoint converted from a GGUF file carries ``IDENTITY_FILE`` with the GGUF's sha256; any other local
checkpoint is identified by a ``fingerprint``; a hub download by its ``revision``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from core.cache import file_sha256

IDENTITY_FILE = "identity.json"
"""Written beside a checkpoint converted from a GGUF file (``core.models``): the GGUF's sha256."""


def checkpoint_fingerprint(path: str | Path) -> str:
    """The ``fingerprint`` of a local transformers checkpoint: the name and sha256 of every file in its folder
    (weights, config, tokenizer, generation config; remembered by ``file_sha256``, so a large model is hashed
    once)."""
    digest = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if p.is_file()):
        digest.update(f"{f.name}:{file_sha256(f)}".encode())
    return digest.hexdigest()


def model_identity(model) -> dict:
    """What a loaded transformers model tells of its identity, in ``draft_identity``'s keys: the ``sha256`` of the
    GGUF a converted checkpoint came from (its ``IDENTITY_FILE``), the ``fingerprint`` of any other local
    checkpoint directory, or the hub ``revision`` it was downloaded at. Empty of digests when it tells none (a
    model built in memory, or loaded from a directory that has changed since). Its ``quantization`` is read from the
    model's modules (``core.quantization.quantization_of``)."""
    from core.quantization import quantization_of

    config = getattr(model, "config", None)
    where = str(getattr(config, "name_or_path", "") or "")
    identity = {"name": where} if where else {}
    path = Path(where) if where else None
    if path is not None and (path / IDENTITY_FILE).is_file():
        identity["sha256"] = json.loads((path / IDENTITY_FILE).read_text())["sha256"]
    elif path is not None and (path / "config.json").is_file():
        identity["fingerprint"] = checkpoint_fingerprint(path)
    elif getattr(config, "_commit_hash", None):
        identity["revision"] = config._commit_hash
    if isinstance(model, torch.nn.Module):
        identity["quantization"] = quantization_of(model)
    return identity

"""Export a trained head to safetensors with everything a runtime needs in the header; load it back.

The header's metadata (string → string) holds ``schema_version``, one JSON blob under ``specheads`` and its digest
under ``specheads_sha256``::

    head:       {"type": "resnet", "init_args": {"hidden_size": 896, "depth": 3}}
    draft:      {"name": …, "source": …, "weights": …, "sha256" | "fingerprint" | "revision": …,
                 "quantization": …}
                (``core.identity``: ``weights`` is the digest of the draft's weights as labeling held them)
    hidden_size, vocab_size
    inputs:     what the head reads: the hidden state and its position (``own``: after reading the token;
                ``prev``: the state that produced q for it), and the draft scores named in init_args
    label:      {"kind": "sprinter", "lam": 1.0} or {"kind": "soft", "w_acc": 1.0, "w_rej": 6.0}
    role:       "verifier" (accept when P̂ ≥ τ), "stop" (stop drafting when 1 − ∏ P̂ over the round > h) or
                "lookup_stop" (prompt lookup's goodput stop on P̂ of each copied candidate: ``draft`` then names
                the target, whose state the head reads, and ``label`` the proposals' n and m)
    threshold:  {"name": "tau" | "h", "value": …, "rule": …}; a stop head's also has ``chosen_by`` (the trace
                simulator's method, split, cost and grid: ``pipeline.train_all.stop_threshold``)
    metrics:    validation (and test) metrics of the exported weights
    trained_on: the prompts whose rows trained the head or chose its threshold (train and val): ``labels`` (the
                folder), ``splits``, ``prompts`` (their count) and ``digests`` (``core.identity.prompt_digest`` of
                each, concatenated): the evaluation refuses to count a prompt the head has seen (``seen_prompts``)
    weights_sha256: digest of the tensors (``weights_digest``); a file without it, or whose weights no longer match
                it, is refused, and so are non-finite weights

``specheads_sha256`` is the sha256 of every other metadata entry (``metadata_digest``), so it covers the threshold,
role, label, draft identity and, through ``weights_sha256``, the tensors: any edit of the header or the body is
refused as a modified file. It is a digest, not a signature: it catches edits and damage, not a forger who
recomputes it.

Loading never unpickles: ``safe_open`` reads the header and the raw tensors. ``check_model`` compares a head with a
loaded transformers draft (hidden size, vocabulary and the identity of its weights, ``core.identity``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from core.columns import FEATURE_COLUMNS
from core.errors import UserError
from core.identity import (DIGEST_KEYS, PROMPT_DIGEST_CHARS, TRANSFORMERS, IdentityError, identity_mismatch,
                           model_identity, record_identity)
from core.label_math import FEATURE_POSITIONS
from core.quantization import NONE, output_rows
from core.runfolder import write_with
from heads.features import SCORES, VECTORS, vector_column
from heads.registry import HEADS, build_head

SCHEMA_VERSION = "2"
META_KEY = "specheads"
META_DIGEST_KEY = "specheads_sha256"
LOOKUP_HEAD_ROLE = "lookup_stop"
"""The role of a prompt-lookup stop head (``decoding.lookup_stop.LookupHead``)."""
REQUIRED = ("head", "draft", "hidden_size", "vocab_size", "label", "role", "threshold", "metrics", "weights_sha256")



class HeadFileError(UserError, ValueError):
    """A head file that is malformed or does not fit the given draft model."""


def feature_position(meta: dict) -> str:
    """The position of the hidden state the head in this metadata reads (``FEATURE_POSITIONS``)."""
    return meta.get("inputs", {}).get("position", "own")


def export_head(head: nn.Module, path: str | Path, *, draft: dict, vocab_size: int, label: dict, role: str,
                threshold: dict, metrics: dict, position: str = "own", vectors: list[str] = (),
                tapped_layers: list[int] | None = None, trained_on: dict | None = None,
                hidden: str | None = None) -> Path:
    """Write ``head``'s weights and metadata to ``path`` (a ``.safetensors`` file); return the path. ``hidden``:
    what the head's hidden input is, where not the draft's state at ``position``."""
    unknown = [v for v in vectors if v not in VECTORS]
    if unknown or bool(int(head.config.get("extra_size", 0))) != bool(vectors):
        raise HeadFileError(f"the head's vector features {list(vectors)} are not known ones ({', '.join(VECTORS)}) "
                            f"or do not match its extra_size {head.config.get('extra_size', 0)}")
    if "layers" in vectors and not tapped_layers:
        raise HeadFileError("a head that reads the draft's tapped layers needs their indices (tapped_layers)")
    if getattr(head, "head_type", None) not in HEADS:
        raise HeadFileError(f"{type(head).__name__} is not a registered head type; known: {', '.join(sorted(HEADS))}")
    if position not in FEATURE_POSITIONS:
        raise HeadFileError(f"unknown feature position {position!r}; known: {', '.join(FEATURE_POSITIONS)}")
    meta = {
        "head": {"type": head.head_type, "init_args": dict(head.config)},
        "draft": record_identity(draft),
        "hidden_size": int(head.config["hidden_size"]),
        "inputs": {"hidden": hidden or FEATURE_POSITIONS[position].description, "position": position,
                   "scores": {n: SCORES[n] for n in head.config.get("scores", [])},
                   "vectors": {n: FEATURE_COLUMNS[vector_column(n, position)] for n in vectors},
                   **({"tapped_layers": list(tapped_layers)} if "layers" in vectors else {})},
        "vocab_size": int(vocab_size),
        "label": label,
        "role": role,
        "threshold": threshold,
        "metrics": {k: float(v) if isinstance(v, (int, float)) else v for k, v in metrics.items()},
        **({"trained_on": trained_on} if trained_on is not None else {}),
    }
    tensors = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    meta["weights_sha256"] = weights_digest(tensors)
    return write_with(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=header(meta)))


def metadata_digest(raw: dict[str, str]) -> str:
    """sha256 over a head file's metadata entries (name and value, in name order), all but its own."""
    return hashlib.sha256(json.dumps({k: v for k, v in raw.items() if k != META_DIGEST_KEY},
                                     sort_keys=True).encode()).hexdigest()


def header(meta: dict) -> dict[str, str]:
    """The safetensors metadata of a head file with metadata ``meta``: the schema version, ``meta`` as JSON, and
    the digest of both."""
    raw = {"schema_version": SCHEMA_VERSION, META_KEY: json.dumps(meta)}
    return {**raw, META_DIGEST_KEY: metadata_digest(raw)}


def weights_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors' names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def read_metadata(path: str | Path) -> dict:
    """The JSON metadata of a head file (checked for the schema version, its digest and the required keys)."""
    if not Path(path).is_file():
        raise HeadFileError(f"{path}: no such head file")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error type for a bad header
        raise HeadFileError(f"{path}: not a readable safetensors file ({e})") from e
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise HeadFileError(f"{path}: head schema version {version!r}, expected {SCHEMA_VERSION!r}: export it again")
    if raw.get(META_DIGEST_KEY) != metadata_digest(raw):
        raise HeadFileError(f"{path}: the metadata does not match the digest recorded at export (the file was "
                            "modified)")
    try:
        meta = json.loads(raw[META_KEY])
    except (KeyError, json.JSONDecodeError) as e:
        raise HeadFileError(f"{path}: missing or malformed {META_KEY!r} metadata ({e})") from e
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise HeadFileError(f"{path}: metadata lacks {', '.join(missing)}")
    if feature_position(meta) not in FEATURE_POSITIONS:
        raise HeadFileError(f"{path}: unknown feature position {feature_position(meta)!r}")
    return meta


def check_draft(meta: dict, *, draft: dict | None = None, hidden_size: int | None = None, path="head file") -> None:
    """Refuse a head trained for another draft: hidden size, then the identity (``core.identity``: quantization,
    then the weights' digest, or the digests both records carry)."""
    for size in (hidden_size, (draft or {}).get("hidden_size")):
        if size is not None and int(size) != meta["hidden_size"]:
            raise HeadFileError(f"{path}: head expects hidden size {meta['hidden_size']}, the draft has {size}")
    if draft is None:
        return
    try:
        differs = identity_mismatch(meta["draft"], draft)
    except IdentityError as e:
        raise HeadFileError(f"{path}: {e}") from None
    if differs is None:
        return
    key, mine, theirs = differs
    if key == "backend":
        raise HeadFileError(f"{path}: head was trained on labels of the {mine} backend, this draft runs on {theirs} "
                            "(its numbers differ); train a head on labels of this backend")
    if key == "quantization":
        raise HeadFileError(f"{path}: head was trained on the features of the {mine!r} draft, this draft is "
                            f"{theirs!r} (its hidden states differ); train a head on labels of this draft")
    raise HeadFileError(f"{path}: head was trained for draft {meta['draft'].get('name')!r} ({key} {mine}), not for "
                        f"{draft.get('name')!r} ({key} {theirs})")


def check_labels(head: str | Path, manifest: dict, labels: str | Path) -> None:
    """Refuse a head trained for another draft than the one the labels in ``labels`` (their ``manifest``) were
    made with, before its rows are replayed with that head."""
    try:
        check_draft(read_metadata(head), draft=manifest["models"]["draft"], path=head)
    except HeadFileError as e:
        raise HeadFileError(f"{e}, the draft of the labels in {labels}") from None


def check_model(meta: dict, model, path="head file") -> None:
    """Refuse a head that does not fit a loaded draft model: hidden size, vocabulary, then the identity recorded at
    export against ``model_identity(model)`` (the digest of the weights it holds). A head exported before the
    draft's weights were digested (no digest in common) passes with a warning, as sizes are then all that can be
    checked."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    check_draft(meta, hidden_size=getattr(text, "hidden_size", None), path=path)
    rows = output_rows(model) if hasattr(model, "get_output_embeddings") else None
    if rows is not None and rows != int(meta["vocab_size"]):
        raise HeadFileError(
            f"{path}: head was trained for a vocabulary of {meta['vocab_size']} tokens, the draft has {rows}"
        )
    identity = model_identity(model)
    recorded = record_identity(meta["draft"])
    if (recorded["quantization"] != identity.get("quantization", NONE)
            or recorded["backend"] != identity.get("backend", TRANSFORMERS)
            or any(k in identity and k in meta["draft"] for k in DIGEST_KEYS)):
        check_draft(meta, draft=identity, path=path)
    else:
        warnings.warn(
            f"{path}: cannot tell whether the draft is the one the head was trained for ({meta['draft']}); "
            f"the model tells {identity or 'nothing of its origin'}. Hidden size and vocabulary match.",
            stacklevel=2,
        )


def seen_prompts(meta: dict) -> set[str]:
    """The digests of the prompts a head trained on or had its threshold chosen on (``trained_on``); empty for a
    head exported without that record."""
    digests = meta.get("trained_on", {}).get("digests", "")
    return {digests[i : i + PROMPT_DIGEST_CHARS] for i in range(0, len(digests), PROMPT_DIGEST_CHARS)}


def check_unseen(meta: dict, digests: dict[int, str], where: str, path="head file") -> None:
    """Refuse to evaluate a head on prompts it trained or had its threshold chosen on (``digests``: prompt id →
    ``core.identity.prompt_digest`` of the prompts at hand, ``where`` names them): its scores there are optimistic."""
    known = seen_prompts(meta)
    seen = sorted(i for i, d in digests.items() if d in known)
    if seen:
        shown = ", ".join(map(str, seen[:5])) + (", …" if len(seen) > 5 else "")
        raise HeadFileError(f"{path} trained on {len(seen)} of the {len(digests)} prompts of {where} (prompt ids "
                            f"{shown}); evaluate it on prompts it has not seen")


def load_head(path: str | Path, *, draft: dict | None = None, hidden_size: int | None = None) -> tuple[nn.Module, dict]:
    """Rebuild a head from its file alone; return ``(module in eval mode, metadata)``.

    ``draft`` (a manifest ``models.draft`` entry or a ``core.identity`` record) and ``hidden_size`` are checked when
    given. Every problem raises one ``HeadFileError`` (a ``ValueError``).
    """
    meta = read_metadata(path)
    check_draft(meta, draft=draft, hidden_size=hidden_size, path=path)
    spec = meta["head"]
    try:
        head = build_head(spec["type"], **spec["init_args"])
    except (KeyError, TypeError, ValueError) as e:
        raise HeadFileError(f"{path}: cannot build head {spec}: {e}") from e
    with safe_open(str(path), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise HeadFileError(f"{path}: weights do not fit head {spec}: {e}") from e
    if weights_digest(state) != meta["weights_sha256"]:
        raise HeadFileError(f"{path}: the weights do not match the digest recorded at export (the file was modified)")
    bad = [k for k, v in state.items() if not torch.isfinite(v).all()]
    if bad:
        raise HeadFileError(f"{path}: non-finite weights in {', '.join(bad)}")
    if head.config["hidden_size"] != meta["hidden_size"]:
        raise HeadFileError(f"{path}: head init_args disagree with hidden_size {meta['hidden_size']}")
    return head.eval(), meta

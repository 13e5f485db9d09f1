"""Evaluation stage: the speculative decoder and its policies (``build_policy``), loading exported heads."""

import importlib

_EXPORTS = {**dict.fromkeys(("DecodeResult", "DecodeStats", "ModelPair", "Policy"), "evaluation.decoder"),
            "build_policy": "evaluation.policies"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    # imported on first use, so that `python -m evaluation` reaches its main (which answers Ctrl-C and bad input
    # in one line) before torch loads
    if name not in _EXPORTS:
        raise AttributeError(f"module 'evaluation' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

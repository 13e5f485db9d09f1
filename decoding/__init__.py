"""The decoding library: the speculative decoder (``decoding.state``) and its policies (``decoding.policies``,
``build_policy``), the decisions they make (``decoding.rules``), the transformers runtime (``decoding.runtimes``),
and the replay of those decisions over acceptance traces (``decoding.traces``, ``decoding.replay``,
``decoding.simulate``), without models or output folders. ``pipeline`` replays to choose the threshold a stop head
is exported with; ``evaluation`` drives experiments with all of it.
"""

import importlib

_EXPORTS = {**dict.fromkeys(("DecodeResult", "DecodeStats", "ModelPair", "Policy"), "decoding.state"),
            "build_policy": "decoding.policies"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    # imported on first use: the replay modules, which pipeline imports, need neither transformers nor the policies
    if name not in _EXPORTS:
        raise AttributeError(f"module 'decoding' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

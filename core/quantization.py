"""Int8 weights for a model on the CPU, and telling a loaded model's quantization from its modules.

A model entry's ``quantization`` names one of ``QUANTIZATIONS``. Each is PyTorch's dynamic int8 quantization
(``torch.ao.quantization.quantize_dynamic``): Linear weights stored in int8, activations quantized per call, the
matmuls run by fbgemm/oneDNN int8 kernels. That is the one int8 path with fast CPU kernels in a plain PyTorch
install (transformers' torchao weight-only int8 dequantizes on every call on the CPU, no faster than float32);
``DESIGN.md`` gives the measurements and what would move the choice.

The quantization belongs to the model's identity (its hidden states, hence the heads' features, differ), so it is
recorded in the manifest and the exported heads, and ``quantization_of`` reads it back from any loaded model, also
one a user quantized by hand, so a head can refuse a draft of another precision.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

NONE = "none"


@dataclass(frozen=True)
class Int8Dynamic:
    """Dynamic int8 quantization of the Linear layers, except those whose names start with one of ``keep``."""

    per_channel: bool
    """One scale per output channel (else one per weight matrix)."""
    keep: tuple[str, ...] = ()
    """Module name prefixes left in floating point, e.g. ``lm_head``."""

    def snippet(self, model: str = "draft") -> str:
        """One line of plain PyTorch that quantizes ``model`` this way (for users without this project)."""
        qconfig = "per_channel_dynamic_qconfig" if self.per_channel else "default_dynamic_qconfig"
        return (f"{model} = torch.ao.quantization.quantize_dynamic({model}, {{n: torch.ao.quantization.{qconfig} "
                f"for n, m in {model}.named_modules() if isinstance(m, torch.nn.Linear) and not n.startswith("
                f"{self.keep!r})}}, dtype=torch.qint8)")


QUANTIZATIONS = {
    "int8-dynamic": Int8Dynamic(per_channel=False),
    "int8-dynamic-per-channel": Int8Dynamic(per_channel=True),
    "int8-dynamic-per-channel-fp-lm-head": Int8Dynamic(per_channel=True, keep=("lm_head",)),
}
"""The quantizations a model entry may name (besides ``none``)."""


def check_name(name: str) -> str:
    """``name`` if it is ``none`` or one of ``QUANTIZATIONS``; else a ``ValueError`` listing them."""
    if name != NONE and name not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {name!r}; choose one of {', '.join([NONE, *QUANTIZATIONS])}")
    return name


def quantize(model: nn.Module, name: str) -> nn.Module:
    """``model`` with its Linear layers quantized as ``name`` says (in place; ``none`` returns it unchanged).

    Only float32 models on the CPU: the int8 kernels read float32 activations and exist only there.
    """
    if check_name(name) == NONE:
        return model
    scheme = QUANTIZATIONS[name]
    params = list(model.parameters())
    if any(p.device.type != "cpu" for p in params) or any(p.dtype != torch.float32 for p in params):
        raise ValueError(f"quantization {name!r} runs on the CPU in float32 only (dtype: float32, device: cpu)")
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qconfig = per_channel_dynamic_qconfig if scheme.per_channel else default_dynamic_qconfig
    layers = {n: qconfig for n, m in model.named_modules()
              if isinstance(m, nn.Linear) and not n.startswith(scheme.keep)}
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao on every call
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, layers, dtype=torch.qint8, inplace=True)


def quantization_of(model: nn.Module) -> str:
    """The ``QUANTIZATIONS`` name that describes ``model``'s Linear layers, ``none`` when none is int8, or
    ``custom`` for a mix none of the names describes."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    quantized = {n: m for n, m in model.named_modules() if isinstance(m, DynamicLinear)}
    if not quantized:
        return NONE
    floats = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    schemes = {m.weight().qscheme() for m in quantized.values()}
    per_channel = schemes <= {torch.per_channel_affine, torch.per_channel_symmetric}
    for name, scheme in QUANTIZATIONS.items():
        kept = all(n.startswith(scheme.keep) for n in floats) and not any(n.startswith(scheme.keep) for n in quantized)
        if scheme.per_channel == per_channel and kept:
            return name
    return "custom"


def output_rows(model: nn.Module) -> int:
    """The vocabulary size of a causal LM's output layer, float or quantized."""
    head = model.get_output_embeddings()
    return int(head.out_features if hasattr(head, "out_features") else head.weight.shape[0])

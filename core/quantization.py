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
from contextlib import contextmanager
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

    quantized = {n.removesuffix(".layer"): m for n, m in model.named_modules() if isinstance(m, DynamicLinear)}
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


REDUCED_RANGE_MAX = 127
"""The largest quantized activation: PyTorch's dynamic Linear quantizes its input to 0..127 (``reduce_range``)."""


class DecodeScaledLinear(nn.Module):
    """A dynamic int8 Linear whose activation scale is taken per token, as a one-token decode step takes it.

    PyTorch's dynamic Linear takes one scale over its whole input, so a token's result depends on every token that
    shares its forward: 8 left-padded sequences in a labeling batch, a prompt's large first-token activations, the
    padding. A decoder reads one token per forward after the prompt. This layer computes what that forward computes
    for every token at once: the same int8 weights, the same choice of scale and zero point (fbgemm's
    ``ChooseQuantizationParams`` over the token's values, reduced range), the same rounding, and the same
    integer product (``torch._int_mm``, int32 accumulation: 2-4x the float32 product's speed on CPUs with int8 dot
    products, which matters because labeling reads the draft this way), rescaled in the kernel's order
    (``tests/test_quantization.py``).
    Tokens listed in ``shared`` share one scale, as the tokens of one prompt share it in the decoder's prefill.
    """

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer  # kept so that ``quantization_of`` still reads the scheme from the modules
        weight = layer.weight()
        if weight.qscheme() == torch.per_channel_affine and not weight.q_per_channel_zero_points().any():
            # the integer product the kernel forms, exactly (int32 accumulation), then its float rescaling
            self.register_buffer("weight_int8", weight.int_repr().t().contiguous(), persistent=False)
            self.register_buffer("weight_scale", weight.q_per_channel_scales().float(), persistent=False)
        else:
            self.weight_int8 = None
            self.register_buffer("weight", weight.dequantize(), persistent=False)
        self.register_buffer("bias", layer.bias(), persistent=False)
        self.out_features = self.bias.shape[0] if self.bias is not None else weight.shape[0]
        self.shared: torch.Tensor | None = None
        """(N,) group of each of the N tokens of the next input (tokens of one group share a scale), or None."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        lo, hi = flat.amin(-1).clamp(max=0), flat.amax(-1).clamp(min=0)
        if self.shared is not None:
            if self.shared.numel() != flat.shape[0]:
                raise RuntimeError(f"shared-scale groups for {self.shared.numel()} tokens, input has {flat.shape[0]}")
            groups = int(self.shared.max()) + 1
            lo = lo.new_zeros(groups).scatter_reduce(0, self.shared, lo, "amin")[self.shared]
            hi = hi.new_zeros(groups).scatter_reduce(0, self.shared, hi, "amax")[self.shared]
        scale, zero = choose_qparams(lo, hi)
        scale, zero = scale.unsqueeze(-1), zero.unsqueeze(-1)
        q = torch.round(flat * (1.0 / scale) + zero).clamp(0, REDUCED_RANGE_MAX)
        if self.weight_int8 is not None:
            # float(Σ (q − z)·w) · s_x · s_w + bias, in place: fbgemm multiplies by (s_x · s_w), within an ulp of
            # this, and a (tokens, outputs) table of scale products would cost more than the product itself
            out = torch._int_mm((q - zero).to(torch.int8), self.weight_int8).float()
            out.mul_(scale).mul_(self.weight_scale)
            if self.bias is not None:
                out.add_(self.bias)
        else:
            out = nn.functional.linear((q - zero) * scale, self.weight, self.bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])


SMALL_SCALE = 6.1e-5
"""PyTorch's ``SMALL_SCALE_THRESHOLD``: a smaller activation scale is raised to it."""


def choose_qparams(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero point), float32, for activations in [lo, hi] (lo ≤ 0 ≤ hi, float32), as PyTorch's dynamic int8
    Linear chooses them (``ChooseQuantizationParams`` in ATen's ``QuantUtils.h``, reduced range 0..127): the scale in
    double, 0.1 where it is 0 or its reciprocal overflows, raised to ``SMALL_SCALE`` (the range widened with it),
    and the zero point from whichever end of the range gives it with the smaller error, rounded and clamped."""
    top = REDUCED_RANGE_MAX
    least = torch.tensor(SMALL_SCALE, dtype=torch.float32)  # ATen's constant is a float
    scale = (hi.double() - lo.double()) / top
    degenerate = (scale.float() == 0) | torch.isinf(1.0 / scale.float())
    scale = torch.where(degenerate, torch.full_like(scale, 0.1), scale)
    small = scale < least.double()
    amplifier, floor = least / scale.float(), least * top
    lo, hi = (torch.where(small, torch.where(lo == 0, lo, torch.where(hi == 0, -floor, lo * amplifier)), lo),
              torch.where(small, torch.where(lo == 0, floor, torch.where(hi == 0, hi, hi * amplifier)), hi))
    scale = torch.where(small, least.double(), scale)
    lo, hi = lo.double(), hi.double()
    better_min = -(lo / scale).abs() < top - (hi / scale).abs()
    zero = torch.where(better_min, -lo / scale, top - hi / scale)
    zero = torch.where(zero < 0, 0.0, torch.where(zero > top, float(top), zero.round()))
    return scale.float(), zero.float()


def decode_numerics(model: nn.Module) -> nn.Module:
    """``model`` (in place) with every dynamic int8 Linear computed as the decoder's one-token steps compute it
    (``DecodeScaledLinear``); a float model is returned unchanged. It costs a float32 copy of the int8 weights and
    float32 matmuls: for labeling, where rows must not depend on their batch, not for decoding."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    wrapped = {id(m.layer) for m in model.modules() if isinstance(m, DecodeScaledLinear)}
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, DynamicLinear) and id(m) not in wrapped]
    for name, layer in layers:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, DecodeScaledLinear(layer))
    return model


@contextmanager
def prompt_scales(model: nn.Module | None, mask: torch.Tensor, prompt_width: int):
    """Within the block, a forward of ``model`` over left-padded (B, T) tokens with attention ``mask`` quantizes each
    row's first ``prompt_width`` unpadded tokens with one scale, as the decoder's prefill of that prompt does, and
    every other token (padding included) with its own. The output layer keeps per-token scales: the decoder applies
    it to the prompt's last position alone. No effect on a model without ``DecodeScaledLinear``."""
    output = model.get_output_embeddings() if model is not None and hasattr(model, "get_output_embeddings") else None
    layers = [m for m in (model.modules() if model is not None else ())
              if isinstance(m, DecodeScaledLinear) and m is not output]
    b, t = mask.shape
    groups = torch.arange(b * t, device=mask.device).view(b, t)
    prompt = mask.bool() & (torch.arange(t, device=mask.device) < prompt_width)
    groups = torch.where(prompt, b * t + torch.arange(b, device=mask.device).unsqueeze(1), groups)
    groups = torch.unique(groups.flatten(), return_inverse=True)[1]
    for layer in layers:
        layer.shared = groups
    try:
        yield
    finally:
        for layer in layers:
            layer.shared = None

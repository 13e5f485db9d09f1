"""The head types: adding a head is one new file plus ``@register("name")``; its constructor takes ``hidden_size``
and ``extra_size`` (both linked from the data by the training CLI)."""

from __future__ import annotations

from torch import nn

from core.registries import Registry

HEADS: Registry = Registry("head type", attr="head_type")
register = HEADS.register
"""Class decorator: make a head buildable by ``name`` (and recorded under it in exported files)."""


def head_class(name: str) -> type[nn.Module]:
    return HEADS.get_class(name)


def build_head(name: str, **init_args) -> nn.Module:
    """Build a registered head, e.g. ``build_head("resnet", hidden_size=896, depth=3)``."""
    return head_class(name)(**init_args)

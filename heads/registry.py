"""Registry of head types: adding a head is one new file plus ``@register("name")``."""

from __future__ import annotations

from torch import nn

HEADS: dict[str, type[nn.Module]] = {}


def register(name: str):
    """Class decorator: make a head buildable by ``name`` (and recorded under it in exported files)."""

    def wrap(cls: type[nn.Module]) -> type[nn.Module]:
        if name in HEADS and HEADS[name] is not cls:
            raise ValueError(f"head type {name!r} is already registered by {HEADS[name].__qualname__}")
        HEADS[name] = cls
        cls.head_type = name
        return cls

    return wrap


def head_class(name: str) -> type[nn.Module]:
    if name not in HEADS:
        raise ValueError(f"unknown head type {name!r}; known: {', '.join(sorted(HEADS)) or '(none)'}")
    return HEADS[name]


def build_head(name: str, **init_args) -> nn.Module:
    """Build a registered head, e.g. ``build_head("resnet", hidden_size=896, depth=3)``."""
    return head_class(name)(**init_args)

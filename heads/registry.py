"""Registries: name -> class, filled by a decorator; an unknown name's error lists the known ones.

Heads use ``HEADS`` (adding a head is one new file plus ``@register("name")``); the decoder's policies use their
own ``Registry`` built from the same class.
"""

from __future__ import annotations

from torch import nn


class Registry(dict):
    """A ``dict`` of name -> class; ``register(name)`` is the decorator, ``get_class(name)`` the checked lookup."""

    def __init__(self, kind: str, attr: str):
        super().__init__()
        self.kind, self.attr = kind, attr  # attr: the class attribute that records the registered name

    def register(self, name: str):
        def wrap(cls: type) -> type:
            if name in self and self[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is already registered by {self[name].__qualname__}")
            self[name] = cls
            setattr(cls, self.attr, name)
            return cls

        return wrap

    def get_class(self, name: str) -> type:
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self)) or '(none)'}")
        return self[name]


HEADS: Registry = Registry("head type", attr="head_type")
register = HEADS.register
"""Class decorator: make a head buildable by ``name`` (and recorded under it in exported files)."""


def head_class(name: str) -> type[nn.Module]:
    return HEADS.get_class(name)


def build_head(name: str, **init_args) -> nn.Module:
    """Build a registered head, e.g. ``build_head("resnet", hidden_size=896, depth=3)``."""
    return head_class(name)(**init_args)

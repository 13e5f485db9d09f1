"""The class every registry is built from: name -> class, filled by a decorator; an unknown name's error lists the
known ones.

Heads (``heads.registry.HEADS``) and decoding policies (``decoding.policies.registry.POLICIES``) each keep one;
adding an entry is one new file plus ``@register("name")``.
"""

from __future__ import annotations


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

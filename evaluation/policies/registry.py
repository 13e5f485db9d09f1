"""The decoding policies' registry: ``@register("name")`` on a policy class makes it buildable by name."""

from __future__ import annotations

from core.registries import Registry

POLICIES = Registry("policy", attr="name")
register = POLICIES.register
"""Class decorator: make a policy buildable by ``name`` with ``evaluation.policies.build_policy(name, **kwargs)``."""

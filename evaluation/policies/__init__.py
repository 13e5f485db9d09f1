"""Every decoding policy, one small class each; importing this package registers them all."""

from evaluation.policies import baselines, fuzzy, specdecpp, speculative, sprinter, training_free  # noqa: F401
from evaluation.policies.registry import POLICIES


def build_policy(name: str, **kwargs):
    """Build a registered policy, e.g. ``build_policy("sd", k=4)``; an unknown name lists the known ones."""
    return POLICIES.get_class(name)(**kwargs)

"""Every decoding policy, one small class each; importing this package registers them all."""

# goodput imports specdecpp, so specdecpp registers first: the first family of a head role runs an exported head of it
from decoding.policies import (baselines, fuzzy, goodput, prompt_lookup, specdecpp, speculative, sprinter,  # noqa: F401
                               training_free)
from decoding.policies.registry import POLICIES


def build_policy(name: str, **kwargs):
    """Build a registered policy, e.g. ``build_policy("sd", k=4)``; an unknown name lists the known ones."""
    return POLICIES.get_class(name)(**kwargs)


HEAD_FAMILIES = {"stop": "specdecpp", "verifier": "sprinter"}
"""The family that runs an exported head of each role when nothing else is said: SpecDec++ a stop head, SPRINTER a
verifier. Named, not looked up by ``head_role``: the goodput stop reads a stop head too, but needs a device's costs,
which a head file does not carry."""


def head_family(role: str) -> str:
    """The family that runs an exported head of ``role`` (``HEAD_FAMILIES``)."""
    return HEAD_FAMILIES[role]


def simulated(exact: bool = False) -> list[str]:
    """The families the trace simulator replays; ``exact``: only the exact ones, whose setting an evaluation can
    choose by simulation (an approximate one trades speed for quality, which a replay of the target's responses
    cannot measure)."""
    return [name for name, cls in POLICIES.items() if cls.simulable and (cls.exact or not exact)]

"""The decoding policies' registry, the one list of policy families: ``@register("name", …)`` on a policy class
makes it buildable by name and records on the class what the evaluation needs to know about its family."""

from __future__ import annotations

from core.registries import Registry

POLICIES = Registry("policy", attr="name")


def register(name: str, *, exact: bool = True, setting: str | None = None, reference: bool = False,
             trained: bool = False):
    """Class decorator: make a policy buildable by ``name`` (``evaluation.policies.build_policy``) and set its
    family's class attributes:

    - ``exact``: its output has the target's distribution (greedy: the target's tokens); an approximate policy's
      setting is chosen under a quality floor (pass@1 of SD, ``EvalConfig.max_pass_drop``);
    - ``setting``: the keyword argument a sweep varies (``None``: nothing to sweep);
    - ``reference``: a point of comparison shown beside every policy (the target alone, the draft alone, fixed-K SD);
    - ``trained``: it reads a trained head.
    """

    def wrap(cls: type) -> type:
        cls.exact, cls.setting, cls.reference, cls.trained = exact, setting, reference, trained
        return POLICIES.register(name)(cls)

    return wrap

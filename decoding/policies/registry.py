"""The decoding policies' registry, the one list of policy families: ``@register("name", …)`` on a policy class
makes it buildable by name and records on the class what the evaluation needs to know about its family."""

from __future__ import annotations

from core.registries import Registry

POLICIES = Registry("policy", attr="name")


def register(name: str, *, exact: bool = True, setting: str | None = None, reference: bool = False,
             head_role: str | None = None, simulable: bool = False, lemma31: bool = True):
    """Class decorator: make a policy buildable by ``name`` (``decoding.policies.build_policy``) and set its
    family's class attributes:

    - ``exact``: its output has the target's distribution (greedy: the target's tokens); an approximate policy's
      setting is chosen under a quality floor (pass@1 of SD, ``EvalConfig.max_pass_drop``);
    - ``setting``: the keyword argument a sweep varies (``None``: nothing to sweep); for a family with a head, the
      head's threshold;
    - ``reference``: a point of comparison shown beside every policy (the target alone, the draft alone, fixed-K SD);
    - ``head_role``: the role of the exported head it reads (``"stop"``, ``"verifier"``; ``None``: no head); a
      family whose head is optional (``goodput``, which reads a calibrated confidence in its place) has the role of
      the head it reads when its settings name one;
    - ``simulable``: the trace simulator (``decoding.simulate``) replays it: by its head's role, or a rule on the
      draft's own scores by the class's ``replay_lengths(trace, max_k, **setting)`` (round lengths per position);
    - ``lemma31``: every round that drafts ends with a target call, so SpecDec++ Lemma 3.1 holds and
      N_draft + N_target − N − N_discarded counts the forwards no token came from (SPRINTER's accepted tokens skip
      the target, so it does not).
    """
    if head_role not in (None, "stop", "verifier"):
        raise ValueError(f"{name}: head_role must be 'stop', 'verifier' or None, got {head_role!r}")

    def wrap(cls: type) -> type:
        cls.exact, cls.setting, cls.reference = exact, setting, reference
        cls.head_role, cls.simulable, cls.lemma31 = head_role, simulable, lemma31
        return POLICIES.register(name)(cls)

    return wrap

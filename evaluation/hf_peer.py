"""The external peers: transformers' ``generate()`` on the same prompts and seeds as our decoder.

- ``hf_assisted``: assisted generation, ``target.generate(input_ids, assistant_model=draft)``, with transformers'
  own stop rules (its defaults, a confidence threshold, a constant K);
- ``hf_target_only``: ``target.generate(input_ids)``, no draft;
- ``hf_specdecpp`` / ``hf_sprinter``: an exported head inside ``generate()`` (``decoding.runtimes.hf.HeadDecoding``);
- ``hf_goodput``: the goodput stop inside ``generate()`` on a stop head's or a calibrated confidence's estimates.

Assisted-generation settings go where transformers reads them, on ``draft.generation_config`` (``num_assistant_tokens``,
``num_assistant_tokens_schedule``, ``assistant_confidence_threshold``), and are restored afterwards. Forward
hooks count the draft's and the target's forward calls, so N_target and N_draft are known; how many drafted
tokens were discarded is not (HF does not expose it), so those columns stay blank.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from core.models import weights_as_loaded
from core.sampling import Sampling
from decoding.costs import CostModel
from decoding.policies import POLICIES, head_family
from evaluation.config import HF_FAMILY, HF_GOODPUT, HF_HEAD_FAMILIES, HF_TARGET_ONLY, EvalError, HFPeer, Mode

DEFAULTS = "defaults"


@dataclass(frozen=True)
class PeerRun:
    """One ``generate()`` configuration run on every prompt."""

    family: str
    """``hf_assisted``, ``hf_target_only``, ``hf_specdecpp``, ``hf_sprinter`` or ``hf_goodput``."""
    params: dict = field(default_factory=dict)
    """What names the run in the report (``run_label``)."""
    settings: dict = field(default_factory=dict)
    """Assisted-generation fields set on the draft's generation config for the run."""
    head: str | None = None
    """The exported head file (``hf_specdecpp``/``hf_sprinter``, ``hf_goodput`` on a head)."""
    threshold: float | None = None
    """The head's h or τ; None: the one exported with it."""
    calibration: str | None = None
    """The calibrated confidence file ``hf_goodput`` reads in place of a head."""
    costs: CostModel | None = None
    """``hf_goodput``'s costs of a draft step and of a verification of m tokens."""
    rate: float | None = None
    """``hf_goodput``'s λ in tokens per second."""

    @property
    def assisted(self) -> bool:
        return self.family != HF_TARGET_ONLY

    def decoding(self, draft):
        """The decoding method ``generate()`` runs in place of transformers' own (None: its own)."""
        if self.head is None and self.calibration is None:
            return None
        from decoding.runtimes.hf import HeadDecoding

        return HeadDecoding(self.head, draft, threshold=self.threshold, costs=self.costs, rate=self.rate,
                            calibration=self.calibration)


def peer_runs(peer: HFPeer, mode: Mode, sd_k: int | None,
              ours: dict[str, dict[str, float | None]] | None = None) -> list[PeerRun]:
    """The peer runs of one mode: HF's own rules, HF target-only, each head, and each goodput stop, in that order.

    Args:
        sd_k: K of our chosen fixed-K SD (``same_k_as_sd``).
        ours: head or calibration file → the settings (h, τ, λ by name) of our decoder's chosen runs that read it
            (``same_threshold_as_ours``; ``evaluation.selection.chosen_file_settings``).
    """
    runs = []
    if peer.defaults:
        runs.append(PeerRun(HF_FAMILY))
    runs += [PeerRun(HF_FAMILY, {"conf": float(c)}, peer_settings(c, "confidence"))
             for c in peer.confidence_thresholds]
    if peer.same_k_as_sd and sd_k is not None:
        runs.append(PeerRun(HF_FAMILY, {"k": sd_k}, peer_settings(sd_k, "k")))
    if peer.target_only:
        runs.append(PeerRun(HF_TARGET_ONLY))
    ours = ours if peer.same_threshold_as_ours else None
    runs += head_runs(peer, ours) + goodput_runs(peer, ours)
    return [r for r in runs if mode.runs(r.family)]


def runnable_head(head: str, listed_in: str) -> dict:
    """The metadata of a head file that ``decoding.runtimes.hf`` can run inside ``generate()``, named in
    ``hf_peer.<listed_in>``; one it cannot run is an ``EvalError``."""
    from heads.export import feature_position, read_metadata
    from heads.exported import features_beyond
    from heads.features import FROM_LOGPROBS

    meta = read_metadata(head)
    beyond = features_beyond(meta, FROM_LOGPROBS)
    if beyond:
        raise EvalError(f"hf_peer.{listed_in}: {head} reads {beyond}, which transformers' generate() does not compute "
                        f"(only the draft's hidden state and {', '.join(FROM_LOGPROBS)})")
    if meta["role"] == "verifier" and feature_position(meta) != "prev":
        raise EvalError(f"hf_peer.{listed_in}: {head} reads the token's own hidden state; the runtime runs SPRINTER "
                        "with the paper's feature, the previous token's state (name a `prev` head)")
    return meta


def head_runs(peer: HFPeer, ours: dict[str, dict[str, float | None]] | None = None) -> list[PeerRun]:
    """A run per head in ``peer.heads``, at its threshold in ``peer.thresholds``, else at our decoder's (``ours``,
    as ``peer_runs`` takes it), else at the exported one; a head the runtime cannot run is an ``EvalError``."""
    runs = []
    for head in map(str, peer.heads):
        meta = runnable_head(head, "heads")
        key = POLICIES[head_family(meta["role"])].setting  # the threshold's name, as our decoder takes it
        threshold = peer.thresholds.get(head, (ours or {}).get(head, {}).get(key))
        if threshold is not None and not 0 <= threshold <= 1:
            raise EvalError(f"hf_peer.thresholds: {key} of {head} must be in [0, 1], got {threshold}")
        runs.append(PeerRun(HF_HEAD_FAMILIES[meta["role"]], {"head": head, key: threshold}, head=head,
                            threshold=threshold))
    unknown = sorted(set(map(str, peer.thresholds)) - set(map(str, peer.heads)))
    if unknown:
        raise EvalError(f"hf_peer.thresholds names heads that hf_peer.heads does not list: {', '.join(unknown)}")
    return runs


def goodput_runs(peer: HFPeer, ours: dict[str, dict[str, float | None]] | None = None) -> list[PeerRun]:
    """A run per file in ``peer.goodput``: the goodput stop under ``peer.timing``'s costs on that stop head's or
    calibrated confidence's estimates, at λ of our decoder's chosen ``goodput`` run of the same file (``ours``, as
    ``peer_runs`` takes it), else at target-only's rate 1 / verify(1). λ is in the run's params, so the report
    shows it and can match the run with our decoder's at the same λ. A file that cannot serve is a one-line error."""
    from decoding.costs import read_timing
    from decoding.estimates import load_calibration

    sources = peer.goodput_sources()
    if not sources:
        return []
    costs = read_timing(peer.timing)
    setting = POLICIES["goodput"].setting
    runs = []
    for kind, path in sources:
        if kind == "head" and runnable_head(path, "goodput")["role"] != "stop":
            raise EvalError(f"hf_peer.goodput: {path} is a verifier; the goodput stop reads a stop head's estimates")
        if kind == "calibration":
            load_calibration(path)  # a file that is not one fails now, not at its first prompt
        lam = (ours or {}).get(path, {}).get(setting)
        lam = costs.target_only_rate() if lam is None else float(lam)
        runs.append(PeerRun(HF_GOODPUT, {kind: path, setting: lam}, head=path if kind == "head" else None,
                            calibration=path if kind == "calibration" else None, costs=costs, rate=lam))
    return runs


@contextmanager
def _count_forwards(model):
    counter = {"n": 0}

    def hook(module, args, output):
        counter["n"] += 1

    handle = model.register_forward_hook(hook)
    try:
        yield counter
    finally:
        handle.remove()


@contextmanager
def assistant_settings(draft, **settings):
    """Temporarily set assisted-generation fields on the draft's generation config."""
    saved = copy.deepcopy(draft.generation_config)
    try:
        for k, v in settings.items():
            setattr(draft.generation_config, k, v)
        yield
    finally:
        draft.generation_config = saved


def peer_settings(variant: str | float | int, kind: str) -> dict:
    """Generation-config fields of one peer run: ``defaults``, a confidence threshold, or a constant K."""
    if kind == DEFAULTS:
        return {}
    if kind == "confidence":
        return {"assistant_confidence_threshold": float(variant)}
    if kind == "k":
        return {"num_assistant_tokens": int(variant), "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
    raise ValueError(f"unknown peer kind {kind!r}")


@torch.no_grad()
def hf_generate(draft, target, prompt_ids: list[int], sampling: Sampling, eos_token_ids: list[int], seed: int,
                settings: dict | None = None, *, assisted: bool = True, custom_generate=None) -> tuple[list[int], dict]:
    """One ``generate()`` call: (generated ids, stats with wall_s, new_tokens, target_calls, draft_calls).

    Args:
        settings: assisted-generation fields for the draft's generation config.
        assisted: pass the draft as ``assistant_model``; False runs the target alone.
        custom_generate: a decoding method (``decoding.runtimes.hf.HeadDecoding``) in place of transformers' own.
    """
    device = next(target.parameters()).device
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    greedy = sampling.temperature == 0
    kw = dict(max_new_tokens=sampling.max_new_tokens, do_sample=not greedy, eos_token_id=eos_token_ids,
              pad_token_id=eos_token_ids[0], attention_mask=torch.ones_like(ids))
    if not greedy:
        kw.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    else:
        kw.update(temperature=None, top_k=None, top_p=None)
    torch.manual_seed(seed)  # HF samples from the global generator
    with assistant_settings(draft, **(settings or {})), weights_as_loaded(draft, target), \
            _count_forwards(target) as nt, _count_forwards(draft) as nd:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        if custom_generate is not None:
            out = target.generate(ids, custom_generate=custom_generate, **kw)
        elif assisted:
            out = target.generate(ids, assistant_model=draft, **kw)
        else:
            out = target.generate(ids, **kw)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t
    tokens = out[0, ids.shape[1]:].tolist()
    stats = {"wall_s": wall, "new_tokens": len(tokens), "target_calls": nt["n"], "draft_calls": nd["n"],
             "discarded": None, "accepted_lengths": None}
    return tokens, stats

"""An exported head (``heads.export``) as a runtime uses it: loaded from its file alone, checked against the draft
it is given, and scoring one draft token at a time (the evaluation's decoder and ``decoding.runtimes.hf`` both use it)."""

from __future__ import annotations

from pathlib import Path

import torch

from heads.export import HeadFileError, check_model, feature_position, load_head
from heads.features import FROM_LOGPROBS, scores_from_logprobs


def features_beyond(meta: dict, computes) -> list[str]:
    """The features an exported head's metadata says it reads (scores, then vectors) that are not in ``computes``."""
    inputs = meta["inputs"]
    return [n for n in (*inputs.get("scores", {}), *inputs.get("vectors", {})) if n not in computes]


class ExportedHead:
    """The head module and its metadata; ``logit(hidden, …)`` scores one draft token on the hidden state's device."""

    def __init__(self, path: str | Path, role: str | None = None, computes: tuple[str, ...] = FROM_LOGPROBS):
        """
        Args:
            path: the exported ``.safetensors`` file.
            role: the role the caller needs (``"stop"`` or ``"verifier"``); None takes the file's.
            computes: the features the caller can feed beside the hidden state: score names
                (``heads.features.SCORES``) and vector names (``VECTORS``); a head reading any other is refused.
                The default, what the draft's log-probs give, is what every runtime has.
        """
        self.path = Path(path)
        self.module, self.meta = load_head(self.path)
        self.role = self.meta["role"]
        if role is not None and self.role != role:
            raise HeadFileError(f"{self.path}: a {self.role!r} head, this policy needs a {role!r} head")
        self._device: torch.device | None = None
        self._scores = list(getattr(self.module, "scores", []))  # read once: ``logit`` runs per draft token
        self.vectors = list(self.meta["inputs"].get("vectors", {}))
        """Vector features appended to the hidden state, in order (``heads.features.VECTORS``)."""
        self.draft_layers = tuple(self.meta["inputs"].get("tapped_layers", ())) if "layers" in self.vectors else ()
        """The draft layers whose outputs the head reads (its ``layers`` vector); none for most heads."""
        if "layers" in self.vectors and not self.draft_layers:
            raise HeadFileError(f"{self.path}: this head reads the draft's tapped layers but does not say which; "
                                f"export it again (make train)")
        beyond = features_beyond(self.meta, computes)
        if beyond:
            raise HeadFileError(f"{self.path}: this head reads {beyond}, which this runtime does not compute (only "
                                f"the draft's hidden state and {', '.join(computes)}); use a head without them")
        self.needs_context = any(n not in FROM_LOGPROBS for n in self._scores) or bool(self.vectors)
        """Whether ``logit`` needs the decoder's ``context`` (``Decoding.head_context``)."""
        self.position = feature_position(self.meta)
        """Which draft hidden state the head reads for a token: ``own`` (after reading it) or ``prev`` (the one
        that produced q for it)."""

    @property
    def threshold(self) -> float:
        """The threshold chosen at export (τ of a verifier, h of a stop head)."""
        return float(self.meta["threshold"]["value"])

    def check(self, draft, target=None) -> None:
        """Refuse a draft the head was not trained for (``heads.export.check_model``), and a ``target`` whose hidden
        state is not the size of the head's ``stale_target`` vector."""
        check_model(self.meta, draft, path=self.path)
        if target is None or "stale_target" not in self.vectors:
            return
        config = getattr(target, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        size = getattr(text, "hidden_size", None)
        extra = int(self.meta["head"]["init_args"].get("extra_size", 0))
        expected = extra - (len(self.draft_layers) * int(self.meta["hidden_size"]))
        if size is not None and int(size) != expected:
            raise HeadFileError(f"{self.path}: head reads the target's hidden state of size {expected}, the target has "
                                f"{size}; train a head on labels of this pair")

    @property
    def scores(self) -> list[str]:
        """The draft scores the head reads beside the hidden state (``heads.features``); often none."""
        return list(self._scores)

    @torch.no_grad()
    def logit(self, hidden: torch.Tensor, logprobs: torch.Tensor | None = None, token: int | None = None,
              context: dict[str, torch.Tensor] | None = None) -> float:
        """The head's logit for one token: its hidden state (d,) and, when the head reads draft scores, the
        draft's confidence log-probs (V,) at the token's position and the token id; a head that reads more gets
        the decoder's ``context`` (label-column names and vector names to tensors, ``Decoding.head_context``)."""
        if self._device != hidden.device:
            self.module.to(hidden.device)
            self._device = hidden.device
        if self.vectors:
            hidden = torch.cat([hidden.float(), *(context[v].float().to(hidden.device) for v in self.vectors)])
        if not self._scores:
            return self.module(hidden.float()).item()
        if logprobs is None or token is None:
            raise ValueError(f"{self.path}: this head reads the draft scores {self._scores}; pass logprobs and token")
        scores = scores_from_logprobs(self._scores, logprobs, token, context or {})
        return self.module(hidden.float(), scores.to(hidden.device)).item()

"""Exported heads inside transformers' ``generate()``: SpecDec++'s stop head and SPRINTER's verifier as a custom
generation method, and the goodput stop on a stop head's or a calibrated confidence's estimates.

    target.generate(**inputs, custom_generate=HeadDecoding(head_file, draft), …)

or, from a folder written by ``make export-hf`` (this file becomes its ``custom_generate/generate.py``):

    target.generate(**inputs, assistant_model=draft, custom_generate=folder, trust_remote_code=True, …)

The head's role picks the algorithm: a stop head runs SpecDec++ (Algorithm 1) in transformers' own assisted decoding
loop with our candidate generator, a verifier SPRINTER (Algorithm 2); with costs and no head, a calibrated confidence
(``decoding.estimates.CalibratedConfidence``) gives the goodput stop its estimates in the same loop. Each decision is
``decoding.rules``', as in the decoder and the trace replay. This file imports nothing of this project but
``decoding``, ``heads`` and ``core`` modules, whose import closure ``decoding.runtimes.hf_export`` copies beside it,
so an exported folder works with torch, transformers and safetensors alone. Design: ``decoding/runtimes/DESIGN.md``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers.generation import (
    AssistedCandidateGenerator,
    GenerateDecoderOnlyOutput,
    StoppingCriteriaList,
)

from core.device import describe_device, same_device
from core.sampling import sample_token, uniform
from decoding.costs import CostModel
from decoding.estimates import CalibratedConfidence, load_calibration
from decoding.rules import GoodputStop, check_token
from decoding.stopping_criteria import CalibratedRule, DraftRule, DraftTap, HeadRule
from heads.export import HeadFileError
from heads.exported import ExportedHead

# transformers 5.24 renamed the cache argument of models, generation kwargs and outputs from `past_key_values` to
# `cache`; an exported folder runs under whichever version the user has, so the name is read from the installed one.
CACHE_KEY = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"

MAX_K = 20
"""SpecDec++'s cap on the candidates of one round (the paper's and ``evaluation``'s default)."""


class HeadCandidateGenerator(AssistedCandidateGenerator):
    """transformers' draft-model candidate generator with the head's rule added to the draft's stopping criteria,
    a constant cap on a round (``max_k``; None: up to ``max_length``, SPRINTER's rounds) and none of transformers'
    own stop rules (no confidence threshold, no K schedule)."""

    def __init__(self, *args, rule: DraftRule, max_k: int | None, on_round=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.rule, self.max_k, self.on_round = rule, max_k, on_round
        self.num_assistant_tokens = max_k
        self.assistant_generation_config.num_assistant_tokens_schedule = "constant"
        self.generation_config.assistant_confidence_threshold = 0.0  # None would be filled with its default, 0.4

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs):
        self.rule.reset()
        if self.on_round is not None:
            self.on_round(input_ids.shape[-1])
        if not getattr(self.rule.stop, "drafting_pays", True):  # the goodput stop where no round can pay
            return input_ids, None  # no candidates: transformers' loop then samples the target's token alone
        return super().get_candidates(input_ids, **kwargs)

    def _calculate_new_tokens(self, input_ids: torch.LongTensor) -> tuple[int, int]:
        if self.max_k is not None:  # a verified round: the target's token must still fit
            return super()._calculate_new_tokens(input_ids)
        return 0, self.main_model_max_length - input_ids.shape[-1]

    def _prepare_generation_args(self, input_ids, min_new_tokens: int, max_new_tokens: int) -> dict:
        args = super()._prepare_generation_args(input_ids, min_new_tokens, max_new_tokens)
        return {**args, "stopping_criteria": StoppingCriteriaList([self.rule])}


def check_supported(model, input_ids: torch.LongTensor, generation_config, model_kwargs: dict, role: str) -> None:
    """One clear error for each ``generate()`` setting this runtime does not run."""
    config = generation_config
    if model.config.is_encoder_decoder:
        raise ValueError("speculative decoding with a head runs decoder-only models; this target is encoder-decoder")
    if (config.num_beams or 1) > 1 or (config.num_beam_groups or 1) > 1:
        raise ValueError(f"beam search (num_beams={config.num_beams}) is not supported by speculative decoding with a "
                         "head; use greedy decoding or sampling (num_beams=1)")
    if (config.num_return_sequences or 1) > 1:
        raise ValueError(f"num_return_sequences={config.num_return_sequences} is not supported; call generate() once "
                         "per sequence")
    if input_ids.shape[0] > 1:
        raise ValueError(f"batch size {input_ids.shape[0]}: speculative decoding with a head runs one sequence at a "
                         "time (batch size 1)")
    if (config.penalty_alpha or 0) > 0 or config.constraints is not None or config.force_words_ids is not None:
        raise ValueError("contrastive search and constrained decoding are not supported by speculative decoding with "
                         "a head")
    if config.prompt_lookup_num_tokens is not None or config.assistant_early_exit is not None:
        raise ValueError("prompt lookup and early-exit drafting replace the draft model; they cannot run with a head")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("the attention mask hides some prompt tokens (padding); pass the unpadded prompt")
    if role == "verifier" and (config.output_scores or config.output_logits or config.output_attentions
                               or config.output_hidden_states):
        raise ValueError("SPRINTER keeps tokens the target never scored: output_scores, output_logits, "
                         "output_attentions and output_hidden_states are not available with a verifier head")


@contextmanager
def _generator_for(model, make):
    """Let the model's assisted decoding loop use ``make(**its arguments)`` as its candidate generator.

    ``_assisted_decoding`` builds its candidate generator itself, with no argument to pass one in, so this shadows
    the model's ``_get_candidate_generator`` for the duration of one call."""
    model._get_candidate_generator = make
    try:
        yield
    finally:
        del model._get_candidate_generator


class HeadDecoding:
    """SpecDec++ (stop head) or SPRINTER (verifier head) as a decoding method for ``generate(custom_generate=…)``;
    with ``costs``, the goodput stop on a stop head's estimates or, with no head, on a calibrated confidence.

    transformers hands a callable ``custom_generate`` neither ``assistant_model`` nor ``streamer`` (only a folder's
    ``generate`` receives them, see ``generate`` below), so both are given here.
    """

    def __init__(self, head: str | Path | ExportedHead | None, draft, *, threshold: float | None = None,
                 max_k: int = MAX_K, streamer=None, costs=None, rate: float | str | None = None,
                 future: float | None = None, calibration: str | Path | CalibratedConfidence | None = None):
        """
        Args:
            head: an exported head file (``make train``), or one already loaded; None with a ``calibration``.
            draft: the draft model the head was trained on (checked: hidden size, vocabulary, identity).
            threshold: h of a stop head, τ of a verifier; None takes the one chosen at export.
            max_k: most candidates per SpecDec++ round.
            streamer: gets the generated tokens, as ``generate(streamer=…)``.
            costs: a stop head stops by the goodput rule (``decoding.rules.GoodputStop``) instead of h, under these
                costs (``decoding.costs.CostModel``).
            rate: the goodput rule's λ in tokens per second; None: target-only's, 1 / (a verification of one token);
                ``"online"``: from target-only's, then before each round the tokens this generation has produced
                over the seconds it has taken (the decoder's ``goodput`` with ``online=True``).
            future: the goodput rule's predicted acceptance of candidates not yet drafted; None: the last estimate.
            calibration: in place of a head, the goodput rule's estimates are the draft's confidence q(Y_i) of each
                candidate calibrated by this ``CalibratedConfidence`` (or its file, ``make calibrate``); needs
                ``costs``. Nothing then checks the draft: the calibration records none.
        """
        if (head is None) == (calibration is None):
            raise ValueError("give a head, or a calibration for the goodput stop in its place (not both)")
        if calibration is not None and (costs is None or threshold is not None):
            raise ValueError("a calibration runs the goodput stop: give its costs and no threshold")
        self.head = None if head is None else head if isinstance(head, ExportedHead) else ExportedHead(head)
        self.calibration = None if calibration is None else load_calibration(calibration)
        self.role = "stop" if self.head is None else self.head.role
        if self.head is not None:
            self.head.check(draft)
        if self.role == "verifier" and self.head.position != "prev":
            raise ValueError(f"{self.head.path}: this verifier reads the token's own hidden state; the runtime runs "
                             "SPRINTER with the paper's feature, the previous token's state (export a `prev` head)")
        if costs is not None and (self.role != "stop" or threshold is not None):
            raise ValueError("costs run the goodput stop of a stop head, in place of its threshold h: give a stop head "
                             "and no threshold")
        # the goodput stop takes the place of h, so no threshold is read
        self.threshold = None if costs is not None else self.head.threshold if threshold is None else float(threshold)
        if self.threshold is not None and not 0 <= self.threshold <= 1 or max_k < 1:
            raise ValueError(f"need 0 <= threshold <= 1 and max_k >= 1, got {self.threshold}, {max_k}")
        self.draft, self.max_k, self.streamer = draft, int(max_k), streamer
        self.costs, self.future = costs, future
        self.online = rate == "online"
        if self.online and costs is None:
            raise ValueError('rate="online" follows the goodput stop\'s λ: give costs')
        self.rate = None if costs is None else costs.target_only_rate() if rate in (None, "online") \
            else float(rate)

    def rule(self, tap: DraftTap, warp: dict) -> DraftRule:
        """The decision the draft's ``generate()`` runs after each token it samples."""
        reads_candidate = self.head is not None and self.head.position == "own"
        goodput = None if self.costs is None else GoodputStop(self.costs, self.rate, self.max_k, self.future,
                                                              reads_candidate)
        if self.head is None:
            return CalibratedRule(self.calibration, tap, warp, goodput)
        return HeadRule(self.head, self.threshold, tap, warp, goodput)

    @torch.no_grad()
    def __call__(self, model, input_ids: torch.LongTensor, logits_processor, stopping_criteria, generation_config,
                 synced_gpus: bool = False, streamer=None, **model_kwargs):
        check_supported(model, input_ids, generation_config, model_kwargs, self.role)
        streamer = streamer if streamer is not None else self.streamer
        c = generation_config  # the labels' warp of q (``warp_logits``): none under greedy decoding
        warp = {"temperature": c.temperature or 1.0, "top_k": c.top_k or 0, "top_p": c.top_p or 1.0} if c.do_sample \
            else {}
        tap = DraftTap(self.draft)
        rule = self.rule(tap, warp)
        saved_k = self.draft.generation_config.num_assistant_tokens  # transformers writes its schedule's K back

        started, prompt = time.perf_counter(), input_ids.shape[-1]

        def follow_rate(length: int) -> None:  # λ = this generation's tokens over its seconds so far
            if length > prompt:
                rule.stop.rate = (length - prompt) / max(time.perf_counter() - started, 1e-9)

        def candidates(generation_config, input_ids, logits_processor, model_kwargs, **_):
            max_k = self.max_k if self.role == "stop" else None
            return HeadCandidateGenerator(input_ids, self.draft, generation_config, model_kwargs,
                                          logits_processor=logits_processor, rule=rule, max_k=max_k,
                                          on_round=follow_rate if self.online else None)

        try:
            if self.role == "stop":
                with _generator_for(model, candidates):
                    return model._assisted_decoding(
                        input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=synced_gpus,
                        streamer=streamer, assistant_model=self.draft, **model_kwargs)
            generator = candidates(generation_config, input_ids, logits_processor, model_kwargs)
            return sprinter(model, generator, input_ids, logits_processor, stopping_criteria, generation_config,
                            streamer, model_kwargs[CACHE_KEY])
        finally:
            tap.remove()
            self.draft.generation_config.num_assistant_tokens = saved_k


def sprinter(model, candidates: HeadCandidateGenerator, input_ids: torch.LongTensor, logits_processor,
             stopping_criteria, generation_config, streamer, cache):
    """SPRINTER's Algorithm 2: each round drafts until the verifier rejects a token (or the sequence ends); the
    target then reads the pending tokens once and keeps the rejected token with probability min(1, p/q), else draws
    from norm((p − q)+) (under greedy decoding: the target's argmax). Tokens the verifier accepted are kept
    unchecked; a round the verifier accepts to the end has no target call."""
    while True:
        ids, draft_scores = candidates.get_candidates(input_ids)
        new = ids[:, input_ids.shape[1]:].to(input_ids.device)
        if candidates.rule.rejected:
            prefix = torch.cat([input_ids, new[:, :-1]], dim=1)  # the sequence and the pending tokens
            past = cache.get_seq_length()
            extra = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}
            positions = torch.arange(past, prefix.shape[1], device=prefix.device).unsqueeze(0)
            out = model(input_ids=prefix[:, past:], position_ids=positions, use_cache=True, **{CACHE_KEY: cache},
                        **extra)
            p_scores = logits_processor(prefix, out.logits[:, -1].float())[0]
            token = _check_last(int(new[0, -1]), p_scores, draft_scores[0, -1].to(p_scores.device),
                                generation_config.do_sample)
            new = torch.cat([new[:, :-1], torch.tensor([[token]], device=new.device)], dim=1)
        input_ids = torch.cat([input_ids, new], dim=1)
        if streamer is not None:
            streamer.put(new.cpu())
        if bool(stopping_criteria(input_ids, None).all()):
            break
    if streamer is not None:
        streamer.end()
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=input_ids, **{CACHE_KEY: cache})
    return input_ids


def _check_last(token: int, p_scores: torch.Tensor, q_scores: torch.Tensor, do_sample: bool) -> int:
    """The token that ends a SPRINTER round: the rejected draft token, kept with probability min(1, p/q), or a
    draw from norm((p − q)+). ``p_scores``/``q_scores`` are the two models' processed logits at its position."""
    if not do_sample:  # q and p are one-hots: keep the draft token iff it is the target's argmax
        return int(p_scores.argmax())
    logp, logq = p_scores.log_softmax(-1), q_scores.float().log_softmax(-1)
    return check_token(token, logq, logp, lambda: uniform().item(), sample_token)[0]


def bundled_head(directory: str | Path) -> Path:
    """Write the head an exported folder carries (``custom_generate/bundled_head.py``) into ``directory``.

    transformers copies only a folder's Python files into its module cache, and tells its ``generate`` no path, so
    the folder carries its head as a Python module: the exact bytes of its ``head.safetensors``."""
    try:
        from .bundled_head import DATA, FILE_NAME, SHA256
    except ImportError:
        raise ValueError("no head given: pass head=<exported .safetensors file> (only a folder written by "
                         "`make export-hf` carries its own)") from None
    data = base64.b64decode(DATA)
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise HeadFileError(f"custom_generate/bundled_head.py: the bundled {FILE_NAME} does not match its digest "
                            "(the file was modified); export the folder again")
    path = Path(directory) / FILE_NAME
    path.write_bytes(data)
    return path


def load_bundled_head() -> ExportedHead:
    """The folder's own head, loaded and checked; its errors (now and when checked against the draft) name it as
    the folder's, not by the temporary copy it is read from."""
    with tempfile.TemporaryDirectory() as tmp:
        path = bundled_head(tmp)
        name = Path(f"custom_generate/bundled_head.py ({path.name})")
        try:
            head = ExportedHead(path)
        except HeadFileError as e:
            raise HeadFileError(str(e).replace(str(path), str(name))) from None
    head.path = name
    return head


def load_bundled_costs() -> tuple[CostModel, float | str | None] | None:
    """The costs a folder exported with ``--timing`` carries (``custom_generate/bundled_costs.py``, a Python module
    for the reason ``bundled_head`` is one), with the λ it runs at (tokens/s or ``"online"``); None outside a folder,
    or for one exported without them."""
    try:
        from .bundled_costs import RATE, SAVED
    except ImportError:
        return None
    return None if SAVED is None else (CostModel.from_dict(json.loads(SAVED)), RATE)


def load_bundled_calibration() -> CalibratedConfidence | None:
    """The calibrated confidence a folder exported with ``--calibration`` carries
    (``custom_generate/bundled_calibration.py``, a Python module for the reason ``bundled_head`` is one); None outside
    a folder, or for one exported without it."""
    try:
        from .bundled_calibration import SAVED
    except ImportError:
        return None
    return None if SAVED is None else CalibratedConfidence.from_dict(SAVED, "custom_generate/bundled_calibration.py")


def generate(model, *args, assistant_model=None, streamer=None, head: str | Path | None = None,
             threshold: float | None = None, max_k: int = MAX_K, costs=None, rate: float | str | None = None,
             calibration: str | Path | CalibratedConfidence | None = None, **kwargs):
    """The entry point transformers calls for ``generate(custom_generate=<folder>, trust_remote_code=True)``, with
    every argument of that ``generate()`` call: ``assistant_model`` (the draft; required) and ``streamer`` go to
    ``HeadDecoding``, everything else back to ``model.generate`` with it as the decoding method.

    Args:
        head: a head file instead of the folder's own (``HeadDecoding``); threshold, max_k, costs, rate,
            calibration: as there. A folder exported with a timing file runs a stop head by the goodput stop under its
            costs unless given a threshold; one exported with a calibration too runs the goodput stop on the draft's
            calibrated confidence unless given a head or a threshold (the folder's head then only checks the draft).
    """
    if assistant_model is None:
        raise ValueError("speculative decoding with a head needs the draft it was trained on: "
                         "generate(..., assistant_model=draft)")
    loaded = load_bundled_head() if head is None else ExportedHead(head)
    if calibration is None and head is None and threshold is None:
        calibration = load_bundled_calibration()
    if calibration is not None and head is None:  # the folder's head names the draft the folder is for
        loaded.check(assistant_model)
        loaded = None
    if costs is None and threshold is None and (loaded is None or loaded.role == "stop"):
        bundled = load_bundled_costs()
        if bundled is not None:
            costs, rate = bundled[0], bundled[1] if rate is None else rate
            here = describe_device(model.device)
            if not same_device(costs.device, here):
                warnings.warn(f"this folder's costs were timed on {costs.device or 'an unnamed device'}, not on this "
                              f"{here}: its goodput stop may stop at the wrong lengths here; export it again with a "
                              "timing file of this device, or pass threshold= to run the head's threshold rule",
                              stacklevel=2)
    decoding = HeadDecoding(loaded, assistant_model, threshold=threshold, max_k=max_k, streamer=streamer,
                            costs=costs, rate=rate, calibration=calibration)
    return model.generate(*args, assistant_model=assistant_model, streamer=streamer, custom_generate=decoding,
                          **kwargs)

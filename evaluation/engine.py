"""The models an evaluation decodes with, behind one ``Engine``: a transformers pair or llama.cpp's GGUF files, loaded
once, and what the run needs from them (our decoder's pairs, the peers, the head check, the likelihood, the traces,
the timing of the pair's forwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


from core.models import resolve_dtype
from core.sampling import Sampling
from evaluation.config import EvalConfig, EvalError
from evaluation.results import run_label


@dataclass
class Engine:
    """What the run needs from the models; injected so tests can drive the run with fakes."""

    tokenizer: Any
    """Encodes prompts, decodes outputs."""
    make_pair: Callable[[Sampling], Any]
    """A ``ModelPair`` for one sampling setting (has ``.device``)."""
    build_policy: Callable[..., Any]
    """``decoding.policies.build_policy``."""
    hf_generate: Callable[..., tuple[list[int], dict]] | None = None
    """``(prompt_ids, sampling, seed, run: PeerRun) → (tokens, stats)``; None = no peer."""
    check_head: Callable[[str], None] | None = None
    """Refuses a head file that is damaged or was not trained for the loaded draft; None = no check."""
    check_calibration: Callable[[str], None] | None = None
    """Refuses a calibration fitted on another draft's rows than the loaded draft; None = no check."""
    loglik: Callable[[list[int], list[int]], float] | None = None
    """``(prompt_ids, tokens) → `` the target's mean log-likelihood per token (``evaluation.likelihood``); None =
    not scored."""
    record_trace: Callable[..., Any] | None = None
    """``evaluation.traces.record_trace`` bound to the pair: a target-only response's decoder trace; None = not
    recorded."""
    time_forwards: Callable[[int, int], dict] | None = None
    """``(prompt_tokens, new_tokens) →`` the pair's forwards timed on this device (``bench_timing.time_pair``);
    None = not timed."""
    llama_generate: Callable[[list[int], Sampling, int, str, dict], tuple[list[int], dict]] | None = None
    """``(prompt_ids, sampling, seed, family, params) →`` one run of llama.cpp's own binaries
    (``evaluation.llama_peer``): its tokens (our tokenizer's reading of its text) and stats; None = no such peer."""
    models: dict | None = None
    """The pair by content, as ``core.prompts.input_digests`` records it (role → digests), for an engine whose
    models the config does not name; None = the config's ``draft`` and ``target`` are read."""

    @classmethod
    def load(cls, cfg: EvalConfig) -> "Engine":
        """The pair ``cfg`` names on its backend (``core.backends``), with the peer the config enables: transformers'
        ``generate()`` (``hf_peer``) or llama.cpp's own binaries (``llama_peer``)."""
        from core.backends import Context, backend
        from core.identity import check_labels_pair
        from core.models import eos_token_ids
        from core.shards import read_manifest
        from evaluation.bench_timing import time_pair

        runtime = backend(cfg.backend)
        device = cfg.model_device()
        dtype = resolve_dtype(cfg.dtype, device)
        quantized = [f"{role}.quantization: {spec.quantization}" for role, spec in (("draft", cfg.draft),
                     ("target", cfg.target)) if spec.quantization != "none"]
        if quantized and device.type != "cpu":
            raise EvalError(f"{', '.join(quantized)} runs on the CPU only; set device: cpu or quantization: none")
        context = Context(LLAMA_CONTEXT)
        pair = runtime.load_pair(cfg.draft, cfg.target, dtype, cfg.model_threads(), context, context)
        draft, target, tok = pair.draft, pair.target, pair.tokenizer
        if cfg.select_by == "simulated":  # the label traces stand for this pair's decoding
            check_labels_pair(read_manifest(cfg.labels_dir)["models"], pair.models, cfg.labels_dir)
        for model in (draft, target):
            model.to(device)
        eos = eos_token_ids(target, tok)
        peers = {}
        if cfg.hf_peer.enabled:
            peers["hf_generate"] = transformers_generate(draft, target, eos)
        if cfg.llama_peer.enabled:
            peers["llama_generate"] = llama_binaries(cfg, draft, target, tok)
        decoder = cfg.resolved_decoder()
        return cls.of_pair(cfg, draft, target, tok, eos, decoder,
                           lambda prompt, new: time_pair(draft, target, device, prompt, new, decoder=decoder),
                           **peers)

    @classmethod
    def of_pair(cls, cfg: EvalConfig, draft, target, tokenizer, eos: list[int], decoder: str,
                time_forwards: Callable[[int, int], dict], **peers) -> "Engine":
        """An engine over a loaded pair, whatever backend runs it: our decoder's pairs, the head check, the
        likelihood, the traces and the timing of its forwards (``time_forwards``); ``peers``: the backend's peer."""
        from core.identity import model_identity
        from decoding.estimates import load_calibration
        from decoding.lookup_stop import LookupCalibration, LookupHead
        from decoding.policies import build_policy
        from decoding.state import HEAD_FEATURES, ModelPair
        from evaluation.likelihood import mean_loglik
        from evaluation.traces import record_trace
        from heads.export import LOOKUP_HEAD_ROLE, read_metadata
        from heads.exported import ExportedHead

        return cls(
            tokenizer=tokenizer,
            make_pair=lambda s: ModelPair(draft=draft, target=target, eos_token_ids=eos, sampling=s, decoder=decoder,
                                          untimed_prefill=cfg.untimed_prefill),
            build_policy=build_policy,
            # a prompt-lookup stop head reads the target's state: checked against the target
            check_head=lambda path: LookupHead.load(path).check_target_model(target)
            if read_metadata(path)["role"] == LOOKUP_HEAD_ROLE
            else ExportedHead(path, computes=HEAD_FEATURES).check(draft, target),
            check_calibration=lambda path: LookupCalibration.load(path).check_target(model_identity(target),
                                                                                     "this evaluation's target")
            if LookupCalibration.holds_one(path) else load_calibration(path).check_draft(model_identity(draft),
                                                                                          "this evaluation's draft"),
            loglik=lambda ids, tokens: mean_loglik(target, ids, tokens),
            record_trace=lambda ids, tokens, generator, prompt: record_trace(draft, target, ids, tokens, generator,
                                                                            prompt),
            time_forwards=time_forwards,
            **peers,
        )


LLAMA_CONTEXT = 4096
"""The cells of a llama.cpp model's context in an eval: a prompt and its response."""


def transformers_generate(draft, target, eos: list[int]):
    """Transformers' ``generate()`` on the pair (``evaluation.hf_peer``), each run's decoding method (a head loaded
    and checked) made once, not per prompt."""
    from evaluation.hf_peer import hf_generate

    decodings = {}

    def peer(ids, sampling, seed, run):
        key = run_label(run.family, run.params)
        if key not in decodings:
            decodings[key] = run.decoding(draft)
        return hf_generate(draft, target, ids, sampling, eos, seed, run.settings, assisted=run.assisted,
                           custom_generate=decodings[key])

    return peer


def llama_binaries(cfg: EvalConfig, draft, target, tok):
    """llama.cpp's own binaries on the pair's GGUF files (``evaluation.llama_peer``): its tokens (our tokenizer's
    reading of its text) and stats."""

    def llama_generate(ids, sampling, seed, family, params):
        from evaluation.llama_peer import run

        text, stats = run(cfg.llama_peer, family, params, target.path, draft.path,
                                     tok.decode(ids, skip_special_tokens=False), sampling, seed,
                                     cfg.model_threads(), LLAMA_CONTEXT)
        return tok.encode(text, add_special_tokens=False), stats

    return llama_generate

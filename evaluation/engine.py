"""The models an evaluation decodes with, behind one ``Engine``: a transformers pair or llama.cpp's GGUF files, loaded
once, and what the run needs from them (our decoder's pairs, the peers, the head check, the likelihood, the traces,
the timing of the pair's forwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from core.models import resolve_device, resolve_dtype
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
        if cfg.backend == "llama_cpp":
            return cls.load_llama_cpp(cfg)
        from core.identity import check_labels_pair
        from core.models import check_vocabularies, eos_token_ids, load_model
        from core.shards import read_manifest
        from evaluation.hf_peer import hf_generate

        device = resolve_device(cfg.device)
        dtype = resolve_dtype(cfg.dtype, device)
        quantized = [f"{role}.quantization: {spec.quantization}" for role, spec in (("draft", cfg.draft),
                     ("target", cfg.target)) if spec.quantization != "none"]
        if quantized and device.type != "cpu":
            raise EvalError(f"{', '.join(quantized)} runs on the CPU only; set device: cpu or quantization: none")
        draft, tok, d_id = load_model(cfg.draft, dtype)
        target, t_tok, t_id = load_model(cfg.target, dtype)
        check_vocabularies(d_id, t_id, same_tokens=tok.get_vocab() == t_tok.get_vocab())
        if cfg.select_by == "simulated":  # the label traces stand for this pair's decoding
            pair = {"draft": d_id, "target": t_id}
            check_labels_pair(read_manifest(cfg.labels_dir)["models"], pair, cfg.labels_dir)
        draft.to(device)
        target.to(device)
        eos = eos_token_ids(target, t_tok)
        decodings = {}  # run label → its decoding method: a head loaded and checked once, not per prompt

        def peer(ids, sampling, seed, run):
            key = run_label(run.family, run.params)
            if key not in decodings:
                decodings[key] = run.decoding(draft)
            return hf_generate(draft, target, ids, sampling, eos, seed, run.settings, assisted=run.assisted,
                               custom_generate=decodings[key])

        from evaluation.bench_timing import time_pair

        return cls.of_pair(cfg, draft, target, t_tok, eos, cfg.resolved_decoder(),
                           lambda prompt, new: time_pair(draft, target, device, prompt, new,
                                                         decoder=cfg.resolved_decoder()),
                           hf_generate=peer)

    @classmethod
    def of_pair(cls, cfg: EvalConfig, draft, target, tokenizer, eos: list[int], decoder: str,
                time_forwards: Callable[[int, int], dict], **peers) -> "Engine":
        """An engine over a loaded pair, whatever backend runs it: our decoder's pairs, the head check, the
        likelihood, the traces and the timing of its forwards (``time_forwards``); ``peers``: the backend's peer."""
        from core.identity import model_identity
        from decoding.estimates import load_calibration
        from decoding.policies import build_policy
        from decoding.state import HEAD_FEATURES, ModelPair
        from evaluation.likelihood import mean_loglik
        from evaluation.traces import record_trace
        from heads.exported import ExportedHead

        return cls(
            tokenizer=tokenizer,
            make_pair=lambda s: ModelPair(draft=draft, target=target, eos_token_ids=eos, sampling=s, decoder=decoder,
                                          untimed_prefill=cfg.untimed_prefill),
            build_policy=build_policy,
            check_head=lambda path: ExportedHead(path, computes=HEAD_FEATURES).check(draft, target),
            check_calibration=lambda path: load_calibration(path).check_draft(model_identity(draft),
                                                                              "this evaluation's draft"),
            loglik=lambda ids, tokens: mean_loglik(target, ids, tokens),
            record_trace=lambda ids, tokens, generator, prompt: record_trace(draft, target, ids, tokens, generator,
                                                                            prompt),
            time_forwards=time_forwards,
            **peers,
        )


    @classmethod
    def load_llama_cpp(cls, cfg: EvalConfig) -> "Engine":
        """The pair's GGUF files run by llama.cpp (``core.llama_cpp``) on ``cfg.llama_threads()`` threads each."""
        from core.identity import check_labels_pair
        from core.models import check_vocabularies, eos_token_ids, load_llama_model
        from core.shards import read_manifest
        from evaluation.bench_timing import time_llama_pair

        n_ctx = 4096
        draft, tok, d_id = load_llama_model(cfg.draft, cfg.llama_threads(), n_ctx)
        target, t_tok, t_id = load_llama_model(cfg.target, cfg.llama_threads(), n_ctx)
        check_vocabularies(d_id, t_id, same_tokens=tok.get_vocab() == t_tok.get_vocab())
        if cfg.select_by == "simulated":
            check_labels_pair(read_manifest(cfg.labels_dir)["models"], {"draft": d_id, "target": t_id},
                              cfg.labels_dir)
        eos = eos_token_ids(target, t_tok)

        def llama_generate(ids, sampling, seed, family, params):
            from evaluation import llama_peer

            text, stats = llama_peer.run(cfg.llama_peer, family, params, target.path, draft.path,
                                         t_tok.decode(ids, skip_special_tokens=False), sampling, seed,
                                         cfg.llama_threads(), n_ctx)
            return t_tok.encode(text, add_special_tokens=False), stats

        return cls.of_pair(cfg, draft, target, t_tok, eos, "eager",
                           lambda prompt, new: time_llama_pair(draft, target, prompt, new),
                           llama_generate=llama_generate)

"""Speculative decoding of two GGUF files in llama.cpp with our rules, outside the evaluation harness.

    specheads generate --target T.gguf --draft D.gguf --timing runs/bench/timing-llama_cpp-2t.json \\
        --calibration checkpoints/calibration.json --prompt "def fib(n):" [--max_new_tokens 128] [--threads 2]

or from Python::

    from decoding.runtimes.llama_cpp import SpeculativeLlama
    llm = SpeculativeLlama("target.gguf", "draft.gguf", threads=2, policy="goodput",
                           calibration="checkpoints/calibration.json", timing="runs/bench/timing-llama_cpp-2t.json")
    text, stats = llm.generate("def fib(n):", max_new_tokens=128)

The models run in llama.cpp through our backend (``core.llama_cpp``), the policy is any of ``decoding.policies``
(default: the goodput stop, which drafts nothing where no round can pay at the timed costs), and the verification is
exact speculative sampling (min(1, p/q)). ``llama_cpp.Llama(draft_model=…)`` cannot carry it: that interface asks
the draft for tokens and keeps one only when the target's own sample equals it, an exact rule that accepts a drafted
token with probability p(y), not min(1, p/q), and it has no place for a stop rule that reads the target's costs.
"""

from __future__ import annotations

import sys
from argparse import ArgumentTypeError
from pathlib import Path

import torch

from core.arguments import CommandParser, description
from core.errors import UserError
from core.interrupt import run_main
from core.models import ModelSpec, eos_token_ids, load_llama_model
from core.prompts import tokenize_prompt
from core.sampling import Sampling
from decoding.policies import build_policy
from decoding.state import DecodeStats, ModelPair


class SpeculativeLlama:
    """A draft and a target GGUF file in llama.cpp, decoded by one of our policies."""

    def __init__(self, target: str | Path, draft: str | Path, *, threads: int = 2, policy: str = "goodput",
                 n_ctx: int = 4096, tokenizer: str | None = None, **policy_kwargs):
        self.target, self.tokenizer, _ = load_llama_model(ModelSpec(path=str(target), tokenizer=tokenizer), threads,
                                                          n_ctx)
        self.draft, draft_tokenizer, _ = load_llama_model(ModelSpec(path=str(draft), tokenizer=tokenizer), threads,
                                                          n_ctx)
        if draft_tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise UserError(f"{draft} and {target} do not share one vocabulary")
        self.eos = eos_token_ids(self.target, self.tokenizer)
        try:
            self.policy = build_policy(policy, **policy_kwargs)
        except (TypeError, ValueError) as e:
            raise UserError(f"policy {policy}: {e}") from None

    def generate(self, prompt: str | list[int], max_new_tokens: int = 128, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, chat_template: bool = True) -> tuple[str, DecodeStats]:
        """The response's text and its counts (``DecodeStats``; its clock starts after the prompt's prefill). A
        string prompt is tokenized with the target's chat template when it has one (``chat_template``)."""
        ids = prompt if isinstance(prompt, list) else tokenize_prompt(self.tokenizer, prompt, chat_template)
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens)
        pair = ModelPair(draft=self.draft, target=self.target, eos_token_ids=self.eos, sampling=sampling,
                         untimed_prefill=True)
        result = self.policy.generate(pair, ids, torch.Generator().manual_seed(seed))
        return self.tokenizer.decode(result.tokens, skip_special_tokens=True), result.stats


def policy_setting(text: str) -> tuple[str, object]:
    """``--param KEY=VALUE`` as ``(key, value)``, the value read as YAML reads a scalar (``4`` an int, ``0.5`` a
    float, ``null`` None)."""
    import yaml

    key, eq, value = text.partition("=")
    if not eq or not key.isidentifier():
        raise ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, yaml.safe_load(value)


def main(argv: list[str] | None = None) -> tuple[str, DecodeStats]:
    from decoding.policies import POLICIES

    settings = ", ".join(f"{name} ({cls.setting})" if cls.setting else name for name, cls in POLICIES.items())
    p = CommandParser(prog="specheads generate", description=description(__doc__))
    p.add_argument("--target", required=True, help="the target's GGUF file")
    p.add_argument("--draft", required=True, help="the draft's GGUF file")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer folder or Hub id for both files, where transformers cannot read a GGUF file's own "
                        "vocabulary (default: the target file's)")
    p.add_argument("--prompt", required=True, help="the prompt's text (the chat template is applied)")
    p.add_argument("--policy", default="goodput", choices=list(POLICIES), metavar="POLICY",
                   help=f"the decoding policy (default goodput); each with the setting it sweeps: {settings}")
    p.add_argument("--param", type=policy_setting, action="append", default=[], metavar="KEY=VALUE",
                   help="a keyword argument of the policy, e.g. --param lam=0.5 or --param h=0.3 (repeatable)")
    p.add_argument("--timing", help="a llama.cpp timing file (make bench-timing ARGS='--backend llama_cpp')")
    p.add_argument("--calibration", help="the draft's calibrated confidence (make calibrate), for goodput")
    p.add_argument("--head", help="an exported stop head, for goodput or specdecpp")
    p.add_argument("--k", type=int, help="candidates per round, for sd")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each model (default 2)")
    p.add_argument("--max_new_tokens", type=int, default=128, help="response length cap (default 128)")
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature, 0 greedy (default 1.0)")
    p.add_argument("--top_k", type=int, default=0, help="keep the k most likely tokens, 0 off (default 0)")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling mass, 1 off (default 1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling draws (default 0)")
    a = p.parse_args(argv)
    kwargs = {k: v for k, v in (("timing", a.timing), ("calibration", a.calibration), ("head", a.head),
                                ("k", a.k)) if v is not None}
    for key, value in a.param:
        if key in kwargs:
            raise UserError(f"{key} given twice (--param {key}= and --{key}): give it once")
        kwargs[key] = value
    llm = SpeculativeLlama(a.target, a.draft, threads=a.threads, policy=a.policy, tokenizer=a.tokenizer,
                           **kwargs)
    text, stats = llm.generate(a.prompt, a.max_new_tokens, a.temperature, a.top_k, a.top_p, seed=a.seed)
    print(text)
    print(f"{stats.new_tokens} tokens in {stats.wall_s:.2f} s ({stats.tokens_per_s:.2f} tokens/s, prefill excluded); "
          f"{stats.target_calls} target and {stats.draft_calls} draft forwards", file=sys.stderr)
    return text, stats

if __name__ == "__main__":
    run_main(main)

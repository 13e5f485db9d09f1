"""Tiny random-init draft/target pairs built from configs, for tests and ``make smoke`` (nothing downloaded).

The draft is a perturbed copy of the target, so acceptance varies between tokens instead of being 0 or 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = (
    "def return if else for in range while import print self x y z i j n a b c "
    "0 1 2 3 4 5 6 7 8 9 + - * / = == < > ( ) [ ] : , . ' \" # list dict int str len"
).split()


def make_tokenizer():
    """A word-level tokenizer over a small code-like vocabulary, with BOS/EOS/PAD and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}: {% endif %}"
    return tok


def make_pair(out_dir: str | Path, *, hidden_size: int = 32, layers: int = 2, noise: float = 0.5, seed: int = 0):
    """Write ``target/`` and ``draft/`` checkpoints (with tokenizer) under ``out_dir``; return the two paths."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tok = make_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    target = LlamaForCausalLM(config)
    with torch.no_grad():  # larger logits than the default init, so distributions are not near-uniform
        target.lm_head.weight.mul_(20)
    draft = LlamaForCausalLM(config)
    draft.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=g))
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = out_dir / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(path)
    return paths[1], paths[0]


def write_prompts(path: str | Path, n: int = 12, seed: int = 0, field: str = "prompt") -> Path:
    """A JSONL file of ``n`` short code-like prompts (lengths vary) with reference answers."""
    g = torch.Generator().manual_seed(seed)
    path = Path(path)
    with open(path, "w") as f:
        for i in range(n):
            k = 3 + int(torch.randint(0, 12, (1,), generator=g))
            words = [WORDS[int(j)] for j in torch.randint(0, len(WORDS), (k,), generator=g)]
            answer = [WORDS[int(j)] for j in torch.randint(0, len(WORDS), (6,), generator=g)]
            f.write(json.dumps({field: " ".join(words), "answer": " ".join(answer), "task_id": i}) + "\n")
    return path


def label_config(draft, target, prompts, output_dir, *, max_new_tokens: int = 12, batch_size: int = 4, **overrides):
    """A CPU ``LabelConfig`` for a tiny pair and a prompt file from ``write_prompts`` (its answers in ``answer``)."""
    from core.models import ModelSpec
    from core.prompts import PromptConfig
    from core.sampling import Sampling
    from data_gen.config import LabelConfig

    kw = dict(
        draft=ModelSpec(path=str(draft), name="tiny-draft"),
        target=ModelSpec(path=str(target), name="tiny-target"),
        prompts=PromptConfig(source=str(prompts), response_field="answer"),
        sampling=Sampling(max_new_tokens=max_new_tokens),
        output_dir=str(output_dir),
        batch_size=batch_size,
        accelerator="cpu",
        devices=1,
        dtype="float32",  # one precision on every CPU (auto is bf16 on CPUs with AMX); bf16 is tested on purpose
    )
    return LabelConfig(**{**kw, **overrides})


def write_eval_config(path: str | Path, draft, target, prompts, output_dir, *, limit: int | None = None,
                      **overrides) -> Path:
    """An eval config file (``specheads eval --config PATH``) for a tiny pair on the CPU and a prompt file from
    ``write_prompts`` (its first ``limit`` prompts), with no training or label folder unless ``overrides`` name one."""
    import yaml

    settings = {
        "draft": {"path": str(draft), "name": "tiny-draft"},
        "target": {"path": str(target), "name": "tiny-target"},
        "prompts": {"source": str(prompts), "response_field": "answer", "limit": limit},
        "train_dir": None, "labels_dir": None, "output_dir": str(output_dir), "device": "cpu", "warmup": False,
        **overrides,
    }
    Path(path).write_text(yaml.safe_dump(settings))
    return Path(path)

"""A GGUF file of a tiny Llama checkpoint (``testing.tiny.make_pair``), for tests of the llama.cpp backend.

Written with the ``gguf`` package, tensor by tensor in float32 under llama.cpp's names. llama.cpp's ``llama``
architecture rotates adjacent pairs of a head's dimensions where transformers' Llama rotates its two halves, so the
query and key rows are permuted as llama.cpp's own converter permutes them; the same model then gives the same
logits in both runtimes (to float32 rounding), which the tests check. The vocabulary is stored as a byte-level BPE
one with no merges: our decoder hands llama.cpp token ids, never text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

NEWLINE = "Ċ"
"""The byte-level spelling of "\\n": llama.cpp looks its id up when it loads a BPE vocabulary."""


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """transformers' half-split rotary layout -> llama.cpp's interleaved one (rows of one projection)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(checkpoint: str | Path, out: str | Path, *, vocab_size: int | None = None) -> Path:
    """Write ``checkpoint`` (a tiny ``LlamaForCausalLM`` folder with its tokenizer) as one float32 GGUF file.

    ``vocab_size`` larger than the model's pads the output layer and the vocabulary with unused rows: a model of
    another vocabulary, for the refusal tests."""
    import gguf
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    c = model.config
    rows = vocab_size or c.vocab_size
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    tokens += [f"<extra_{i}>" for i in range(rows - len(tokens))]
    tokens[tokens.index("<unk>")] = NEWLINE
    types = [gguf.TokenType.CONTROL if t.startswith("<") and t.endswith(">") else gguf.TokenType.NORMAL for t in tokens]

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(Path(checkpoint).name)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]) if getattr(c, "rope_parameters", None)
                         else float(c.rope_theta))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["r e"])  # one merge: llama.cpp refuses a BPE vocabulary without the list
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_add_bos_token(False)

    sd = {k: v.numpy() for k, v in model.state_dict().items()}

    def pad(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.zeros((rows - a.shape[0], *a.shape[1:]), a.dtype)]) if rows > a.shape[0] else a

    w.add_tensor("token_embd.weight", pad(sd["model.embed_tokens.weight"]))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", pad(sd["lm_head.weight"]))
    names = {"self_attn.o_proj": "attn_output", "self_attn.v_proj": "attn_v", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        for hf, cpp in names.items():
            w.add_tensor(f"blk.{i}.{cpp}.weight", sd[p + hf + ".weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)

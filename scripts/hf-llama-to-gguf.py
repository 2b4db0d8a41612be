#!/usr/bin/env python3
"""Convert a Hugging Face Llama folder written by `strata make-model --arch llama` to GGUF.

For the side-by-side runs against llama.cpp's server (docs/full-hit.md): both servers then
hold the same weights. Needs numpy (Debian: python3-numpy) and llama.cpp's gguf-py package
(pure Python; pass its folder with --gguf-py, it is not part of this repository).

    python3 scripts/hf-llama-to-gguf.py --model /tmp/hit/bench-llama \
        --out /tmp/hit/bench-llama-f32.gguf --gguf-py /path/to/llama.cpp/gguf-py

What it handles (and refuses otherwise): LlamaForCausalLM, no biases, F32/F16/BF16
safetensors (one file or sharded with an index), written as F32; rope_scaling null;
a byte-level BPE tokenizer.json (the one make-model generates, or another ByteLevel BPE).
What it does, as llama.cpp's own convert_hf_to_gguf.py does for Llama:
  - q_proj and k_proj rows are permuted from Hugging Face's rotate-half RoPE layout to
    the interleaved pairs llama.cpp's LLAMA architecture rotates (the model computes the
    same function);
  - the vocabulary is padded to the model's vocab_size with "[PAD<i>]" tokens of type
    UNUSED (make-model's tokenizer has fewer entries than the embedding has rows);
  - pre-tokenizer "gpt-2" (ByteLevel with the GPT-2 regex), merges as in tokenizer.json,
    special tokens as CONTROL, BOS/EOS/pad ids from config.json / generation_config.json,
    add_bos/add_eos from tokenizer_config.json, the chat template copied.
The safetensors reader is local (8-byte little-endian header length, JSON header, raw
little-endian data), so neither torch nor safetensors is needed.
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    """Yields (name, np.ndarray float32) for every tensor of one .safetensors file."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    header = json.loads(bytes(data[8:8 + n]))
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        shape = info["shape"]
        dt = info["dtype"]
        if dt == "BF16":
            u16 = raw.view(np.uint16).astype(np.uint32) << 16
            arr = u16.view(np.float32)
        elif dt in DTYPES:
            arr = raw.view(DTYPES[dt]).astype(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name}: unsupported dtype {dt}")
        yield name, np.ascontiguousarray(arr.reshape(shape))


def read_model_tensors(model_dir):
    index = model_dir / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.exists() else ["model.safetensors"])
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(model_dir / f))
    return tensors


def permute_rope(w, n_head):
    # Hugging Face rotate-half rows -> interleaved pairs (convert_hf_to_gguf.py's permute).
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path, help="Hugging Face model folder")
    ap.add_argument("--out", required=True, type=Path, help="GGUF file to write")
    ap.add_argument("--gguf-py", required=True, type=Path, help="llama.cpp's gguf-py folder")
    a = ap.parse_args()
    sys.path.insert(0, str(a.gguf_py))
    import gguf  # noqa: E402

    cfg = json.loads((a.model / "config.json").read_text())
    if cfg.get("architectures") != ["LlamaForCausalLM"]:
        raise SystemExit(f"only LlamaForCausalLM is handled, not {cfg.get('architectures')}")
    if cfg.get("rope_scaling") or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise SystemExit("rope_scaling, attention_bias and mlp_bias are not handled")
    n_embd, n_layer = cfg["hidden_size"], cfg["num_hidden_layers"]
    n_head = cfg["num_attention_heads"]
    n_head_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim", n_embd // n_head)
    n_vocab = cfg["vocab_size"]

    w = gguf.GGUFWriter(str(a.out), "llama")
    w.add_name(a.model.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    # Tokenizer: byte-level BPE ("gpt2" model, "gpt-2" pre-tokenizer), padded to n_vocab.
    tok = json.loads((a.model / "tokenizer.json").read_text())
    if tok["model"]["type"] != "BPE" or (tok.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise SystemExit("only a ByteLevel BPE tokenizer.json is handled")
    tok_cfg_path = a.model / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text()) if tok_cfg_path.exists() else {}
    id_to_tok = {i: t for t, i in tok["model"]["vocab"].items()}
    special = {}
    for t in tok.get("added_tokens", []):
        id_to_tok[t["id"]] = t["content"]
        if t.get("special", False):
            special[t["id"]] = t["content"]
    if max(id_to_tok) >= n_vocab:
        raise SystemExit(f"tokenizer id {max(id_to_tok)} is beyond vocab_size {n_vocab}")
    tokens, types = [], []
    for i in range(n_vocab):
        if i in id_to_tok:
            tokens.append(id_to_tok[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    gen_path = a.model / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    first = lambda v: v[0] if isinstance(v, list) else v  # noqa: E731
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(first(cfg["bos_token_id"]))
    if cfg.get("eos_token_id") is not None:
        w.add_eos_token_id(first(cfg["eos_token_id"]))
    if gen.get("pad_token_id") is not None:
        w.add_pad_token_id(gen["pad_token_id"])
    w.add_add_bos_token(bool(tok_cfg.get("add_bos_token", False)))
    w.add_add_eos_token(bool(tok_cfg.get("add_eos_token", False)))
    if tok_cfg.get("chat_template"):
        w.add_chat_template(tok_cfg["chat_template"])

    # Tensors, under llama.cpp's names; q/k rows permuted for its RoPE.
    t = read_model_tensors(a.model)
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(n_layer):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    if "lm_head.weight" not in t:  # tied embeddings: llama.cpp reuses token_embd
        names.pop("lm_head.weight")
    missing = [k for k in names if k not in t]
    extra = [k for k in t if k not in names and not k.endswith("rotary_emb.inv_freq")]
    if missing or extra:
        raise SystemExit(f"tensors missing: {missing}; not handled: {extra}")
    for hf, gg in names.items():
        arr = t[hf]
        if hf.endswith("self_attn.q_proj.weight"):
            arr = permute_rope(arr, n_head)
        elif hf.endswith("self_attn.k_proj.weight"):
            arr = permute_rope(arr, n_head_kv)
        w.add_tensor(gg, np.ascontiguousarray(arr, dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: {len(names)} tensors, vocab {n_vocab} "
          f"({len(id_to_tok)} tokenizer entries, {n_vocab - len(id_to_tok)} padding)")


if __name__ == "__main__":
    main()

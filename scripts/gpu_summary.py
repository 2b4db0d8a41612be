#!/usr/bin/env python3
"""The forward benchmark's summary for scripts/gpu-check.sh (issue 30's targets), from the
files the check wrote in one folder:

  forward-<shape>.json   `strata bench forward --device cuda --json` on that shape
  torch-<shape>.jsonl    scripts/gpu_baselines.py on the same folder (one JSON a line)

Prints a Markdown table per shape and the targets, met or missed, and writes the same to
summary-forward.md. Plain Python (no PyTorch): it runs anywhere, and its tests feed it
made-up files (tests/scripts/gpu_summary_test.py).

  python3 scripts/gpu_summary.py DIR
"""
import glob
import json
import os
import sys


def load_json(path):
    with open(path) as f:
        return json.load(f)


def load_lines(path):
    """The JSON objects of a .jsonl file, one a line; other lines (logs) and lines cut short
    (a run killed mid-line) are left out."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def scenario(forward, prefix):
    for r in forward.get("results", []):
        if r["scenario"].startswith(prefix):
            return r
    return None


def summarize(folder):
    out = []
    verdicts = []  # (target, met, detail)
    shapes = sorted(os.path.basename(p)[len("forward-"):-len(".json")]
                    for p in glob.glob(os.path.join(folder, "forward-*.json")))
    if not shapes:
        return "no forward-*.json in " + folder + "\n", []
    for shape in shapes:
        path = os.path.join(folder, f"forward-{shape}.json")
        try:
            fwd = load_json(path)
            fwd["results"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            # A run cut short or a benchmark that failed: said, never silently lost.
            out.append(f"## {shape}\n\nforward-{shape}.json could not be read: "
                       f"{type(e).__name__}: {e}\n")
            verdicts.append((f"the forward benchmark of {shape} ran", False, "no results"))
            continue
        torch_rows = load_lines(os.path.join(folder, f"torch-{shape}.jsonl"))
        gemm = next((r for r in torch_rows if r.get("kind") == "gemm"), None)
        decodes = [r for r in torch_rows if r.get("kind") == "decode"]
        t1 = next((r for r in decodes if r["batch"] == 1), None)
        tn = next((r for r in decodes if r["batch"] > 1), None)
        hf = next((r for r in torch_rows if r.get("kind") == "hf"), None)
        errors = [r for r in torch_rows if r.get("kind") == "error"]
        out.append(f"## {shape}: {fwd.get('machine', '?')}\n")
        out.append(f"hidden {fwd['hidden_size']}, {fwd['num_layers']} layers, "
                   f"{fwd['num_heads']}/{fwd['num_kv_heads']} heads, FFN "
                   f"{fwd['intermediate_size']}, vocab {fwd['vocab_size']}; device copy "
                   f"bandwidth {fwd.get('copy_bandwidth_gbs', 0):.0f} GB/s\n")
        out.append("| scenario | Strata | baseline | ratio |")
        out.append("| --- | --- | --- | --- |")
        pre = scenario(fwd, "prefill")
        if pre:
            line = f"| {pre['scenario']} | {pre['seconds'] * 1e3:.1f} ms |"
            if gemm:
                of = gemm["ceiling_ms"] / (pre["seconds"] * 1e3)
                line += (f" GEMM ceiling {gemm['ceiling_ms']:.1f} ms (torch.matmul, "
                         f"{gemm['tflops']:.0f} TFLOP/s) | {of:.2f} of the ceiling |")
                if shape == "qwen3-8b" or len(shapes) == 1:
                    verdicts.append(("prefill at >= 60 % of the GEMM ceiling", of >= 0.6,
                                     f"{of:.2f} ({shape})"))
            else:
                line += " - | - |"
            out.append(line)
        dec = scenario(fwd, "decode ")
        if dec and "step_ms" not in dec:  # a CPU run (gpu-check dry): no floor
            out.append(f"| {dec['scenario']} | {dec['tokens_per_s']:.0f} tokens/s | - | - |")
            dec = None
        if dec:
            line = (f"| batch-1 {dec['scenario']} | {dec['step_ms']:.3f} ms a step, "
                    f"{dec['of_floor']:.2f} of the floor ({dec['floor_ms']:.3f} ms) |")
            if t1:
                ratio = t1["step_ms"] / dec["step_ms"]
                line += f" torch graph loop {t1['step_ms']:.3f} ms | {ratio:.2f}x |"
            else:
                line += " - | - |"
            out.append(line)
            if shape == "qwen3-8b" or len(shapes) == 1:
                verdicts.append(("batch-1 decode at >= 85 % of the bandwidth floor",
                                 dec["of_floor"] >= 0.85, f"{dec['of_floor']:.2f} ({shape})"))
                if t1:
                    verdicts.append(("batch-1 decode faster than the PyTorch graph loop",
                                     dec["step_ms"] < t1["step_ms"],
                                     f"{dec['step_ms']:.3f} vs {t1['step_ms']:.3f} ms ({shape})"))
        bat = scenario(fwd, "batched decode")
        if bat:
            line = f"| {bat['scenario']} | {bat['tokens_per_s']:.0f} tokens/s |"
            if tn:
                ratio = bat["tokens_per_s"] / tn["tokens_per_s"]
                line += (f" torch graph loop x{tn['batch']} {tn['tokens_per_s']:.0f} tokens/s"
                         f" | {ratio:.2f}x |")
                if shape == "qwen3-8b" or len(shapes) == 1:
                    verdicts.append(("batched decode ahead of the PyTorch loop", ratio > 1.0,
                                     f"{ratio:.2f}x ({shape})"))
            else:
                line += " - | - |"
            out.append(line)
        if hf and dec:
            out.append(f"| HF generate, batch 1 | {1e3 / dec['step_ms']:.0f} tokens/s | "
                       f"{hf['tokens_per_s']:.0f} tokens/s | "
                       f"{1e3 / dec['step_ms'] / hf['tokens_per_s']:.2f}x |")
        for e in errors:
            out.append(f"\nbaseline failed: {e['what']}: {e['error']}")
        out.append("")
    out.append("## Targets (issue 30)\n")
    for target, met, detail in verdicts:
        out.append(f"- {'met' if met else 'MISSED'}: {target}: {detail}")
    return "\n".join(out) + "\n", verdicts


def main():
    if len(sys.argv) != 2:
        print("usage: gpu_summary.py DIR", file=sys.stderr)
        return 2
    text, _ = summarize(sys.argv[1])
    print(text, end="")
    with open(os.path.join(sys.argv[1], "summary-forward.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

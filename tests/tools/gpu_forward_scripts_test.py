#!/usr/bin/env python3
"""The GPU forward benchmark's scripts, on a machine without a GPU (CTest
gpu_forward_scripts): scripts/gpu_summary.py on made-up files (ratios and verdicts, met
and missed), scripts/gpu_baselines.py compiles, and `strata bench forward --device cuda`
and `strata make-model --preset qwen3-*` answer as they should where there is no GPU.

  python3 tests/tools/gpu_forward_scripts_test.py STRATA_BIN
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # nothing written into the source tree
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_summary  # noqa: E402

STRATA = None


def forward_report(step_ms, floor_ms, prefill_s, batch_tps):
    return {
        "machine": "NVIDIA H200, sm_90", "hidden_size": 4096, "num_layers": 36, "num_heads": 32,
        "num_kv_heads": 8, "intermediate_size": 12288, "vocab_size": 151936,
        "copy_bandwidth_gbs": 4000.0,
        "results": [
            {"scenario": "prefill 8192", "seconds": prefill_s, "tokens_per_s": 8192 / prefill_s},
            {"scenario": "decode 128 (context 1024)", "seconds": step_ms * 128e-3,
             "tokens_per_s": 1e3 / step_ms, "step_ms": step_ms, "floor_ms": floor_ms,
             "of_floor": floor_ms / step_ms},
            {"scenario": "batched decode x64 (context 1024)", "seconds": 0.01,
             "tokens_per_s": batch_tps, "step_ms": 10.0, "floor_ms": 5.0, "of_floor": 0.5},
        ],
    }


def torch_lines(ceiling_ms, t1_ms, tn_tps):
    return [
        {"kind": "device", "name": "NVIDIA H200"},
        {"kind": "gemm", "tokens": 8192, "ceiling_ms": ceiling_ms, "tflops": 700.0, "products": []},
        {"kind": "decode", "batch": 1, "context": 1024, "step_ms": t1_ms,
         "tokens_per_s": 1e3 / t1_ms},
        {"kind": "decode", "batch": 64, "context": 1024, "step_ms": 64e3 / tn_tps,
         "tokens_per_s": tn_tps},
        {"kind": "hf", "batch": 1, "tokens_per_s": 30.0, "new_tokens": 32, "seconds": 1.0},
    ]


def write(folder, shape, forward, lines):
    with open(os.path.join(folder, f"forward-{shape}.json"), "w") as f:
        json.dump(forward, f)
    with open(os.path.join(folder, f"torch-{shape}.jsonl"), "w") as f:
        f.write("some log line the script ignores\n")
        for line in lines:
            f.write(json.dumps(line) + "\n")


class SummaryTest(unittest.TestCase):
    def test_targets_met(self):
        with tempfile.TemporaryDirectory() as d:
            # 4.0 ms a step against a 3.6 ms floor (0.9); prefill 200 ms against a 150 ms
            # ceiling (0.75); torch's loop 4.4 ms and 2,000 tokens/s against 2,500.
            write(d, "qwen3-8b", forward_report(4.0, 3.6, 0.2, 2500.0),
                  torch_lines(150.0, 4.4, 2000.0))
            text, verdicts = gpu_summary.summarize(d)
            self.assertEqual(len(verdicts), 4, text)
            self.assertTrue(all(met for _, met, _ in verdicts), text)
            self.assertIn("0.75 of the ceiling", text)
            self.assertIn("1.10x", text)  # 4.4 / 4.0
            self.assertIn("1.25x", text)  # 2,500 / 2,000
            self.assertIn("HF generate", text)

    def test_targets_missed_are_named(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, "qwen3-8b", forward_report(5.0, 3.6, 0.5, 1500.0),
                  torch_lines(150.0, 4.4, 2000.0))
            text, verdicts = gpu_summary.summarize(d)
            missed = [t for t, met, _ in verdicts if not met]
            self.assertEqual(len(missed), 4, text)
            self.assertEqual(text.count("MISSED"), 4, text)

    def test_a_failed_baseline_is_reported_not_hidden(self):
        with tempfile.TemporaryDirectory() as d:
            lines = [l for l in torch_lines(150.0, 4.4, 2000.0) if l["kind"] != "gemm"]
            lines.append({"kind": "error", "what": "gemm", "error": "RuntimeError: boom"})
            write(d, "qwen3-0.6b", forward_report(1.0, 0.5, 0.02, 9000.0), lines)
            text, verdicts = gpu_summary.summarize(d)
            self.assertIn("baseline failed: gemm: RuntimeError: boom", text)
            self.assertNotIn("prefill at >= 60 %", [t for t, _, _ in verdicts])

    def test_an_unreadable_result_is_said_and_the_other_shapes_summed(self):
        # A status line written into the JSON (the bug of issue 50, item 5), or a run cut off
        # mid-file: the summary says so by name and still sums up the shapes it can read.
        with tempfile.TemporaryDirectory() as d:
            write(d, "qwen3-0.6b", forward_report(1.0, 0.5, 0.02, 9000.0),
                  torch_lines(15.0, 1.2, 9000.0))
            with open(os.path.join(d, "forward-qwen3-8b.json"), "w") as f:
                f.write("-- bench forward qwen3-8b: exit 0 in 40 s\n{\"results\": [")
            with open(os.path.join(d, "torch-qwen3-0.6b.jsonl"), "a") as f:
                f.write('{"kind": "decode", "batch": 1, "step_')  # cut off mid-line
            text, verdicts = gpu_summary.summarize(d)
            self.assertIn("forward-qwen3-8b.json could not be read", text)
            self.assertIn(("the forward benchmark of qwen3-8b ran", False, "no results"), verdicts)
            self.assertIn("## qwen3-0.6b", text)

    def test_no_files(self):
        with tempfile.TemporaryDirectory() as d:
            text, verdicts = gpu_summary.summarize(d)
            self.assertIn("no forward-", text)
            self.assertEqual(verdicts, [])


class ScriptsTest(unittest.TestCase):
    def test_the_baselines_compile(self):
        path = os.path.join(ROOT, "scripts", "gpu_baselines.py")
        with open(path) as f:
            compile(f.read(), path, "exec")

    def test_forward_on_cuda_without_a_gpu_fails_clearly(self):
        r = subprocess.run([STRATA, "bench", "forward", "--device", "cuda", "--preset", "tiny",
                            "--prompt-tokens", "16", "--decode-tokens", "2", "--repeats", "1"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--device cuda:", r.stderr)
        r = subprocess.run([STRATA, "bench", "forward", "--device", "tpu"], capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cpu or cuda", r.stderr + r.stdout)

    def test_forward_on_the_cpu_reports_the_device(self):
        r = subprocess.run([STRATA, "bench", "forward", "--preset", "tiny", "--prompt-tokens", "16",
                            "--decode-tokens", "4", "--decode-batches", "2", "--repeats", "1",
                            "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        report = json.loads(r.stdout)
        self.assertEqual(report["device"], "cpu")
        self.assertEqual(report["architecture"], "LlamaForCausalLM")
        self.assertEqual([x["scenario"] for x in report["results"]],
                         ["prefill 16", "decode 4 (context 1)", "batched decode x2 (context 512)"])
        self.assertIn("phases", report["results"][0])

    def test_unknown_preset_names_the_shapes(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([STRATA, "make-model", "--out", d, "--preset", "qwen3-70b"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2)
            self.assertIn("qwen3-8b", r.stderr)


if __name__ == "__main__":
    STRATA = sys.argv.pop(1)
    unittest.main()

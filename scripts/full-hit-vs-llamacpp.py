#!/usr/bin/env python3
"""Full-prefix-hit latency, Strata's server against llama.cpp's, side by side.

Starts each server in turn on 127.0.0.1 (never two at once, so they do not compete for
the cores), sends the same N-token prompt as token ids once (cold) and then --reps times
(full hits) on one keep-alive connection, with one token to generate at temperature 0,
stops the server by its PID, and goes on with the next one; --rounds rounds of that
(A, B, A, B, ...) so that slow drifts of a shared machine fall on both. Prints, per
server and round and pooled over the rounds, the median / p10 / p90 client wall time,
and the server's own account: Strata's Server-Timing `total` (and `engine`), llama.cpp's
`timings` (prompt_n, prompt_ms, predicted_ms, cache_n). Then the ratios of the medians.

    python3 scripts/full-hit-vs-llamacpp.py \
        --strata build/strata --model /tmp/hit/bench-llama \
        --llama-server /path/to/llama-server --gguf /tmp/hit/bench-llama-f32.gguf

Requests: Strata POST /v1/completions {"prompt": ids, "max_tokens": 1, "temperature": 0};
llama.cpp POST /completion {"prompt": ids, "n_predict": 1, "temperature": 0,
"cache_prompt": true}. The prompt's ids are drawn (seeded) from the tokenizer's
ordinary ids below --max-id, the same list for both servers. Only the standard library.
"""
import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


class Server:
    def __init__(self, name, argv, port, log_path):
        self.name, self.argv, self.port, self.log_path = name, argv, port, log_path
        self.proc = None

    def start(self, timeout_s=300):
        self.log = open(self.log_path, "ab")
        self.log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"{self.name} did not become healthy in {timeout_s} s; see {self.log_path}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        self.log.close()


def post(conn, path, body):
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    raw = r.read()
    dt = (time.perf_counter() - t0) * 1e3
    if r.status != 200:
        raise SystemExit(f"{path}: {r.status} {raw[:300]!r}")
    return dt, json.loads(raw), r.getheader("Server-Timing")


def get_text(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    raw = r.read()
    c.close()
    return raw.decode(errors="replace")


def variant(ids, k, a):
    # --vary-last: the k-th hit ends with another token, so only the prefix before the
    # last token is the same (no remembered answer can serve it: one forward pass).
    if not a.vary_last or k < 0:
        return ids
    return ids[:-1] + [(ids[-1] + 1 + k) % a.max_id]


def measure_strata(port, ids, a):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0}
    cold, out, _ = post(conn, "/v1/completions", body)
    rows = []
    for k in range(a.reps):
        body["prompt"] = variant(ids, k, a)
        dt, out, timing = post(conn, "/v1/completions", body)
        cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0, out["usage"]
        ph = {k: float(v) for k, v in (p.strip().split(";dur=") for p in timing.split(","))} if timing else {}
        rows.append({"wall": dt, "server": ph.get("total"), "engine": ph.get("engine"),
                     "phases": ph, "cached": cached, "prompt": out["usage"]["prompt_tokens"],
                     "text": out["choices"][0]["text"]})
    conn.close()
    return cold, rows


def measure_llama(port, ids, a):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"prompt": ids, "n_predict": 1, "temperature": 0, "cache_prompt": True}
    cold, out, _ = post(conn, "/completion", body)
    rows = []
    for k in range(a.reps):
        body["prompt"] = variant(ids, k, a)
        dt, out, _ = post(conn, "/completion", body)
        t = out.get("timings", {})
        cached = t.get("cache_n", out.get("tokens_cached"))
        rows.append({"wall": dt, "server": t.get("prompt_ms", 0) + t.get("predicted_ms", 0),
                     "prompt_ms": t.get("prompt_ms"), "prompt_n": t.get("prompt_n"),
                     "predicted_ms": t.get("predicted_ms"), "cached": cached,
                     "prompt": out.get("tokens_evaluated"), "text": out.get("content")})
    conn.close()
    return cold, rows


def med(rows, key):
    v = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(v) if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", required=True, help="the strata binary")
    ap.add_argument("--model", required=True, help="Hugging Face model folder for Strata")
    ap.add_argument("--llama-server", required=True, help="llama.cpp's llama-server binary")
    ap.add_argument("--gguf", required=True, help="the same model as GGUF for llama.cpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--max-id", type=int, default=1020, help="prompt ids are drawn from [0, max-id)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=18461, help="first of the ports (one per server)")
    ap.add_argument("--strata-kv", default="f32",
                    help="Strata KV pool dtypes to run, one Strata server each (f32: its default)")
    ap.add_argument("--llama-kv", default="f16,f32",
                    help="llama.cpp KV cache types to run, one llama.cpp server each (f16: its default)")
    ap.add_argument("--vary-last", action="store_true",
                    help="every hit ends with another last token (the forward pass of the tail runs)")
    ap.add_argument("--log-dir", default="/tmp/full-hit-vs-llamacpp")
    a = ap.parse_args()
    os.makedirs(a.log_dir, exist_ok=True)

    rng = random.Random(1)
    ids = [rng.randrange(a.max_id) for _ in range(a.tokens)]

    servers, port = [], a.port
    for kv in a.strata_kv.split(","):
        argv = [a.strata, "serve", "--model", a.model, "--host", "127.0.0.1", "--port", str(port),
                "--threads", str(a.threads), "--kv-cache-dtype", kv]
        servers.append((f"strata kv {kv}", Server(f"strata-{kv}", argv, port,
                                                   f"{a.log_dir}/strata-{kv}.log"), measure_strata))
        port += 1
    for kv in a.llama_kv.split(","):
        argv = [a.llama_server, "-m", a.gguf, "-t", str(a.threads), "-tb", str(a.threads),
                "-c", "4096", "-np", "1", "--host", "127.0.0.1", "--port", str(port),
                "-ctk", kv, "-ctv", kv]
        servers.append((f"llama.cpp kv {kv}", Server(f"llama.cpp-{kv}", argv, port,
                                                      f"{a.log_dir}/llama-{kv}.log"), measure_llama))
        port += 1

    results = {name: [] for name, _, _ in servers}
    print(f"prompt: {a.tokens} token ids{' (last one varied per hit)' if a.vary_last else ''}; "
          f"{a.reps} hits after a cold request; "
          f"{a.rounds} rounds; {a.threads} threads; load average at start {os.getloadavg()[0]:.2f}")
    for rnd in range(a.rounds):
        for name, srv, fn in servers:
            srv.start()
            try:
                cold, rows = fn(srv.port, ids, a)
                extra = ""
                if name.startswith("strata"):
                    hits = [line.split()[-1] for line in get_text(srv.port, "/metrics").splitlines()
                            if 'event="prompt_logits_hits"' in line]
                    extra = f" | prompt_logits_hits {hits[0] if hits else 'n/a'}"
            finally:
                srv.stop()
            results[name].append(rows)
            r0 = rows[-1]
            print(f"round {rnd + 1} {name:18s} cold {cold:8.1f} ms | hits: wall median {med(rows, 'wall'):7.2f}"
                  f" p10 {q([r['wall'] for r in rows], 0.1):7.2f} p90 {q([r['wall'] for r in rows], 0.9):7.2f}"
                  f" | in server {med(rows, 'server'):7.2f}"
                  + (f" (engine {med(rows, 'engine'):.3f})" if name.startswith("strata") else
                     f" (prompt_n {r0['prompt_n']}, prompt_ms {med(rows, 'prompt_ms'):.2f},"
                     f" predicted_ms {med(rows, 'predicted_ms'):.2f})")
                  + f" | cached {r0['cached']} | first token {r0['text']!r}{extra}"
                  + f" | load {os.getloadavg()[0]:.2f}", flush=True)
            if name.startswith("strata"):
                keys = [k for k in rows[0]["phases"] if k != "total"]
                print("    Server-Timing medians (ms): " + ", ".join(
                    f"{k} {statistics.median(r['phases'].get(k, 0.0) for r in rows):.3f}" for k in keys))

    print("\npooled over the rounds (median of all hits):")
    pooled = {}
    for name, _, _ in servers:
        rows = [r for rr in results[name] for r in rr]
        pooled[name] = (med(rows, "wall"), med(rows, "server"))
        print(f"  {name:18s} wall {pooled[name][0]:7.2f} ms   in server {pooled[name][1]:7.2f} ms   (n={len(rows)})")
    for sn in (n for n, _, _ in servers if n.startswith("strata")):
        for ln in (n for n, _, _ in servers if n.startswith("llama")):
            s, l = pooled[sn], pooled[ln]
            print(f"  {sn} / {ln}: wall {s[0] / l[0]:.3f}x   in server {s[1] / l[1]:.3f}x")


if __name__ == "__main__":
    main()

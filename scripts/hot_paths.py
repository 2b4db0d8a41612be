#!/usr/bin/env python3
"""The hot paths' regression guard (issue 56): runs the radix tree's and the router's
micro-benchmarks, takes each figure's median, and compares it with the baseline kept in the
repository (docs/bench/hot-paths.json), printing a table that flags any figure more than 25 %
worse than its baseline and any target missed. Timing on a shared machine is noisy: this
prints, it never fails a build (exit 0 unless a benchmark could not run).

  python3 scripts/hot_paths.py [--build DIR] [--baseline FILE] [--update] [--quick]

--update writes the figures measured into the baseline file (with the machine and commit);
--quick runs the router's index at 1M blocks instead of 10M (the baseline's figures for the
scale benchmark are then not comparable and are shown but not flagged).
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Targets (µs): issue 56's table, and the router's decision at 1,024 workers.
TARGETS = {
    "radix_tree/BM_Evict1000Pages": 25.0,
    "radix_tree/BM_Insert1KBranch": 2.5,
    "radix_tree/BM_Pin1000Unpin1000": 100.0,
    "radix_tree/BM_MatchPrefix16K": 2.0,
    "router_scale/1024 workers: decision p99": 20.0,
}
WORSE = 1.25


def gbench(binary, repetitions):
    """Median real time (µs) of every benchmark of a Google Benchmark program."""
    out = subprocess.run([binary, f"--benchmark_repetitions={repetitions}",
                          "--benchmark_report_aggregates_only=true", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    figures = {}
    runs = json.loads(out)["benchmarks"]
    medians = [b for b in runs if b.get("aggregate_name") == "median"]
    for b in medians or runs:  # one repetition: no aggregates
        name = b["run_name"].split("/iterations:")[0]
        figures[name] = b["real_time"] * scale[b.get("time_unit", "ns")]
    return figures


def router_scale(binary, quick):
    args = [binary, "--workers", "64,1024"]
    if quick:
        args += ["--blocks", "1000000", "--decisions", "50000"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    figures, workers = {}, None
    for line in out.splitlines():
        m = re.match(r"workers (\d+):", line)
        if m:
            workers = m.group(1)
        m = re.search(r"decision \(match \+ choose.*p50 ([\d.]+) us, p99 ([\d.]+) us", line)
        if m and workers:
            figures[f"{workers} workers: decision p50"] = float(m.group(1))
            figures[f"{workers} workers: decision p99"] = float(m.group(2))
        m = re.search(r"match\(\) alone: p50 ([\d.]+) us, p99 ([\d.]+) us", line)
        if m and workers:
            figures[f"{workers} workers: match p50"] = float(m.group(1))
    return figures


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores ({platform.node()})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--baseline", default=os.path.join(ROOT, "docs/bench/hot-paths.json"))
    p.add_argument("--update", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repetitions", type=int, default=3)
    a = p.parse_args()
    micro = os.path.join(a.build, "src/bench/micro")
    figures = {}
    try:
        for name, value in gbench(os.path.join(micro, "bench_radix_tree"), a.repetitions).items():
            figures[f"radix_tree/{name}"] = value
        for name, value in gbench(os.path.join(micro, "bench_router_index"), a.repetitions).items():
            figures[f"router_index/{name}"] = value
        for name, value in router_scale(os.path.join(micro, "bench_router_index_scale"),
                                        a.quick).items():
            figures[f"router_scale/{name}"] = value
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"hot paths: a benchmark could not run: {e}", file=sys.stderr)
        return 1
    base = {}
    if os.path.exists(a.baseline):
        with open(a.baseline) as f:
            base = json.load(f)
    baseline = base.get("figures_us", {})
    print(f"machine: {machine()}")
    if base:
        print(f"baseline: {base.get('commit', '?')} on {base.get('machine', '?')}")
    print()
    print("| figure | baseline µs | now µs | now / baseline | target µs | |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    flagged = 0
    for name in sorted(figures):
        now = figures[name]
        was = baseline.get(name)
        target = TARGETS.get(name)
        notes = []
        ratio = ""
        if was:
            ratio = f"{now / was:.2f}"
            comparable = not (a.quick and name.startswith("router_scale/"))
            if comparable and now > WORSE * was:
                notes.append("WORSE by more than 25 %")
        if target is not None and now > target:
            notes.append("over its target")
        flagged += bool(notes)
        print(f"| {name} | {was if was else '-'} | {now:.2f} | {ratio or '-'} | "
              f"{target if target else '-'} | {'; '.join(notes)} |")
    print(f"\n{flagged} figure(s) flagged (timings are noisy: rerun before acting on one).")
    if a.update:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        with open(a.baseline, "w") as f:
            json.dump({"machine": machine(), "commit": commit, "quick": a.quick,
                       "figures_us": {k: round(v, 3) for k, v in sorted(figures.items())}},
                      f, indent=2)
            f.write("\n")
        print(f"baseline written: {a.baseline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

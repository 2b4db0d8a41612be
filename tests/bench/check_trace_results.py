#!/usr/bin/env python3
"""Checks the results.json of a `strata bench cluster --trace` run (CTest bench_cluster_trace).

Usage: check_trace_results.py RESULTS_JSON TRACE EXPECTED_REQUESTS POLICY[,POLICY...] [REPLICAS[,killed]]

The trace workload is there in the shape of the other workloads, one entry per policy;
every request answered, its prompt as long as the trace's input_length and its answer as
long as its output_length (ignore_eos); the ideal hit above zero (the tiny trace shares
prefixes). With REPLICAS, each phase ran behind that many router replicas (and with
",killed", the first was killed mid-run, yet no request failed). No time is asserted.
"""
import json
import sys


def fail(message):
    print("check_trace_results: " + message, file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) not in (5, 6):
        fail(__doc__)
    replicas, killed = 1, False
    if len(sys.argv) == 6:
        parts = sys.argv[5].split(",")
        replicas, killed = int(parts[0]), parts[1:] == ["killed"]
    with open(sys.argv[1]) as f:
        results = json.load(f)
    with open(sys.argv[2]) as f:
        by_line = {i + 1: json.loads(text) for i, text in enumerate(f) if text.strip()}
    expected = int(sys.argv[3])
    policies = sys.argv[4].split(",")
    if results.get("error"):
        fail("the run reported an error: " + str(results["error"]))
    trace = results["cluster"].get("trace")
    if not trace or trace["requests"] != expected:
        fail("cluster.trace should list %d requests: %r" % (expected, trace))
    if not 0 < trace["ideal"]["token_fraction"] < 1:
        fail("the tiny trace shares prefixes: its ideal hit is in (0, 1): %r" % trace["ideal"])
    workloads = {w["name"]: w for w in results["workloads"]}
    if list(workloads) != ["trace"]:
        fail("only the trace workload ran: %r" % list(workloads))
    got = [p["name"] for p in workloads["trace"]["policies"]]
    if got != policies:
        fail("policies %r, expected %r" % (got, policies))
    for p in workloads["trace"]["policies"]:
        name = p["name"]
        if p["requests"] != expected or p["failed_requests"] != 0:
            fail("%s: %d requests, %d failed" % (name, p["requests"], p["failed_requests"]))
        for key in ("ttft_s", "itl_s"):
            for q in ("p50", "p90", "p99"):
                if p[key][q] is None:
                    fail("%s: %s.%s is missing" % (name, key, q))
        if not 0 < p["ideal_hit_fraction"] < 1:
            fail("%s: ideal_hit_fraction %r" % (name, p["ideal_hit_fraction"]))
        if p["hit_of_ideal"] is None:
            fail("%s: hit_of_ideal is missing" % name)
        for key in ("requests_per_worker", "sessions_per_worker", "computed_tokens_per_worker"):
            if len(p[key]) != results["cluster"]["workers"]:
                fail("%s: %s has not one entry per worker" % (name, key))
        if sum(p["sessions_per_worker"]) != trace["prefix_families"]:
            fail("%s: the families' first requests do not add up" % name)
        for key in ("router_queue", "router_rejected", "router_retries", "router_decision"):
            if key not in p:
                fail("%s: %s is missing" % (name, key))
        if p["router_replicas"] != replicas:
            fail("%s: %r router replicas, expected %d" % (name, p["router_replicas"], replicas))
        if killed and (p["router_killed_at_s"] is None or p["router_failovers"] < 1):
            fail("%s: a replica should have been killed and requests sent through the others: "
                 "killed at %r, %d failovers" % (name, p["router_killed_at_s"],
                                                 p["router_failovers"]))
        if not killed and p["router_failovers"] != 0:
            fail("%s: %d failovers without a killed replica" % (name, p["router_failovers"]))
        if killed:
            pass  # the killed replica's decisions are gone with it
        elif p["router_decision"]["count"] < expected:
            fail("%s: the router timed %d decisions" % (name, p["router_decision"]["count"]))
    for phase in results["phases"]:
        lines = sorted(r["line"] for r in phase["requests"])
        if len(lines) != expected or len(set(lines)) != expected:
            fail("%s: the requests' trace lines %r" % (phase["policy"], lines))
        for r in phase["requests"]:
            if not r["ok"]:
                fail("%s: line %d failed: %s" % (phase["policy"], r["line"], r.get("error")))
            asked = by_line[r["line"]]
            if (r["prompt_tokens"], r["completion_tokens"]) != (asked["input_length"],
                                                               asked["output_length"]):
                fail("%s: line %d: %d prompt and %d completion tokens, the trace says %d and %d"
                     % (phase["policy"], r["line"], r["prompt_tokens"], r["completion_tokens"],
                        asked["input_length"], asked["output_length"]))
    print("check_trace_results: %d requests under %s: ok" % (expected, ", ".join(policies)))


if __name__ == "__main__":
    main()

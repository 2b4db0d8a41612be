#!/usr/bin/python3
"""Black-box check of the KV event stream: a ZeroMQ subscriber (Debian's python3-zmq and
python3-msgpack, decoding vLLM's wire format) follows a real `strata serve` through
requests, evictions, pins and a flush, and must rebuild exactly the set of blocks that
/cache/state?detail=tree reports. Then the replay socket must give the same stream again.

usage: kv_events_check.py STRATA_BIN MODEL_DIR
"""
import re
import signal
import subprocess
import sys
import time

import msgpack
import zmq

from event_check_util import free_port, http


def apply(blocks, payload, counts):
    ts, events, rank = msgpack.unpackb(payload, raw=False)
    assert isinstance(ts, float) and rank == 0, (ts, rank)
    for ev in events:
        tag = ev[0]
        counts[tag] = counts.get(tag, 0) + 1
        if tag == "BlockStored":
            # vLLM's fields (lora_name after medium; extra_keys only for a salted first block).
            _, hashes, parent, token_ids, block_size, lora_id, medium, lora_name = ev[:8]
            assert medium == "GPU" and lora_id is None and lora_name is None and block_size == 16, ev[:2]
            assert len(ev) == 8, "extra_keys for a request without a salt"
            assert len(token_ids) == block_size * len(hashes)
            assert parent is None or parent in blocks, "parent of a stored block is unknown"
            for h in hashes:
                assert h not in blocks, f"block {h} stored twice"
                blocks.add(h)
        elif tag == "BlockRemoved":
            _, hashes, medium = ev
            assert medium == "GPU"
            for h in hashes:
                assert h in blocks, f"block {h} removed but never stored"
                blocks.remove(h)
        elif tag == "AllBlocksCleared":
            blocks.clear()
        else:
            raise AssertionError(f"unknown event {tag}")


def main():
    strata, model = sys.argv[1], sys.argv[2]
    pub_port, replay_port = free_port(), free_port()
    proc = subprocess.Popen(
        [strata, "serve", "--model", model, "--port", "0", "--threads", "1", "--log-level", "warn",
         "--kv-cache-tokens", "2048",
         "--kv-events-endpoint", f"tcp://127.0.0.1:{pub_port}",
         "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert m, "server did not start: " + line + proc.stderr.read()
        base = m.group(1)
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{pub_port}")
        time.sleep(0.5)  # let the subscription reach the publisher before any event

        words = ["alpha", "river", "stone", "cloud", "metric", "vector", "quiet", "orange", "signal"]
        for i in range(24):  # 24 x ~200 tokens through a 2048-token pool: evictions
            prompt = " ".join(words[(i * 7 + k * k) % len(words)] + str(k % (i + 3)) for k in range(150))
            http(base, "/v1/completions", {"prompt": prompt, "max_tokens": 3})
        tree = http(base, "/cache/state?detail=tree")  # no admin key configured
        some = [h for n in tree["nodes"] for h in n["block_hashes"]][:3]
        http(base, "/cache/pin", {"block_hashes": some})
        http(base, "/cache/flush", {})
        http(base, "/v1/completions", {"prompt": "after the flush " * 40, "max_tokens": 2})
        time.sleep(0.5)

        blocks, counts, seqs = set(), {}, []
        while sub.poll(500):
            topic, seq, payload = sub.recv_multipart()
            seqs.append(int.from_bytes(seq, "big"))
            apply(blocks, payload, counts)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "sequence numbers have gaps"
        assert seqs[0] == 0, f"first batch seen has sequence {seqs[0]}"
        state = http(base, "/cache/state?detail=tree")
        cached = {h for n in state["nodes"] for h in n["block_hashes"]}
        assert blocks == cached, f"replayed {len(blocks)} blocks, the server has {len(cached)}"
        assert counts.get("BlockRemoved", 0) > 0, "no eviction happened"
        assert state["device"]["pinned_blocks"] == 3

        # The replay socket gives the same stream from sequence 0.
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed, n = set(), 0
        while True:
            assert dealer.poll(5000), "replay timed out"
            _, seq, payload = dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                break
            apply(replayed, payload, {})
            n += 1
        assert n == len(seqs) and replayed == cached
        print(f"events: {counts}, {len(cached)} blocks cached; replay of {n} batches agrees")
        print("3 passed, 0 failed")
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""A Strata worker in vLLM's hashing mode (--prefix-caching-hash-algo sha256_cbor) read by
an indexer written from llm-d's published code, field by field:

- transport: llm-d's centralized mode, whose SUB socket binds and which every model server
  connects to (Strata: --kv-events-connect), with topics kv@<pod-ip>:<port>@<model> under
  the filter "kv@" (llm-d-kv-cache: pkg/kvevents/zmq_subscriber.go; the topic parsed as in
  pkg/kvevents/engineadapter/common.go, parseTopic);
- payload: pkg/kvevents/engineadapter/vllm_adapter.go: the batch an array [ts, events,
  rank?], each event a tagged array; BlockStored's fields at their positions (1
  block_hashes, 2 parent_block_hash, 3 token_ids, 4 block_size, 5 lora_id, 6 medium,
  7 lora_name, 8 extra_keys), hashes read as getHashAsUint64 reads them (int64 or uint64
  to their 64 bits, bytes to their last 8 read big-endian);
- hashes: what llm-d computed from a request's tokens when it matched vLLM's own hashes
  (pkg/kvcache/kvblock/token_processor.go at 994abf2, "Align with recent vLLM kv-block
  hashing changes"): the root SHA-256 of the seed's canonical CBOR, each block SHA-256 of
  CBOR [parent digest, tokens, extra], the key the digest's last 8 bytes big-endian; the
  extra of a salted first block (cache_salt,) as vLLM's generate_block_hash_extra_keys.

Chats with salts, tool calls and a multi-turn session go through the worker; the indexer
tokenizes each request as the worker's template does (POST /tokenize with the messages and
tools) and its hashes must name blocks the events stored, and every stored block's hash
must be what its tokens and the chain before it give.

usage: llmd_events_check.py STRATA_BIN MODEL_DIR
"""
import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import cbor2
import msgpack
import zmq

from event_check_util import free_port, http

SEED = "0"  # PYTHONHASHSEED of the fleet
BLOCK = 16


# ---- llm-d's decoder, field by field (vllm_adapter.go) ----

def parse_topic(topic):
    parts = topic.split("@")
    return (parts[1], parts[2]) if len(parts) == 3 else ("", "")


def hash_as_uint64(raw):
    if isinstance(raw, int):
        return raw & ((1 << 64) - 1)
    if isinstance(raw, (bytes, bytearray)):
        return int.from_bytes(bytes(raw[-8:]).rjust(8, b"\0"), "big")
    raise AssertionError(f"unsupported hash type {type(raw)}")


def field_at(fields, i):
    return fields[i] if i < len(fields) else None


def decode_batch(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) in (2, 3), "the batch is not [ts, events, rank?]"
    ts, events = batch[0], batch[1]
    assert isinstance(ts, float)
    out = []
    for fields in events:
        assert isinstance(fields, list) and fields and isinstance(fields[0], str), fields
        tag = fields[0]
        if tag == "BlockStored":
            assert len(fields) >= 5, "BlockStored: need at least 5 fields"
            extra_keys = field_at(fields, 8)
            if extra_keys is not None:
                assert isinstance(extra_keys, list)
                for k in extra_keys:
                    assert k is None or isinstance(k, list), "extra_keys entries are arrays or nil"
            medium = field_at(fields, 6)
            assert medium is None or isinstance(medium, str)
            lora_name = field_at(fields, 7)
            assert lora_name is None or isinstance(lora_name, str)
            out.append({
                "type": tag,
                "block_hashes": [hash_as_uint64(h) for h in fields[1]],
                "parent": 0 if fields[2] is None else hash_as_uint64(fields[2]),
                "tokens": [int(t) & 0xFFFFFFFF for t in fields[3]],
                "block_size": int(fields[4]),
                "lora_id": field_at(fields, 5),
                "medium": medium,
                "lora_name": lora_name,
                "extra_keys": extra_keys,
            })
        elif tag == "BlockRemoved":
            assert len(fields) >= 2
            out.append({"type": tag, "block_hashes": [hash_as_uint64(h) for h in fields[1]],
                        "medium": field_at(fields, 2)})
        elif tag == "AllBlocksCleared":
            out.append({"type": tag})
        else:
            raise AssertionError(f"unknown vLLM event tag: {tag}")
    return out


# ---- llm-d's token processor when it hashed as vLLM (token_processor.go at 994abf2) ----

def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


ROOT = sha256_cbor(SEED)


def key_of(digest):
    return int.from_bytes(digest[24:], "big")


def request_keys(tokens, salt=""):
    parent, keys = ROOT, []
    for i in range(len(tokens) // BLOCK):
        extra = [salt] if (i == 0 and salt) else None
        parent = sha256_cbor([parent, tokens[i * BLOCK:(i + 1) * BLOCK], extra])
        keys.append(key_of(parent))
    return keys


def main():
    strata, model = sys.argv[1], sys.argv[2]
    # Bad flags end at once with a clear message (before the model loads).
    bad = subprocess.run([strata, "serve", "--model", model, "--port", "0", "--kv-events-connect"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--kv-events-connect needs --kv-events-endpoint" in bad.stderr, bad.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    bad = subprocess.run([strata, "serve", "--model", model, "--port", "0",
                          "--prefix-caching-hash-algo", "sha256_cbor"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "PYTHONHASHSEED" in bad.stderr, bad.stderr
    assert "loaded" not in bad.stderr, "the seed was checked only after the model loaded"
    sub_port = free_port()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.bind(f"tcp://127.0.0.1:{sub_port}")  # llm-d's centralized endpoint
    # (Subscribed after the bind: libzmq 4.3.4 sent a bound SUB's earlier subscription to no
    # publisher that connected later, here.)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    proc = subprocess.Popen(
        [strata, "serve", "--model", model, "--port", "0", "--threads", "1", "--log-level", "warn",
         "--served-model-name", "tiny-qwen3", "--kv-cache-tokens", "8192",
         "--prefix-caching-hash-algo", "sha256_cbor", "--prefix-caching-hash-seed", SEED,
         "--kv-events-endpoint", f"tcp://127.0.0.1:{sub_port}", "--kv-events-connect",
         "--kv-events-topic", "kv@10.0.0.7:8000@tiny-qwen3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert m, "server did not start: " + line + proc.stderr.read()
        base = m.group(1)
        # /server_info names no socket to subscribe to: the events go to llm-d.
        assert http(base, "/server_info")["kv_events"] is None
        # A publisher that connects may lose what it sends before the subscriber's subscription
        # reaches it (ZeroMQ's slow joiner; here libzmq dropped a connecting PUB's first
        # message): a first request of its own, then the stream from the next batch on.
        http(base, "/v1/completions", {"prompt": "warm up " * 40, "max_tokens": 1})
        deadline = time.time() + 30
        while time.time() < deadline:
            http(base, "/v1/completions", {"prompt": f"probe {time.time()} " * 20, "max_tokens": 1})
            if sub.poll(500):
                break
        while sub.poll(500):
            sub.recv_multipart()
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}]
        system = "You are a careful assistant. " * 12
        chats = [
            # Two tenants with the same prompt: their blocks must differ.
            {"messages": [{"role": "system", "content": system},
                          {"role": "user", "content": "Name three rivers in Europe."}],
             "cache_salt": "tenant-a"},
            {"messages": [{"role": "system", "content": system},
                          {"role": "user", "content": "Name three rivers in Europe."}],
             "cache_salt": "tenant-b"},
            {"messages": [{"role": "system", "content": system},
                          {"role": "user", "content": "Name three rivers in Europe."}]},
            # A tool call and its result.
            {"messages": [{"role": "system", "content": system},
                          {"role": "user", "content": "What is the weather in Paris?"},
                          {"role": "assistant", "content": None, "tool_calls": [{
                              "id": "call_1", "type": "function",
                              "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."}],
             "tools": tools},
        ]
        asked = []
        for chat in chats:
            http(base, "/v1/chat/completions", {**chat, "max_tokens": 4, "temperature": 0})
            asked.append(chat)
        # A session of two turns.
        turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "Count to five."}]
        r1 = http(base, "/v1/chat/completions", {"messages": turn1, "max_tokens": 6, "temperature": 0,
                                                  "session_id": "s-1"})
        turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "And to ten?"}]
        http(base, "/v1/chat/completions", {"messages": turn2, "max_tokens": 4, "temperature": 0,
                                            "session_id": "s-1"})
        time.sleep(0.5)

        stored = {}  # key -> (parent key, tokens, extra keys of the block)
        topics = set()
        while sub.poll(1000):
            topic, seq, payload = sub.recv_multipart()
            assert len(seq) == 8
            topics.add(parse_topic(topic.decode()))
            for ev in decode_batch(payload):
                if ev["type"] != "BlockStored":
                    continue
                assert ev["block_size"] == BLOCK and ev["medium"] == "GPU" and ev["lora_name"] is None
                n = len(ev["block_hashes"])
                assert len(ev["tokens"]) == n * BLOCK
                assert ev["extra_keys"] is None or len(ev["extra_keys"]) == n
                parent = ev["parent"]
                for i, h in enumerate(ev["block_hashes"]):
                    extra = ev["extra_keys"][i] if ev["extra_keys"] else None
                    stored[h] = (parent, ev["tokens"][i * BLOCK:(i + 1) * BLOCK], extra)
                    parent = h
        assert topics == {("10.0.0.7:8000", "tiny-qwen3")}, topics

        # Every stored block's hash is its tokens' and its chain's, by vLLM's recipe.
        digests = {}

        def digest_of(h):
            if h not in digests:
                parent, tokens, extra = stored[h]
                if parent == 0:
                    assert extra is None or parent == 0
                    parent_digest = ROOT
                else:
                    assert parent in stored, "a block's parent was never stored"
                    parent_digest = digest_of(parent)
                digests[h] = sha256_cbor([parent_digest, tokens, extra])
            return digests[h]

        for h in stored:
            assert key_of(digest_of(h)) == h, f"block {h}: its tokens hash to another key"
        salted = [v[2] for v in stored.values() if v[2] is not None]
        assert sorted(s[0] for s in salted) == ["tenant-a", "tenant-b"], salted

        # The indexer's keys for each request, from its tokens alone, name stored blocks.
        checked = 0
        for chat in asked:
            body = {"messages": chat["messages"]}
            if "tools" in chat:
                body["tools"] = chat["tools"]
            tokens = http(base, "/tokenize", body)["tokens"]
            keys = request_keys(tokens, chat.get("cache_salt", ""))
            assert keys, "a prompt shorter than a block"
            missing = [k for k in keys if k not in stored]
            assert not missing, f"{len(missing)} of {len(keys)} blocks of a request not stored"
            checked += len(keys)
        a, b, plain = (request_keys(http(base, "/tokenize", {"messages": c["messages"]})["tokens"],
                                    c.get("cache_salt", "")) for c in asked[:3])
        assert not set(a) & set(b) and not set(a) & set(plain), "salted blocks shared across tenants"
        # The session: turn 2's keys, computed from the whole conversation, find at least turn
        # 1's prompt stored (its exact tokens continue from the record the worker kept).
        t1 = request_keys(http(base, "/tokenize", {"messages": turn1})["tokens"])
        t2 = request_keys(http(base, "/tokenize", {"messages": turn2})["tokens"])
        hit = 0
        while hit < len(t2) and t2[hit] in stored:
            hit += 1
        assert hit >= len(t1), f"turn 2 hits {hit} blocks, turn 1 had {len(t1)}"
        print(f"{len(stored)} blocks stored, all recomputed; {checked} request blocks found; "
              f"turn 2 hits {hit} of {len(t2)} blocks")
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

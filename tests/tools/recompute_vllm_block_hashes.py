#!/usr/bin/python3
"""Recomputes vLLM's sha256_cbor block hashes the way vLLM does, with the libraries vLLM
uses (cbor2's canonical encoding and hashlib's SHA-256), and compares them with
`strata block-hashes --prefix-caching-hash-algo sha256_cbor`.

The algorithm, as vLLM's own code states it (vllm/v1/core/kv_cache_utils.py,
vllm/utils/hashing.py):
  - sha256_cbor(x) = hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
  - init_none_hash: NONE_HASH = sha256_cbor(os.getenv("PYTHONHASHSEED")), the seed a str
  - hash_block_tokens: sha256_cbor((parent_block_hash or NONE_HASH, tuple(token_ids),
    extra_keys)), the parent the previous block's 32-byte digest
  - generate_block_hash_extra_keys: (cache_salt,) on the first block of a salted request,
    else None (no LoRA, no multimodal inputs, no prompt embeddings)
  - maybe_convert_block_hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, the default):
    int.from_bytes(digest, "big") & ((1 << 64) - 1), the KV events' integer
Strata's events carry it as a signed int64 (the same 64 bits).

With --vectors it prints the fixed vectors tests/cache/block_hash_test.cc pins instead.
"""
import hashlib
import json
import random
import sys

import cbor2

from block_hash_compare import compare_with_strata


def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


def block_hashes(tokens, n, seed, salt=""):
    parent = sha256_cbor(seed)
    out = []
    for i in range(len(tokens) // n):
        extra = (salt,) if (i == 0 and salt) else None
        parent = sha256_cbor((parent, tuple(tokens[i * n:(i + 1) * n]), extra))
        h = int.from_bytes(parent, "big") & ((1 << 64) - 1)
        out.append(h - (1 << 64) if h >= (1 << 63) else h)
    return out


def vectors():
    cases = [
        ("0", 2, [1, 2, 3, 4], ""),
        ("0", 16, list(range(1, 33)), ""),
        ("0", 16, list(range(1, 33)), "tenant-a"),
        ("42", 4, [0, 23, 24, 255, 256, 65535, 65536, 151643], ""),
    ]
    for seed, n, tokens, salt in cases:
        print(json.dumps({"seed": seed, "page_size": n, "tokens": tokens, "salt": salt,
                          "root": sha256_cbor(seed).hex(),
                          "block_hashes": block_hashes(tokens, n, seed, salt)}))
    return 0


def cases(rng):
    for page_size in (1, 2, 16, 64):
        for seed in ("0", "1234", "ünï"):
            for salt in ("", "tenant-a", "ünï"):
                tokens = [rng.randrange(0, 200_000) for _ in range(rng.randrange(1, 300))]
                # Small ids too: CBOR writes 0..23, 24..255 and 256..65535 shorter.
                tokens[:4] = [rng.randrange(0, 24), rng.randrange(24, 256), rng.randrange(256, 65536), 0][:len(tokens)]
                extra = ["--page-size", str(page_size), "--prefix-caching-hash-algo", "sha256_cbor",
                         "--prefix-caching-hash-seed", seed] + (["--cache-salt", salt] if salt else [])
                yield (f"page_size={page_size} seed={seed!r} salt={salt!r}", extra, tokens,
                       block_hashes(tokens, page_size, seed, salt))


def main():
    if sys.argv[1] == "--vectors":
        return vectors()
    return compare_with_strata(sys.argv[1], cases(random.Random(7)))


if __name__ == "__main__":
    sys.exit(main())

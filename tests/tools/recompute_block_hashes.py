#!/usr/bin/python3
"""Recomputes block hashes from docs/block-hashes.md independently of Strata's C++ code
(Python + the xxhash module) and compares with `strata block-hashes`."""
import random
import struct
import sys

import xxhash

from block_hash_compare import compare_with_strata


def block_hashes(tokens, n=16, salt=""):
    parent, out = 0x3130415441525453, []
    for i in range(len(tokens) // n):
        extra = ("salt:" + salt).encode() if (i == 0 and salt) else b""
        data = (struct.pack("<QI", parent, n) + struct.pack(f"<{n}i", *tokens[i * n:(i + 1) * n])
                + struct.pack("<I", len(extra)) + extra)
        parent = xxhash.xxh3_64_intdigest(data)
        out.append(parent - (1 << 64) if parent >= (1 << 63) else parent)
    return out


def cases(rng):
    for page_size in (1, 2, 16, 64):
        for salt in ("", "tenant-a", "ünï"):
            tokens = [rng.randrange(0, 200_000) for _ in range(rng.randrange(0, 300))]
            if not tokens:
                continue
            extra = ["--page-size", str(page_size)] + (["--cache-salt", salt] if salt else [])
            yield (f"page_size={page_size} salt={salt!r}", extra, tokens,
                   block_hashes(tokens, page_size, salt))


def main():
    return compare_with_strata(sys.argv[1], cases(random.Random(11)))


if __name__ == "__main__":
    sys.exit(main())

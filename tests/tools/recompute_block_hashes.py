#!/usr/bin/python3
"""Recomputes block hashes from docs/block-hashes.md independently of Strata's C++ code
(Python + the xxhash module) and compares with `strata block-hashes`."""
import json
import random
import struct
import subprocess
import sys

import xxhash


def block_hashes(tokens, n=16, salt=""):
    parent, out = 0x3130415441525453, []
    for i in range(len(tokens) // n):
        extra = ("salt:" + salt).encode() if (i == 0 and salt) else b""
        data = (struct.pack("<QI", parent, n) + struct.pack(f"<{n}i", *tokens[i * n:(i + 1) * n])
                + struct.pack("<I", len(extra)) + extra)
        parent = xxhash.xxh3_64_intdigest(data)
        out.append(parent - (1 << 64) if parent >= (1 << 63) else parent)
    return out


def main():
    strata = sys.argv[1]
    rng = random.Random(11)
    cases = 0
    for page_size in (1, 2, 16, 64):
        for salt in ("", "tenant-a", "ünï"):
            tokens = [rng.randrange(0, 200_000) for _ in range(rng.randrange(0, 300))]
            args = [strata, "block-hashes", "--page-size", str(page_size)]
            if salt:
                args += ["--cache-salt", salt]
            if not tokens:
                continue
            got = json.loads(subprocess.check_output(args + [str(t) for t in tokens]))
            want = block_hashes(tokens, page_size, salt)
            if got["block_hashes"] != want:
                print(f"MISMATCH page_size={page_size} salt={salt!r}: {got} != {want}")
                return 1
            cases += 1
    print(f"{cases} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

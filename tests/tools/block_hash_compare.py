"""What the block-hash recomputers share (recompute_block_hashes.py,
recompute_vllm_block_hashes.py): run `strata block-hashes` on each case and compare its
hashes with the ones recomputed in Python."""
import json
import subprocess


def compare_with_strata(strata, cases):
    """cases: (label, extra strata arguments, tokens, expected hashes). Prints the first
    mismatch and returns 1, or the count passed and 0."""
    passed = 0
    for label, extra, tokens, want in cases:
        args = [strata, "block-hashes", *extra, *(str(t) for t in tokens)]
        got = json.loads(subprocess.check_output(args))
        if got["block_hashes"] != want:
            print(f"MISMATCH {label}: {got} != {want}")
            return 1
        passed += 1
    print(f"{passed} passed, 0 failed")
    return 0

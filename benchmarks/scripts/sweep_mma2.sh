#!/usr/bin/env bash
# The sweep behind the mma2 entries of the launch table (issue 16): the Gluon kernel's tile rows, stages, warps and
# head blocks against the tl kernel and the peers, decode by CUDA-graph replay, on the GPU machine:
#   OUT=... bash benchmarks/scripts/sweep_mma2.sh decode|prefill   (carry .peers)
set -u
PY="$(command -v python3 || command -v python)"
OUT="${OUT:-$PWD/.device-out}"
mkdir -p "$OUT"
m() { echo "{\"family\": \"mma2\", \"block_h\": $1, \"block_n\": $2, \"num_warps\": $3, \"num_stages\": $4, \"programs_per_sm\": $5}"; }
SMALL="[{\"family\": \"tl\"}, {\"family\": \"tl\", \"f16_dot\": true}, $(m 16 32 4 2 2), $(m 16 32 4 3 1), $(m 16 32 4 4 1), $(m 16 64 8 2 1), $(m 16 32 4 2 1)]"
LARGE="[{\"family\": \"tl\"}, $(m 32 64 8 2 1), $(m 64 32 8 2 1), $(m 16 32 4 3 1), $(m 16 64 8 2 1), $(m 32 32 8 3 1)]"
PRE_SMALL="[{\"family\": \"tl\"}, $(m 16 32 4 2 2), $(m 16 32 4 3 1), $(m 16 32 4 4 1), $(m 16 64 8 2 1)]"
PRE_LARGE="[{\"family\": \"tl\"}, $(m 32 64 8 2 1), $(m 64 32 8 2 1), $(m 16 64 8 2 1)]"
run() { timeout "${SWEEP_TIMEOUT:-280}" "$PY" benchmarks/scripts/sweep.py --graph "$@"; }
case "${1:-decode}" in
decode)
    run --cases decode_h8,decode_h16,decode_h16_b256 --configs "$SMALL" --out "$OUT/sweep-small.json" 2>&1 | tee "$OUT/sweep-small.txt"
    run --cases decode_h64,decode_h128 --configs "$LARGE" --out "$OUT/sweep-large.json" 2>&1 | tee "$OUT/sweep-large.txt" ;;
prefill)
    run --cases prefill_h8,prefill_h16 --formats bf16,fp8_ds_mla --configs "$PRE_SMALL" --out "$OUT/sweep-pre-small.json" 2>&1 | tee "$OUT/sweep-pre-small.txt"
    run --cases prefill_h64,prefill_h128 --formats bf16,fp8_ds_mla --configs "$PRE_LARGE" --out "$OUT/sweep-pre-large.json" 2>&1 | tee "$OUT/sweep-pre-large.txt" ;;
esac

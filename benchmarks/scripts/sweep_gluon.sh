#!/usr/bin/env bash
# The sweeps behind the Gluon entries of the launch table (issue 16; results in
# benchmarks/results/sweep-h200-2026-12-01-gluon.txt, read in benchmarks/NOTES.md): the mma2 and wgmma kernels'
# tile rows, stages, warps, head blocks and resident programs against the tl kernel and the peers, decode by
# CUDA-graph replay, prefill by do_bench. On the GPU machine (carry .peers):
#   OUT=... bash benchmarks/scripts/sweep_gluon.sh small|mid|large|prefill|wgmma|one-buffer|fp8|regs|transposed|
#       transposed-fp8|transposed-w8
set -u
PY="$(command -v python3 || command -v python)"
OUT="${OUT:-$PWD/.device-out}"
mkdir -p "$OUT"
# mma2 BLOCK_H BLOCK_N WARPS STAGES PROGRAMS_PER_SM / wgmma BLOCK_N STAGES (64-head blocks, 8 warps)
m() { echo "{\"family\": \"mma2\", \"block_h\": $1, \"block_n\": $2, \"num_warps\": $3, \"num_stages\": $4, \"programs_per_sm\": $5}"; }
w() { echo "{\"family\": \"wgmma\", \"block_h\": 64, \"block_n\": $1, \"num_warps\": 8, \"num_stages\": $2}"; }
# wgmma_t BLOCK_H STAGES [OVERLAP [WARPS]] (64-row tiles, one program per SM; OVERLAP: fp8_ds_mla's next tile
# dequantised during the output MMAs; WARPS 8: two warpgroups, each with half the heads)
t() { echo "{\"family\": \"wgmma_t\", \"block_h\": $1, \"block_n\": 64, \"num_warps\": ${4:-4}, \"num_stages\": $2, \"programs_per_sm\": 1, \"overlap\": ${3:-false}}"; }
TL='{"family": "tl"}'
run() { name=$1; shift; timeout "${SWEEP_TIMEOUT:-280}" "$PY" benchmarks/scripts/sweep.py --graph "$@" \
    --out "$OUT/sweep-$name.json" 2>&1 | tee "$OUT/sweep-$name.txt"; }
case "${1:-small}" in
small)  # <= 16 heads, decode
    run small --cases decode_h8,decode_h16,decode_h16_b256 --configs "[$TL, {\"family\": \"tl\", \"f16_dot\": true}, \
$(m 16 32 4 2 2), $(m 16 32 4 3 1), $(m 16 32 4 4 1), $(m 16 64 8 2 1), $(m 16 32 4 2 1)]" --splits 3,5,6 ;;
mid)  # 32 heads, decode: 16-head blocks (two per row), 32-head blocks, a half-empty 64-head wgmma block
    run mid --cases decode_h32 --configs "[$TL, $(m 16 32 4 2 1), $(m 16 32 4 3 1), $(m 32 64 8 2 1), \
$(m 32 32 8 2 1), $(w 64 2), $(w 32 3)]" ;;
large)  # 64 and 128 heads, decode, mma2
    run large --cases decode_h64,decode_h128 --configs "[$TL, $(m 32 64 8 2 1), $(m 64 32 8 2 1), $(m 16 32 4 3 1), \
$(m 16 64 8 2 1), $(m 32 32 8 3 1), $(m 16 32 4 2 1)]" ;;
prefill)
    run prefill --cases prefill_h8,prefill_h16,prefill_h64,prefill_h128 --formats bf16,fp8_ds_mla \
        --configs "[$TL, $(m 16 32 4 2 1), $(m 16 64 8 2 1), $(m 32 64 8 2 1)]" ;;
wgmma)  # 64-head blocks
    run wgmma --cases decode_h64,decode_h128,decode_h128_b256,prefill_h64,prefill_h128 \
        --configs "[$TL, $(w 64 2), $(w 32 3), $(w 32 4), $(w 32 2)]" ;;
one-buffer)  # STAGES=1: the other resident programs hide a tile's latency
    run one-buffer --cases decode_h8,decode_h16,decode_h16_b256,prefill_h8,prefill_h16 --formats bf16,fp8_ds_mla \
        --configs "[$TL, $(m 16 32 4 2 1), $(m 16 32 4 3 1), $(m 16 32 4 1 4), $(m 16 32 4 1 2), $(m 16 32 4 1 3), \
$(m 16 64 4 1 2)]" ;;
fp8)  # fp8_ds_mla: float16 tiles in units of each chunk's scale (f16_dot, opt-in) against bf16 exact tiles (the table's)
    x() { echo "$1" | sed "s/}\$/, \"f16_dot\": $2}/"; }
    run fp8 --cases decode_h8,decode_h16,decode_h64,decode_h128,prefill_h16,prefill_h128 --formats fp8_ds_mla \
        --configs "[$TL, $(x "$(m 16 32 4 3 1)" true), $(x "$(m 16 32 4 3 1)" false), $(x "$(m 16 32 4 2 1)" false), \
$(x "$(w 32 3)" true), $(x "$(w 32 3)" false), $(x "$(w 64 2)" false)]" ;;
regs)  # a register cap (ptxas maxnreg) so three or four one-buffer programs fit an SM; fp8 at 32 heads, exact tiles
    r() { echo "$1" | sed "s/}\$/, \"max_registers\": $2}/"; }
    run regs --cases decode_h8,decode_h16,decode_h16_b256 --configs "[$(m 16 32 4 3 1), $(m 16 32 4 2 1), \
$(r "$(m 16 32 4 1 3)" 128), $(r "$(m 16 32 4 1 4)" 128), $(r "$(m 16 32 4 1 4)" 120), $(r "$(m 16 32 4 1 2)" 128)]" \
        --splits 6,8
    run regs32 --cases decode_h32 --formats fp8_ds_mla --configs "[$(m 32 64 8 2 1), $(m 16 32 4 3 1), $(w 64 2), \
$(w 32 3)]" ;;
transposed)  # wgmma_t (tile rows along M, heads along N) against the table at 8-32 heads, both formats
    run transposed --cases decode_h8,decode_h16,decode_h16_b256,decode_h32 --formats bf16,fp8_ds_mla \
        --configs "[{}, $(t 16 2), $(t 16 3), $(t 16 2 true), $(t 16 3 true), $(t 8 2), $(t 32 2), $(t 32 2 true)]" \
        --splits 2,4
    run transposed-prefill --cases prefill_h8,prefill_h16 --formats bf16,fp8_ds_mla \
        --configs "[{}, $(t 16 2), $(t 16 3), $(t 16 3 true), $(t 8 2)]" ;;
transposed-fp8)  # wgmma_t, fp8_ds_mla: stages, overlap, head blocks
    run transposed-fp8 --cases decode_h8,decode_h16,decode_h16_b256,decode_h32 --formats fp8_ds_mla \
        --configs "[{}, $(t 16 2), $(t 16 3), $(t 16 2 true), $(t 16 3 true), $(t 8 2 true)]" --splits 2
    run transposed-fp8-prefill --cases prefill_h8,prefill_h16 --formats fp8_ds_mla \
        --configs "[{}, $(t 16 2 true), $(t 16 3 true)]" ;;
transposed-w8)  # wgmma_t on one warpgroup against two (each MMA on half the heads; twice the warps for the rest)
    run transposed-w8 --cases decode_h8,decode_h16,decode_h16_b256,decode_h32 --formats fp8_ds_mla,bf16 \
        --configs "[{}, $(t 16 2 true), $(t 16 2 true 8), $(t 16 3 true 8), $(t 32 2 true 8)]" --splits 2 ;;
*) echo "usage: sweep_gluon.sh small|...|transposed|transposed-fp8|transposed-w8" >&2; exit 2 ;;
esac

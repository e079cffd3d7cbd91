#!/usr/bin/env bash
# Issue 16: the warp-specialised fp8_ds_mla kernel (wgmma_ws) on the GPU machine: its GPU tests, then graph-replay
# times against the table's choice (wgmma_t) and FlashMLA fp8 in one process (sweep.py). Carry .peers.
#   OUT=... [SKIP_TESTS=1] [MEMCHECK=1] bash benchmarks/scripts/ab_ws.sh [CASES] [CONFIGS-JSON]
set -u
PY="$(command -v python3 || command -v python)"
OUT="${OUT:-$PWD/.device-out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
CASES=${1:-decode_h8,decode_h16,decode_h32,decode_h16_b256,prefill_h16}
CONFIGS=${2:-'[{}, {"family": "wgmma_ws"}]'}
if [ "${SKIP_TESTS:-0}" != "1" ]; then
    timeout "${TEST_TIMEOUT:-240}" "$PY" -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu_gluon.py \
        -k "${TEST_FILTER:-wgmma_ws}" 2>&1 | tail -40 | tee "$OUT/ws-tests.txt"
fi
timeout "${SWEEP_TIMEOUT:-280}" "$PY" benchmarks/scripts/sweep.py --graph --peers .peers --cases "$CASES" \
    --formats fp8_ds_mla --configs "$CONFIGS" --out "$OUT/ws-sweep.json" 2>&1 | tee "$OUT/ws-sweep.txt"
if [ "${MEMCHECK:-0}" = "1" ]; then  # the family's memcheck cases (tests/gpu/test_gpu_reliability.py) under memcheck
    CS="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${MEMCHECK_TIMEOUT:-240}" "$CS" --tool memcheck --error-exitcode 1 \
        --padding 4096 "$PY" -m pytest -q -rs -p no:cacheprovider -m memcheck tests/gpu/test_gpu_reliability.py \
        -k wgmma_ws 2>&1 | tail -20 | tee "$OUT/ws-memcheck.txt"
fi

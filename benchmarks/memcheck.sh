#!/usr/bin/env bash
# The GPU tier's `memcheck` cases (tests/gpu/test_gpu_reliability.py: garbage indices against buffers that end their
# allocations) under compute-sanitizer's memcheck tool. On the GPU machine, from the repository root, with $OUT set:
#   TMS_COMMIT=<sha> bash benchmarks/memcheck.sh
# Writes the whole output (versions, pytest, the sanitizer's report ending in "ERROR SUMMARY: N errors") to
# $OUT/memcheck.txt. Exit status 0 only when the sanitizer reports 0 errors AND the cases ran (none skipped).
#
# - PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is its own cudaMalloc of its exact size, so the sanitizer knows
#   each tensor's bounds (PyTorch's caching allocator hands out pieces of larger segments, where an overrun reads a
#   neighbouring tensor and nothing is reported).
# - --padding: the sanitizer places a guard region after every allocation, so a read just past a buffer cannot land
#   in the next allocation either (used when this compute-sanitizer has the option).
# - The sanitizer slows kernels 10-100x and instruments every module Triton loads: the cases are small (a few dozen
#   launches); budget < 3 minutes (killed at 9).
# - compute-sanitizer needs a runtime that lets it at the device (seen working on Firecracker machines, refused as
#   "Device not supported" on gVisor ones: see the device notes); that case is reported, not hidden.
set -u
set -o pipefail

OUT="${OUT:-$PWD/.device-out}"
mkdir -p "$OUT"
LOG="$OUT/memcheck.txt"
export PYTHONUNBUFFERED=1
PY="$(command -v python3 || command -v python)"
if [ -n "${TRITON_INTERPRET:-}" ]; then
    echo "note: unsetting TRITON_INTERPRET=${TRITON_INTERPRET} (kernels must compile for the GPU here)"
    unset TRITON_INTERPRET
fi
if ! "$PY" -c "import triton_mla_sparse" 2>/dev/null; then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi

CS="$(command -v compute-sanitizer || true)"
if [ -z "$CS" ]; then
    for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer \
             /opt/nvidia/compute-sanitizer/compute-sanitizer; do
        if [ -x "$c" ]; then CS="$c"; break; fi
    done
fi

{
    echo "== memcheck run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    if [ -n "${TMS_COMMIT:-}" ]; then  # the GPU machine's copy carries stale git metadata: name the commit
        echo "commit: $TMS_COMMIT (TMS_COMMIT)"
    elif git rev-parse --short HEAD >/dev/null 2>&1; then
        echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests || echo ' (with local changes)')"
    fi
    nvidia-smi -L 2>&1 || true
    "$PY" -c "import torch, triton; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, cuda available: {torch.cuda.is_available()}')" 2>&1
    if [ -n "$CS" ]; then "$CS" --version 2>&1 | tail -n 2; else echo "compute-sanitizer: not found"; fi
} 2>&1 | tee "$LOG"
[ -n "$CS" ] || { echo "FAILED: compute-sanitizer not found" | tee -a "$LOG"; exit 1; }

PAD=()
if "$CS" --help 2>&1 | grep -q -- "--padding"; then PAD=(--padding 4096); fi
CMD=("$CS" --tool memcheck --error-exitcode 1 --print-limit 200 "${PAD[@]}"
     "$PY" -m pytest -q -rs -p no:cacheprovider -m memcheck tests/gpu)
echo "== PYTORCH_NO_CUDA_MEMORY_CACHING=1 ${CMD[*]}" | tee -a "$LOG"
t0=$(date +%s)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 540 "${CMD[@]}" 2>&1 | tee -a "$LOG"
rc=$?
echo "== exit status $rc after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"

fail=()
[ $rc -eq 124 ] && fail+=("stopped at the 540 s limit")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && fail+=("exit status $rc")
grep -q "ERROR SUMMARY: 0 errors" "$LOG" || fail+=("no 'ERROR SUMMARY: 0 errors' line")
grep -Eq "[0-9]+ passed" "$LOG" || fail+=("no case passed")
grep -Eq "[0-9]+ skipped" "$LOG" && fail+=("cases were skipped (no CUDA under the sanitizer?)")
grep -q "Device not supported" "$LOG" && fail+=("compute-sanitizer: device not supported on this runtime")
if [ ${#fail[@]} -ne 0 ]; then
    echo "MEMCHECK FAILED: ${fail[*]}" | tee -a "$LOG"
    exit 1
fi
echo "MEMCHECK PASSED: 0 errors" | tee -a "$LOG"

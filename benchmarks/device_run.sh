#!/usr/bin/env bash
# One run on the GPU machine, from the repository root, with $OUT set:
#   TMS_COMMIT=<sha> bash benchmarks/device_run.sh [--quick] [more bench options...]
# Prints the device and versions, installs the package (editable, offline; falls back to PYTHONPATH=src), runs the GPU
# test tier (-> $OUT/gpu-tests.txt), then `triton-mla-sparse bench` with every peer it can load (-> $OUT/<gpu>-<date>.json,
# $OUT/<gpu>-<date>.png when matplotlib is there, and the log $OUT/bench.txt, also copied to bench-<gpu>-<date>.txt).
# Peers: carry the git-ignored ./.peers folder (../shared/tools/get-peers.sh) with the run, or set TMS_PEERS_DIR; the
# bench reports each peer as loaded or not available. The copy on the GPU machine has no .git: TMS_COMMIT (passed
# through to the bench) names the commit benchmarked. --quick runs the benchmark's quick subset; any further options
# go to the bench (e.g. --filter 'decode h16'). SKIP_TESTS=1 skips the tests. Every step runs even when an earlier
# one fails; the exit status is non-zero when any step failed. Budget: tests <= TEST_TIMEOUT=300 s, bench <=
# BENCH_TIMEOUT=270 s (each under `timeout`; the bench starts no case after BENCH_BUDGET=250 s and rewrites its JSON
# after every case).
# Indexer cases (DeepGEMM peer): also carry .peers-deepgemm (get-peers.sh --deepgemm; 57 MB), or, to fit one call's
# 64 MiB carry beside .peers, its archive .peers-deepgemm.tar.xz (6 MB: tar -cJf .peers-deepgemm.tar.xz
# .peers-deepgemm), which this script unpacks; DeepGEMM's first use JIT-compiles.
set -u
set -o pipefail

QUICK=""
if [ "${1:-}" = "--quick" ]; then QUICK="--quick"; shift; fi
OUT="${OUT:-$PWD/.device-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TMS_COMMIT="${TMS_COMMIT:-}"
PY="$(command -v python3 || command -v python)"
failed=()
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

stamp "== device"
nvidia-smi -L || failed+=("nvidia-smi")
"$PY" - <<'EOF' || failed+=("versions")
import sys, platform
import torch, triton
print(f"python {platform.python_version()} ({sys.executable})")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}")
print(f"cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device 0: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB, cc {p.major}.{p.minor}")
EOF
if [ -n "${TRITON_INTERPRET:-}" ]; then
    echo "note: unsetting TRITON_INTERPRET=${TRITON_INTERPRET} (kernels must compile for the GPU here)"
    unset TRITON_INTERPRET
fi

if [ -f .peers-deepgemm.tar.xz ] && [ ! -d .peers-deepgemm ]; then
    stamp "== unpack .peers-deepgemm.tar.xz"
    tar -xJf .peers-deepgemm.tar.xz || failed+=("unpack deepgemm")
fi

stamp "== install"
if "$PY" -m pip install -e . --no-deps --no-build-isolation -q 2>&1 | tail -5 \
        && "$PY" -c "import triton_mla_sparse, triton_mla_sparse.cli" 2>/dev/null; then
    echo "installed (editable)"
else
    echo "pip install -e failed or the package does not import; using PYTHONPATH=$PWD/src"
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" -c "import triton_mla_sparse; print('import ok from', triton_mla_sparse.__file__)" || failed+=("import")
fi

if [ "${SKIP_TESTS:-0}" != "1" ]; then
    stamp "== GPU tests"
    XDIST=""
    if "$PY" -c "import xdist" 2>/dev/null; then XDIST="-n 4"; fi  # parallel workers hide kernel compile time
    # shellcheck disable=SC2086
    # (240 s until d9717bb, whose tier finished in 233 s and hit the limit on exit; the bench then took 118 s)
    timeout "${TEST_TIMEOUT:-300}" "$PY" -m pytest -q -p no:cacheprovider $XDIST tests/gpu 2>&1 | tee "$OUT/gpu-tests.txt"
    rc=$?
    [ $rc -eq 124 ] && echo "GPU tests stopped at the ${TEST_TIMEOUT:-300} s limit" | tee -a "$OUT/gpu-tests.txt"
    [ $rc -ne 0 ] && failed+=("gpu-tests (rc $rc)")
fi

stamp "== bench $QUICK $*"
echo "commit: ${TMS_COMMIT:-unknown (TMS_COMMIT not set)}"
if [ -n "${TMS_PEERS_DIR:-}" ]; then echo "peers folder: \$TMS_PEERS_DIR=$TMS_PEERS_DIR"
elif [ -d .peers ]; then echo "peers folder: ./.peers ($(ls .peers | tr '\n' ' '))"
else echo "peers folder: none (carry .peers or set TMS_PEERS_DIR; an installed vLLM is tried next)"; fi
if [ -n "${TMS_DEEPGEMM_DIR:-}" ]; then echo "DeepGEMM folder: \$TMS_DEEPGEMM_DIR=$TMS_DEEPGEMM_DIR"
elif [ -d .peers-deepgemm ]; then echo "DeepGEMM folder: ./.peers-deepgemm"
else echo "DeepGEMM folder: none (indexer cases: carry .peers-deepgemm from get-peers.sh --deepgemm)"; fi
"$PY" -c "import matplotlib" 2>/dev/null || echo "note: matplotlib missing here; redraw the PNG with: triton-mla-sparse bench --plot <json>"
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-270}" "$PY" -m triton_mla_sparse.cli bench $QUICK --out-dir "$OUT" \
    --budget "${BENCH_BUDGET:-250}" "$@" 2>&1 | tee "$OUT/bench.txt"
rc=$?
[ $rc -eq 124 ] && echo "bench stopped at the ${BENCH_TIMEOUT:-270} s limit" | tee -a "$OUT/bench.txt"
[ $rc -ne 0 ] && failed+=("bench (rc $rc)")
json=$(ls -t "$OUT"/*-20[0-9][0-9]-[0-9][0-9]-[0-9][0-9].json 2>/dev/null | head -n1)
if [ -n "$json" ]; then
    stem=$(basename "$json" .json)
    cp "$OUT/bench.txt" "$OUT/bench-$stem.txt"
    echo "results: $json$( [ -f "$OUT/$stem.png" ] && echo " + $stem.png" ), log bench-$stem.txt"
else
    echo "no results JSON under $OUT"
fi

stamp "== done"
if [ ${#failed[@]} -ne 0 ]; then
    echo "FAILED steps: ${failed[*]}"
    exit 1
fi
echo "all steps passed"

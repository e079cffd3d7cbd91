#!/usr/bin/env bash
# Tests of the vLLM plugin against the real vLLM 0.33.0 package, in its own cached virtual environment.
#
#   bash ci/vllm-env.sh                 # create/reuse the venv, then: pytest -q tests/integrations/vllm
#   bash ci/vllm-env.sh CMD [ARGS...]   # create/reuse the venv, then run CMD inside it, e.g.
#                                       #   bash ci/vllm-env.sh python -m triton_mla_sparse.integrations.vllm.select \
#                                       #       -c 8.9 -m glm5 --tp 8
#   bash ci/vllm-env.sh --setup-only    # only create/refresh the venv and the libcuda stand-in
#
# Environment:
#   TMS_VLLM_VENV     venv folder (default ~/.cache/triton-mla-sparse/vllm-venv); reused while it holds vllm 0.33.0
#   TMS_VLLM_PYTHON   interpreter that creates it (default python3)
#   TMS_LIBCUDA_STUB  auto (default: use the stand-in only when no libcuda.so.1 is installed) | 1 (always) | 0 (never)
#
# The venv pins torch 2.14 (a CUDA build) through vllm==0.33.0: ~5 minutes and ~9.4 GB the first time.
# vLLM's CUDA platform module needs libcuda.so.1 even to import; on GPU-less machines (CI) a stand-in built from
# tests/integrations/vllm/libcuda_stub.c exports the three entry points it resolves, each answering
# CUDA_ERROR_NO_DEVICE.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TMS_VLLM_VENV:-$HOME/.cache/triton-mla-sparse/vllm-venv}"
PY="${TMS_VLLM_PYTHON:-python3}"
VLLM_VERSION="0.33.0"

log() { echo "[vllm-env] $*" >&2; }

have_vllm() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VLLM_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("vllm") == sys.argv[1] and version("pytest") else 1)
EOF
}

if have_vllm; then
    log "reusing $VENV (vllm $VLLM_VERSION)"
else
    if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
        log "$VENV exists and is not a virtual environment: not touching it (set TMS_VLLM_VENV)"
        exit 1
    fi
    log "creating $VENV with vllm==$VLLM_VERSION (takes minutes, ~9.4 GB)"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    INSTALL_LOG="$(dirname "$VENV")/vllm-venv-install.log"
    {
        "$PY" -m venv "$VENV" &&
        "$VENV/bin/python" -m pip install -q --upgrade pip &&
        "$VENV/bin/python" -m pip install -q "vllm==$VLLM_VERSION" pytest
    } >"$INSTALL_LOG" 2>&1 || { tail -n 40 "$INSTALL_LOG" >&2; log "installing vllm failed (log: $INSTALL_LOG)"; exit 1; }
    have_vllm || { log "vllm $VLLM_VERSION did not install (log: $INSTALL_LOG)"; exit 1; }
fi

# Our package, editable, without touching vLLM's pinned torch/triton. Re-installed when it points elsewhere or when
# pyproject.toml changed (vLLM's plugin loader reads the entry point from the installed metadata).
STAMP="$VENV/.tms-install.stamp"
WANT="$REPO $(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ] || ! "$VENV/bin/python" - "$REPO" <<'EOF2' 2>/dev/null
import os, sys, triton_mla_sparse
sys.exit(0 if os.path.realpath(triton_mla_sparse.__file__).startswith(os.path.realpath(sys.argv[1])) else 1)
EOF2
then
    log "installing $REPO (editable, --no-deps)"
    "$VENV/bin/python" -m pip install -q --no-deps -e "$REPO" >"$VENV/.tms-install.log" 2>&1 \
        || { cat "$VENV/.tms-install.log" >&2; exit 1; }
    echo "$WANT" >"$STAMP"
fi

# The libcuda.so.1 stand-in.
use_stub="${TMS_LIBCUDA_STUB:-auto}"
if [ "$use_stub" = auto ]; then
    if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then use_stub=0; else use_stub=1; fi
fi
if [ "$use_stub" = 1 ]; then
    STUB_DIR="$VENV/tms-libcuda-stub"
    SRC="$REPO/tests/integrations/vllm/libcuda_stub.c"
    if [ ! -f "$STUB_DIR/libcuda.so.1" ] || [ "$SRC" -nt "$STUB_DIR/libcuda.so.1" ]; then
        mkdir -p "$STUB_DIR"
        CC="${CC:-$(command -v gcc || command -v cc || true)}"
        [ -n "$CC" ] || { log "no C compiler (gcc/cc) to build the libcuda.so.1 stand-in"; exit 1; }
        "$CC" -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$STUB_DIR/libcuda.so.1.tmp" "$SRC"
        mv "$STUB_DIR/libcuda.so.1.tmp" "$STUB_DIR/libcuda.so.1"
        log "built libcuda.so.1 stand-in in $STUB_DIR"
    fi
    export LD_LIBRARY_PATH="$STUB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
cd "$REPO"

if [ "${1:-}" = "--setup-only" ]; then
    log "ready: $VENV"
    exit 0
fi
if [ "$#" -gt 0 ]; then
    exec "$@"
fi
log "running the vLLM plugin tests"
export TMS_VLLM_REQUIRED=1  # fail (not skip) when vLLM's CUDA platform module does not import
exec "$VENV/bin/python" -m pytest -q tests/integrations/vllm

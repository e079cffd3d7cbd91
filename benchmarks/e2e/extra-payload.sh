#!/usr/bin/env bash
# What DeepSeek-V4 needs beyond ../shared/tools/vllm-offline/build-payload.sh (which leaves TileLang out): vLLM 0.33's
# V4 model runs its mHC (hyper-connection) kernels in TileLang on every NVIDIA GPU. Downloads, on a machine that
# reaches PyPI, the wheels of vLLM's pins (tilelang 0.1.12, z3-solver 4.15.4.0, cloudpickle) into OUT/x0 … OUT/xN,
# one large wheel per chunk (49 and 28 MiB: one chunk per device call beside the checkout; the script stops if one
# exceeds 56 MiB), the SHA256 list in the last; `benchmarks/e2e/device.sh stage-extra N` copies one there and
# `device.sh start` unpacks them beside vLLM. Never commit OUT (third-party code): keep it git-ignored.
#   bash benchmarks/e2e/extra-payload.sh [OUT]        (default OUT=.vllm-extra)
set -euo pipefail
OUT=${1:-.vllm-extra}
PY=${PY:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none"
for p in manylinux_2_35_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         any; do PLAT="$PLAT --platform $p"; done
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps $PLAT -d "$work" tilelang==0.1.12 z3-solver==4.15.4.0 cloudpickle==3.1.3
rm -rf "$OUT"
n=0
for w in "$work"/tilelang-*.whl "$work"/z3_solver-*.whl; do mkdir -p "$OUT/x$n"; mv "$w" "$OUT/x$n/"; n=$((n + 1)); done
mv "$work"/cloudpickle-*.whl "$OUT/x$((n - 1))/"
for d in "$OUT"/x*; do
    [ "$(du -m -s "$d" | cut -f1)" -le 56 ] || { echo "$d exceeds 56 MiB: too large for one device call" >&2; exit 1; }
    (cd "$d" && sha256sum ./*.whl)
done > "$OUT/SHA256"
cp "$OUT/SHA256" "$OUT/x$((n - 1))/"
du -sh "$OUT"/x*; echo "extra payload ready in $OUT ($n chunks)"

#!/usr/bin/env bash
# The end-to-end runs on the offline GPU machine, from the repository root (the device tool's working copy).
#   bash benchmarks/e2e/device.sh stage N      copy the carried payload chunk .vllm-payload/cN to /tmp/vllm-stage
#   bash benchmarks/e2e/device.sh start        unpack vLLM, install this package, a smoke engine (SKIP_SMOKE=1: none),
#                                              then in the background (setsid):
#                                              the fp8 check, the GPU tests of the batch-invariant paths, the soaks
#                                              (E2E_SOAKS, default all of soak.SOAKS, side by side); with
#                                              E2E_TRACE=1 the module-by-module trace (trace.py); with
#                                              E2E_MATRIX=1 also the correctness matrix, then the serving runs alone;
#                                              results under /tmp/e2e
#   bash benchmarks/e2e/device.sh wait [SEC]   wait up to SEC (default 540) for the runs, then copy a tarball of
#                                              /tmp/e2e (without model folders) and the section files to $OUT
# Payload: ../shared/tools/vllm-offline/build-payload.sh .vllm-payload (git-ignored); carry one chunk per call.
set -u
E2E=/tmp/e2e
cmd=${1:?stage|start|wait}
case "$cmd" in
stage)
    mkdir -p /tmp/vllm-stage && cp .vllm-payload/c"$2"/* /tmp/vllm-stage/ -r && ls /tmp/vllm-stage ;;
start)
    if [ ! -f /tmp/vllm-site/env.sh ]; then
        bash /tmp/vllm-stage/unpack.sh /tmp/vllm-stage >/tmp/unpack.log 2>&1 || { tail -20 /tmp/unpack.log; exit 1; }
        tail -2 /tmp/unpack.log
    fi
    . /tmp/vllm-site/env.sh
    python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -3
    python3 -c "import triton_mla_sparse, vllm; print('ok', vllm.__version__)" || exit 1
    rm -rf "$E2E"; mkdir -p "$E2E"
    if [ "${SKIP_SMOKE:-0}" != "1" ]; then
    # A smoke run first (one eager engine): a broken harness shows here, before the background runs start.
    (cd benchmarks && PYTHONUNBUFFERED=1 timeout 300 python3 -m e2e correctness --out "$E2E"/smoke --variants glm5-h8 \
        --modes eager --only 'bfloat16-ours$' --parallel 1 --timeout 280) 2>&1 | tail -5
    python3 - "$E2E"/smoke/runs/glm5-h8-eager-bfloat16-ours.json <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r.get(k) for k in ("ok", "error", "start_s", "generate_s", "calls", "indexer_shadow", "weights")})
print(r.get("traceback", "")[-2500:])
print([(p["length"], p["tokens"][:8]) for p in r.get("prompts", [])])
sys.exit(0 if r["ok"] else 1)
PY
    fi
    [ "${SMOKE_ONLY:-0}" = "1" ] && exit 0
    REPO=$PWD setsid nohup bash -c '
        . /tmp/vllm-site/env.sh; cd "$REPO/benchmarks"; export PYTHONUNBUFFERED=1
        nvidia-smi > '"$E2E"'/nvidia-smi.txt 2>&1
        if [ -f e2e/fp8_sw_check.py ]; then
            (timeout 300 python3 e2e/fp8_sw_check.py --out '"$E2E"'/fp8_sw_check.json > '"$E2E"'/fp8_sw_check.log 2>&1) &
        fi
        (cd .. && timeout 600 python3 -m pytest -q -p no:cacheprovider tests/ops/indexer/test_indexer.py \
            tests/ops/sparse_mla/test_attention_features.py -k "deterministic or depend_on_the_batch" \
            > '"$E2E"'/gpu-tests.log 2>&1) &
        port=8377
        for name in ${E2E_SOAKS:-ours-batch-invariant ours-batch-invariant-deepgemm-indexer ours fa3-page1}; do
            (timeout 1200 python3 -m e2e soak --name "$name" --port $port --duration ${E2E_SOAK_DURATION:-300} --out '"$E2E"'/soak-"$name" \
                > '"$E2E"'/soak-"$name".log 2>&1) &
            port=$((port + 1))
        done
        if [ "${E2E_TRACE:-0}" = "1" ]; then
            (timeout 1000 python3 -m e2e trace --out '"$E2E"'/trace > '"$E2E"'/trace.log 2>&1) &
        fi
        if [ "${E2E_MATRIX:-0}" = "1" ]; then
            timeout 1500 python3 -m e2e correctness --out '"$E2E"'/correctness ${E2E_ONLY:+--only "$E2E_ONLY"} \
                > '"$E2E"'/correctness.log 2>&1
        fi
        wait
        touch '"$E2E"'/CORRECTNESS_DONE
        if [ "${E2E_MATRIX:-0}" = "1" ]; then
            timeout 1200 python3 -m e2e serving --out '"$E2E"'/serving > '"$E2E"'/serving.log 2>&1
        fi
        touch '"$E2E"'/DONE' > /tmp/e2e-orchestrator.log 2>&1 < /dev/null &
    echo "started" ;;
wait)
    limit=${2:-540}; t0=$(date +%s)
    while [ ! -f "$E2E/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
        sleep 10
        oks=$(grep '^\[pool\]' "$E2E"/correctness.log 2>/dev/null | grep -c ': ok (' || true)
        bad=$(grep '^\[pool\]' "$E2E"/correctness.log 2>/dev/null | grep -vc ': ok (' || true)
        if [ "${oks:-0}" = "0" ] && [ "${bad:-0}" -ge 4 ]; then echo "harness looks broken: $bad failures, no success"; break; fi
    done
    [ -f "$E2E/DONE" ] && echo "all done" || echo "still running after ${limit} s"
    tail -n 3 "$E2E"/*.log 2>/dev/null | tail -n 60
    tail -n 4 "$E2E"/trace/runs/*.log 2>/dev/null | tail -n 30
    grep -h "Error\|not supported" "$E2E"/soak-*/soak-server.log 2>/dev/null | grep -v "Chat template\|Tokenizer not\|ulimit\|base.py:383" | tail -n 8
    ls "$E2E"/correctness/runs 2>/dev/null | grep -c '\.json$' | sed 's/^/result files: /'
    tar -C /tmp --exclude='e2e/*/models' --exclude='*.spec.json' -czf "${OUT:-/tmp}"/e2e.tar.gz e2e
    for f in correctness/correctness.json serving/serving.json trace/trace.json fp8_sw_check.json gpu-tests.log; do
        [ -f "$E2E/$f" ] && cp "$E2E/$f" "${OUT:-/tmp}/"
    done
    for f in "$E2E"/soak-*/soak.json; do
        [ -f "$f" ] && cp "$f" "${OUT:-/tmp}/$(basename "$(dirname "$f")").json"
    done
    ls -la "${OUT:-/tmp}" ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac

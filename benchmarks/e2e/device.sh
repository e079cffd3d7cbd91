#!/usr/bin/env bash
# The end-to-end runs on the offline GPU machine, from the repository root (the device tool's working copy).
#   bash benchmarks/e2e/device.sh stage N      copy the carried payload chunk .vllm-payload/cN to /tmp/vllm-stage
#   bash benchmarks/e2e/device.sh stage-extra N  copy the carried chunk .vllm-extra/xN (extra-payload.sh: TileLang
#                                              for DeepSeek-V4) to /tmp/vllm-extra-stage
#   bash benchmarks/e2e/device.sh start        unpack vLLM (and the extra wheels where staged), install this package,
#                                              a smoke run (SKIP_SMOKE=1: none; SMOKE_VARIANTS / SMOKE_RE pick its
#                                              engines, default one eager GLM-5 h8 engine of ours),
#                                              then in the background (setsid):
#                                              the fp8 check, the GPU tests of the batch-invariant paths, the soaks
#                                              (E2E_SOAKS, default all of soak.SOAKS, side by side; set and empty:
#                                              none); with E2E_TRACE=1 the module-by-module trace (trace.py); with
#                                              E2E_MATRIX=1 also the correctness matrix, then the serving runs alone
#                                              (E2E_VARIANTS / E2E_SERVING_VARIANTS: their models, default the
#                                              harness's; E2E_TP=2,4: the tensor-parallel runs instead of the matrix;
#                                              E2E_SERVING=0: no serving runs); E2E_SIDE=0 skips the
#                                              fp8 check and the GPU tests;
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
stage-extra)
    mkdir -p /tmp/vllm-extra-stage && cp .vllm-extra/x"$2"/* /tmp/vllm-extra-stage/ && ls /tmp/vllm-extra-stage ;;
start)
    if [ ! -f /tmp/vllm-site/env.sh ]; then
        bash /tmp/vllm-stage/unpack.sh /tmp/vllm-stage >/tmp/unpack.log 2>&1 || { tail -20 /tmp/unpack.log; exit 1; }
        tail -2 /tmp/unpack.log
    fi
    if ls /tmp/vllm-extra-stage/*.whl >/dev/null 2>&1 && [ ! -f /tmp/vllm-extra-stage/SHA256 ]; then
        echo "extra wheels staged without their SHA256 (stage the last .vllm-extra chunk too)"; exit 1
    fi
    if [ -f /tmp/vllm-extra-stage/SHA256 ] && [ ! -f /tmp/vllm-site/.extra-done ]; then
        (cd /tmp/vllm-extra-stage && sha256sum -c SHA256) || exit 1
        # wheels unpacked beside vLLM, keeping each member's mode bits (TileLang and z3 ship shared libraries)
        python3 - /tmp/vllm-site /tmp/vllm-extra-stage/*.whl <<'PY' || exit 1
import os, sys, zipfile
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            path = z.extract(info, sys.argv[1])
            mode = info.external_attr >> 16
            if mode and not info.is_dir():
                os.chmod(path, mode | 0o444)
    print("unpacked", os.path.basename(whl))
PY
        touch /tmp/vllm-site/.extra-done
    fi
    . /tmp/vllm-site/env.sh
    python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -3
    python3 -c "import triton_mla_sparse, vllm; print('ok', vllm.__version__)" || exit 1
    rm -rf "$E2E"; mkdir -p "$E2E"
    if [ "${SKIP_SMOKE:-0}" != "1" ]; then
    # A smoke run first (one eager engine): a broken harness shows here, before the background runs start.
    (cd benchmarks && PYTHONUNBUFFERED=1 timeout 420 python3 -m e2e correctness --out "$E2E"/smoke \
        --variants "${SMOKE_VARIANTS:-glm5-h8}" --modes eager --only "${SMOKE_RE:-(bfloat16|dsv41?-h[0-9]+-eager-fp8_ds_mla)-ours\$}" \
        --parallel 4 --timeout 400) 2>&1 | tail -5
    ls "$E2E"/smoke/runs/*.json >/dev/null 2>&1 || { echo "smoke: no run matched SMOKE_VARIANTS / SMOKE_RE"; exit 1; }
    python3 - "$E2E"/smoke/runs/*.json <<'PY' || exit 1
import json, sys
ok = True
for path in sys.argv[1:]:
    r = json.load(open(path))
    print(path.rsplit("/", 1)[-1], {k: r.get(k) for k in ("ok", "error", "start_s", "generate_s", "calls",
                                                         "indexer_shadow", "layers")})
    print(r.get("traceback", "")[-2500:])
    print([(p["length"], p["tokens"][:8]) for p in r.get("prompts", [])])
    ok = ok and r["ok"]
sys.exit(0 if ok else 1)
PY
    fi
    [ "${SMOKE_ONLY:-0}" = "1" ] && exit 0
    REPO=$PWD setsid nohup bash -c '
        . /tmp/vllm-site/env.sh; cd "$REPO/benchmarks"; export PYTHONUNBUFFERED=1
        nvidia-smi > '"$E2E"'/nvidia-smi.txt 2>&1
        if [ "${E2E_SIDE:-1}" = "1" ] && [ -f e2e/fp8_sw_check.py ]; then
            (timeout 300 python3 e2e/fp8_sw_check.py --out '"$E2E"'/fp8_sw_check.json > '"$E2E"'/fp8_sw_check.log 2>&1) &
        fi
        [ "${E2E_SIDE:-1}" = "1" ] && (cd .. && timeout 600 python3 -m pytest -q -p no:cacheprovider tests/ops/indexer/test_indexer.py \
            tests/ops/sparse_mla/test_attention_features.py -k "deterministic or depend_on_the_batch" \
            > '"$E2E"'/gpu-tests.log 2>&1) &
        port=8377
        for name in ${E2E_SOAKS-ours-batch-invariant ours-batch-invariant-deepgemm-indexer ours fa3-page1}; do
            (timeout 1200 python3 -m e2e soak --name "$name" --port $port --duration ${E2E_SOAK_DURATION:-300} --out '"$E2E"'/soak-"$name" \
                > '"$E2E"'/soak-"$name".log 2>&1) &
            port=$((port + 1))
        done
        if [ "${E2E_TRACE:-0}" = "1" ]; then
            (timeout 1000 python3 -m e2e trace --out '"$E2E"'/trace > '"$E2E"'/trace.log 2>&1) &
        fi
        if [ "${E2E_MATRIX:-0}" = "1" ]; then
            timeout 1500 python3 -m e2e correctness --out '"$E2E"'/correctness ${E2E_ONLY:+--only "$E2E_ONLY"} \
                ${E2E_TP:+--tp "$E2E_TP"} \
                ${E2E_VARIANTS:+--variants "$E2E_VARIANTS"} \
                > '"$E2E"'/correctness.log 2>&1
        fi
        wait
        touch '"$E2E"'/CORRECTNESS_DONE
        if [ "${E2E_MATRIX:-0}" = "1" ] && [ "${E2E_SERVING:-1}" = "1" ]; then
            timeout 1200 python3 -m e2e serving --out '"$E2E"'/serving \
                ${E2E_SERVING_VARIANTS:+--variants "$E2E_SERVING_VARIANTS"} > '"$E2E"'/serving.log 2>&1
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

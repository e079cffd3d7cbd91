"""The engine runs of the correctness matrix and of the serving figures, and the parallel worker pool."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .models import VARIANTS, is_v4, is_v41, uses_v4_layer
from .prompts import CORRECTNESS_LENGTHS
from .schema import OURS, OURS_V4, OURS_V41, PEER_V4, PEER_V41, PEERS, validate_spec

BENCH_DIR = Path(__file__).resolve().parent.parent  # benchmarks/: the worker runs as ``python -m e2e.worker``

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def base_spec(name: str, *, variant: str, backend: str, kv: str, mode: str, model_root: str,
              task: str = "generate", env: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A worker spec with the settings every engine shares (the serving runs too, so that they reuse the
    correctness runs' torch.compile cache)."""
    spec: dict[str, Any] = {
        "name": name, "task": task, "variant": variant, "backend": backend, "kv_cache_dtype": kv, "mode": mode,
        "model_root": model_root, "max_model_len": 33024, "max_num_seqs": 32, "max_num_batched_tokens": 16384,
        "gpu_memory_utilization": 0.05, "kv_cache_memory_bytes": 4 << 30, "capture_sizes": [1, 2, 4, 8, 16, 32],
        "seed": 0, "weights_seed": 0, "weights_std": 0.02, "env": dict(env or {}),
        "prompts": list(CORRECTNESS_LENGTHS), "prompt_seed": 1000, "max_tokens": 64, "logprobs": 20,
    }
    spec.update(extra)
    return validate_spec(spec)


#: Everything the plugin runs on an SM 8.x GPU instead of vLLM's Hopper components, forced on any GPU.
SM8X_ENV = {"TRITON_MLA_SPARSE_INDEXER": "always", "TRITON_MLA_SPARSE_SOFT_FP8": "always",
            "TRITON_MLA_SPARSE_DSV4_PORTABLE": "always"}


def correctness_specs(model_root: str, *, variants: tuple[str, ...] = tuple(VARIANTS),
                      modes: tuple[str, ...] = ("eager", "graphs")) -> tuple[list[dict], list[dict]]:
    """The runs and the pairs to compare: per variant and mode, each cache dtype's peer, ours with vLLM's indexer
    (DeepGEMM on SM90; eager runs also shadow it with ours) and ours with ours forced; on dsv32-h16 with CUDA
    graphs also the n-gram speculator (ours, the peer, and ours without it on the same repetitive prompts) and the
    software e4m3 path of SM80/86 forced (``TRITON_MLA_SPARSE_SOFT_FP8=always``). A DeepSeek-V4 variant runs
    per mode our layer against vLLM's FlashMLA layer (fp8_ds_mla pages), with vLLM's indexer and with ours forced
    (its compressed C4A cache); the FlashMLA engines also recompute each eager attention call with our layer's
    forward (``shadow_attention``); with CUDA graphs, ours also with the software e4m3 casts forced in vLLM's V4
    Triton kernels (``TRITON_MLA_SPARSE_SOFT_FP8=always``, SM 8.0/8.6's path) against ours without them, and with
    everything SM 8.x runs instead of vLLM's components forced (our indexer, the software casts, the portable mHC
    prenorm: ``TRITON_MLA_SPARSE_DSV4_PORTABLE=always``) against ours without them. A DeepSeek-V4.1 variant runs per
    mode our V4.1 layer against vLLM's V4.1 FlashMLA layer (shadowed as V4's) and ours with everything SM 8.x runs
    forced against ours (eager: each portable call shadowed), plus the eager-vs-graphs yardsticks."""
    specs: list[dict] = []
    pairs: list[dict] = []

    def pair(kind: str, ours: str, peer: str, *, variant: str, mode: str, kv: str, indexer: str = "vllm") -> None:
        pairs.append({"kind": kind, "variant": variant, "mode": mode, "kv_cache_dtype": kv, "indexer": indexer,
                      "ours": ours, "peer": peer})

    def yardsticks(variant: str, kv: str) -> None:
        """How far vLLM's backend (or layer) and ours drift from themselves between eager and CUDA-graph mode."""
        if {"eager", "graphs"} <= set(modes):
            for who in ("peer", "ours"):
                pair(f"{who}_eager_vs_graphs", f"{variant}-eager-{kv}-{who}", f"{variant}-graphs-{kv}-{who}",
                     variant=variant, mode="eager~graphs", kv=kv)

    v3 = tuple(v for v in variants if not uses_v4_layer(v))
    for variant in variants:
        if not is_v4(variant):
            continue
        for mode in modes:
            tag = f"{variant}-{mode}-fp8_ds_mla"
            specs.append(base_spec(f"{tag}-peer", variant=variant, backend=PEER_V4, kv="fp8_ds_mla", mode=mode,
                                   model_root=model_root, shadow_attention=True))
            specs.append(base_spec(f"{tag}-ours", variant=variant, backend=OURS_V4, kv="fp8_ds_mla", mode=mode,
                                   model_root=model_root, count_calls=True))
            specs.append(base_spec(f"{tag}-ours-ti", variant=variant, backend=OURS_V4, kv="fp8_ds_mla", mode=mode,
                                   model_root=model_root, count_calls=True,
                                   env={"TRITON_MLA_SPARSE_INDEXER": "always"}))
            pair("vs_peer", f"{tag}-ours", f"{tag}-peer", variant=variant, mode=mode, kv="fp8_ds_mla")
            pair("vs_peer", f"{tag}-ours-ti", f"{tag}-peer", variant=variant, mode=mode, kv="fp8_ds_mla",
                 indexer="ours")
        if "graphs" in modes:  # the software e4m3 casts of SM 8.0/8.6 forced in vLLM's V4 Triton kernels
            tag = f"{variant}-graphs-fp8_ds_mla"
            specs.append(base_spec(f"{tag}-ours-softfp8", variant=variant, backend=OURS_V4, kv="fp8_ds_mla",
                                   mode="graphs", model_root=model_root, count_calls=True,
                                   env={"TRITON_MLA_SPARSE_SOFT_FP8": "always"}))
            pair("soft_fp8_vs_native", f"{tag}-ours-softfp8", f"{tag}-ours", variant=variant, mode="graphs",
                 kv="fp8_ds_mla")
            # everything SM 8.x runs instead of vLLM's components: our indexer, the software casts, the portable
            # mHC prenorm (and o_proj, a no-op on these bf16 weights)
            specs.append(base_spec(f"{tag}-ours-sm8x", variant=variant, backend=OURS_V4, kv="fp8_ds_mla",
                                   mode="graphs", model_root=model_root, count_calls=True,
                                   env=SM8X_ENV))
            pair("sm8x_vs_native", f"{tag}-ours-sm8x", f"{tag}-ours", variant=variant, mode="graphs",
                 kv="fp8_ds_mla", indexer="ours")
        if "eager" in modes:  # the same eager, each portable call also made with vLLM's kernel (shadow_portable)
            tag = f"{variant}-eager-fp8_ds_mla"
            specs.append(base_spec(f"{tag}-ours-sm8x", variant=variant, backend=OURS_V4, kv="fp8_ds_mla",
                                   mode="eager", model_root=model_root, count_calls=True, shadow_portable=True,
                                   env=SM8X_ENV))
            pair("sm8x_vs_native", f"{tag}-ours-sm8x", f"{tag}-ours", variant=variant, mode="eager",
                 kv="fp8_ds_mla", indexer="ours")
        yardsticks(variant, "fp8_ds_mla")
    for variant in variants:
        if not is_v41(variant):
            continue
        for mode in modes:
            tag = f"{variant}-{mode}-fp8_ds_mla"
            specs.append(base_spec(f"{tag}-peer", variant=variant, backend=PEER_V41, kv="fp8_ds_mla", mode=mode,
                                   model_root=model_root, shadow_attention=True))
            specs.append(base_spec(f"{tag}-ours", variant=variant, backend=OURS_V41, kv="fp8_ds_mla", mode=mode,
                                   model_root=model_root, count_calls=True, shadow_indexer=mode == "eager"))
            # our indexer (with V4.1's candidate blocks), the software casts and the indexer-q route, as on SM 8.x
            specs.append(base_spec(f"{tag}-ours-sm8x", variant=variant, backend=OURS_V41, kv="fp8_ds_mla",
                                   mode=mode, model_root=model_root, count_calls=True,
                                   shadow_portable=mode == "eager", env=SM8X_ENV))
            pair("vs_peer", f"{tag}-ours", f"{tag}-peer", variant=variant, mode=mode, kv="fp8_ds_mla")
            pair("sm8x_vs_native", f"{tag}-ours-sm8x", f"{tag}-ours", variant=variant, mode=mode, kv="fp8_ds_mla",
                 indexer="ours")
        yardsticks(variant, "fp8_ds_mla")
    for variant in v3:
        for mode in modes:
            for kv, peer in PEERS.items():
                tag = f"{variant}-{mode}-{kv}"
                specs.append(base_spec(f"{tag}-peer", variant=variant, backend=peer, kv=kv, mode=mode,
                                       model_root=model_root))
                specs.append(base_spec(f"{tag}-ours", variant=variant, backend=OURS, kv=kv, mode=mode,
                                       model_root=model_root, count_calls=True, shadow_indexer=mode == "eager"))
                specs.append(base_spec(f"{tag}-ours-ti", variant=variant, backend=OURS, kv=kv, mode=mode,
                                       model_root=model_root, count_calls=True,
                                       env={"TRITON_MLA_SPARSE_INDEXER": "always"}))
                for ours, indexer in ((f"{tag}-ours", "vllm"), (f"{tag}-ours-ti", "ours")):
                    pair("vs_peer", ours, f"{tag}-peer", variant=variant, mode=mode, kv=kv, indexer=indexer)
    # Baselines: how far vLLM's own backend (and ours) drift from themselves between eager and CUDA-graph mode, and
    # what the cache dtype and the indexer alone change, on the same prompts and weights.
    for variant in v3:
        for kv in PEERS:
            yardsticks(variant, kv)
    for variant in v3:
        for mode in modes:
            pair("peer_fp8_vs_peer_bf16", f"{variant}-{mode}-fp8_ds_mla-peer", f"{variant}-{mode}-bfloat16-peer",
                 variant=variant, mode=mode, kv="fp8_ds_mla~bfloat16")
    if "dsv32-h16" in variants and "graphs" in modes:
        v, m = "dsv32-h16", "graphs"
        rep = dict(prompt_kind="repetitive", prompts=[300, 2500, 5000], max_tokens=96)
        specs.append(base_spec(f"{v}-{m}-bfloat16-peer-ngram", variant=v, backend=PEERS["bfloat16"], kv="bfloat16",
                               mode=m, model_root=model_root, speculative=NGRAM, **rep))
        specs.append(base_spec(f"{v}-{m}-bfloat16-ours-ngram", variant=v, backend=OURS, kv="bfloat16", mode=m,
                               model_root=model_root, speculative=NGRAM, count_calls=True, **rep))
        specs.append(base_spec(f"{v}-{m}-bfloat16-ours-rep", variant=v, backend=OURS, kv="bfloat16", mode=m,
                               model_root=model_root, **rep))
        pair("speculative_vs_peer", f"{v}-{m}-bfloat16-ours-ngram", f"{v}-{m}-bfloat16-peer-ngram",
             variant=v, mode=m, kv="bfloat16")
        pair("speculative_vs_plain", f"{v}-{m}-bfloat16-ours-ngram", f"{v}-{m}-bfloat16-ours-rep",
             variant=v, mode=m, kv="bfloat16")
        for kv in PEERS:
            name = f"{v}-{m}-{kv}-ours-ti-softfp8"
            specs.append(base_spec(name, variant=v, backend=OURS, kv=kv, mode=m, model_root=model_root,
                                   count_calls=True, env={"TRITON_MLA_SPARSE_INDEXER": "always",
                                                          "TRITON_MLA_SPARSE_SOFT_FP8": "always"}))
            pair("soft_fp8_vs_native", name, f"{v}-{m}-{kv}-ours-ti", variant=v, mode=m, kv=kv, indexer="ours")
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise AssertionError("duplicate run names")
    return specs, pairs


#: NVLink multicast (NVLS) off in every tensor-parallel engine, as on the lent machines (KINDS.md).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}


def parallel_specs(model_root: str, *, tp_sizes: tuple[int, ...], variants: tuple[str, ...] = ("dsv32-h16", "glm5-h8"),
                   expert_parallel: bool = False) -> tuple[list[dict], list[dict]]:
    """Tensor-parallel runs (issue 18): per size t, per variant (its heads are one GPU's share: the model has t times
    as many) and cache dtype, ours against the peer with CUDA graphs, every rank a worker process (vLLM's ``mp``
    executor; t = 1 runs the same path on one GPU), NVLink multicast off; ``expert_parallel``: experts split over
    the ranks too. Pairs carry ``tensor_parallel_size``."""
    specs: list[dict] = []
    pairs: list[dict] = []
    for t in tp_sizes:
        par = {"tensor_parallel_size": t, "enable_expert_parallel": expert_parallel, "executor": "mp"}
        for variant in variants:
            if uses_v4_layer(variant):
                raise ValueError(f"parallel_specs: {variant} is a DeepSeek-V4 / V4.1 variant (not in issue 18's runs)")
            for kv, peer in PEERS.items():
                tag = f"tp{t}{'ep' if expert_parallel else ''}-{variant}-graphs-{kv}"
                specs.append(base_spec(f"{tag}-peer", variant=variant, backend=peer, kv=kv, mode="graphs",
                                       model_root=model_root, parallel=dict(par), env=dict(NCCL_ENV)))
                specs.append(base_spec(f"{tag}-ours", variant=variant, backend=OURS, kv=kv, mode="graphs",
                                       model_root=model_root, parallel=dict(par), env=dict(NCCL_ENV)))
                pairs.append({"kind": "vs_peer", "variant": variant, "mode": "graphs", "kv_cache_dtype": kv,
                              "indexer": "vllm", "ours": f"{tag}-ours", "peer": f"{tag}-peer",
                              "tensor_parallel_size": t})
    return specs, pairs


def serving_specs(model_root: str, *, variants: tuple[str, ...] = ("dsv32-h16", "dsv32-h128")) -> list[dict]:
    """Per variant, each backend (ours and the peer, per cache dtype) with CUDA graphs at contexts 8K and 32K."""
    specs = []
    serving = {"contexts": [8192, 32768], "batch": {"8192": 32, "32768": 8}, "new_tokens": 128, "repeats": 1}
    for variant in variants:
        if uses_v4_layer(variant):
            ours, peer = (OURS_V4, PEER_V4) if is_v4(variant) else (OURS_V41, PEER_V41)
            for backend, who in ((ours, "ours"), (peer, "peer")):
                specs.append(base_spec(f"serve-{variant}-fp8_ds_mla-{who}", task="serving", variant=variant,
                                       backend=backend, kv="fp8_ds_mla", mode="graphs", model_root=model_root,
                                       serving=serving))
            continue
        for kv, peer in PEERS.items():
            for backend in (OURS, peer):
                who = "ours" if backend == OURS else "peer"
                specs.append(base_spec(f"serve-{variant}-{kv}-{who}", task="serving", variant=variant,
                                       backend=backend, kv=kv, mode="graphs", model_root=model_root,
                                       serving=serving))
    return specs


def trace_specs(model_root: str) -> list[dict]:
    """Ours under vLLM's batch-invariant mode, eager, with one CUDA stream and with vLLM's default second stream
    for the shared experts: a 2,345-token target alone and inside 63 soak requests (:mod:`.trace`)."""
    from .soak import BATCH_INVARIANT

    trace = {"target_len": 2345, "others": 63, "max_tokens": 64}
    specs = []
    for tag, env in (("", {}), ("-one-stream", {"VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"})):
        specs.append(base_spec(f"trace-dsv32-h16-eager-bfloat16-ours-bi{tag}", task="trace", variant="dsv32-h16",
                               backend=OURS, kv="bfloat16", mode="eager", model_root=model_root,
                               env={**BATCH_INVARIANT, **env}, max_num_seqs=64, max_num_batched_tokens=2048,
                               max_model_len=8192, trace=trace))
    return specs


def run_pool(specs: list[dict], out_dir: Path, *, parallel: int, timeout_s: float, budget_s: float = math.inf,
             log: Any = sys.stdout) -> dict[str, dict]:
    """Run each spec in its own worker process, ``parallel`` at a time; returns name -> result (a failure or a
    timeout is a result with ``ok: False``; a spec not started within ``budget_s`` is a result ``not run``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pending = list(specs)
    running: dict[str, tuple[subprocess.Popen, float, Path, Any]] = {}
    results: dict[str, dict] = {}
    start = time.time()
    env = {**os.environ, "PYTHONPATH": f"{BENCH_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    while pending or running:
        while pending and time.time() - start > budget_s:
            spec = pending.pop(0)
            results[spec["name"]] = {"ok": False, "error": f"not run: budget of {budget_s:.0f} s spent", "spec": spec}
        while pending and len(running) < parallel:
            spec = pending.pop(0)
            spec_path = out_dir / f"{spec['name']}.spec.json"
            spec_path.write_text(json.dumps(spec, indent=1))
            res_path = out_dir / f"{spec['name']}.json"
            res_path.unlink(missing_ok=True)  # a result left by an earlier run must not stand for this one
            logf = open(out_dir / f"{spec['name']}.log", "w")
            proc = subprocess.Popen([sys.executable, "-m", "e2e.worker", str(spec_path), str(res_path)],
                                    cwd=BENCH_DIR, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            running[spec["name"]] = (proc, time.time(), res_path, logf)
        time.sleep(2)
        for name, (proc, t0, res_path, logf) in list(running.items()):
            if proc.poll() is None and time.time() - t0 < timeout_s:
                continue
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            del running[name]
            logf.close()
            try:
                results[name] = json.loads(res_path.read_text())
            except (OSError, ValueError):
                tail = (out_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                results[name] = {"ok": False, "error": f"no result (exit {proc.returncode}, "
                                 f"{time.time() - t0:.0f} s)", "log_tail": tail}
            print(f"[pool] {name}: {'ok' if results[name].get('ok') else results[name].get('error')} "
                  f"({time.time() - t0:.0f} s; {len(pending)} pending, {len(running)} running)", file=log, flush=True)
    return results

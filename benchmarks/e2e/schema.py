"""The worker spec and the results file ``benchmarks/results/e2e-<gpu>-<date>.json`` (validated; CPU-tested)."""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1
OURS = "TRITON_MLA_SPARSE"
#: vLLM 0.33's own sparse backend on SM90 per cache dtype, the peer of ours for that cache (and the only one it reads).
PEERS = {"bfloat16": "FLASH_ATTN_MLA_SPARSE", "fp8_ds_mla": "FLASHMLA_SPARSE"}
#: DeepSeek-V4 models: our attention layer (``TRITON_MLA_SPARSE_DSV4=triton``, no backend named) and vLLM 0.33's
#: FlashMLA layer on SM90 (named, with our routing off); both read fp8_ds_mla pages only.
OURS_V4, PEER_V4 = "TRITON_MLA_SPARSE_DSV4", "FLASHMLA_SPARSE_DSV4"
V4_BACKENDS = (OURS_V4, PEER_V4)
#: DeepSeek-V4.1 models: our V4.1 layer (the same switch) and vLLM 0.33's V4.1 FlashMLA layer on SM90, named by its
#: own backend name (V4's would select the same class; vLLM keeps the names apart).
OURS_V41, PEER_V41 = "TRITON_MLA_SPARSE_DSV41", "FLASHMLA_SPARSE_DSV41"
V41_BACKENDS = (OURS_V41, PEER_V41)
#: The backends that are the plugin's layer class, chosen by ``TRITON_MLA_SPARSE_DSV4``, not by a backend name.
OURS_LAYERS = (OURS_V4, OURS_V41)
BACKENDS = (OURS, *PEERS.values(), *V4_BACKENDS, *V41_BACKENDS)
KV_CACHE_DTYPES = ("bfloat16", "fp8_ds_mla")
MODES = ("eager", "graphs")
TASKS = ("generate", "serving", "trace")

_SPEC_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str, "task": str, "variant": str, "backend": str, "kv_cache_dtype": str, "mode": str,
    "model_root": str, "max_model_len": int, "max_num_seqs": int, "max_num_batched_tokens": int,
    "gpu_memory_utilization": float, "kv_cache_memory_bytes": int, "capture_sizes": list, "seed": int,
    "weights_seed": int, "weights_std": float, "env": dict,
}
_GENERATE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "prompts": list, "prompt_seed": int, "max_tokens": int, "logprobs": int,
}


def _need(obj: dict[str, Any], fields: dict[str, Any], what: str) -> None:
    for key, typ in fields.items():
        if key not in obj:
            raise ValueError(f"{what}: missing field {key!r}")
        if not isinstance(obj[key], typ) or (typ is int and isinstance(obj[key], bool)):
            raise ValueError(f"{what}: field {key!r} must be {getattr(typ, '__name__', typ)}, got {obj[key]!r}")


def variant_backends(variant: str) -> tuple[str, ...]:
    """The backends ``variant`` (a key of ``models.VARIANTS``) can run: its family's pair of layers for DeepSeek-V4 and
    V4.1, ours and the peers of the others."""
    from .models import V4_FAMILY, V41_FAMILY, VARIANTS

    return {V4_FAMILY: V4_BACKENDS, V41_FAMILY: V41_BACKENDS}.get(VARIANTS[variant].family, (OURS, *PEERS.values()))


def validate_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Check one worker spec (:mod:`.worker`); returns it. Raises ``ValueError`` naming the field."""
    if not isinstance(spec, dict):
        raise ValueError(f"spec must be a dict, got {type(spec).__name__}")
    _need(spec, _SPEC_FIELDS, "spec")
    from .models import VARIANTS

    for key, allowed in (("task", TASKS), ("backend", BACKENDS), ("kv_cache_dtype", KV_CACHE_DTYPES),
                         ("mode", MODES), ("variant", tuple(VARIANTS))):
        if spec[key] not in allowed:
            raise ValueError(f"spec field {key!r} must be one of {allowed}, got {spec[key]!r}")
    for kv, peer in PEERS.items():
        if spec["backend"] == peer and spec["kv_cache_dtype"] != kv:
            raise ValueError(f"spec: {peer} reads only {kv} caches here, got {spec['kv_cache_dtype']!r}")
    if spec["backend"] not in variant_backends(spec["variant"]):
        raise ValueError(f"spec: variant {spec['variant']!r} cannot run backend {spec['backend']!r} "
                         f"(DeepSeek-V4 variants take {V4_BACKENDS}, V4.1 variants {V41_BACKENDS}, the others "
                         f"{(OURS, *PEERS.values())})")
    if spec["backend"] in V4_BACKENDS + V41_BACKENDS and spec["kv_cache_dtype"] != "fp8_ds_mla":
        raise ValueError(f"spec: {spec['backend']} reads only fp8_ds_mla caches, got {spec['kv_cache_dtype']!r}")
    if spec["task"] == "generate":
        _need(spec, _GENERATE_FIELDS, "generate spec")
        if spec["max_tokens"] < 1 or any(not isinstance(n, int) or n < 1 for n in spec["prompts"]):
            raise ValueError("generate spec: max_tokens and every prompt length must be positive ints")
        if max(spec["prompts"]) + spec["max_tokens"] > spec["max_model_len"]:
            raise ValueError("generate spec: the longest prompt plus max_tokens exceeds max_model_len")
    elif spec["task"] == "trace":
        t = spec.get("trace")
        if not isinstance(t, dict):
            raise ValueError("trace spec: missing dict field 'trace'")
        _need(t, {"target_len": int, "others": int, "max_tokens": int}, "trace spec")
        if spec["mode"] != "eager":
            raise ValueError("trace spec: mode must be 'eager' (CUDA-graph replays skip the module hooks)")
        if t["target_len"] + t["max_tokens"] > spec["max_model_len"] or min(t.values()) < 1:
            raise ValueError("trace spec: lengths must be positive and fit max_model_len")
    else:
        s = spec.get("serving")
        if not isinstance(s, dict):
            raise ValueError("serving spec: missing dict field 'serving'")
        _need(s, {"contexts": list, "batch": dict, "new_tokens": int, "repeats": int}, "serving spec")
        for c in s["contexts"]:
            if str(c) not in s["batch"]:
                raise ValueError(f"serving spec: no batch size for context {c}")
            if c + s["new_tokens"] + 1 > spec["max_model_len"]:
                raise ValueError(f"serving spec: context {c} + new tokens exceeds max_model_len")
    _validate_parallel(spec)
    return spec


#: The engine's parallel layout (``spec["parallel"]``, optional; absent: one GPU, vLLM's in-process executor). Data
#: parallelism is not among them: vLLM's offline ``LLM`` refuses ``data_parallel_size`` > 1 in one process (one
#: process per rank, or ``vllm serve``, which this worker is not).
PARALLEL_FIELDS = {"tensor_parallel_size": int, "enable_expert_parallel": bool, "executor": str}
EXECUTORS = ("uni", "mp")
#: Spec flags whose hooks wrap code in the driver process only: they see nothing of separate worker processes.
IN_PROCESS_HOOKS = ("count_calls", "shadow_indexer", "shadow_attention", "shadow_portable")


def _validate_parallel(spec: dict[str, Any]) -> None:
    par = spec.get("parallel")
    if par is None:
        return
    if not isinstance(par, dict):
        raise ValueError(f"spec field 'parallel' must be a dict, got {type(par).__name__}")
    _need(par, PARALLEL_FIELDS, "spec parallel")
    if set(par) - set(PARALLEL_FIELDS):
        raise ValueError(f"spec parallel: unknown fields {sorted(set(par) - set(PARALLEL_FIELDS))} (data parallelism "
                         "needs one process per rank or vllm serve, not this worker)")
    if par["tensor_parallel_size"] < 1:
        raise ValueError("spec parallel: tensor_parallel_size must be >= 1")
    if par["executor"] not in EXECUTORS:
        raise ValueError(f"spec parallel: executor must be one of {EXECUTORS}, got {par['executor']!r}")
    if par["tensor_parallel_size"] > 1 and par["executor"] != "mp":
        raise ValueError("spec parallel: tensor_parallel_size > 1 runs its ranks in worker processes (executor 'mp')")
    separate = par["executor"] == "mp"
    hooked = [k for k in IN_PROCESS_HOOKS if spec.get(k)]
    if separate and hooked:
        raise ValueError(f"spec: {hooked} hook the driver process only; with worker processes (parallel "
                         f"{par}) they would count nothing")


def validate_results(doc: dict[str, Any]) -> dict[str, Any]:
    """Check a results document: header fields, and each section present is well-formed."""
    _need(doc, {"schema": int, "date": str, "commit": str, "gpu": str, "versions": dict}, "results")
    if doc["schema"] != SCHEMA_VERSION:
        raise ValueError(f"results: schema must be {SCHEMA_VERSION}, got {doc['schema']}")
    for key in ("vllm", "torch", "triton"):
        if not isinstance(doc["versions"].get(key), str):
            raise ValueError(f"results: versions.{key} must be a string")
    if "correctness" in doc:
        for row in doc["correctness"]:
            _need(row, {"variant": str, "mode": str, "kv_cache_dtype": str, "ours": str, "peer": str,
                        "ok": bool}, "correctness row")
            if row["ok"]:
                _need(row, {"prompts": list, "all_identical": bool}, "correctness row")
                for p in row["prompts"]:
                    _need(p, {"length": int, "generated": int, "prefix": int, "equal": float, "first_logprob_diff": float},
                          "correctness prompt")
    if "serving" in doc:
        for row in doc["serving"]:
            _need(row, {"variant": str, "backend": str, "kv_cache_dtype": str, "ok": bool}, "serving row")
            if row["ok"]:
                for r in row["contexts"]:
                    _need(r, {"context": int, "ttft_ms": float, "tpot_ms": float, "decode_tok_s": float},
                          "serving context")
    if "soak" in doc:
        if not isinstance(doc["soak"], list):
            raise ValueError(f"soak: expected a list of soak runs, got {type(doc['soak']).__name__}")
        for run in doc["soak"]:
            _need(run, {"name": str, "backend": str, "ok": bool}, "soak run")
            if "error" not in run:
                _need(run, {"requests": int, "errors": int, "duration_s": float, "compared": int, "identical": int,
                            "near_tie": int, "mismatch": int, "preemptions": int}, "soak run")
    return doc

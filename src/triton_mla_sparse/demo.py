"""``triton-mla-sparse demo``: one GLM-5-shaped sparse attention step on embedded (seeded random) data.

On a GPU: a decode batch of 64 requests, 8 heads (GLM-5 under TP8), D_qk 576, top-k 2048 of 8192 tokens per request,
block 64, bf16 cache. On a CPU the same step at a reduced size runs through the Triton interpreter in float16
(the interpreter's bf16 dots are not exact). The result is checked against the float32 reference.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from .bench import GLM5_SCALE, Case, build_inputs, config_str, rel_err

GPU_CASE = Case(name="demo", kind="decode", rows=64, heads=8, topk=2048, ctx=8192, kv_format="bf16", requests=64,
                block_size=64, q_dtype="bfloat16", softmax_scale=GLM5_SCALE)
CPU_CASE = Case(name="demo-cpu", kind="decode", rows=2, heads=8, topk=256, ctx=1024, kv_format="fp16", requests=2,
                block_size=64, q_dtype="float16", softmax_scale=GLM5_SCALE)
TOLERANCE = {"bfloat16": 1e-2, "float16": 3e-3}


def run_demo(device: str = "auto", seed: int = 0, log=None) -> int:
    """Run the demo; returns 0 when the error is within tolerance, 1 otherwise."""
    log = log or (lambda s: print(s, flush=True))
    from . import reference
    from .api import sparse_mla_attention, sparse_mla_attention_with_config

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    case = GPU_CASE if on_gpu else CPU_CASE
    dev_name = torch.cuda.get_device_name(dev) if on_gpu else "CPU (Triton interpreter)"
    log(f"running sparse MLA decode on {dev_name} … {case.rows} requests × {case.heads} heads, D_qk 576, "
        f"top-k {case.topk} of {case.ctx} tokens each, block {case.block_size}, {case.kv_format} cache, "
        f"{case.q_dtype} q, seed {seed}")
    inp = build_inputs(case, dev, seed)
    args = (inp.q, inp.kv_cache, inp.indices, inp.softmax_scale)
    kw = dict(kv_format=inp.kv_format)

    t0 = time.perf_counter()
    out, cfg = sparse_mla_attention_with_config(*args, **kw, return_config=True)
    if on_gpu:
        torch.cuda.synchronize(dev)
    first_ms = (time.perf_counter() - t0) * 1e3
    log(f"kernel: {config_str(cfg)}")

    ref = reference.sparse_mla_attention(*args, **kw, compute_dtype=torch.float32, out_dtype=torch.float32)
    err = rel_err(out, ref)
    tol = TOLERANCE[case.q_dtype]

    if on_gpu:
        times = []
        for _ in range(3):
            sparse_mla_attention(*args, **kw, out=out)
        for _ in range(20):
            st = torch.cuda.Event(enable_timing=True)
            en = torch.cuda.Event(enable_timing=True)
            st.record()
            sparse_mla_attention(*args, **kw, out=out)
            en.record()
            en.synchronize()
            times.append(st.elapsed_time(en))
        ms = statistics.median(times)
        tflops = case.flops / (ms * 1e-3) / 1e12
        gbps = inp.unique_bytes / (ms * 1e-3) / 1e9
        log(f"time: {ms:.4f} ms (median of 20 calls, CUDA events; first call with compilation "
            f"{first_ms:.0f} ms), {tflops:.1f} TFLOP/s, {gbps:.0f} GB/s of unique bytes")
    else:
        log(f"time: {first_ms:.0f} ms wall (Triton interpreter on the CPU: a correctness run, not a speed)")
    ok = err <= tol
    log(f"relative error vs float32 reference: {err:.2e} (tolerance {tol:.0e}) -> {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo())

"""``triton-mla-sparse demo``: one GLM-5-shaped sparse attention step on seeded random data, checked and timed.

On a GPU: a decode batch of 64 requests, 8 heads (GLM-5 under TP8), D_qk 576, top-k 2048 of 8192 tokens per request,
block 64, bf16 cache. On a CPU the same step at a reduced size runs through the Triton interpreter in float16
(the interpreter's bf16 dots are not exact). The result is checked against the float32 reference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._device import prepare_device

@dataclass(frozen=True)
class DemoCase:
    requests: int
    heads: int
    topk: int
    ctx: int
    kv_format: str
    q_dtype: torch.dtype
    block_size: int = 64

    @property
    def flops(self) -> int:
        return 2 * self.heads * self.topk * (576 + 512) * self.requests


GPU_CASE = DemoCase(requests=64, heads=8, topk=2048, ctx=8192, kv_format="bf16", q_dtype=torch.bfloat16)
CPU_CASE = DemoCase(requests=2, heads=8, topk=256, ctx=1024, kv_format="fp16", q_dtype=torch.float16)


def run_demo(device: str = "auto", seed: int = 0, log: Callable[[str], None] | None = None) -> int:
    """Run the demo; returns 0 when the error is within tolerance, 1 otherwise."""
    log = log or (lambda s: print(s, flush=True))
    from .. import reference, testing
    from ..ops.sparse_mla import sparse_mla_attention, sparse_mla_attention_with_config

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    case = GPU_CASE if on_gpu else CPU_CASE
    dev_name = torch.cuda.get_device_name(dev) if on_gpu else "CPU (Triton interpreter)"
    q_name = str(case.q_dtype).removeprefix("torch.")
    log(f"running sparse MLA decode on {dev_name} … {case.requests} requests × {case.heads} heads, D_qk 576, "
        f"top-k {case.topk} of {case.ctx} tokens each, block {case.block_size}, {case.kv_format} cache, "
        f"{q_name} q, seed {seed}")
    inp = testing.sparse_mla_inputs("decode", rows=case.requests, heads=case.heads, ctx=case.ctx, topk=case.topk,
                                    requests=case.requests, block_size=case.block_size, kv_format=case.kv_format,
                                    q_dtype=case.q_dtype, device=dev, seed=seed)
    args = (inp.q, inp.kv_cache, inp.indices, testing.GLM5_SOFTMAX_SCALE)
    kw = dict(kv_format=inp.kv_format)

    t0 = time.perf_counter()
    out, cfg = sparse_mla_attention_with_config(*args, **kw, return_config=True)
    if on_gpu:
        torch.cuda.synchronize(dev)
    first_ms = (time.perf_counter() - t0) * 1e3
    log(f"kernel: {cfg.describe()}")

    ref = reference.sparse_mla_attention(*args, **kw, compute_dtype=torch.float32, out_dtype=torch.float32)
    err = testing.rel_err(out, ref)

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
        log(f"time: {ms:.4f} ms (median of 20 calls, CUDA events; first call with compilation "
            f"{first_ms:.0f} ms), {case.flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s, "
            f"{inp.unique_bytes / (ms * 1e-3) / 1e9:.0f} GB/s of unique bytes")
    else:
        log(f"time: {first_ms:.0f} ms wall (Triton interpreter on the CPU: a correctness run, not a speed)")
    tol = testing.OUTPUT_TOLERANCE[case.q_dtype]
    ok = err <= tol
    log(f"relative error vs float32 reference: {err:.2e} (tolerance {tol:.0e}) -> {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    prepare_device(want_cpu=args.device == "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("triton-mla-sparse demo: --device cuda, but no CUDA GPU is available", file=sys.stderr)
        return 2
    return run_demo(device=args.device, seed=args.seed)


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="run one GLM-5-shaped sparse attention step on random data and check it",
                       description="One GLM-5-shaped sparse MLA decode step (8 heads, D_qk 576, top-k 2048 of 8192 "
                                   "tokens, block 64, bf16 cache) on seeded random data, checked against the float32 "
                                   "reference and timed. Without a GPU a reduced size runs through the Triton "
                                   "interpreter in float16. Exits 1 if the error exceeds the tolerance.")
    d.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where to run (default: cuda when available, else the CPU interpreter)")
    d.add_argument("--seed", type=int, default=0, help="random seed of the generated data (default 0)")
    d.set_defaults(run=run)

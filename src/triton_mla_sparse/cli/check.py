"""``triton-mla-sparse check``: every format and both kernels against the reference on the current GPU (reduced
sizes through the Triton interpreter without one)."""

from __future__ import annotations

import argparse
import math
import time

import torch

from ..capabilities import arch_for_device, describe_device
from ._device import prepare_device

# (heads, rows, topk, slots): a GLM-5 TP8 decode, a DeepSeek-V3.2 TP8 decode, a 64-head prefill, a 128-head step.
GPU_SIZES = [(8, 64, 2048, 8192), (16, 4, 2048, 8192), (64, 256, 512, 4096), (128, 8, 2048, 8192)]
CPU_SIZES = [(3, 2, 40, 128), (16, 3, 70, 256)]  # through the interpreter: tiny
CHECK_FORMATS = ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla/pow2", "fp8_ds_mla/fp32"]
SOFTMAX_SCALE = 0.0625


def _inputs(fmt: str, heads: int, rows: int, topk: int, slots: int, device: torch.device, q_dtype: torch.dtype,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """q, a [slots / 64, 64, row] cache in ``fmt`` and slot lists with out-of-range entries at both ends."""
    from ..testing import encode_cache

    kv_format, _, scale_format = fmt.partition("/")
    kv = torch.randn(slots // 64, 64, 576, generator=gen, device=device)
    cache, k_scale = encode_cache(kv, kv_format, scale_format=scale_format or "pow2")
    q = torch.randn(rows, heads, 576, generator=gen, device=device).to(q_dtype)
    idx = torch.randint(-8, slots + 8, (rows, topk), generator=gen, device=device, dtype=torch.int32)
    return q, cache, idx, ({} if k_scale is None else {"k_scale": k_scale})


def run_check(seed: int = 0) -> int:
    """Every supported format × both kernels against the float32 reference at a few sizes; 0 if all pass."""
    from .. import reference
    from ..ops.sparse_mla import sparse_mla_attention_with_config
    from ..testing import OUTPUT_TOLERANCE, nan_filled, rel_err

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda") if on_gpu else torch.device("cpu")
    arch = arch_for_device(device) if on_gpu else None
    where = f"{torch.cuda.get_device_name(device)} ({describe_device(device)}, {arch.name if arch else 'undeclared'})" \
        if on_gpu else "CPU (Triton interpreter, float16, reduced sizes)"
    print(f"triton-mla-sparse check on {where}", flush=True)
    q_dtype = torch.bfloat16 if on_gpu else torch.float16
    tol = OUTPUT_TOLERANCE[q_dtype]
    gen = torch.Generator(device=device).manual_seed(seed)
    sizes = GPU_SIZES if on_gpu else CPU_SIZES
    header = f"{'format':16s} {'kernel':8s} {'heads':>5s} {'rows':>5s} {'topk':>5s}  {'config':44s} {'rel err':>8s} " \
             f"{'lse err':>8s}  result"
    print(header)
    print("-" * len(header))
    failures = 0
    for fmt in CHECK_FORMATS:
        for heads, rows, topk, slots in sizes:
            q, cache, idx, kwargs = _inputs(fmt, heads, rows, topk, slots, device, q_dtype, gen)
            ref, ref_lse = reference.sparse_mla_attention(q, cache, idx, SOFTMAX_SCALE, return_lse=True,
                                                          out_dtype=torch.float32, **kwargs)
            for kernel in ("decode", "prefill"):
                t0 = time.time()
                try:
                    out = nan_filled((rows, heads, 512), q_dtype, device)
                    _, lse, cfg = sparse_mla_attention_with_config(q, cache, idx, SOFTMAX_SCALE, out=out,
                                                                   return_lse=True, kernel=kernel,
                                                                   return_config=True, **kwargs)
                    err = rel_err(out, ref)
                    finite = torch.isfinite(ref_lse)
                    same_inf = bool(torch.equal(finite, torch.isfinite(lse)))
                    lse_err = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
                    ok = math.isfinite(err) and err <= tol and same_inf and lse_err <= 1e-2
                    cfg_s, result = cfg.describe(), "pass" if ok else "FAIL"
                except Exception as e:  # noqa: BLE001 - reported as a failure of this cell
                    err = lse_err = float("nan")
                    cfg_s, result, ok = f"{type(e).__name__}: {e}"[:44], "FAIL", False
                failures += not ok
                print(f"{fmt:16s} {kernel:8s} {heads:5d} {rows:5d} {topk:5d}  {cfg_s:44s} {err:8.1e} {lse_err:8.1e}  "
                      f"{result} ({time.time() - t0:.1f} s)", flush=True)
    total = len(CHECK_FORMATS) * len(sizes) * 2
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


def _run_check(args: argparse.Namespace) -> int:
    prepare_device()
    return run_check(seed=args.seed)


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("check", help="self-test: every format and both kernels against the reference on this GPU",
                       description="Runs every supported kv format (bf16, fp16, fp8_e4m3, fp8_ds_mla with pow2 and "
                                   "fp32 scales) through both kernels at a few sizes against the float32 reference and "
                                   "prints a pass/fail table with errors and the chosen configs. Exits 1 on any "
                                   "failure. Without a GPU it runs reduced sizes through the Triton interpreter.")
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(run=_run_check)

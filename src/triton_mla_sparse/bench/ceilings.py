"""Ceilings measured in the same run as the cases: device copy bandwidth (bytes read + written), read-only
bandwidth (:func:`read_sum`, a streaming read) and the bf16 matmul rate. The cases' floors are derived from them.

:func:`read_sum`'s programs each read ``ITERS`` consecutive blocks of ``BLOCK`` int32 words and write one wrapped
int32 sum, so the loads cannot be dropped and the writes are negligible. Importing this module imports triton.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .util import short_exc


@triton.jit
def _read_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(ITERS):
        o = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + o, mask=o < n, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def read_sum(x: torch.Tensor, block: int = 4096, iters: int = 16, num_warps: int = 8) -> torch.Tensor:
    """Per-program wrapped int32 sums of the int32 view of the contiguous tensor ``x`` (its bytes a multiple of 4);
    returns the int32 vector of partial sums (their sum is the sum of the words, modulo 2^32)."""
    w = x.view(-1).view(torch.int32)  # view: a non-contiguous x is an error, not a silent copy
    progs = triton.cdiv(w.numel(), block * iters)
    out = torch.empty(progs, dtype=torch.int32, device=x.device)
    _read_sum_kernel[(progs,)](w, out, w.numel(), BLOCK=block, ITERS=iters, num_warps=num_warps)
    return out


def measure_ceilings(device: torch.device | str) -> dict:
    """Device copy bandwidth (bytes read + written), read-only bandwidth (the best of a few configurations of a
    streaming read of 2 GiB, :data:`READ_CONFIGS`) and the bf16 8192³ matmul rate, by do_bench medians. A read
    configuration that fails is skipped (``read_errors``); the copy and matmul ceilings never depend on it."""
    from triton.testing import do_bench

    src = torch.ones(1 << 30, dtype=torch.bfloat16, device=device)  # 2 GiB
    dst = torch.empty_like(src)
    ms = float(do_bench(lambda: dst.copy_(src), return_mode="median"))
    copy_gbps = 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9
    del dst
    out = {"copy_gbps": copy_gbps, "copy_ms_2GiB": ms}
    out.update(_measure_read(src, do_bench))
    del src
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    ms_mm = float(do_bench(lambda: torch.matmul(a, b), return_mode="median"))
    tflops = 2 * n ** 3 / (ms_mm * 1e-3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    out.update(bf16_tflops=tflops, matmul_ms_8192=ms_mm)
    return out


READ_CONFIGS = ((4096, 16, 8), (8192, 8, 16), (2048, 32, 4), (16384, 4, 16))  # (block, iters, warps) of read_sum


def _measure_read(src: torch.Tensor, do_bench: Callable[..., float]) -> dict:
    """Read-only bandwidth of ``src``: the fastest of :data:`READ_CONFIGS` (a lower bound on what the device can
    read: a kernel that only gathers cannot beat the device's true read bandwidth). A configuration that fails is
    skipped (``read_errors``); ``read_gbps`` is None only when all fail."""
    best, errors = None, []
    for block, iters, warps in READ_CONFIGS:
        label = f"block {block} x {iters}, {warps} warps"
        try:
            ms = float(do_bench(lambda: read_sum(src, block, iters, warps), return_mode="median"))
        except Exception as e:  # noqa: BLE001 - the other configurations and ceilings stay usable
            errors.append(f"{label}: {short_exc(e)}")
            continue
        if best is None or ms < best[0]:
            best = (ms, label)
    out = {"read_errors": errors} if errors else {}
    if best is None:
        return dict(out, read_gbps=None)
    gbps = src.numel() * src.element_size() / (best[0] * 1e-3) / 1e9
    return dict(out, read_gbps=gbps, read_ms_2GiB=best[0], read_config=best[1])

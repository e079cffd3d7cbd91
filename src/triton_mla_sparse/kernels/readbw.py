"""A streaming read of a large buffer, for the benchmark's read-bandwidth ceiling (``bench.measure_ceilings``).

Every program reads ``ITERS`` consecutive blocks of ``BLOCK`` int32 words and writes one wrapped int32 sum, so the
loads cannot be dropped and the writes are negligible (one word per ``BLOCK · ITERS · 4`` bytes read).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _read_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(ITERS):
        o = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + o, mask=o < n, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def read_sum(x, block: int = 4096, iters: int = 16, num_warps: int = 8):
    """Per-program wrapped int32 sums of the int32 view of the contiguous tensor ``x`` (its bytes a multiple of 4);
    returns the int32 vector of partial sums (their sum is the sum of the words, modulo 2^32)."""
    import torch

    w = x.view(-1).view(torch.int32)  # view: a non-contiguous x is an error, not a silent copy
    progs = triton.cdiv(w.numel(), block * iters)
    out = torch.empty(progs, dtype=torch.int32, device=x.device)
    _read_sum_kernel[(progs,)](w, out, w.numel(), BLOCK=block, ITERS=iters, num_warps=num_warps)
    return out

"""Launch configurations: block sizes, warps, stages and split counts, fixed per problem shape.

No autotuning at call time (it would re-benchmark inside a CUDA-graph capture): every choice is a pure function
of the problem's shape and the device's multiprocessor count.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch

KERNELS = ("auto", "decode", "prefill")


@dataclass(frozen=True)
class AttentionConfig:
    kernel: str  # "decode" (split top-k + combine) or "prefill" (one program per row and head block)
    block_h: int
    block_n: int
    num_splits: int
    split_len: int
    num_warps: int
    num_stages: int
    sw_fp8: bool = False  # decode e4m3 with integer operations (no fp8 conversion instructions on the target)
    programs_per_sm: int = 1  # resident programs per multiprocessor (registers/shared memory bound)
    combine_block_h: int = 8
    combine_warps: int = 4


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter on the CPU: a small "device" so both kernels get exercised


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _split_count(rows_x_heads: int, n_blocks: int, slots: int) -> int:
    """Splits of each row's list so the grid fills whole waves of ``slots`` resident programs.

    Measured on the H200 (benchmarks/NOTES.md): a grid of 1.2 waves ran 50% slower than one of 0.97 waves, so the
    choice maximises the filled fraction of the last wave, over at most two waves, preferring more splits on ties
    (more memory parallelism)."""
    best, best_score = 1, -1.0
    if rows_x_heads <= 0:
        return 1
    for ns in range(1, n_blocks + 1):
        progs = rows_x_heads * ns
        waves = -(-progs // slots)
        if waves > 2 and ns > 1:
            break
        score = progs / (waves * slots)
        if score >= best_score - 1e-9:
            best, best_score = ns, score
    return best


def choose_config(T: int, H: int, topk: int, device: torch.device, kernel: str = "auto",
                  **overrides) -> AttentionConfig:
    """Pick the kernel and its launch parameters for ``T`` rows, ``H`` heads and lists of ``topk`` slots.

    Heads are tiled by ``block_h`` (16..64, a power of two covering H where H <= 64), so every cache row gathered
    for a row is shared by up to 64 heads. The prefill kernel is chosen when rows × head blocks alone fill two waves
    of resident programs; otherwise the decode kernel splits each row's list so that the grid fills whole waves.
    ``overrides`` replace any field (tests and benchmarks use them to reach a specific configuration).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    block_h = overrides.pop("block_h", min(64, max(16, _next_pow2(H))))
    n_hb = -(-H // block_h)
    block_n = overrides.pop("block_n", 16 if interpreting() else 64)
    num_warps = 4 if block_h <= 16 else 8
    num_stages = 1 if interpreting() else 2
    per_sm = 2 if block_h <= 16 else 1
    slots = multiprocessor_count(device) * per_sm
    n_blocks = -(-topk // block_n)
    if kernel == "auto":
        kernel = "prefill" if T * n_hb >= 2 * slots or n_blocks == 1 else "decode"
    if kernel == "prefill":
        num_splits = 1
    else:
        num_splits = overrides.pop("num_splits", _split_count(T * n_hb, n_blocks, slots))
    split_len = -(-(-(-topk // num_splits)) // block_n) * block_n
    num_splits = -(-topk // split_len)
    cfg = AttentionConfig(kernel=kernel, block_h=block_h, block_n=block_n, num_splits=num_splits,
                          split_len=split_len, num_warps=num_warps, num_stages=num_stages, programs_per_sm=per_sm)
    return replace(cfg, **overrides) if overrides else cfg

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
    q_in_loop: bool = False
    fp8_fold: bool = False  # fp8_ds_mla: apply tile scales to scores/probabilities instead of the tile
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


def choose_config(T: int, H: int, topk: int, device: torch.device, kernel: str = "auto", **overrides) -> AttentionConfig:
    """Pick the kernel and its launch parameters for ``T`` rows, ``H`` heads and lists of ``topk`` slots.

    Heads are tiled by ``block_h`` (16..64, a power of two covering H where H <= 64), so every cache row gathered
    for a row is shared by up to 64 heads. The prefill kernel is chosen when rows × head blocks alone give at least
    two programs per multiprocessor; otherwise the decode kernel splits each row's list so that the grid does.
    ``overrides`` replace any field (tests and benchmarks use them to reach a specific configuration).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    block_h = min(64, max(16, _next_pow2(H)))
    block_h = overrides.pop("block_h", block_h)
    n_hb = -(-H // block_h)
    block_n = overrides.pop("block_n", 16 if interpreting() else 64)
    num_warps = 4 if block_h <= 16 else 8
    num_stages = 1 if interpreting() else 2
    sms = multiprocessor_count(device)
    n_blocks = -(-topk // block_n)
    want = 2 * sms
    if kernel == "auto":
        kernel = "prefill" if T * n_hb >= want or n_blocks == 1 else "decode"
    if kernel == "prefill":
        num_splits = 1
    else:
        num_splits = overrides.pop("num_splits", max(1, min(-(-want // max(1, T * n_hb)), n_blocks)))
    split_len = -(-(-(-topk // num_splits)) // block_n) * block_n
    num_splits = -(-topk // split_len)
    cfg = AttentionConfig(kernel=kernel, block_h=block_h, block_n=block_n, num_splits=num_splits,
                          split_len=split_len, num_warps=num_warps, num_stages=num_stages)
    return replace(cfg, **overrides) if overrides else cfg

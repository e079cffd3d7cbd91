"""The DSA "lightning indexer" on the Triton kernels: validation and the public functions.

``indexer_logits`` computes, for every query row t and request-local position p,
``logits[t, p] = Σ_h weights[t, h] · relu(<q[t, h], k[p]> · kscale[p])`` over the row's request (causal:
p <= positions[t]); ``indexer_topk`` returns the positions of each row's ``topk`` largest logits, picked by the
top-k operator (:mod:`triton_mla_sparse.ops.topk`). The contract is the docstring of
:func:`triton_mla_sparse.reference.indexer_logits` / :func:`~triton_mla_sparse.reference.indexer_topk` (plain
torch); the validation here is shared with them. Importing this module touches neither CUDA nor triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..._common.runtime import check_kernel_device, device_guard
from ..._common.validate import (MAX_GRID, check_int, check_int32, check_out, check_paged_strides, dtype_names,
                                 fail)
from ...formats import D_INDEX, INDEXER_ROW_BYTES
from ..topk import check_select, launch_select, select_workspace
from .configs import IndexerConfig, choose_indexer_config

__all__ = ["IndexerProblem", "check_indexer_inputs", "check_indexer_topk_inputs", "indexer_logits", "indexer_topk"]

MAX_INDEX_HEADS = 64  # DeepSeek-V3.2: 64, GLM-5: 32
Q_DTYPES = (torch.float8_e4m3fn, torch.float16, torch.bfloat16)  # the indexer's own: its q may be fp8 too
MAX_LEN = 2**31 - 2**16  # positions (and a chunk past the last) stay in int32 inside the kernels


@dataclass
class IndexerProblem:
    """Normalised inputs of one indexer call (no copies)."""

    q: torch.Tensor  # [T, Hi, 128], unit last stride
    weights: torch.Tensor  # float32 [T, Hi]
    k: torch.Tensor  # the cache tensor as given (the kernels use its base pointer and the strides below)
    k_fp8: bool  # vLLM's fp8 indexer layout (uint8) vs bf16/fp16 rows
    k_block_stride: int  # elements (bytes for fp8) between blocks
    k_row_stride: int  # elements between rows of a block (128 for fp8: values are packed)
    block_table: torch.Tensor  # int32 [R, max_blocks]
    req_id_per_token: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T]
    T: int
    Hi: int
    block_size: int
    num_blocks: int

    @property
    def q_fp8(self) -> bool:
        return self.q.dtype == torch.float8_e4m3fn

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def capacity(self) -> int:
        """Positions the block table can address: max_blocks · block_size."""
        return self.block_table.shape[1] * self.block_size


def _check_k_cache(k_cache, q_dtype, device):
    """(k, k_fp8, block_stride, row_stride, num_blocks, block_size) of an indexer K cache."""
    if not isinstance(k_cache, torch.Tensor):
        fail("k_cache", f"a uint8 tensor [num_blocks, block_size·{INDEXER_ROW_BYTES}] (vLLM's fp8 indexer layout) "
             f"or a float16/bfloat16 tensor [num_blocks, block_size, {D_INDEX}]", k_cache)
    if k_cache.device != device:
        fail("k_cache", f"device {device} (the device of q)", k_cache)
    if k_cache.dtype == torch.uint8:
        if k_cache.dim() == 4 and k_cache.shape[2] == 1 and k_cache.shape[3] == INDEXER_ROW_BYTES:
            nb, bs = k_cache.shape[:2]
            if k_cache.stride(3) != 1 or (bs > 1 and k_cache.stride(1) != INDEXER_ROW_BYTES):
                fail("k_cache", f"the bytes of each block contiguous (strides (*, {INDEXER_ROW_BYTES}, *, 1))",
                     f"strides {tuple(k_cache.stride())}")
        elif k_cache.dim() == 2 and k_cache.shape[1] > 0 and k_cache.shape[1] % INDEXER_ROW_BYTES == 0:
            nb, bs = k_cache.shape[0], k_cache.shape[1] // INDEXER_ROW_BYTES
            if k_cache.stride(1) != 1:
                fail("k_cache", "a unit stride in the last dimension", f"strides {tuple(k_cache.stride())}")
        else:
            fail("k_cache", f"shape [num_blocks, block_size·{INDEXER_ROW_BYTES}] or [num_blocks, block_size, 1, "
                 f"{INDEXER_ROW_BYTES}] for the uint8 fp8 indexer layout ({D_INDEX} e4m3 bytes + a float32 scale per "
                 f"token)", k_cache)
        block_stride = k_cache.stride(0)
        if nb > 1 and block_stride < bs * INDEXER_ROW_BYTES:
            fail("k_cache", f"a block stride of at least block_size·{INDEXER_ROW_BYTES} = "
                 f"{bs * INDEXER_ROW_BYTES} bytes", f"strides {tuple(k_cache.stride())}")
        if (nb > 1 and block_stride % 4) or k_cache.data_ptr() % 4:
            fail("k_cache", "blocks aligned to 4 bytes (the float32 scales): block stride and start divisible by 4",
                 f"strides {tuple(k_cache.stride())}, start offset {k_cache.data_ptr() % 16} mod 16")
        return k_cache, True, block_stride, D_INDEX, nb, bs
    if k_cache.dtype in (torch.float16, torch.bfloat16):
        if q_dtype != torch.float8_e4m3fn and k_cache.dtype != q_dtype:
            fail("k_cache", f"dtype {q_dtype} (the dtype of q) or the uint8 fp8 indexer layout", k_cache)
        k = k_cache[:, :, 0] if (k_cache.dim() == 4 and k_cache.shape[2] == 1) else k_cache
        if k.dim() != 3 or k.shape[2] != D_INDEX:
            fail("k_cache", f"shape [num_blocks, block_size, {D_INDEX}] (or [num_blocks, block_size, 1, {D_INDEX}])",
                 k_cache)
        nb, bs = k.shape[:2]
        check_paged_strides("k_cache", k, k_cache, D_INDEX)
        return k, False, k.stride(0), k.stride(1), nb, bs
    fail("k_cache", "dtype uint8 (vLLM's fp8 indexer layout), float16 or bfloat16", k_cache)


def check_indexer_inputs(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                         req_id_per_token: torch.Tensor, positions: torch.Tensor) -> IndexerProblem:
    """Validate the common arguments of the indexer functions; each failure is one ``ValueError`` naming the
    argument and the expectation, raised before anything is launched or written."""
    if not isinstance(q, torch.Tensor) or q.dtype not in Q_DTYPES:
        fail("q", f"a {dtype_names(Q_DTYPES)} tensor [T, Hi, {D_INDEX}]", q)
    if q.dim() != 3 or q.shape[2] != D_INDEX:
        fail("q", f"shape [T, Hi, {D_INDEX}] (index head dim {D_INDEX})", q)
    T, Hi = q.shape[:2]
    if not 1 <= Hi <= MAX_INDEX_HEADS:
        fail("q", f"1 to {MAX_INDEX_HEADS} index heads (DeepSeek-V3.2 has 64, GLM-5 32)", q)
    if q.stride(2) != 1:
        fail("q", "a unit stride in the last dimension", f"strides {q.stride()}")
    device = q.device
    if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
        fail("weights", f"a float32 tensor [{T}, {Hi}]", weights)
    if weights.shape != (T, Hi):
        fail("weights", f"shape [{T}, {Hi}] (rows and heads of q)", weights)
    if weights.device != device:
        fail("weights", f"device {device} (the device of q)", weights)
    k, k_fp8, block_stride, row_stride, nb, bs = _check_k_cache(k_cache, q.dtype, device)
    check_int32("block_table", block_table, "[num_requests, max_blocks]", 2, device)
    check_int32("req_id_per_token", req_id_per_token, f"[{T}]", 1, device, first=T)
    check_int32("positions", positions, f"[{T}]", 1, device, first=T)
    return IndexerProblem(q=q, weights=weights, k=k, k_fp8=k_fp8, k_block_stride=block_stride,
                          k_row_stride=row_stride, block_table=block_table, req_id_per_token=req_id_per_token,
                          positions=positions, T=T, Hi=Hi, block_size=bs, num_blocks=nb)


def _launch_logits(p: IndexerProblem, out: torch.Tensor, cfg: IndexerConfig, ws: torch.Tensor | None = None) -> None:
    from .kernels import launch_indexer_logits

    chunk = cfg.block_k * cfg.chunk_tiles
    if p.T * -(-out.shape[1] // chunk) > MAX_GRID:
        fail("max_len", f"rows · ceil(max_len / {chunk}) <= {MAX_GRID} programs (split the rows)",
             f"{p.T} rows and max_len {out.shape[1]}")
    launch_indexer_logits(p, out, cfg, ws)


def _deterministic_config(p: IndexerProblem) -> IndexerConfig:
    """One query row per logits program (row groups share K tiles in prefill: the head sum's order would follow the
    grouping), one kernel for every shape of call (the wgmma kernel takes decode-shaped calls only), torch.topk."""
    return choose_indexer_config(p, select="torch", rows_per_program=1, family="tl")


def indexer_logits(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                   req_id_per_token: torch.Tensor, positions: torch.Tensor, max_len: int, *,
                   out: torch.Tensor | None = None, deterministic: bool = False) -> torch.Tensor:
    """Indexer logits float32 ``[T, max_len]`` with the Triton kernel.

    Same arguments and result as :func:`triton_mla_sparse.reference.indexer_logits` (the contract): row t, column p
    holds ``Σ_h weights[t, h] · relu(<q[t, h], k[p]> · kscale[p])`` for request-local positions
    ``p <= positions[t]`` of request ``req_id_per_token[t]`` whose block is addressable, and -inf elsewhere.
    ``out=`` (float32 ``[T, max_len]``, any strides) receives the result when given. No host synchronisation.
    ``deterministic=True``: each row's logits are a function of that row's inputs alone (one query row per
    program; otherwise rows that share K tiles may sum their heads in another order), as in :func:`indexer_topk`.
    """
    p = check_indexer_inputs(q, weights, k_cache, block_table, req_id_per_token, positions)
    check_int("max_len", max_len, 0, MAX_LEN)
    check_out(out, torch.float32, (p.T, max_len), p.device)
    if not isinstance(deterministic, bool):
        fail("deterministic", "a bool", repr(deterministic))
    check_kernel_device(p.device)
    result = out if out is not None else torch.empty(p.T, max_len, dtype=torch.float32, device=p.device)
    if p.T and max_len:
        cfg = _deterministic_config(p) if deterministic else choose_indexer_config(p)
        with device_guard(p.device):
            _launch_logits(p, result, cfg)
    return result


def check_indexer_topk_inputs(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                              block_table: torch.Tensor, req_id_per_token: torch.Tensor, positions: torch.Tensor,
                              topk: int, max_len: int | None, out: torch.Tensor | None
                              ) -> tuple[IndexerProblem, int]:
    """Validate the arguments of ``indexer_topk`` (shared with the reference); returns (problem, max_len)."""
    p = check_indexer_inputs(q, weights, k_cache, block_table, req_id_per_token, positions)
    check_int("topk", topk, 1, MAX_LEN)
    if max_len is None:
        max_len = p.capacity
    check_int("max_len", max_len, 0, MAX_LEN)
    check_out(out, torch.int32, (p.T, topk), p.device)
    return p, max_len


def indexer_topk(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                 req_id_per_token: torch.Tensor, positions: torch.Tensor, topk: int, *, max_len: int | None = None,
                 out: torch.Tensor | None = None, select: str | None = None,
                 deterministic: bool = False) -> torch.Tensor:
    """Request-local positions int32 ``[T, topk]`` of each row's ``topk`` largest indexer logits (any order; -1
    padded when the row has fewer than ``topk`` candidates), with the Triton kernels.

    Same contract as :func:`triton_mla_sparse.reference.indexer_topk`. ``max_len`` bounds the positions considered
    (default: the block table's capacity, max_blocks · block_size); the logits kernel writes a float32
    ``[T, max_len]`` workspace, then a selection picks the positions without sorting: ``select="split"`` (this
    package's multi-program select: on long rows a counting bound and the row maximum, a histogram of the
    candidates at or above the bound (2048 bins up to the maximum; the top 11 key bits on short rows), then every
    program writes its positions above the threshold bin and the row's last program resolves the boundary bin by
    radix select; the default for decode rows on sm90, where it measured fastest, and under the interpreter),
    ``"torch"`` (``torch.topk``, a radix select; the default for prefill rows and other GPUs), or ``None`` = the
    configuration's choice. Shapes decide every allocation: no host synchronisation, CUDA-graph capturable. The
    result plugs into :func:`triton_mla_sparse.topk_to_slots`. ``deterministic=True``: each row's positions are a
    function of that row's inputs alone — not of the other rows of the call, their number, or ``max_len`` beyond
    the row's position (one query row per logits program, then ``torch.topk``; exact ties at the k-th logit are
    broken as ``torch.topk`` breaks them); ``select`` must then be None or ``"torch"``. vLLM's batch-invariant
    mode uses it.
    """
    p, max_len = check_indexer_topk_inputs(q, weights, k_cache, block_table, req_id_per_token, positions, topk,
                                           max_len, out)
    check_select(select)
    if not isinstance(deterministic, bool):
        fail("deterministic", "a bool", repr(deterministic))
    if deterministic and select not in (None, "torch"):
        fail("select", "None or 'torch' with deterministic=True (the split select's choice among equal keys "
             "follows atomic order)", repr(select))
    check_kernel_device(p.device)
    result = out if out is not None else torch.empty(p.T, topk, dtype=torch.int32, device=p.device)
    if p.T:
        if deterministic:
            cfg = _deterministic_config(p)
        else:
            cfg = choose_indexer_config(p, **({"select": select} if select else {}))
        logits = torch.empty(p.T, max_len, dtype=torch.float32, device=p.device)
        # the select's workspace is zeroed by the logits launch (one launch fewer than a memset)
        ws = select_workspace(cfg, p.T, p.device) if max_len else None
        with device_guard(p.device):
            if max_len:
                _launch_logits(p, logits, cfg, ws)
            launch_select(logits, result, topk, cfg, ws)
    return result

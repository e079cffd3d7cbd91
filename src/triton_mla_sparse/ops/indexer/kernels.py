"""Triton kernel of the DSA "lightning indexer"'s logits.

:func:`_indexer_logits_kernel`: one program per (group of ``ROWS`` query rows, chunk of request-local positions).
The group's q is loaded once as the transposed right operand [128, ROWS · heads]; per tile of ``BLOCK_K``
positions it gathers the K rows through the block table (fp8 indexer layout: per block ``block_size · 128`` e4m3
bytes, then ``block_size`` float32 scales; or bf16/fp16 rows), computes the scores ``k · qᵀ`` [BLOCK_K, heads] in
float32 (fp8 × fp8 tensor-core dots where the GPU has them, otherwise both operands decoded exactly into
fp16/bf16), scales each row by its K scale, applies relu and reduces over the heads with the weights inside each
thread's rows. Rows of one request (prefill) share each K tile; decode rows (one per request) use ``ROWS = 1``.
Positions past a row's own (or of a row with an invalid request id) get -inf and are never read.

:func:`launch_indexer_logits` launches it, or the Gluon kernel of :mod:`.kernels_wgmma` (same arguments; sm90
decode rows of e4m3 q over vLLM's fp8 cache) where the configuration's ``family`` says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from ..._common.fp8 import e4m3_to_f32 as _e4m3_to_f32
from ..._common.launch import CachedLauncher
from ..._common.runtime import interpreting

if TYPE_CHECKING:
    import torch

    from .api import IndexerProblem
    from .configs import IndexerConfig


@triton.jit
def _to_dot(raw, IS_FP8: tl.constexpr, SW_FP8: tl.constexpr, DOT_BF16: tl.constexpr):
    """Stored values -> the dot operand type (exact: every e4m3 value is representable in fp16 and bf16)."""
    if IS_FP8:
        x = _e4m3_to_f32(raw, SW_FP8)
    else:
        x = raw.to(tl.float32)
    if DOT_BF16:
        return x.to(tl.bfloat16)
    else:
        return x.to(tl.float16)


@triton.jit
def _row_scalar(v, o_r, r):
    """Element ``r`` of the small per-row vector ``v``."""
    return tl.sum(tl.where(o_r == r, v, 0), 0)


@triton.jit(do_not_specialize=["T", "max_len", "num_blocks", "R", "max_blocks", "n_chunks", "chunk", "ws_width"])
def _indexer_logits_kernel(
    q_ptr, w_ptr, k_ptr, bt_ptr, req_ptr, pos_ptr, out_ptr, ws_ptr,
    stride_q_t, stride_q_h, stride_w_t, stride_w_h,
    stride_k_blk, stride_k_row,
    stride_bt_r, stride_bt_c, stride_req, stride_pos, stride_o_t, stride_o_p, stride_ws_t,
    T, Hi, max_len, block_size, num_blocks, R, max_blocks, n_chunks, chunk, ws_width,
    Q_FP8: tl.constexpr, K_FP8: tl.constexpr, USE_FP8_DOT: tl.constexpr, DOT_BF16: tl.constexpr,
    SW_FP8: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
    ZERO_WS: tl.constexpr,
):
    """One program per (group of ROWS consecutive rows, chunk of ``chunk`` positions, a multiple of BLOCK_K).

    The group's q is loaded once, transposed, as the [128, ROWS·BLOCK_H] right operand; per tile of BLOCK_K
    positions the scores come from one dot ``k [BLOCK_K, 128] · qᵀ`` (heads along N, so the weighted ReLU sum
    over heads stays inside each thread's row), and each row of the group stores its logits. Rows of one
    request share every K tile (prefill); a group whose rows belong to different requests is done one row per
    pass. Columns past a row's position (or of a row with an invalid request id) are -inf and never read.
    ``ZERO_WS``: the program of chunk 0 also zeroes its rows' ``ws_width`` int32 of ``ws`` (the split select's
    workspace, used by the kernels launched after this one: one launch fewer than a separate memset)."""
    RH: tl.constexpr = ROWS * BLOCK_H
    pid = tl.program_id(0)
    g = pid // n_chunks
    k0 = (pid % n_chunks) * chunk
    k1 = tl.minimum(k0 + chunk, max_len)  # this program writes columns [k0, k1)
    o_b = tl.arange(0, BLOCK_K)
    o_d = tl.arange(0, 128)
    o_r = tl.arange(0, ROWS)
    o_j = tl.arange(0, RH)
    t_r = g.to(tl.int64) * ROWS + o_r
    m_r = t_r < T
    pos_r = tl.load(pos_ptr + t_r * stride_pos, mask=m_r, other=-1)
    req_r = tl.load(req_ptr + t_r * stride_req, mask=m_r, other=-1)
    req0 = _row_scalar(req_r, o_r, 0)
    uniform = tl.sum(((req_r != req0) & m_r).to(tl.int32), 0) == 0

    # q of the group, transposed: column j = (row j // BLOCK_H, head j % BLOCK_H); padded heads/rows are 0.
    row_j = o_j // BLOCK_H
    head_j = o_j % BLOCK_H
    t_j = g.to(tl.int64) * ROWS + row_j
    m_j = (head_j < Hi) & (t_j < T)
    b_q = tl.load(q_ptr + t_j[None, :] * stride_q_t + head_j[None, :].to(tl.int64) * stride_q_h + o_d[:, None],
                  mask=m_j[None, :], other=0)
    if USE_FP8_DOT:
        q_t = b_q.to(tl.float8e4nv, bitcast=True)
    else:
        q_t = _to_dot(b_q, Q_FP8, SW_FP8, DOT_BF16)
    b_w = tl.load(w_ptr + t_j * stride_w_t + head_j * stride_w_h, mask=m_j, other=0.0)

    n_pass = tl.where(uniform, 1, ROWS)
    for i_p in range(0, n_pass):
        act_r = m_r & (uniform | (o_r == i_p))
        req = tl.where(uniform, req0, _row_scalar(req_r, o_r, i_p))
        req_ok = (req >= 0) & (req < R)
        # candidate columns of active row r: [k0, hi_r); the pass computes tiles up to the largest
        hi_r = tl.where(act_r & req_ok, tl.minimum(k1 - 1, pos_r) + 1, k0)
        hi = tl.max(tl.maximum(hi_r, k0), 0)
        bt_row = bt_ptr + tl.where(req_ok, req, 0).to(tl.int64) * stride_bt_r
        for kk in range(k0, hi, BLOCK_K):
            o_k = kk + o_b
            col = o_k // block_size
            m_k = (o_k < hi) & (col < max_blocks)
            blk = tl.load(bt_row + tl.where(m_k, col, 0).to(tl.int64) * stride_bt_c, mask=m_k, other=-1)
            m_k = m_k & (blk >= 0) & (blk < num_blocks)
            blk = tl.where(m_k, blk, 0).to(tl.int64)
            off = tl.where(m_k, o_k - col * block_size, 0).to(tl.int64)
            p_blk = k_ptr + blk * stride_k_blk
            b_k = tl.load((p_blk + off * stride_k_row)[:, None] + o_d[None, :], mask=m_k[:, None], other=0)
            if USE_FP8_DOT:
                b_s = tl.dot(b_k.to(tl.float8e4nv, bitcast=True), q_t)
            else:
                b_s = tl.dot(_to_dot(b_k, K_FP8, SW_FP8, DOT_BF16), q_t)
            if K_FP8:
                p_sc = (p_blk + block_size * 128 + off * 4).to(tl.pointer_type(tl.float32))
                b_s = b_s * tl.load(p_sc, mask=m_k, other=0.0)[:, None]
            b_v = tl.maximum(b_s, 0.0) * b_w[None, :]
            for r in tl.static_range(ROWS):
                if ROWS == 1:
                    val = tl.sum(b_v, 1)
                else:
                    val = tl.sum(tl.where((row_j == r)[None, :], b_v, 0.0), 1)
                cand = m_k & (o_k < _row_scalar(hi_r, o_r, r))
                act = (o_k * 0 + _row_scalar(act_r.to(tl.int32), o_r, r)) != 0  # (a vector: the interpreter
                tl.store(out_ptr + (g.to(tl.int64) * ROWS + r) * stride_o_t + o_k.to(tl.int64) * stride_o_p,
                         tl.where(cand, val, float("-inf")), mask=(o_k < k1) & act)  # rejects scalar masks)
        # the rest of the chunk for the active rows: -inf
        k_fill = k0 + tl.cdiv(hi - k0, BLOCK_K) * BLOCK_K
        for kk in range(k_fill, k1, BLOCK_K):
            o_k = kk + o_b
            for r in tl.static_range(ROWS):
                act = (o_k * 0 + _row_scalar(act_r.to(tl.int32), o_r, r)) != 0
                tl.store(out_ptr + (g.to(tl.int64) * ROWS + r) * stride_o_t + o_k.to(tl.int64) * stride_o_p,
                         tl.full([BLOCK_K], float("-inf"), dtype=tl.float32), mask=(o_k < k1) & act)
    if ZERO_WS:
        if pid % n_chunks == 0:
            o_z = tl.arange(0, 1024)
            for r in tl.static_range(ROWS):
                t_z = g.to(tl.int64) * ROWS + r
                for z in range(0, ws_width, 1024):
                    tl.store(ws_ptr + t_z * stride_ws_t + z + o_z, tl.zeros([1024], dtype=tl.int32),
                             mask=(z + o_z < ws_width) & (o_z + t_z < T + o_z))  # (vector: interpreter)


_launch_logits = CachedLauncher(_indexer_logits_kernel)


def launch_indexer_logits(p: IndexerProblem, out: torch.Tensor, cfg: IndexerConfig,
                          ws: torch.Tensor | None = None) -> None:
    """Logits of the validated problem ``p`` (an ``IndexerProblem``) into ``out`` float32 [T, max_len]; with ``ws``
    (an int32 [T, W] workspace, unit last stride) the kernel also zeroes ``ws`` (the split select's workspace: see
    :func:`triton_mla_sparse.ops.topk.select_workspace`). ``cfg.family`` picks the kernel; a wgmma configuration
    on a problem that :func:`.configs.wgmma_refusal` refuses runs the tl kernel's configuration instead."""
    import torch

    T, max_len = p.T, out.shape[1]
    if cfg.family == "wgmma":
        from ...capabilities import arch_for_device
        from .configs import choose_indexer_config, wgmma_refusal

        if wgmma_refusal(p, arch_for_device(p.device)) is not None:
            cfg = choose_indexer_config(p, family="tl")
    chunk = cfg.block_k * cfg.chunk_tiles
    n_chunks = triton.cdiv(max_len, chunk)
    if T == 0 or n_chunks == 0:
        return
    if ws is not None and (ws.dtype != torch.int32 or ws.dim() != 2 or ws.shape[0] != T or ws.stride(1) != 1):
        raise ValueError(f"ws: expected an int32 tensor [{T}, W] with a unit last stride, got {ws.dtype} "
                         f"{tuple(ws.shape)} strides {ws.stride()}")
    rows = cfg.rows_per_program
    q = p.q.view(torch.uint8) if p.q_fp8 else p.q
    args = (
        q, p.weights, p.k, p.block_table, p.req_id_per_token, p.positions, out, out if ws is None else ws,
        q.stride(0), q.stride(1), p.weights.stride(0), p.weights.stride(1),
        p.k_block_stride, p.k_row_stride,
        p.block_table.stride(0), p.block_table.stride(1), p.req_id_per_token.stride(0), p.positions.stride(0),
        out.stride(0), out.stride(1), 0 if ws is None else ws.stride(0),
        T, p.Hi, max_len, p.block_size, p.num_blocks, p.block_table.shape[0], p.block_table.shape[1], n_chunks,
        chunk, 0 if ws is None else ws.shape[1])
    opts = {"maxnreg": cfg.maxnreg} if cfg.maxnreg and not interpreting() else {}
    if cfg.family == "wgmma":
        from .kernels_wgmma import launch_logits_wgmma

        launch_logits_wgmma((T * n_chunks,), args,
                            dict(BLOCK_H=cfg.block_h, STAGES=cfg.num_stages, ZERO_WS=ws is not None),
                            num_warps=cfg.num_warps, num_stages=1, **opts)
        return
    _launch_logits((triton.cdiv(T, rows) * n_chunks,), args,
                   dict(Q_FP8=p.q_fp8, K_FP8=p.k_fp8, USE_FP8_DOT=cfg.use_fp8_dot, DOT_BF16=cfg.dot_bf16,
                        SW_FP8=cfg.sw_fp8, BLOCK_H=cfg.block_h, BLOCK_K=cfg.block_k, ROWS=rows,
                        ZERO_WS=ws is not None),
                   num_warps=cfg.num_warps, num_stages=cfg.num_stages, **opts)

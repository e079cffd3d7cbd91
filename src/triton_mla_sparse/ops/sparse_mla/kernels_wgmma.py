"""Gluon kernel for sparse MLA attention on Hopper (sm90) with 64-head blocks: cp.async gathers, wgmma dots.

The memory pipeline, the grid, the arguments and the outputs are those of :mod:`.kernels_mma2` (whose helpers it
uses); the dots are warpgroup MMAs reading both operands from shared memory, which is what makes 64 heads per program
pay: one operand read serves a whole warpgroup, where mma.sync makes every warp read its own copy of q.

Eight warps form two warpgroups. The scores ``[64, BLOCK_N]`` are split between them along the tile's rows, the
probabilities go through shared memory (each warpgroup needs all of them), and the output ``[64, 512]`` is split
along its columns (four ``[64, 128]`` float32 accumulators, 128 registers per thread). fp8_ds_mla rows are
dequantised once per tile as in the mma2 kernel (bf16 exact values; float16 in chunk units with ``F16_DOT``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _ac
from triton.runtime.jit import constexpr_function

from ..._common.launch import CachedLauncher
from ..._common.pdl import launch_dependents as _launch_dependents
from .kernels_mma2 import (LATENT, _barrier, _chunk_scales, _dequant_tile, _dequant_tile_exact, _gather_layout,
                           _ids_at, _issue_at, _mask_slots, _prologue, _q_buffers, _q_to_shared, _row_range,
                           _softmax_step, _store_outputs, _tile_buffers)


@constexpr_function
def _wg_layout(n):
    """A wgmma accumulator of 64 rows: four warps along the rows, the two warpgroups side by side along ``n``
    columns."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, n // 2, 16])


@gluon.jit
def _qk_chunk(q_s, k_t, b_s, s_c, C: gl.constexpr):
    """fp8_ds_mla: the scores of latent chunk C (two 64-column dots from zero), times the chunk's scale."""
    b_c = gl.zeros_like(b_s)
    b_c = hopper.warpgroup_mma(q_s.slice(C * 128, 64, dim=1), k_t.slice(C * 128, 64, dim=1).permute([1, 0]), b_c)
    b_c = hopper.warpgroup_mma(q_s.slice(C * 128 + 64, 64, dim=1),
                               k_t.slice(C * 128 + 64, 64, dim=1).permute([1, 0]), b_c)
    return b_s + b_c * s_c


@constexpr_function
def _p_layout(block_h, block_n, dtype):
    """The probabilities' shared tile: the widest swizzle its rows allow."""
    return gl.NVMMASharedLayout.get_default_for([block_h, block_n], dtype)


@gluon.jit(do_not_specialize=["T", "topk", "num_slots", "num_splits", "split_len", "topk2", "num_slots2"])
def _sparse_mla_fwd_wgmma(
    q_nope_ptr, q_pe_ptr, kv_ptr, idx_ptr, topk_len_ptr, sink_ptr, k_scale_ptr, out_ptr, lse_ptr,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
    stride_kv_blk, stride_kv_row,
    stride_idx_t, stride_idx_k, stride_tl, stride_sink,
    stride_o_t, stride_o_s, stride_o_h,
    stride_l_t, stride_l_s, stride_l_h,
    T, H, topk, num_slots, block_size, num_splits, split_len,
    sm_scale_log2, k_scale,
    kv2_ptr, idx2_ptr, topk_len2_ptr, stride_kv2_blk, stride_kv2_row, stride_idx2_t, stride_idx2_k, stride_tl2,
    topk2, num_slots2, block_size2,
    FMT: gl.constexpr, HAS_ROPE: gl.constexpr, HAS_TOPK_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
    SPLIT: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    SW_FP8: gl.constexpr, F16_DOT: gl.constexpr, PDL: gl.constexpr,
    HAS_EXTRA: gl.constexpr, HAS_TOPK_LEN2: gl.constexpr,
):
    gl.static_assert(BLOCK_H == 64, "the wgmma kernel runs 64-head blocks")
    gl.static_assert(gl.num_warps() == 8, "the wgmma kernel runs two warpgroups")
    i_ts = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_t = (i_ts // num_splits).to(gl.int64)
    i_s = i_ts % num_splits
    dt: gl.constexpr = q_nope_ptr.dtype.element_ty
    UNITS: gl.constexpr = F16_DOT if FMT == 2 else False  # as in kernels_mma2.py
    lt: gl.constexpr = gl.float16 if UNITS else dt

    S_L: gl.constexpr = _wg_layout(BLOCK_N)
    O_L: gl.constexpr = _wg_layout(128)
    ROW: gl.constexpr = gl.SliceLayout(1, _gather_layout(8, gl.num_warps()))

    q_s, qr_s, rope_s = _q_buffers(lt, dt, BLOCK_H, BLOCK_N, STAGES)
    p_s = gl.allocate_shared_memory(lt, [BLOCK_H, BLOCK_N], _p_layout(BLOCK_H, BLOCK_N, lt))
    raw_s, sc_s, lat_s = _tile_buffers(lt, dt, FMT, BLOCK_N, STAGES)
    b_qmax = _q_to_shared(q_nope_ptr, q_pe_ptr, i_t, i_hb, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H,
                          q_s, qr_s, UNITS, HAS_ROPE, BLOCK_H)
    if UNITS:
        b_qmax = gl.convert_layout(b_qmax, gl.SliceLayout(1, S_L))
    n_start, n_end, n_row, n_pad, n_tiles = _row_range(topk_len_ptr, i_t, stride_tl, topk, topk_len2_ptr,
                                                       stride_tl2, topk2, i_s, split_len, BLOCK_N, HAS_TOPK_LEN,
                                                       HAS_EXTRA, HAS_TOPK_LEN2)
    idx_nx = _prologue(i_t, n_start, n_end, n_row, n_pad, n_tiles, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
                       num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                       stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s, rope_s, sc_s,
                       FMT, HAS_ROPE, HAS_EXTRA, BLOCK_N, STAGES)
    ns_m = _mask_slots(num_slots, num_slots2, HAS_EXTRA)

    o_h = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, O_L))
    m_h = o_h < H
    o_c = gl.arange(0, 128, gl.SliceLayout(0, O_L))
    b_m = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))
    b_l = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, S_L))
    b_a0 = gl.zeros([BLOCK_H, 128], gl.float32, O_L)
    b_a1 = gl.zeros([BLOCK_H, 128], gl.float32, O_L)
    b_a2 = gl.zeros([BLOCK_H, 128], gl.float32, O_L)
    b_a3 = gl.zeros([BLOCK_H, 128], gl.float32, O_L)
    qk_scale = sm_scale_log2
    # fp8_ds_mla: accumulator c holds its output columns / s_run_c (kernels_mma2.py)
    s_run0 = 1.0
    s_run1 = 1.0
    s_run2 = 1.0
    s_run3 = 1.0

    for t in range(0, n_tiles):
        st = t % STAGES
        _ac.wait_group(STAGES - 2)
        # each thread's cp.async data (and, first, its q stores) ordered before the wgmma reads: fence, then barrier
        hopper.fence_async_shared()
        _barrier()  # tile t and q visible; every warp done with tile t - 1 and with the probabilities of t - 1
        t_nx = t + STAGES - 1
        idx_t = idx_nx
        idx_nx = _ids_at(n_start + (t_nx + 1) * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                         stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                         stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N,
                         ROW, HAS_EXTRA)
        if t_nx < n_tiles:
            _issue_at(n_start + t_nx * BLOCK_N, idx_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
                      num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                      stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s, rope_s, sc_s,
                      t_nx % STAGES, FMT, HAS_ROPE, HAS_EXTRA)
        _ac.commit_group()
        b_s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, S_L)
        if UNITS:
            s0, s1, s2, s3 = _chunk_scales(sc_s, st)
            _dequant_tile(raw_s, sc_s, lat_s.index(0), st, s0, s1, s2, s3, SW_FP8)
            hopper.fence_async_shared()
            _barrier()
            k_t = lat_s.index(0)
            hopper.fence_async_shared()  # cp.async and register stores -> the wgmma operand reads
            b_s = _qk_chunk(q_s, k_t, b_s, s0, 0)
            b_s = _qk_chunk(q_s, k_t, b_s, s1, 1)
            b_s = _qk_chunk(q_s, k_t, b_s, s2, 2)
            b_s = _qk_chunk(q_s, k_t, b_s, s3, 3)
            b_s = b_s * b_qmax[:, None]
        else:
            if FMT >= 2:
                _dequant_tile_exact(raw_s, sc_s, rope_s, lat_s.index(0), st, FMT, SW_FP8)
                hopper.fence_async_shared()
                _barrier()
                k_t = lat_s.index(0)
            else:
                k_t = lat_s.index(st)
            hopper.fence_async_shared()  # cp.async and register stores -> the wgmma operand reads
            for c in gl.static_range(LATENT // 64):
                b_s = hopper.warpgroup_mma(q_s.slice(c * 64, 64, dim=1),
                                           k_t.slice(c * 64, 64, dim=1).permute([1, 0]), b_s)
        if HAS_ROPE:
            b_s = hopper.warpgroup_mma(qr_s, rope_s.index(st).permute([1, 0]), b_s)
        # this tile's slot ids in the score layout, for the masks (loaded STAGES - 1 steps ago: a cache hit; loaded
        # here, not at the top of the step, so they hold no registers across the dots)
        idx_c = _ids_at(n_start + t * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
                        num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                        stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N,
                        gl.SliceLayout(0, S_L), HAS_EXTRA)
        b_p, b_alpha, b_m, b_l = _softmax_step(b_s, idx_c, ns_m, qk_scale, b_m, b_l)
        p_s.store(b_p.to(lt))
        hopper.fence_async_shared()
        _barrier()  # both warpgroups' probabilities in place
        b_al = gl.convert_layout(b_alpha, gl.SliceLayout(1, O_L))
        if UNITS:  # each accumulator moves to the units of its chunk's scale in this tile
            b_a0 = hopper.warpgroup_mma(p_s, k_t.slice(0 * 128, 128, dim=1), b_a0 * (b_al * (s_run0 / s0))[:, None])
            b_a1 = hopper.warpgroup_mma(p_s, k_t.slice(1 * 128, 128, dim=1), b_a1 * (b_al * (s_run1 / s1))[:, None])
            b_a2 = hopper.warpgroup_mma(p_s, k_t.slice(2 * 128, 128, dim=1), b_a2 * (b_al * (s_run2 / s2))[:, None])
            b_a3 = hopper.warpgroup_mma(p_s, k_t.slice(3 * 128, 128, dim=1), b_a3 * (b_al * (s_run3 / s3))[:, None])
            s_run0 = s0
            s_run1 = s1
            s_run2 = s2
            s_run3 = s3
        else:
            b_a0 = hopper.warpgroup_mma(p_s, k_t.slice(0 * 128, 128, dim=1), b_a0 * b_al[:, None])
            b_a1 = hopper.warpgroup_mma(p_s, k_t.slice(1 * 128, 128, dim=1), b_a1 * b_al[:, None])
            b_a2 = hopper.warpgroup_mma(p_s, k_t.slice(2 * 128, 128, dim=1), b_a2 * b_al[:, None])
            b_a3 = hopper.warpgroup_mma(p_s, k_t.slice(3 * 128, 128, dim=1), b_a3 * b_al[:, None])
    _ac.wait_group(0)
    if PDL:  # the combine kernel may start (and wait for this grid) once every program has left its loop
        _launch_dependents()

    b_inv = gl.where(b_l > 0, 1.0 / b_l, 0.0)
    b_lse2 = gl.where(b_l > 0, b_m + gl.log2(b_l), float("-inf"))
    b_inv = gl.convert_layout(b_inv, gl.SliceLayout(1, O_L))
    b_lse2 = gl.convert_layout(b_lse2, gl.SliceLayout(1, O_L))
    _store_outputs(out_ptr, lse_ptr, sink_ptr, i_t, i_s, stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s,
                   stride_l_h, stride_sink, o_h, m_h, o_c, b_inv, b_lse2, b_a0, b_a1, b_a2, b_a3, s_run0, s_run1,
                   s_run2, s_run3, SPLIT, HAS_SINK)


launch_fwd_wgmma = CachedLauncher(_sparse_mla_fwd_wgmma)

__all__ = ["launch_fwd_wgmma"]

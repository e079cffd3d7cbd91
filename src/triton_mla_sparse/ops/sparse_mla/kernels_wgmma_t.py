"""Gluon kernel for sparse MLA attention on Hopper (sm90) with few heads: wgmma with the cache rows along M.

A warpgroup MMA has 64 rows (M); with 8–32 heads per program, the 64-head kernel (:mod:`.kernels_wgmma`) pads the
heads to 64 and the mma.sync kernel (:mod:`.kernels_mma2`) makes every warp read all of q from shared memory for
each tile. This kernel swaps the operands instead, so M is the 64 rows of a tile and N the heads:

* scores, transposed: ``Sᵀ [64 rows, BLOCK_H] = K_tile [64, 576] · qᵀ [576, BLOCK_H]`` (both operands in shared
  memory; one warpgroup, 8 registers per thread at 16 heads);
* the softmax runs along the rows (axis 0); each thread keeps its own partial row sums, added up once at the end;
* output, transposed: ``Oᵀ [512, BLOCK_H] = Vᵀ [512, 64] · Pᵀ [64, BLOCK_H]``, Vᵀ read from the tile in shared
  memory in its stored order (an M-major operand) and Pᵀ written to shared memory once per tile; four
  ``[128, BLOCK_H]`` float32 accumulators (64 registers per thread at 16 heads).

The memory pipeline, grid, arguments and outputs are those of :mod:`.kernels_mma2` (whose helpers it uses): cp.async
row gathers STAGES − 1 tiles ahead, fp8_ds_mla rows and DeepSeek-V4 pages dequantised once per tile into a bf16 tile
of exact values, an extra cache after the main list. With ``OVERLAP`` (the fp8 formats) the loop is
software-pipelined: the next tile is dequantised one 128-column chunk at a time while this tile's four output MMAs
run, each chunk only after the MMA that reads those columns has completed in every warp (a wait, then a barrier).
With ``MERGE`` (a decode of at most two splits) the program that writes a row's last partial also merges the row's
partials into the final output and lse (:func:`_merge_if_last`, counted in with an arrival counter), so no combine
kernel runs after this one. One warpgroup per program (8 warps: two, each MMA on half the heads — measured slower,
kept buildable); a 64-row tile of bf16 rows takes 72 KB per stage, so a program fills most of an SM's shared
memory and the stages, not other programs, hide the gathers' latency.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _ac
from triton.runtime.jit import constexpr_function

from ..._common.launch import CachedLauncher
from ..._common.fp8 import e4m3_to_f32 as _e4m3_to_f32
from ..._common.pdl import launch_dependents as _launch_dependents
from .kernels_mma2 import (LATENT, ROPE, _barrier, _dequant_chunk_v4, _gather_layout, _ids_at, _issue_at,
                           _mask_slots, _prologue, _q_to_shared, _row_range, _tile_buffers)

DEQ_W = gl.constexpr(128)  # columns per step of the fp8_ds_mla dequantisation


@constexpr_function
def _t_layout(block_h, num_warps):
    """A wgmma accumulator with M (tile rows, or output columns) over a warpgroup's four warps and the heads along
    N, split between the warpgroups (8 warps: each MMA of the two runs on half the heads)."""
    wg = num_warps // 4
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, wg], instr_shape=[16, block_h // wg, 16])


@constexpr_function
def _pt_layout(block_n, block_h, dtype):
    """The transposed probabilities' shared tile: the widest swizzle its rows allow."""
    return gl.NVMMASharedLayout.get_default_for([block_n, block_h], dtype)


@constexpr_function
def _deq_layout(w, num_warps):
    """fp8 bytes of ``w`` columns per row: 16-byte vectors, a row's vectors over neighbouring lanes."""
    return gl.BlockedLayout([1, 16], [32 * 16 // w, w // 16], [num_warps, 1], [1, 0])


@constexpr_function
def _deq_scale_layout(w, num_warps):
    """A tile's four chunk scales per row, the rows over the threads as in :func:`_deq_layout`."""
    return gl.BlockedLayout([1, 4], [32 * 16 // w, w // 16], [num_warps, 1], [1, 0])


@gluon.jit
def _tile_scales(sc_s, st, FMT: gl.constexpr, PRE: gl.constexpr):
    """With ``PRE`` (fp8_ds_mla): stage ``st``'s ``[rows, 4]`` chunk scales in registers, read once for the four
    chunks of a tile (each chunk reading them again cost 0.5 us at 16 heads, 1.3 at 8); otherwise 0, unused."""
    if PRE:
        gl.static_assert(FMT == 2, "the chunk scales of fp8_ds_mla")
        return sc_s.index(st).load(_deq_scale_layout(DEQ_W, gl.num_warps()))
    else:
        return 0.0


@gluon.jit
def _dequant_chunk_t(raw_s, sc_s, sc_t, deq_s, st, C: gl.constexpr, W: gl.constexpr, SW_FP8: gl.constexpr,
                     PRE: gl.constexpr):
    """fp8_ds_mla: the 128 columns of latent chunk ``C`` of stage ``st``, e4m3 bytes x their row's chunk scale, into
    the bf16 tile ``deq_s`` (exact values), ``W`` columns at a time (few values live at once); the scales from
    ``sc_t`` with ``PRE`` (:func:`_tile_scales`), else read here."""
    L8: gl.constexpr = _deq_layout(W, gl.num_warps())
    LQ: gl.constexpr = _deq_scale_layout(W, gl.num_warps())
    o_s = gl.arange(0, 4, gl.SliceLayout(0, LQ))
    if not PRE:
        sc_t = sc_s.index(st).load(LQ)
    sc_c = gl.convert_layout(gl.sum(gl.where(o_s[None, :] == C, sc_t, 0.0), 1), gl.SliceLayout(1, L8))
    for p in gl.static_range(128 // W):
        raw = raw_s.index(st).slice(C * 128 + p * W, W, dim=1).load(L8)
        deq_s.slice(C * 128 + p * W, W, dim=1).store((_e4m3_to_f32(raw, SW_FP8) * sc_c[:, None]).to(deq_s.dtype))


@gluon.jit
def _dequant_chunk_any(raw_s, sc_s, sc_t, rope_s, deq_s, st, C: gl.constexpr, FMT: gl.constexpr,
                       SW_FP8: gl.constexpr, PRE: gl.constexpr):
    """Latent chunk ``C`` of stage ``st`` dequantised into ``deq_s``: fp8_ds_mla (:func:`_dequant_chunk_t`) or
    DeepSeek-V4 pages (:func:`.kernels_mma2._dequant_chunk_v4`)."""
    if FMT == 3:
        _dequant_chunk_v4(raw_s, sc_s, rope_s, deq_s, st, C, SW_FP8)
    else:
        _dequant_chunk_t(raw_s, sc_s, sc_t, deq_s, st, C, DEQ_W, SW_FP8, PRE)


@gluon.jit
def _dequant_tile_t(raw_s, sc_s, rope_s, deq_s, st, FMT: gl.constexpr, SW_FP8: gl.constexpr):
    """:func:`_dequant_chunk_any` for the whole tile."""
    for c in gl.static_range(LATENT // 128):
        _dequant_chunk_any(raw_s, sc_s, 0.0, rope_s, deq_s, st, c, FMT, SW_FP8, False)


@gluon.jit
def _dequant_after_pv(acc, YOUNGER: gl.constexpr, more, raw_s, sc_s, sc_t, rope_s, deq_s, st, C: gl.constexpr,
                      FMT: gl.constexpr, SW_FP8: gl.constexpr, PRE: gl.constexpr):
    """The overlap loop's step for latent chunk ``C``: wait for this tile's output MMA of the chunk (``YOUNGER``
    MMAs issued after it may still run), then — once every warp's is done, so no MMA still reads those columns —
    dequantise chunk ``C`` of the next tile (stage ``st``) into them, if there is one. Returns the accumulator."""
    acc = hopper.warpgroup_mma_wait(YOUNGER, deps=[acc])
    _barrier()
    if more:
        _dequant_chunk_any(raw_s, sc_s, sc_t, rope_s, deq_s, st, C, FMT, SW_FP8, PRE)
    return acc


@gluon.jit
def _zero(t):
    """0, computed from the loop counter ``t`` by an instruction the compiler cannot see through."""
    return gl.inline_asm_elementwise("and.b32 $0, $1, 0;", "=r,r", [t], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _scores_t(k_t, q_t, rope_t, qr_t, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, HAS_ROPE: gl.constexpr,
              layout: gl.constexpr):
    """Transposed scores ``K_tile · qᵀ`` [rows, heads]: the chain of warpgroup MMAs issued at once, one wait."""
    b_s = hopper.warpgroup_mma(k_t.slice(0, 64, dim=1), q_t.slice(0, 64, dim=1).permute([1, 0]),
                               gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout), use_acc=False, is_async=True)
    for c in gl.static_range(1, LATENT // 64):
        b_s = hopper.warpgroup_mma(k_t.slice(c * 64, 64, dim=1), q_t.slice(c * 64, 64, dim=1).permute([1, 0]), b_s,
                                   is_async=True)
    if HAS_ROPE:
        b_s = hopper.warpgroup_mma(rope_t, qr_t.permute([1, 0]), b_s, is_async=True)
    return hopper.warpgroup_mma_wait(0, deps=[b_s])


@gluon.jit
def _pv_t(k_t, p_t, C: gl.constexpr, acc):
    """Issue the output MMA of latent chunk ``C``: ``Vᵀ_C · Pᵀ``."""
    return hopper.warpgroup_mma(k_t.slice(C * 128, 128, dim=1).permute([1, 0]), p_t, acc, is_async=True)


@gluon.jit
def _pv_all_t(k_t, p_t, b_alpha, b_a0, b_a1, b_a2, b_a3):
    """Issue the four output MMAs of a tile, each accumulator first rescaled by ``b_alpha`` (not waited for)."""
    b_a0 = _pv_t(k_t, p_t, 0, b_a0 * b_alpha[None, :])
    b_a1 = _pv_t(k_t, p_t, 1, b_a1 * b_alpha[None, :])
    b_a2 = _pv_t(k_t, p_t, 2, b_a2 * b_alpha[None, :])
    b_a3 = _pv_t(k_t, p_t, 3, b_a3 * b_alpha[None, :])
    return b_a0, b_a1, b_a2, b_a3


@gluon.jit
def _acc_init_t(BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, A_L: gl.constexpr):
    """The softmax state and output accumulators before the first tile, in the accumulator layout ``A_L``: max -inf
    per head, each thread's partial sums and the four ``[128, BLOCK_H]`` output chunks at 0."""
    HEADS: gl.constexpr = gl.SliceLayout(0, A_L)
    b_m = gl.full([BLOCK_H], float("-inf"), gl.float32, HEADS)
    b_l = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, A_L)  # each thread's partial sums, added up after the loop
    b_a0 = gl.zeros([128, BLOCK_H], gl.float32, A_L)
    b_a1 = gl.zeros([128, BLOCK_H], gl.float32, A_L)
    b_a2 = gl.zeros([128, BLOCK_H], gl.float32, A_L)
    b_a3 = gl.zeros([128, BLOCK_H], gl.float32, A_L)
    return b_m, b_l, b_a0, b_a1, b_a2, b_a3


@gluon.jit
def _softmax_t(b_s, idx_c, num_slots, qk_scale, b_m, b_l):
    """One tile of the online softmax (base 2) along the rows of the transposed scores ``b_s`` [rows, heads]:
    invalid slot ids score -inf; returns the probabilities, the rescale of what came before, the running max and
    each thread's running partial sums (a head with no valid entry yet keeps max -inf, sums 0)."""
    m_n = (idx_c >= 0) & (idx_c < num_slots)
    b_s = gl.where(m_n[:, None], b_s * qk_scale, float("-inf"))
    b_m_new = gl.maximum(b_m, gl.max(b_s, 0))
    b_m_use = gl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_alpha = gl.exp2(b_m - b_m_use)
    b_p = gl.exp2(b_s - b_m_use[None, :])
    return b_p, b_alpha, b_m_new, b_l * b_alpha[None, :] + b_p


@gluon.jit
def _store_outputs_t(out_ptr, lse_ptr, sink_ptr, i_t, i_s, stride_o_t, stride_o_s, stride_o_h, stride_l_t,
                     stride_l_s, stride_l_h, stride_sink, o_h, m_h, o_d, b_inv, b_lse2, b_a0, b_a1, b_a2, b_a3,
                     SPLIT: gl.constexpr, HAS_SINK: gl.constexpr):
    """:func:`.kernels_mma2._store_outputs` for transposed accumulators (``[128 columns, BLOCK_H heads]``)."""
    if SPLIT:
        p_o = out_ptr + i_t * stride_o_t + i_s.to(gl.int64) * stride_o_s + o_h[None, :].to(gl.int64) * stride_o_h
        gl.store(lse_ptr + i_t * stride_l_t + i_s.to(gl.int64) * stride_l_s + o_h * stride_l_h, b_lse2, mask=m_h)
    else:
        if HAS_SINK:
            b_sink = gl.load(sink_ptr + o_h * stride_sink, mask=m_h, other=0.0)
            # as in the tl kernel: an empty row stays 0, a -inf sink changes nothing
            b_inv = gl.where(b_lse2 == float("-inf"), 0.0,
                             b_inv / (1.0 + gl.exp2(b_sink * 1.4426950408889634 - b_lse2)))
        p_o = out_ptr + i_t * stride_o_t + o_h[None, :].to(gl.int64) * stride_o_h
        gl.store(lse_ptr + i_t * stride_l_t + o_h * stride_l_h, b_lse2 * 0.6931471805599453, mask=m_h)
    ty: gl.constexpr = out_ptr.dtype.element_ty
    gl.store(p_o + (0 * 128 + o_d)[:, None], (b_a0 * b_inv[None, :]).to(ty), mask=m_h[None, :])
    gl.store(p_o + (1 * 128 + o_d)[:, None], (b_a1 * b_inv[None, :]).to(ty), mask=m_h[None, :])
    gl.store(p_o + (2 * 128 + o_d)[:, None], (b_a2 * b_inv[None, :]).to(ty), mask=m_h[None, :])
    gl.store(p_o + (3 * 128 + o_d)[:, None], (b_a3 * b_inv[None, :]).to(ty), mask=m_h[None, :])


@gluon.jit
def _finish_t(out_ptr, lse_ptr, sink_ptr, i_t, i_s, stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s,
              stride_l_h, stride_sink, o_h, m_h, o_d, b_m, b_l, b_a0, b_a1, b_a2, b_a3, SPLIT: gl.constexpr,
              HAS_SINK: gl.constexpr):
    """After the loop: the threads' partial sums added up, the output normalised and written with the lse
    (:func:`_store_outputs_t`); an empty range (no valid entry) gives 0 and lse -inf."""
    b_sum = gl.sum(b_l, 0)
    b_inv = gl.where(b_sum > 0, 1.0 / b_sum, 0.0)
    b_lse2 = gl.where(b_sum > 0, b_m + gl.log2(b_sum), float("-inf"))
    _store_outputs_t(out_ptr, lse_ptr, sink_ptr, i_t, i_s, stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s,
                     stride_l_h, stride_sink, o_h, m_h, o_d, b_inv, b_lse2, b_a0, b_a1, b_a2, b_a3, SPLIT, HAS_SINK)


# not inlined: inlined, it slowed the fp8_ds_mla loop before it by ~9 us (benchmarks/NOTES.md, session 17)
@gluon.jit(noinline=True)
def _merge_if_last(out_ptr, lse_ptr, fin_out_ptr, fin_lse_ptr, cnt_ptr, sink_ptr, i_t, i_hb, H, num_splits,
                   stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s, stride_l_h, stride_fo_t, stride_fo_h,
                   stride_fl_t, stride_fl_h, stride_sink, BLOCK_H: gl.constexpr, HAS_SINK: gl.constexpr):
    """After this program's partial is written: count it in (row, head block)'s counter; the program that counts
    last (all ``num_splits`` <= 2 partials written) puts the counter back to 0 and merges the partials as
    :func:`.kernels._combine_kernel` does (same operations in split order, whichever program is last), writing the
    final output and lse. The partials are read from L2 (``.cg``): other programs wrote them."""
    _barrier()  # every thread's partial stores before the count, which releases them at gpu scope
    p_cnt = cnt_ptr + i_t * gl.num_programs(1) + i_hb
    done = gl.atomic_add(p_cnt, 1, sem="acq_rel", scope="gpu")
    if done == num_splits - 1:
        gl.atomic_xchg(p_cnt, 0, sem="relaxed", scope="gpu")
        _barrier()  # the count acquired before any thread reads the other partials
        LM: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [gl.num_warps(), 1], [1, 0])
        o_h = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, LM))
        m_h = o_h < H
        m_h1 = m_h & (num_splits > 1)
        o_d = gl.arange(0, 512, gl.SliceLayout(0, LM))
        # every split's lse and 512 columns loaded at once: one round trip to L2 (128-column steps measured slower)
        p_l = lse_ptr + i_t * stride_l_t + o_h * stride_l_h
        b_l0 = gl.load(p_l, mask=m_h, other=float("-inf"), cache_modifier=".cg")
        b_l1 = gl.load(p_l + stride_l_s, mask=m_h1, other=float("-inf"), cache_modifier=".cg")
        p_po = out_ptr + i_t * stride_o_t + o_h[:, None].to(gl.int64) * stride_o_h + o_d[None, :]
        b_o0 = gl.load(p_po, mask=m_h[:, None], other=0.0, cache_modifier=".cg")
        b_o1 = gl.load(p_po + stride_o_s, mask=m_h1[:, None], other=0.0, cache_modifier=".cg")
        b_m = gl.maximum(gl.maximum(gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, LM)), b_l0), b_l1)
        b_m_use = gl.where(b_m == float("-inf"), 0.0, b_m)
        b_w0 = gl.exp2(b_l0 - b_m_use)
        b_w1 = gl.exp2(b_l1 - b_m_use)
        b_acc = gl.zeros([BLOCK_H, 512], gl.float32, LM)
        b_acc += gl.where(b_w0[:, None] > 0, b_o0, 0.0) * b_w0[:, None]
        b_acc += gl.where(b_w1[:, None] > 0, b_o1, 0.0) * b_w1[:, None]
        b_w = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, LM))
        b_w += b_w0
        b_w += b_w1
        b_lse2 = gl.where(b_w > 0, b_m_use + gl.log2(b_w), float("-inf"))
        b_inv = gl.where(b_w > 0, 1.0 / b_w, 0.0)
        if HAS_SINK:
            b_sink = gl.load(sink_ptr + o_h * stride_sink, mask=m_h, other=0.0)
            b_inv = gl.where(b_lse2 == float("-inf"), 0.0,
                             b_inv / (1.0 + gl.exp2(b_sink * 1.4426950408889634 - b_lse2)))
        p_o = fin_out_ptr + i_t * stride_fo_t + o_h[:, None].to(gl.int64) * stride_fo_h + o_d[None, :]
        gl.store(p_o, (b_acc * b_inv[:, None]).to(fin_out_ptr.dtype.element_ty), mask=m_h[:, None])
        gl.store(fin_lse_ptr + i_t * stride_fl_t + o_h * stride_fl_h, b_lse2 * 0.6931471805599453, mask=m_h)


@gluon.jit(do_not_specialize=["T", "topk", "num_slots", "num_splits", "split_len", "topk2", "num_slots2"])
def _sparse_mla_fwd_wgmma_t(
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
    fin_out_ptr, fin_lse_ptr, cnt_ptr, stride_fo_t, stride_fo_h, stride_fl_t, stride_fl_h,
    FMT: gl.constexpr, HAS_ROPE: gl.constexpr, HAS_TOPK_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
    SPLIT: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    SW_FP8: gl.constexpr, F16_DOT: gl.constexpr, OVERLAP: gl.constexpr, PDL: gl.constexpr,
    HAS_EXTRA: gl.constexpr, HAS_TOPK_LEN2: gl.constexpr, MERGE: gl.constexpr,
):
    gl.static_assert(BLOCK_N == 64, "the tile's rows are the 64 rows of a warpgroup MMA")
    gl.static_assert(gl.num_warps() == 4 or gl.num_warps() == 8, "one or two warpgroups")
    gl.static_assert(STAGES >= 2, "cp.async gathers at least one tile ahead")
    i_ts = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_t = (i_ts // num_splits).to(gl.int64)
    i_s = i_ts % num_splits
    dt: gl.constexpr = q_nope_ptr.dtype.element_ty

    A_L: gl.constexpr = _t_layout(BLOCK_H, gl.num_warps())
    HEADS: gl.constexpr = gl.SliceLayout(0, A_L)
    ROWS: gl.constexpr = gl.SliceLayout(1, A_L)
    ROW: gl.constexpr = gl.SliceLayout(1, _gather_layout(8, gl.num_warps()))

    SH16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    # q, its RoPE part and the probabilities in one-buffer arrays: the loop takes buffer 0 through an index the
    # compiler cannot see is constant (_zero), so it does not keep their ~70 wgmma descriptors (64 bits each) in
    # registers across the loop (they spilled); the same for fp8_ds_mla's dequantised tile
    q_s = gl.allocate_shared_memory(dt, [1, BLOCK_H, LATENT], SH16)
    qr_s = gl.allocate_shared_memory(dt, [1, BLOCK_H, ROPE], SH16)
    rope_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, ROPE], SH16)
    pt_s = gl.allocate_shared_memory(dt, [1, BLOCK_N, BLOCK_H], _pt_layout(BLOCK_N, BLOCK_H, dt))
    raw_s, sc_s, lat_s = _tile_buffers(dt, dt, FMT, BLOCK_N, STAGES)
    _q_to_shared(q_nope_ptr, q_pe_ptr, i_t, i_hb, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H,
                 q_s.index(0), qr_s.index(0), False, HAS_ROPE, BLOCK_H)
    n_start, n_end, n_row, n_pad, n_tiles = _row_range(topk_len_ptr, i_t, stride_tl, topk, topk_len2_ptr,
                                                       stride_tl2, topk2, i_s, split_len, BLOCK_N, HAS_TOPK_LEN,
                                                       HAS_EXTRA, HAS_TOPK_LEN2)
    idx_nx = _prologue(i_t, n_start, n_end, n_row, n_pad, n_tiles, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
                       num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                       stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s, rope_s, sc_s,
                       FMT, HAS_ROPE, HAS_EXTRA, BLOCK_N, STAGES)
    ns_m = _mask_slots(num_slots, num_slots2, HAS_EXTRA)

    o_h = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, HEADS)
    m_h = o_h < H
    o_d = gl.arange(0, 128, ROWS)
    b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _acc_init_t(BLOCK_N, BLOCK_H, A_L)

    if FMT >= 2 and OVERLAP:
        # fp8_ds_mla / V4 pages, software-pipelined: tile t + 1 is dequantised chunk by chunk while the output MMAs of
        # tile t run, each chunk once the MMA that reads those columns of tile t is done; fp8_ds_mla's scales read
        # once a tile up to 16 heads (32-head blocks, at 255 registers, spill with them held)
        PRE: gl.constexpr = FMT == 2 and BLOCK_H <= 16
        _ac.wait_group(STAGES - 2)
        _barrier()  # tile 0 visible to every warp
        idx_t = idx_nx
        idx_nx = _ids_at(n_start + STAGES * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                         stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                         stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N,
                         ROW, HAS_EXTRA)
        if STAGES - 1 < n_tiles:
            _issue_at(n_start + (STAGES - 1) * BLOCK_N, idx_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                      stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                      stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s,
                      rope_s, sc_s, STAGES - 1, FMT, HAS_ROPE, HAS_EXTRA)
        _ac.commit_group()
        if n_tiles > 0:
            _dequant_tile_t(raw_s, sc_s, rope_s, lat_s.index(0), 0, FMT, SW_FP8)
        hopper.fence_async_shared()
        _barrier()  # tile 0 dequantised, q in place
        for t in range(0, n_tiles):
            st = t % STAGES
            i_z = _zero(t)
            k_t = lat_s.index(i_z)
            p_t = pt_s.index(i_z)
            b_s = _scores_t(k_t, q_s.index(i_z), rope_s.index(st), qr_s.index(i_z), BLOCK_N, BLOCK_H, HAS_ROPE, A_L)
            idx_c = _ids_at(n_start + t * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                            stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                            stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                            BLOCK_N, ROWS, HAS_EXTRA)
            b_p, b_alpha, b_m, b_l = _softmax_t(b_s, idx_c, ns_m, sm_scale_log2, b_m, b_l)
            p_t.store(b_p.to(dt))
            _ac.wait_group(STAGES - 2)
            hopper.fence_async_shared()
            _barrier()  # the probabilities and tile t + 1 visible; every warp done with the scores of tile t
            t_nx = t + STAGES  # into the stage of tile t, whose bytes are dequantised and RoPE rows read
            idx_t = idx_nx
            idx_nx = _ids_at(n_start + (t_nx + 1) * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                             stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                             stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                             BLOCK_N, ROW, HAS_EXTRA)
            if t_nx < n_tiles:
                _issue_at(n_start + t_nx * BLOCK_N, idx_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                          stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                          stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s,
                          rope_s, sc_s, st, FMT, HAS_ROPE, HAS_EXTRA)
            _ac.commit_group()
            b_a0, b_a1, b_a2, b_a3 = _pv_all_t(k_t, p_t, b_alpha, b_a0, b_a1, b_a2, b_a3)
            more = t + 1 < n_tiles
            st1 = (t + 1) % STAGES
            sc_t = _tile_scales(sc_s, st1, FMT, PRE)  # while the output MMAs run (past the last tile: unused)
            b_a0 = _dequant_after_pv(b_a0, 3, more, raw_s, sc_s, sc_t, rope_s, k_t, st1, 0, FMT, SW_FP8, PRE)
            b_a1 = _dequant_after_pv(b_a1, 2, more, raw_s, sc_s, sc_t, rope_s, k_t, st1, 1, FMT, SW_FP8, PRE)
            b_a2 = _dequant_after_pv(b_a2, 1, more, raw_s, sc_s, sc_t, rope_s, k_t, st1, 2, FMT, SW_FP8, PRE)
            b_a3 = _dequant_after_pv(b_a3, 0, more, raw_s, sc_s, sc_t, rope_s, k_t, st1, 3, FMT, SW_FP8, PRE)
            hopper.fence_async_shared()
            _barrier()  # tile t + 1 dequantised; every warp done with the probabilities of tile t
    else:
        for t in range(0, n_tiles):
            st = t % STAGES
            _ac.wait_group(STAGES - 2)
            # each thread's cp.async data (and, first, its q stores) ordered before the wgmma reads: fence, barrier
            hopper.fence_async_shared()
            _barrier()  # tile t and q visible; every warp done with tile t - 1 and its probabilities
            t_nx = t + STAGES - 1
            idx_t = idx_nx
            idx_nx = _ids_at(n_start + (t_nx + 1) * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                             stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                             stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                             BLOCK_N, ROW, HAS_EXTRA)
            if t_nx < n_tiles:
                _issue_at(n_start + t_nx * BLOCK_N, idx_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                          stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                          stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s,
                          rope_s, sc_s, t_nx % STAGES, FMT, HAS_ROPE, HAS_EXTRA)
            _ac.commit_group()
            i_z = _zero(t)
            p_t = pt_s.index(i_z)
            if FMT >= 2:
                k_t = lat_s.index(i_z)
                _dequant_tile_t(raw_s, sc_s, rope_s, k_t, st, FMT, SW_FP8)
                hopper.fence_async_shared()
                _barrier()
            else:
                k_t = lat_s.index(st)
            b_s = _scores_t(k_t, q_s.index(i_z), rope_s.index(st), qr_s.index(i_z), BLOCK_N, BLOCK_H, HAS_ROPE, A_L)
            # this tile's slot ids along the score rows, for the mask (loaded STAGES - 1 steps ago: a cache hit)
            idx_c = _ids_at(n_start + t * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                            stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                            stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                            BLOCK_N, ROWS, HAS_EXTRA)
            b_p, b_alpha, b_m, b_l = _softmax_t(b_s, idx_c, ns_m, sm_scale_log2, b_m, b_l)
            p_t.store(b_p.to(dt))
            hopper.fence_async_shared()
            _barrier()  # every warp's probabilities in place
            b_a0, b_a1, b_a2, b_a3 = _pv_all_t(k_t, p_t, b_alpha, b_a0, b_a1, b_a2, b_a3)
            b_a0, b_a1, b_a2, b_a3 = hopper.warpgroup_mma_wait(0, deps=[b_a0, b_a1, b_a2, b_a3])
    _ac.wait_group(0)  # no copy may outlive the program's shared memory
    if PDL:  # the combine kernel may start (and wait for this grid) once every program has left its loop
        _launch_dependents()

    _finish_t(out_ptr, lse_ptr, sink_ptr, i_t, i_s, stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s,
              stride_l_h, stride_sink, o_h, m_h, o_d, b_m, b_l, b_a0, b_a1, b_a2, b_a3, SPLIT, HAS_SINK)
    if MERGE:
        gl.static_assert(SPLIT, "the merge finishes a split decode")
        _merge_if_last(out_ptr, lse_ptr, fin_out_ptr, fin_lse_ptr, cnt_ptr, sink_ptr, i_t, i_hb, H, num_splits,
                       stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s, stride_l_h, stride_fo_t,
                       stride_fo_h, stride_fl_t, stride_fl_h, stride_sink, BLOCK_H, HAS_SINK)


launch_fwd_wgmma_t = CachedLauncher(_sparse_mla_fwd_wgmma_t)

__all__ = ["launch_fwd_wgmma_t"]

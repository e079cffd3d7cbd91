"""Gluon kernel for sparse MLA attention on Hopper (sm90), fp8_ds_mla caches: a warp-specialised wgmma_t.

:mod:`.kernels_wgmma_t` with one warpgroup dequantises each tile itself, so the ~800 instructions per thread of a
tile's dequantisation sit on the MMA warpgroup's critical path with no other warp on its schedulers (ncu, session 9
of ``benchmarks/NOTES.md``). Here the work is split between two partitions of one program (``gl.warp_specialize``),
as FlashMLA's sm90 kernels split it:

* the **producer** (a worker partition of ``WS_WARPS`` warps: the config's ``num_warps`` less the consumer's 4)
  loads a tile's raw 656-byte rows straight into registers as int32 words (16-byte loads, one tile ahead of the one
  it dequantises, slot ids two tiles ahead), waits until the consumer has released one of the ``STAGES`` bf16 tile
  buffers, writes the tile's exact values (e4m3 × its row's chunk scale) and RoPE part there and signals the buffer
  full (an mbarrier);
* the **consumer** (the default partition, one warpgroup) waits for a full buffer and runs what wgmma_t runs on it:
  transposed scores ``K_tile · qᵀ`` (M = the tile's 64 rows, N = the heads), the online softmax along the rows, the
  transposed output ``Vᵀ · Pᵀ`` into four ``[128, BLOCK_H]`` accumulators, then releases the buffer.

No raw stage lives in shared memory (two 72 KB bf16 tiles, q and the probabilities: ~166 KB at 16 heads); the raw
rows' latency is hidden by the producer's registers and by the second buffer. Grid, arguments and outputs are those
of :mod:`.kernels_mma2`; an extra cache after the main list is read as there (each tile from one list). Invalid or
out-of-range slot ids are never read: their rows load as zeros and their scores are masked.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.runtime.jit import constexpr_function

from ..._common.launch import CachedLauncher
from ..._common.pdl import launch_dependents as _launch_dependents
from .kernels_mma2 import LATENT, ROPE, _barrier, _ids_at, _mask_slots, _q_to_shared, _row_range, _src
from .kernels_wgmma_t import (_acc_init_t, _finish_t, _pt_layout, _pv_all_t, _scores_t, _softmax_t, _t_layout,
                              _zero)


@constexpr_function
def _raw_layout(num_warps):
    """A [64, 32] chunk of int32 words (128 e4m3 bytes per row): four words (16 bytes) per vector, 8 lanes along a
    row, rows over lanes and warps. Words, not bytes, so that a tile held across the loop takes 16 registers per
    chunk and thread (bytes would take one each)."""
    return gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])


_SPLIT2 = gl.constexpr("mov.b32 {$0, $1}, $2;")  # a word's two bf16 values (RoPE, held as words like the latent)


# four e4m3 bytes of a word ($4) times their row's float32 scale ($5), rounded to bf16 ($0..$3, in byte order): the
# arithmetic of the other kernels' dequantisation (exact e4m3 -> f32, one f32 multiply, one rounding to bf16)
_DEQ4 = gl.constexpr("""{
.reg .b16 l, h;
.reg .b32 p0, p1, q0, q1;
.reg .f16 a0, a1, a2, a3;
.reg .f32 f0, f1, f2, f3;
mov.b32 {l, h}, $4;
cvt.rn.f16x2.e4m3x2 p0, l;
cvt.rn.f16x2.e4m3x2 p1, h;
mov.b32 {a0, a1}, p0;
mov.b32 {a2, a3}, p1;
cvt.f32.f16 f0, a0;
cvt.f32.f16 f1, a1;
cvt.f32.f16 f2, a2;
cvt.f32.f16 f3, a3;
mul.rn.f32 f0, f0, $5;
mul.rn.f32 f1, f1, $5;
mul.rn.f32 f2, f2, $5;
mul.rn.f32 f3, f3, $5;
cvt.rn.bf16x2.f32 q0, f1, f0;
cvt.rn.bf16x2.f32 q1, f3, f2;
mov.b32 {$0, $1}, q0;
mov.b32 {$2, $3}, q1;
}""")


@gluon.jit
def _load_chunk(p_row, m_n, C: gl.constexpr):
    """The e4m3 bytes of latent chunk ``C`` (columns [128·C, 128·C + 128)) of the rows ``p_row`` as int32 words
    (zeros where ``m_n`` is false) and each row's scale of that chunk (0 there)."""
    LW: gl.constexpr = _raw_layout(gl.num_warps())
    o_w = gl.arange(0, 32, gl.SliceLayout(0, LW))
    raw = gl.load(p_row.to(gl.pointer_type(gl.int32))[:, None] + (C * 32 + o_w)[None, :], mask=m_n[:, None],
                  other=0)
    sc = gl.load((p_row + LATENT).to(gl.pointer_type(gl.float32)) + C, mask=m_n, other=0.0)
    return raw, sc


@gluon.jit
def _tile_rows(pos0, ids, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
               stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2,
               block_size2, stride_kv2_blk, stride_kv2_row, HAS_EXTRA: gl.constexpr):
    """Row pointers of the tile at entry ``pos0`` (slot ids ``ids``, from its list's cache) and their validity;
    invalid ids point at slot 0."""
    kv, idx, s_t, s_k, p0, e, ns, bs, sb, sr = _src(
        pos0, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
        stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2, block_size2,
        stride_kv2_blk, stride_kv2_row, HAS_EXTRA)
    m_n = (ids >= 0) & (ids < ns)
    slot = gl.where(m_n, ids, 0)
    i_blk = slot // bs
    i_off = slot - i_blk * bs
    return kv + i_blk.to(gl.int64) * sb + i_off.to(gl.int64) * sr, m_n


@gluon.jit
def _load_tile(pos0, ids, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
               stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2,
               block_size2, stride_kv2_blk, stride_kv2_row, HAS_ROPE: gl.constexpr, HAS_EXTRA: gl.constexpr):
    """Issue the loads of the tile at entry ``pos0`` (slot ids ``ids``) into registers: four latent chunks with
    their scales, and the RoPE part (bf16, as stored)."""
    p_row, m_n = _tile_rows(pos0, ids, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots,
                            block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                            stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, HAS_EXTRA)
    r0, s0 = _load_chunk(p_row, m_n, 0)
    r1, s1 = _load_chunk(p_row, m_n, 1)
    r2, s2 = _load_chunk(p_row, m_n, 2)
    r3, s3 = _load_chunk(p_row, m_n, 3)
    if HAS_ROPE:  # the RoPE part's 64 bf16 values as 32 words, in the latent chunks' layout
        LW: gl.constexpr = _raw_layout(gl.num_warps())
        o_w = gl.arange(0, ROPE // 2, gl.SliceLayout(0, LW))
        rope = gl.load((p_row + LATENT + 16).to(gl.pointer_type(gl.int32))[:, None] + o_w[None, :],
                       mask=m_n[:, None], other=0)
    else:
        rope = gl.zeros_like(r0)
    return r0, s0, r1, s1, r2, s2, r3, s3, rope


@gluon.jit
def _store_chunk(deq_s, raw, sc, C: gl.constexpr):
    """Chunk ``C`` (int32 words of e4m3 bytes, the rows' scales) as exact values into the tile buffer."""
    o0, o1, o2, o3 = gl.inline_asm_elementwise(_DEQ4, "=h,=h,=h,=h,r,r", [raw, sc[:, None]],
                                               dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16),
                                               is_pure=True, pack=1)
    v = gl.join(gl.join(o0, o2), gl.join(o1, o3))  # [rows, words, 2, 2]: byte 2·q + k of a word at [.., q, k]
    deq_s.slice(C * 128, 128, dim=1).store(gl.reshape(v, [raw.shape[0], 128]))


@gluon.jit
def _write_tile(t, r0, s0, r1, s1, r2, s2, r3, s3, rope, deq_s, rope_s, full_b, empty_b, HAS_ROPE: gl.constexpr,
                STAGES: gl.constexpr):
    """Tile ``t`` (held in registers) into buffer ``t % STAGES`` once the consumer has released it (the first
    STAGES waits pass at once: parity 1), then signal the buffer full."""
    j = t % STAGES
    mbarrier.wait(empty_b.index(j), ((t // STAGES) & 1) ^ 1)
    buf = deq_s.index(j)
    _store_chunk(buf, r0, s0, 0)
    _store_chunk(buf, r1, s1, 1)
    _store_chunk(buf, r2, s2, 2)
    _store_chunk(buf, r3, s3, 3)
    if HAS_ROPE:
        lo, hi = gl.inline_asm_elementwise(_SPLIT2, "=h,=h,r", [rope], dtype=(gl.bfloat16, gl.bfloat16),
                                           is_pure=True, pack=1)
        rope_s.index(j).store(gl.reshape(gl.join(lo, hi), [rope.shape[0], ROPE]))
    hopper.fence_async_shared()  # the generic-proxy stores ordered before the consumer's wgmma reads
    _barrier()  # every producer warp's stores done before the one arrival
    mbarrier.arrive(full_b.index(j), count=1)


@gluon.jit
def _producer(i_t, i_s, kv_ptr, idx_ptr, topk_len_ptr, stride_kv_blk, stride_kv_row, stride_idx_t, stride_idx_k,
              stride_tl, topk, num_slots, block_size, split_len, kv2_ptr, idx2_ptr, topk_len2_ptr, stride_kv2_blk,
              stride_kv2_row, stride_idx2_t, stride_idx2_k, stride_tl2, topk2, num_slots2, block_size2,
              deq_s, rope_s, full_b, empty_b, HAS_ROPE: gl.constexpr, HAS_TOPK_LEN: gl.constexpr,
              HAS_EXTRA: gl.constexpr, HAS_TOPK_LEN2: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr):
    """The worker partition: raw rows -> registers (the tile after the one being written; slot ids one tile
    further) -> exact bf16 tiles in the ``STAGES`` buffers, in order. Slot ids past the range are -1: nothing is
    read for them."""
    ROW: gl.constexpr = gl.SliceLayout(1, _raw_layout(gl.num_warps()))
    n_start, n_end, n_row, n_pad, n_tiles = _row_range(topk_len_ptr, i_t, stride_tl, topk, topk_len2_ptr,
                                                       stride_tl2, topk2, i_s, split_len, BLOCK_N, HAS_TOPK_LEN,
                                                       HAS_EXTRA, HAS_TOPK_LEN2)
    ids = _ids_at(n_start, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots,
                  block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k,
                  num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N, ROW, HAS_EXTRA)
    r0, s0, r1, s1, r2, s2, r3, s3, rope = _load_tile(
        n_start, ids, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
        stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2, block_size2,
        stride_kv2_blk, stride_kv2_row, HAS_ROPE, HAS_EXTRA)
    ids = _ids_at(n_start + BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
                  num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                  stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N, ROW, HAS_EXTRA)
    for t in range(0, n_tiles):
        pos1 = n_start + (t + 1) * BLOCK_N
        q0, u0, q1, u1, q2, u2, q3, u3, qr = _load_tile(
            pos1, ids, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
            stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2,
            block_size2, stride_kv2_blk, stride_kv2_row, HAS_ROPE, HAS_EXTRA)
        ids = _ids_at(pos1 + BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
                      num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                      stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N, ROW,
                      HAS_EXTRA)
        _write_tile(t, r0, s0, r1, s1, r2, s2, r3, s3, rope, deq_s, rope_s, full_b, empty_b, HAS_ROPE, STAGES)
        r0, s0, r1, s1, r2, s2, r3, s3, rope = q0, u0, q1, u1, q2, u2, q3, u3, qr


@gluon.jit
def _consumer(i_t, i_s, i_hb, idx_ptr, topk_len_ptr, sink_ptr, out_ptr, lse_ptr, kv_ptr, stride_kv_blk,
              stride_kv_row, stride_idx_t, stride_idx_k, stride_tl, stride_sink, stride_o_t, stride_o_s, stride_o_h,
              stride_l_t, stride_l_s, stride_l_h, H, topk, num_slots, block_size, split_len, sm_scale_log2,
              kv2_ptr, idx2_ptr, topk_len2_ptr, stride_kv2_blk, stride_kv2_row, stride_idx2_t, stride_idx2_k,
              stride_tl2, topk2, num_slots2, block_size2, q_s, qr_s, pt_s, deq_s, rope_s, full_b, empty_b,
              HAS_ROPE: gl.constexpr, HAS_TOPK_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SPLIT: gl.constexpr,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr,
              HAS_EXTRA: gl.constexpr, HAS_TOPK_LEN2: gl.constexpr):
    """The default partition (one warpgroup): scores, softmax and output of each full buffer, then the outputs."""
    dt: gl.constexpr = q_s.dtype
    A_L: gl.constexpr = _t_layout(BLOCK_H, gl.num_warps())
    HEADS: gl.constexpr = gl.SliceLayout(0, A_L)
    ROWS: gl.constexpr = gl.SliceLayout(1, A_L)
    n_start, n_end, n_row, n_pad, n_tiles = _row_range(topk_len_ptr, i_t, stride_tl, topk, topk_len2_ptr,
                                                       stride_tl2, topk2, i_s, split_len, BLOCK_N, HAS_TOPK_LEN,
                                                       HAS_EXTRA, HAS_TOPK_LEN2)
    ns_m = _mask_slots(num_slots, num_slots2, HAS_EXTRA)
    o_h = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, HEADS)
    m_h = o_h < H
    o_d = gl.arange(0, 128, ROWS)
    b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _acc_init_t(BLOCK_N, BLOCK_H, A_L)
    for t in range(0, n_tiles):
        j = t % STAGES
        # this tile's slot ids along the score rows, for the mask (requested before the wait)
        idx_c = _ids_at(n_start + t * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                        stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                        stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                        BLOCK_N, ROWS, HAS_EXTRA)
        mbarrier.wait(full_b.index(j), (t // STAGES) & 1)
        i_z = _zero(t)  # q and the probabilities through an index the compiler cannot fold (kernels_wgmma_t.py)
        k_t = deq_s.index(j)
        p_t = pt_s.index(i_z)
        b_s = _scores_t(k_t, q_s.index(i_z), rope_s.index(j), qr_s.index(i_z), BLOCK_N, BLOCK_H, HAS_ROPE, A_L)
        b_p, b_alpha, b_m, b_l = _softmax_t(b_s, idx_c, ns_m, sm_scale_log2, b_m, b_l)
        p_t.store(b_p.to(dt))
        hopper.fence_async_shared()
        _barrier()  # every consumer warp's probabilities in place
        b_a0, b_a1, b_a2, b_a3 = _pv_all_t(k_t, p_t, b_alpha, b_a0, b_a1, b_a2, b_a3)
        b_a0, b_a1, b_a2, b_a3 = hopper.warpgroup_mma_wait(0, deps=[b_a0, b_a1, b_a2, b_a3])
        _barrier()  # every warp's MMAs done with the buffer (and the probabilities) before it is released
        mbarrier.arrive(empty_b.index(j), count=1)
    if PDL:  # the combine kernel may start (and wait for this grid) once every program has left its loop
        _launch_dependents()
    _finish_t(out_ptr, lse_ptr, sink_ptr, i_t, i_s, stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s,
              stride_l_h, stride_sink, o_h, m_h, o_d, b_m, b_l, b_a0, b_a1, b_a2, b_a3, SPLIT, HAS_SINK)


@gluon.jit(do_not_specialize=["T", "topk", "num_slots", "num_splits", "split_len", "topk2", "num_slots2"])
def _sparse_mla_fwd_wgmma_ws(
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
    WS_WARPS: gl.constexpr, WS_REGS: gl.constexpr,
):
    gl.static_assert(FMT == 2, "the warp-specialised kernel reads fp8_ds_mla rows")
    gl.static_assert(not SW_FP8, "sm90 converts e4m3 in hardware")
    gl.static_assert(BLOCK_N == 64, "the tile's rows are the 64 rows of a warpgroup MMA")
    gl.static_assert(gl.num_warps() == 4, "one consumer warpgroup")
    gl.static_assert(STAGES >= 2, "two tile buffers at least: one written while the other is read")
    i_ts = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_t = (i_ts // num_splits).to(gl.int64)
    i_s = i_ts % num_splits
    dt: gl.constexpr = q_nope_ptr.dtype.element_ty

    SH16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_s = gl.allocate_shared_memory(dt, [1, BLOCK_H, LATENT], SH16)
    qr_s = gl.allocate_shared_memory(dt, [1, BLOCK_H, ROPE], SH16)
    pt_s = gl.allocate_shared_memory(dt, [1, BLOCK_N, BLOCK_H], _pt_layout(BLOCK_N, BLOCK_H, dt))
    deq_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, LATENT], SH16)
    rope_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, ROPE], SH16)
    full_b = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_b = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full_b.index(s), count=1)
        mbarrier.init(empty_b.index(s), count=1)
    _q_to_shared(q_nope_ptr, q_pe_ptr, i_t, i_hb, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H,
                 q_s.index(0), qr_s.index(0), False, HAS_ROPE, BLOCK_H)
    hopper.fence_async_shared()
    _barrier()  # q and the initialised barriers visible to both partitions

    gl.warp_specialize([
        (_consumer, (i_t, i_s, i_hb, idx_ptr, topk_len_ptr, sink_ptr, out_ptr, lse_ptr, kv_ptr, stride_kv_blk,
                     stride_kv_row, stride_idx_t, stride_idx_k, stride_tl, stride_sink, stride_o_t, stride_o_s,
                     stride_o_h, stride_l_t, stride_l_s, stride_l_h, H, topk, num_slots, block_size, split_len,
                     sm_scale_log2, kv2_ptr, idx2_ptr, topk_len2_ptr, stride_kv2_blk, stride_kv2_row, stride_idx2_t,
                     stride_idx2_k, stride_tl2, topk2, num_slots2, block_size2, q_s, qr_s, pt_s, deq_s, rope_s,
                     full_b, empty_b, HAS_ROPE, HAS_TOPK_LEN, HAS_SINK, SPLIT, BLOCK_H, BLOCK_N, STAGES, PDL,
                     HAS_EXTRA, HAS_TOPK_LEN2)),
        (_producer, (i_t, i_s, kv_ptr, idx_ptr, topk_len_ptr, stride_kv_blk, stride_kv_row, stride_idx_t,
                     stride_idx_k, stride_tl, topk, num_slots, block_size, split_len, kv2_ptr, idx2_ptr,
                     topk_len2_ptr, stride_kv2_blk, stride_kv2_row, stride_idx2_t, stride_idx2_k, stride_tl2, topk2,
                     num_slots2, block_size2, deq_s, rope_s, full_b, empty_b, HAS_ROPE, HAS_TOPK_LEN, HAS_EXTRA,
                     HAS_TOPK_LEN2, BLOCK_N, STAGES)),
    ], [WS_WARPS], [WS_REGS])


launch_fwd_wgmma_ws = CachedLauncher(_sparse_mla_fwd_wgmma_ws)

__all__ = ["launch_fwd_wgmma_ws"]

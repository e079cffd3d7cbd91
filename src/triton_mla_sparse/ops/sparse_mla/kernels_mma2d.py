"""Gluon kernel for sparse MLA attention on bf16/fp16 caches from sm80 on, its scores' 576 dims split over the warps.

A variant of :mod:`.kernels_mma2` (same arguments, grid, outputs and cp.async pipeline, without its one-buffer form;
``AttentionConfig.dsplit``)
for the Ampere-class targets, where mma.sync reads every operand from shared memory and shared-memory bandwidth
bounds the larger head blocks: there each warp of a 32-head block read its 16 heads' q and half the tile for the
scores, and half the tile again for the output (two reads of q and the tile per tile, ~140 KB). Here

* the scores are one batched dot over the 4 warps: warp w multiplies q's and the tile's columns ``[128 w, 128 w +
  128)`` (and RoPE columns ``[16 w, 16 w + 16)``) for every head and row, so q and the tile are each read once; the 4
  partial score tiles meet in one layout change (each thread sums its positions' four partials);
* the output's 512 columns are split over the warps (each reads its 128-column quarter of the tile once), all heads
  per warp, the probabilities shared by all (one layout change per tile);
* q and the tile sit in shared memory as ``[warps, rows, 128]`` column quarters (RoPE ``[warps, rows, 16]``), which
  is also how the output's dots read them.

With three or more stages the loop is software-pipelined: a step issues tile t + 1's score dot and then tile t's
output dot (independent instructions the scheduler interleaves), and takes tile t + 1 into the softmax after both;
tiles t and t + 1 stay resident, STAGES − 2 in flight. With two, each step does one tile's scores, softmax and output.

bf16/fp16 caches read as stored, 4 warps, 16- or 32-head blocks, 16- or 32-row tiles, at least two stages, no extra
cache: :func:`.configs.gluon_config_problem` and the launch decide.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import ampere
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _ac
from triton.runtime.jit import constexpr_function

from ..._common.launch import CachedLauncher
from ..._common.pdl import launch_dependents as _launch_dependents
from .kernels_mma2 import LATENT, ROPE, _gather_layout, _ids_at, _row_ptrs, _row_range, _softmax_step

# Names that changed between triton 3.6 (the H200's) and 3.9 (the CI's).
_async_load = getattr(_ac, "async_load", None) or _ac.async_copy_global_to_shared
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

K_STEP = gl.constexpr(32)  # columns of q and the tile per batched scores dot (registers: one step's operands)


@constexpr_function
def _batch_layout(num_warps):
    """Batched dots ``[warps, rows, cols]`` (the scores' partials, the output's column quarters): warp w holds
    batch w."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1, 1], instr_shape=[1, 16, 8])


@constexpr_function
def _sum_layout(num_warps, block_h, block_n):
    """``[warps, heads, rows]`` with a position's partials in one thread: rows over the lanes, heads over lanes and
    warps (the scores then live in its slice along dim 0)."""
    lanes_n = min(block_n, 32)
    lanes_h = 32 // lanes_n
    return gl.BlockedLayout([num_warps, max(1, block_h // (lanes_h * num_warps)), block_n // lanes_n],
                            [1, lanes_h, lanes_n], [1, num_warps, 1], [0, 2, 1])


@constexpr_function
def _bcast_layout(num_warps, block_n):
    """``[warps, heads, rows]`` with batch w in warp w: the probabilities broadcast to every warp's batch."""
    lanes_n = min(block_n, 32)
    return gl.BlockedLayout([1, 1, block_n // lanes_n], [1, 32 // lanes_n, lanes_n], [num_warps, 1, 1], [2, 1, 0])


@constexpr_function
def _gather3_layout(num_warps, cols, rows):
    """``[warps, rows, cols]`` gathers of 16-byte vectors (8 elements), a row's vectors over adjacent lanes; lanes
    and warps the rows do not fill go along the first dim (no element copied by two threads)."""
    lanes_c = min(cols // 8, 32)
    lanes_r = min(32 // lanes_c, rows)
    warps_r = max(1, min(num_warps, rows // lanes_r))
    lanes = [32 // (lanes_c * lanes_r), lanes_r, lanes_c]
    return gl.BlockedLayout([1, 1, 8], lanes, [num_warps // warps_r, warps_r, 1], [2, 1, 0])


@gluon.jit
def _quarters(base_ptr, o_w, o_c, off: gl.constexpr, width: gl.constexpr):
    """``[warps, rows, width]`` pointers of column quarter w of each row: ``base_ptr[row] + off + w · width + c``."""
    return base_ptr[None, :, None] + off + (o_w * width)[:, None, None] + o_c[None, None, :]


@gluon.jit
def _issue_d(kv_ptr, idx, num_slots, block_size, stride_kv_blk, stride_kv_row, kv_s, kr_s, st,
             HAS_ROPE: gl.constexpr):
    """Start the copies of one tile's rows (slot ids ``idx``) into stage ``st``: column quarter w of the latent part
    to ``kv_s[st, w]``, of the RoPE part to ``kr_s[st, w]``; invalid ids zero-fill their rows."""
    W: gl.constexpr = gl.num_warps()
    N: gl.constexpr = kv_s.shape[2]
    G3: gl.constexpr = _gather3_layout(W, LATENT // W, N)
    LR: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, G3))
    p_row, m_n = _row_ptrs(kv_ptr, gl.convert_layout(idx, LR), num_slots, block_size, stride_kv_blk, stride_kv_row)
    o_w = gl.arange(0, W, gl.SliceLayout(1, gl.SliceLayout(2, G3)))
    o_c = gl.arange(0, LATENT // W, gl.SliceLayout(0, gl.SliceLayout(1, G3)))
    _async_load(kv_s.index(st), _quarters(p_row, o_w, o_c, 0, LATENT // W), mask=m_n[None, :, None])
    if HAS_ROPE:
        GR: gl.constexpr = _gather3_layout(W, ROPE // W, N)
        LRR: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, GR))
        p_r = gl.convert_layout(p_row, LRR)
        m_r = gl.convert_layout(m_n, LRR)
        o_wr = gl.arange(0, W, gl.SliceLayout(1, gl.SliceLayout(2, GR)))
        o_r = gl.arange(0, ROPE // W, gl.SliceLayout(0, gl.SliceLayout(1, GR)))
        _async_load(kr_s.index(st), _quarters(p_r, o_wr, o_r, LATENT, ROPE // W), mask=m_r[None, :, None])


@gluon.jit
def _refill_d(t_nx, idx_nx, n_tiles, i_t, n_start, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
              num_slots, block_size, stride_kv_blk, stride_kv_row, kv_s, kr_s, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, HAS_ROPE: gl.constexpr):
    """A loop step's refill: the copies of tile ``t_nx`` (slot ids ``idx_nx``, loaded a step before) into its stage
    when the range has it, one commit group either way (so the waits count steps); returns tile ``t_nx + 1``'s
    slot ids."""
    ROW: gl.constexpr = gl.SliceLayout(1, _gather_layout(8, gl.num_warps()))
    # (no extra cache in this kernel: _ids_at's extra-cache arguments are this cache's, unread)
    idx_next = _ids_at(n_start + (t_nx + 1) * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                       stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv_ptr, idx_ptr,
                       stride_idx_t, stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, BLOCK_N, ROW,
                       False)
    if t_nx < n_tiles:
        _issue_d(kv_ptr, idx_nx, num_slots, block_size, stride_kv_blk, stride_kv_row, kv_s, kr_s, t_nx % STAGES,
                 HAS_ROPE)
    _ac.commit_group()
    return idx_next


@gluon.jit
def _q_to_shared_d(q_nope_ptr, q_pe_ptr, i_t, i_hb, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H, q_s, qr_s,
                   HAS_ROPE: gl.constexpr, BLOCK_H: gl.constexpr):
    """q of this row and head block into its column quarters in shared memory (heads past H read as 0)."""
    W: gl.constexpr = gl.num_warps()
    G3: gl.constexpr = _gather3_layout(W, LATENT // W, BLOCK_H)
    o_h = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(0, gl.SliceLayout(2, G3)))
    o_w = gl.arange(0, W, gl.SliceLayout(1, gl.SliceLayout(2, G3)))
    o_c = gl.arange(0, LATENT // W, gl.SliceLayout(0, gl.SliceLayout(1, G3)))
    p_q = q_nope_ptr + i_t * stride_qn_t + o_h.to(gl.int64) * stride_qn_h
    q_s.store(gl.load(_quarters(p_q, o_w, o_c, 0, LATENT // W), mask=(o_h < H)[None, :, None], other=0.0))
    if HAS_ROPE:
        GR: gl.constexpr = _gather3_layout(W, ROPE // W, BLOCK_H)
        o_hr = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(0, gl.SliceLayout(2, GR)))
        o_wr = gl.arange(0, W, gl.SliceLayout(1, gl.SliceLayout(2, GR)))
        o_r = gl.arange(0, ROPE // W, gl.SliceLayout(0, gl.SliceLayout(1, GR)))
        p_qr = q_pe_ptr + i_t * stride_qp_t + o_hr.to(gl.int64) * stride_qp_h
        qr_s.store(gl.load(_quarters(p_qr, o_wr, o_r, 0, ROPE // W), mask=(o_hr < H)[None, :, None], other=0.0))


@gluon.jit
def _scores_d(q_s, qr_s, kv_s, kr_s, st, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HAS_ROPE: gl.constexpr):
    """The 4 warps' partial scores ``[warps, heads, rows]`` of the tile in stage ``st``: warp w's column quarter."""
    W: gl.constexpr = gl.num_warps()
    M3: gl.constexpr = _batch_layout(W)
    DA3: gl.constexpr = gl.DotOperandLayout(0, M3, 2)
    DB3: gl.constexpr = gl.DotOperandLayout(1, M3, 2)
    k_t = kv_s.index(st)  # [W, BLOCK_N, DW]
    b_s3 = gl.zeros([W, BLOCK_H, BLOCK_N], gl.float32, M3)
    for k0 in gl.static_range(0, LATENT // W, K_STEP):
        b_s3 = ampere.mma_v2(q_s.slice(k0, K_STEP, dim=2).load(DA3),
                             k_t.slice(k0, K_STEP, dim=2).permute([0, 2, 1]).load(DB3), b_s3)
    if HAS_ROPE:
        b_s3 = ampere.mma_v2(qr_s.load(DA3), kr_s.index(st).permute([0, 2, 1]).load(DB3), b_s3)
    return b_s3


@gluon.jit
def _p_operand(b_p, b_alpha, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr):
    """The probabilities as every warp's A operand of the output dot (broadcast along the batch dim) and the rescale
    ``b_alpha`` in the output's layout."""
    W: gl.constexpr = gl.num_warps()
    M3: gl.constexpr = _batch_layout(W)
    BC: gl.constexpr = _bcast_layout(W, BLOCK_N)
    b_p3 = gl.convert_layout(b_p, gl.SliceLayout(0, BC))
    b_pa = gl.convert_layout(gl.broadcast(b_p3[None, :, :], gl.zeros([W, BLOCK_H, BLOCK_N], b_p.dtype, BC))[0],
                             gl.DotOperandLayout(0, M3, 2))
    return b_pa, gl.convert_layout(b_alpha, gl.SliceLayout(0, gl.SliceLayout(2, M3)))[None, :, None]


@gluon.jit
def _softmax_d(b_s3, idx_c, num_slots, sm_scale_log2, b_m, b_l, dt: gl.constexpr, BLOCK_H: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """A tile's partial scores ``b_s3`` summed, masked by its slot ids ``idx_c`` and taken into the online softmax:
    returns the output dot's A operand, the rescale and the new running max and sum."""
    b_s = gl.sum(gl.convert_layout(b_s3, _sum_layout(gl.num_warps(), BLOCK_H, BLOCK_N)), 0)
    b_p, b_alpha, b_m, b_l = _softmax_step(b_s, idx_c, num_slots, sm_scale_log2, b_m, b_l)
    b_pa, b_a3 = _p_operand(b_p.to(dt), b_alpha, BLOCK_H, BLOCK_N)
    return b_pa, b_a3, b_m, b_l


@gluon.jit(do_not_specialize=["T", "topk", "num_slots", "num_splits", "split_len", "topk2", "num_slots2"])
def _sparse_mla_fwd_mma2d(
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
    gl.static_assert(FMT == 0, "bf16/fp16 caches read as stored")
    gl.static_assert(not HAS_EXTRA, "no extra cache (the mma2 kernel reads one)")
    gl.static_assert(gl.num_warps() == 4, "4 warps: 128 latent and 16 RoPE columns each")
    gl.static_assert(STAGES >= 2, "at least two stages")
    W: gl.constexpr = gl.num_warps()
    DW: gl.constexpr = LATENT // W
    RW: gl.constexpr = ROPE // W
    i_ts = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_t = (i_ts // num_splits).to(gl.int64)
    i_s = i_ts % num_splits
    dt: gl.constexpr = q_nope_ptr.dtype.element_ty

    M3: gl.constexpr = _batch_layout(W)
    DB3: gl.constexpr = gl.DotOperandLayout(1, M3, 2)
    SUM: gl.constexpr = _sum_layout(W, BLOCK_H, BLOCK_N)
    S2: gl.constexpr = gl.SliceLayout(0, SUM)
    ROW: gl.constexpr = gl.SliceLayout(1, _gather_layout(8, W))
    SH: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0])
    SR: gl.constexpr = gl.SwizzledSharedLayout(8, 4, 2, [2, 1, 0])
    q_s = gl.allocate_shared_memory(dt, [W, BLOCK_H, DW], SH)
    qr_s = gl.allocate_shared_memory(dt, [W, BLOCK_H, RW], SR)
    kv_s = gl.allocate_shared_memory(dt, [STAGES, W, BLOCK_N, DW], SH)
    kr_s = gl.allocate_shared_memory(dt, [STAGES, W, BLOCK_N, RW], SR)
    _q_to_shared_d(q_nope_ptr, q_pe_ptr, i_t, i_hb, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H, q_s, qr_s,
                   HAS_ROPE, BLOCK_H)
    n_start, n_end, n_row, n_pad, n_tiles = _row_range(topk_len_ptr, i_t, stride_tl, topk, topk_len2_ptr,
                                                       stride_tl2, topk2, i_s, split_len, BLOCK_N, HAS_TOPK_LEN,
                                                       False, False)
    # tiles 0 .. STAGES-2 in flight
    idx_nx = _ids_at(n_start, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots,
                     block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k,
                     num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N, ROW, False)
    for u in gl.static_range(STAGES - 1):
        idx_u = idx_nx
        idx_nx = _ids_at(n_start + (u + 1) * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                         stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                         stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                         BLOCK_N, ROW, False)
        if u < n_tiles:
            _issue_d(kv_ptr, idx_u, num_slots, block_size, stride_kv_blk, stride_kv_row, kv_s, kr_s, u, HAS_ROPE)
        _ac.commit_group()

    b_m = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, S2))
    b_l = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, S2))
    b_o = gl.zeros([W, BLOCK_H, DW], gl.float32, M3)  # output column quarter w in warp w

    if STAGES >= 3:
        # software-pipelined: each step runs tile t's output dot beside tile t + 1's score dot (independent
        # instructions for the scheduler), so tiles t and t + 1 are resident and STAGES - 2 tiles in flight
        idx_c = _ids_at(n_start, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots,
                        block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k,
                        num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N, gl.SliceLayout(0, S2),
                        False)
        _ac.wait_group(STAGES - 2)
        _barrier()  # tile 0 (and q) visible to every warp
        b_pa, b_a3, b_m, b_l = _softmax_d(_scores_d(q_s, qr_s, kv_s, kr_s, 0, BLOCK_H, BLOCK_N, HAS_ROPE), idx_c,
                                          num_slots, sm_scale_log2, b_m, b_l, dt, BLOCK_H, BLOCK_N)
        for t in range(0, n_tiles):
            # tile t + 1's slot ids for its masks (past the last tile all -1: the softmax step then leaves the state
            # as it is, whatever the scores read from a stage nobody writes now)
            idx_c = _ids_at(n_start + (t + 1) * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                            stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                            stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                            BLOCK_N, gl.SliceLayout(0, S2), False)
            _ac.wait_group(STAGES - 3)
            _barrier()  # tile t + 1 visible; every warp done with tile t - 1, whose stage is refilled now
            idx_nx = _refill_d(t + STAGES - 1, idx_nx, n_tiles, i_t, n_start, n_end, n_row, n_pad, kv_ptr, idx_ptr,
                               stride_idx_t, stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv_s,
                               kr_s, BLOCK_N, STAGES, HAS_ROPE)
            b_s3 = _scores_d(q_s, qr_s, kv_s, kr_s, (t + 1) % STAGES, BLOCK_H, BLOCK_N, HAS_ROPE)
            b_o = ampere.mma_v2(b_pa, kv_s.index(t % STAGES).load(DB3), b_o * b_a3)
            b_pa, b_a3, b_m, b_l = _softmax_d(b_s3, idx_c, num_slots, sm_scale_log2, b_m, b_l, dt, BLOCK_H, BLOCK_N)
    else:
        for t in range(0, n_tiles):
            st = t % STAGES
            # this tile's slot ids in the score layout, for the masks (loaded STAGES - 1 steps ago: a cache hit)
            idx_c = _ids_at(n_start + t * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                            stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                            stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                            BLOCK_N, gl.SliceLayout(0, S2), False)
            _ac.wait_group(STAGES - 2)
            _barrier()  # tile t visible to every warp; every warp done with tile t - 1, whose stage is refilled now
            idx_nx = _refill_d(t + STAGES - 1, idx_nx, n_tiles, i_t, n_start, n_end, n_row, n_pad, kv_ptr, idx_ptr,
                               stride_idx_t, stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv_s,
                               kr_s, BLOCK_N, STAGES, HAS_ROPE)
            b_pa, b_a3, b_m, b_l = _softmax_d(_scores_d(q_s, qr_s, kv_s, kr_s, st, BLOCK_H, BLOCK_N, HAS_ROPE),
                                              idx_c, num_slots, sm_scale_log2, b_m, b_l, dt, BLOCK_H, BLOCK_N)
            b_o = ampere.mma_v2(b_pa, kv_s.index(st).load(DB3), b_o * b_a3)
    _ac.wait_group(0)  # no copy may outlive the program's shared memory
    if PDL:  # the combine kernel may start (and wait for this grid) once every program has left its loop
        _launch_dependents()

    # Normalise; an empty range (no valid entry) gives 0 and lse -inf.
    HL: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, M3))
    o_h = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, HL)
    m_h = o_h < H
    b_m = gl.convert_layout(b_m, HL)
    b_l = gl.convert_layout(b_l, HL)
    b_inv = gl.where(b_l > 0, 1.0 / b_l, 0.0)
    b_lse2 = gl.where(b_l > 0, b_m + gl.log2(b_l), float("-inf"))
    if SPLIT:
        p_o = out_ptr + i_t * stride_o_t + i_s.to(gl.int64) * stride_o_s
        gl.store(lse_ptr + i_t * stride_l_t + i_s.to(gl.int64) * stride_l_s + o_h * stride_l_h, b_lse2, mask=m_h)
    else:
        if HAS_SINK:
            b_sink = gl.load(sink_ptr + o_h * stride_sink, mask=m_h, other=0.0)
            # as in the tl kernel: an empty row stays 0, a -inf sink changes nothing
            b_inv = gl.where(b_lse2 == float("-inf"), 0.0,
                             b_inv / (1.0 + gl.exp2(b_sink * 1.4426950408889634 - b_lse2)))
        p_o = out_ptr + i_t * stride_o_t
        gl.store(lse_ptr + i_t * stride_l_t + o_h * stride_l_h, b_lse2 * 0.6931471805599453, mask=m_h)
    o_w = gl.arange(0, W, gl.SliceLayout(1, gl.SliceLayout(2, M3)))
    o_c = gl.arange(0, DW, gl.SliceLayout(0, gl.SliceLayout(1, M3)))
    p_o = p_o + o_h.to(gl.int64)[None, :, None] * stride_o_h + (o_w * DW)[:, None, None] + o_c[None, None, :]
    gl.store(p_o, (b_o * b_inv[None, :, None]).to(out_ptr.dtype.element_ty), mask=m_h[None, :, None])


launch_fwd_mma2d = CachedLauncher(_sparse_mla_fwd_mma2d)


__all__ = ["launch_fwd_mma2d"]

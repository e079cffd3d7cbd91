"""Gluon kernel for sparse MLA attention on NVIDIA GPUs from sm80 on: cp.async row gathers, mma.sync dots.

Same program grid, arguments and outputs as :func:`.kernels._sparse_mla_fwd_kernel` (one program per query row,
block of ``BLOCK_H`` heads and range of the row's list; prefill or split-decode partials merged by the same combine
kernel), for bf16/fp16 caches read as stored, fp8_ds_mla rows and DeepSeek-V4 pages. What differs is the memory
pipeline, written out instead of left to Triton's pipeliner (which waits for every gather before the step that uses
it):

* the cache rows of ``STAGES - 1`` tiles are in flight (``cp.async`` straight into shared memory, one 16-byte copy
  per vector, zero-filled for masked rows) while a tile is computed; the slot ids of the next tile to gather are
  loaded one step ahead, so no step waits for an index;
* q sits in shared memory and both dots read their operands from there (``ldmatrix``): the registers hold the
  four ``[BLOCK_H, 128]`` float32 accumulators and one tile's scores, nothing of the size of q or a tile;
* each 16 heads of a block of up to 32 have their own warps; within them the scores are split over the warps along
  the tile's rows and the output along its columns, so no warp reads another's q and, where the tile has 8 rows a
  warp, none repeats another's work (Triton gives a 32-head block's scores to every warp);
* fp8_ds_mla: the raw 656-byte rows (e4m3 latent, float32 tile scales, bf16 RoPE) are gathered as bytes and
  dequantised once per tile from shared memory into a bf16 tile of exact values (value × its row's chunk scale)
  that both dots read; with ``F16_DOT`` (opt-in) into a float16 tile instead, each 128-column chunk divided by its
  largest scale in the tile (applied back to that chunk's scores and output);
* ``STAGES = 1``: one buffer, the tile's copies issued at the top of its step and waited for at once (the other
  programs resident on the SM hide the latency);
* DeepSeek-V4 pages (``FMT = 3``): each row's 448 e4m3 NoPE bytes, 64 bf16 RoPE values and 8 footer bytes (7
  UE8M0 exponents) gathered into the stage, dequantised like fp8_ds_mla into a bf16 tile whose last 64 columns are
  the RoPE values (V is the whole row, q 512 wide);
* an extra cache (``HAS_EXTRA``: DeepSeek-V4's second list, FlashMLA's ``extra_*``): the row's main list padded to
  whole tiles, then the extra list, as the tl kernel walks them; each tile reads one cache, chosen by its first
  entry (:func:`_src`), in one softmax.

Every layout is derived from ``num_warps`` and ``BLOCK_H``; the launch table decides where this kernel runs
(``family``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.runtime.jit import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import ampere
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _ac

from ..._common.fp8 import e4m3_to_f32 as _e4m3_to_f32
from ..._common.launch import CachedLauncher
from ..._common.pdl import launch_dependents as _launch_dependents
from .kernels import _e4m3_to_f16

# Names that changed between triton 3.6 (the H200's) and 3.9 (the CI's).
_async_load = getattr(_ac, "async_load", None) or _ac.async_copy_global_to_shared
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

LATENT = gl.constexpr(512)
ROPE = gl.constexpr(64)
V4_NOPE = gl.constexpr(448)  # DeepSeek-V4 rows: e4m3 NoPE bytes, then 64 bf16 RoPE values
V4_ROW = gl.constexpr(576)  # bytes per DeepSeek-V4 row; the page's footer follows its block_size rows


@constexpr_function
def _mma_layout(num_warps, block_h):
    """Scores and outputs: up to 32-head blocks, each 16 heads on their own warps (a warp reads only its heads' q),
    the other warps side by side along the columns (tile rows / output columns); 64-head blocks (no table entry) keep
    all warps along the columns, which builds them without spills."""
    rows = min(block_h // 16, num_warps) if block_h <= 32 else 1
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[rows, num_warps // rows], instr_shape=[16, 8])


@constexpr_function
def _gather_layout(vec, num_warps):
    """Rows over warps (4 per warp), ``vec``-element 16-byte vectors over 8 lanes per row."""
    return gl.BlockedLayout([1, vec], [4, 8], [num_warps, 1], [1, 0])


@constexpr_function
def _scale_layout(num_warps):
    """fp8_ds_mla tile scales: a row's four float32 values in one thread."""
    return gl.BlockedLayout([1, 4], [32, 1], [num_warps, 1], [1, 0])


@constexpr_function
def _v4_scale_layout(num_warps):
    """DeepSeek-V4 footers: a row's 8 bytes (two int32) in one thread."""
    return gl.BlockedLayout([1, 2], [32, 1], [num_warps, 1], [1, 0])


@gluon.jit
def _load_idx(idx_ptr, i_t, stride_idx_t, stride_idx_k, pos0, n_end, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Slot ids of list entries ``pos0 + [0, BLOCK_N)`` (-1 past this program's range)."""
    o_k = pos0 + gl.arange(0, BLOCK_N, layout)
    m_k = o_k < n_end
    return gl.load(idx_ptr + i_t * stride_idx_t + o_k.to(gl.int64) * stride_idx_k, mask=m_k, other=-1)


@gluon.jit
def _row_ptrs(kv_ptr, idx, num_slots, block_size, stride_kv_blk, stride_kv_row):
    """Row pointers of slot ids and their validity (0 <= slot < num_slots); invalid ids point at slot 0."""
    m_n = (idx >= 0) & (idx < num_slots)
    slot = gl.where(m_n, idx, 0)
    i_blk = slot // block_size
    i_off = slot - i_blk * block_size
    return kv_ptr + i_blk.to(gl.int64) * stride_kv_blk + i_off.to(gl.int64) * stride_kv_row, m_n


@gluon.jit
def _issue(kv_ptr, idx, num_slots, block_size, stride_kv_blk, stride_kv_row, lat_s, rope_s, sc_s, st,
           FMT: gl.constexpr, HAS_ROPE: gl.constexpr):
    """Start the copies of one tile's rows (slot ids ``idx``) into stage ``st`` of the shared buffers."""
    p_row, m_n = _row_ptrs(kv_ptr, idx, num_slots, block_size, stride_kv_blk, stride_kv_row)
    if FMT >= 2:
        # the fp8 formats: the row's first 512 bytes as bytes (fp8_ds_mla: the e4m3 latent; V4 pages: 448 e4m3
        # NoPE values, the last 64 bytes the first half of the RoPE part, copied but unused)
        L8: gl.constexpr = _gather_layout(16, gl.num_warps())
        p8 = gl.convert_layout(p_row, gl.SliceLayout(1, L8))
        m8 = gl.convert_layout(m_n, gl.SliceLayout(1, L8))
        o_c = gl.arange(0, LATENT, gl.SliceLayout(0, L8))
        _async_load(lat_s.index(st), p8[:, None] + o_c[None, :], mask=m8[:, None])
    if FMT == 3:
        # DeepSeek-V4 pages: the row's 64 bf16 RoPE values and its 8 footer bytes (7 UE8M0 exponents and a pad
        # byte, read as two int32) at 576 · block_size + 8 · offset in the page
        LW: gl.constexpr = _v4_scale_layout(gl.num_warps())
        slot = gl.convert_layout(gl.where(m_n, idx, 0), gl.SliceLayout(1, LW))
        i_blk = slot // block_size
        i_off = slot - i_blk * block_size
        p_foot = kv_ptr + i_blk.to(gl.int64) * stride_kv_blk + (i_off * 8 + block_size * V4_ROW).to(gl.int64)
        o_w = gl.arange(0, 2, gl.SliceLayout(0, LW))
        _async_load(sc_s.index(st), p_foot.to(gl.pointer_type(gl.int32))[:, None] + o_w[None, :],
                    mask=gl.convert_layout(m_n, gl.SliceLayout(1, LW))[:, None])
        o_r = gl.arange(0, ROPE, gl.SliceLayout(0, _gather_layout(8, gl.num_warps())))
        _async_load(rope_s.index(st), (p_row + V4_NOPE).to(gl.pointer_type(gl.bfloat16))[:, None] + o_r[None, :],
                    mask=m_n[:, None])
    elif FMT == 2:
        LS: gl.constexpr = _scale_layout(gl.num_warps())
        ps = gl.convert_layout(p_row, gl.SliceLayout(1, LS))
        ms = gl.convert_layout(m_n, gl.SliceLayout(1, LS))
        o_s = gl.arange(0, 4, gl.SliceLayout(0, LS))
        _async_load(sc_s.index(st), (ps + LATENT).to(gl.pointer_type(gl.float32))[:, None] + o_s[None, :],
                    mask=ms[:, None])
        if HAS_ROPE:
            o_r = gl.arange(0, ROPE, gl.SliceLayout(0, _gather_layout(8, gl.num_warps())))
            _async_load(rope_s.index(st), (p_row + LATENT + 16).to(gl.pointer_type(gl.bfloat16))[:, None]
                        + o_r[None, :], mask=m_n[:, None])
    else:
        o_c = gl.arange(0, LATENT, gl.SliceLayout(0, _gather_layout(8, gl.num_warps())))
        _async_load(lat_s.index(st), p_row[:, None] + o_c[None, :], mask=m_n[:, None])
        if HAS_ROPE:
            o_r = gl.arange(0, ROPE, gl.SliceLayout(0, _gather_layout(8, gl.num_warps())))
            _async_load(rope_s.index(st), p_row[:, None] + (LATENT + o_r)[None, :], mask=m_n[:, None])


@gluon.jit
def _src(pos0, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
         stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2, block_size2,
         stride_kv2_blk, stride_kv2_row, HAS_EXTRA: gl.constexpr):
    """The list that the tile at entry ``pos0`` of this program's range reads (the main list, or with an extra
    cache the extra list from entry ``n_pad`` on), as scalars: cache, slot ids and their strides, the tile's first
    entry in that list and the list's end for this program, slots, block size, block and row strides."""
    kv, idx, s_t, s_k, p0, e = kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, pos0, n_end
    ns, bs, sb, sr = num_slots, block_size, stride_kv_blk, stride_kv_row
    if HAS_EXTRA:
        e = gl.minimum(n_end, n_row)
        if pos0 >= n_pad:
            kv, idx, s_t, s_k, p0, e = kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, pos0 - n_pad, n_end - n_pad
            ns, bs, sb, sr = num_slots2, block_size2, stride_kv2_blk, stride_kv2_row
    return kv, idx, s_t, s_k, p0, e, ns, bs, sb, sr


@gluon.jit
def _ids_at(pos0, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
            stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2, block_size2,
            stride_kv2_blk, stride_kv2_row, BLOCK_N: gl.constexpr, layout: gl.constexpr, HAS_EXTRA: gl.constexpr):
    """Slot ids of the tile at entry ``pos0`` (-1 past its list's part of this program's range); with an extra
    cache, ids invalid for their own list are -1 too (the two lists have their own slot counts, the masks one
    bound: :func:`_mask_slots`)."""
    kv, idx, s_t, s_k, p0, e, ns, bs, sb, sr = _src(
        pos0, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
        stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2, block_size2,
        stride_kv2_blk, stride_kv2_row, HAS_EXTRA)
    ids = _load_idx(idx, i_t, s_t, s_k, p0, e, BLOCK_N, layout)
    if HAS_EXTRA:
        ids = gl.where((ids >= 0) & (ids < ns), ids, -1)
    return ids


@gluon.jit
def _issue_at(pos0, ids, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
              stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2, block_size2,
              stride_kv2_blk, stride_kv2_row, lat_s, rope_s, sc_s, st, FMT: gl.constexpr, HAS_ROPE: gl.constexpr,
              HAS_EXTRA: gl.constexpr):
    """:func:`_issue` of the tile at entry ``pos0`` (slot ids ``ids``, from :func:`_ids_at`) from its list's
    cache."""
    kv, idx, s_t, s_k, p0, e, ns, bs, sb, sr = _src(
        pos0, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots, block_size,
        stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2, block_size2,
        stride_kv2_blk, stride_kv2_row, HAS_EXTRA)
    _issue(kv, ids, ns, bs, sb, sr, lat_s, rope_s, sc_s, st, FMT, HAS_ROPE)


@gluon.jit
def _mask_slots(num_slots, num_slots2, HAS_EXTRA: gl.constexpr):
    """The bound the score masks compare slot ids with: the main cache's slot count, or with an extra cache one
    that every id :func:`_ids_at` left valid is below."""
    if HAS_EXTRA:
        num_slots = gl.maximum(num_slots, num_slots2)
    return num_slots


@gluon.jit
def _v4_scale(sc_s, st, G: gl.constexpr, layout: gl.constexpr):
    """DeepSeek-V4: float32 scales 2^(e - 127) of NoPE group ``G`` (64 values) of stage ``st``'s rows, in
    ``layout`` (a slice along the rows), exact (e = 0: 2^-127, a subnormal; 255: inf, as the reference)."""
    LW: gl.constexpr = _v4_scale_layout(gl.num_warps())
    o_w = gl.arange(0, 2, gl.SliceLayout(0, LW))
    word = gl.sum(gl.where(o_w[None, :] == G // 4, sc_s.index(st).load(LW), 0), 1)
    e = (word >> (8 * (G % 4))) & 255
    return gl.convert_layout(gl.where(e > 0, e << 23, 0x400000).to(gl.float32, bitcast=True), layout)


@gluon.jit
def _dequant_group_v4(raw_s, sc_s, deq_s, st, G: gl.constexpr, SW_FP8: gl.constexpr):
    """DeepSeek-V4: NoPE group ``G`` (columns [64·G, 64·G + 64)) of stage ``st`` as exact values in ``deq_s``'s
    dtype (bf16): e4m3 bytes times the group's scale."""
    L8: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [gl.num_warps(), 1], [1, 0])
    s_g = _v4_scale(sc_s, st, G, gl.SliceLayout(1, L8))
    raw = raw_s.index(st).slice(G * 64, 64, dim=1).load(L8)
    deq_s.slice(G * 64, 64, dim=1).store((_e4m3_to_f32(raw, SW_FP8) * s_g[:, None]).to(deq_s.dtype))


@gluon.jit
def _dequant_chunk_v4(raw_s, sc_s, rope_s, deq_s, st, C: gl.constexpr, SW_FP8: gl.constexpr):
    """DeepSeek-V4: columns [128·C, 128·C + 128) of stage ``st`` into ``deq_s``: NoPE groups 2C and 2C + 1
    (:func:`_dequant_group_v4`); chunk 3 is group 6 and the RoPE part (bf16, copied as stored)."""
    _dequant_group_v4(raw_s, sc_s, deq_s, st, 2 * C, SW_FP8)
    if C < 3:
        _dequant_group_v4(raw_s, sc_s, deq_s, st, 2 * C + 1, SW_FP8)
    else:
        deq_s.slice(V4_NOPE, ROPE, dim=1).store(rope_s.index(st).load(_gather_layout(8, gl.num_warps())))


@gluon.jit
def _dequant_tile_v4(raw_s, sc_s, rope_s, deq_s, st, SW_FP8: gl.constexpr):
    """:func:`_dequant_chunk_v4` for the whole tile."""
    for c in gl.static_range(LATENT // 128):
        _dequant_chunk_v4(raw_s, sc_s, rope_s, deq_s, st, c, SW_FP8)


@gluon.jit
def _chunk_scales(sc_s, st):
    """fp8_ds_mla: for each of a tile's four 128-column chunks, the largest scale over the tile's rows (1 where all
    are 0: zero-filled rows only). Chunks are normalised separately: their scales are independent (and may be 2^100
    apart), and each chunk alone makes 128 output columns."""
    LS: gl.constexpr = _scale_layout(gl.num_warps())
    cmax = gl.max(sc_s.index(st).load(LS), 0)
    cmax = gl.where(cmax > 0, cmax, 1.0)
    o_s = gl.arange(0, 4, gl.SliceLayout(0, LS))
    return (gl.sum(gl.where(o_s == 0, cmax, 0.0), 0), gl.sum(gl.where(o_s == 1, cmax, 0.0), 0),
            gl.sum(gl.where(o_s == 2, cmax, 0.0), 0), gl.sum(gl.where(o_s == 3, cmax, 0.0), 0))


@gluon.jit
def _dequant_chunk(raw_s, sc, o_s, deq_s, st, s_c, C: gl.constexpr, SW_FP8: gl.constexpr):
    L8: gl.constexpr = _gather_layout(16, gl.num_warps())
    r = 1.0 / s_c
    if SW_FP8:
        r = r * 256.0  # the integer decode's float16 is the value / 256
    r_c = gl.convert_layout(gl.sum(gl.where(o_s[None, :] == C, sc, 0.0), 1) * r, gl.SliceLayout(1, L8))
    raw = raw_s.index(st).slice(C * 128, 128, dim=1).load(L8)
    deq_s.slice(C * 128, 128, dim=1).store(_e4m3_to_f16(raw, SW_FP8) * r_c.to(gl.float16)[:, None])


@gluon.jit
def _dequant_tile(raw_s, sc_s, deq_s, st, s0, s1, s2, s3, SW_FP8: gl.constexpr):
    """fp8_ds_mla: e4m3 bytes -> the float16 tile ``deq_s`` of value x scale / ``s_c`` for chunk c (<= 448 in
    magnitude; the caller applies ``s_c`` to the chunk's scores and output): one conversion per two values (float16
    holds every e4m3 value) and one float16 multiply per value."""
    LQ: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [gl.num_warps(), 1], [1, 0])  # rows as the gather's
    sc = sc_s.index(st).load(LQ)
    o_s = gl.arange(0, 4, gl.SliceLayout(0, LQ))
    _dequant_chunk(raw_s, sc, o_s, deq_s, st, s0, 0, SW_FP8)
    _dequant_chunk(raw_s, sc, o_s, deq_s, st, s1, 1, SW_FP8)
    _dequant_chunk(raw_s, sc, o_s, deq_s, st, s2, 2, SW_FP8)
    _dequant_chunk(raw_s, sc, o_s, deq_s, st, s3, 3, SW_FP8)


@gluon.jit
def _dequant_tile_exact(raw_s, sc_s, rope_s, deq_s, st, FMT: gl.constexpr, SW_FP8: gl.constexpr):
    """The fp8 formats without F16_DOT: e4m3 bytes x their scale -> the tile ``deq_s`` in q's 16-bit dtype (bf16
    holds float32's range, as in the tl kernel: no unit to track, any scales); fp8_ds_mla with its row's tile
    scales, DeepSeek-V4 pages with :func:`_dequant_tile_v4`."""
    if FMT == 3:
        _dequant_tile_v4(raw_s, sc_s, rope_s, deq_s, st, SW_FP8)
    else:
        L8: gl.constexpr = _gather_layout(16, gl.num_warps())
        LQ: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [gl.num_warps(), 1], [1, 0])  # rows as the gather's
        sc = sc_s.index(st).load(LQ)
        o_s = gl.arange(0, 4, gl.SliceLayout(0, LQ))
        for c in gl.static_range(LATENT // 128):
            sc_c = gl.convert_layout(gl.sum(gl.where(o_s[None, :] == c, sc, 0.0), 1), gl.SliceLayout(1, L8))
            raw = raw_s.index(st).slice(c * 128, 128, dim=1).load(L8)
            deq_s.slice(c * 128, 128, dim=1).store((_e4m3_to_f32(raw, SW_FP8) * sc_c[:, None]).to(deq_s.dtype))


@gluon.jit
def _qk_chunk(q_s, k_t, b_s, s_c, C: gl.constexpr, DOT_A: gl.constexpr, DOT_B: gl.constexpr):
    """fp8_ds_mla: the scores of latent chunk C (two 64-column dots from zero), times the chunk's scale."""
    b_c = gl.zeros_like(b_s)
    b_c = ampere.mma_v2(q_s.slice(C * 128, 64, dim=1).load(DOT_A),
                        k_t.slice(C * 128, 64, dim=1).permute([1, 0]).load(DOT_B), b_c)
    b_c = ampere.mma_v2(q_s.slice(C * 128 + 64, 64, dim=1).load(DOT_A),
                        k_t.slice(C * 128 + 64, 64, dim=1).permute([1, 0]).load(DOT_B), b_c)
    return b_s + b_c * s_c


@gluon.jit
def _q_buffers(lt: gl.constexpr, dt: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr):
    """Shared memory for q's latent part (in the latent dots' dtype ``lt``), q's RoPE part and each stage's RoPE
    rows."""
    SH16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_s = gl.allocate_shared_memory(lt, [BLOCK_H, LATENT], SH16)
    qr_s = gl.allocate_shared_memory(dt, [BLOCK_H, ROPE], SH16)
    rope_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, ROPE], SH16)
    return q_s, qr_s, rope_s


@gluon.jit
def _tile_buffers(lt: gl.constexpr, dt: gl.constexpr, FMT: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr):
    """Shared memory for each stage's latent rows as gathered (``raw_s``), the fp8 formats' scales (``sc_s``:
    fp8_ds_mla's tile scales, DeepSeek-V4's footers) and the tile the dots read (``lat_s``: the fp8 formats'
    dequantised tile; the stages themselves for 16-bit caches)."""
    SH16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    if FMT >= 2:
        SH8: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        raw_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, LATENT], SH8)
        if FMT == 3:  # DeepSeek-V4: each row's footer (7 UE8M0 exponents, a pad byte) as two int32
            sc_s = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 2], SH8)
        else:
            sc_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, 4], SH8)
        lat_s = gl.allocate_shared_memory(lt, [1, BLOCK_N, LATENT], SH16)  # the dequantised tile
    else:
        raw_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, LATENT], SH16)
        sc_s = raw_s  # unused
        lat_s = raw_s
    return raw_s, sc_s, lat_s


@gluon.jit
def _q_to_shared(q_nope_ptr, q_pe_ptr, i_t, i_hb, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H, q_s, qr_s,
                 UNITS: gl.constexpr, HAS_ROPE: gl.constexpr, BLOCK_H: gl.constexpr):
    """q of this row and head block into shared memory, through registers (any alignment; heads past H read as 0).
    With ``UNITS`` q's latent part is stored over a power of two >= each head's largest |q| (exact in float16),
    returned per head for the caller to scale the scores back (1 otherwise)."""
    G16: gl.constexpr = _gather_layout(8, gl.num_warps())
    ROW: gl.constexpr = gl.SliceLayout(1, G16)
    o_hq = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, ROW)
    p_q = q_nope_ptr + i_t * stride_qn_t + o_hq.to(gl.int64)[:, None] * stride_qn_h
    b_q = gl.load(p_q + gl.arange(0, LATENT, gl.SliceLayout(0, G16))[None, :], mask=(o_hq < H)[:, None], other=0.0)
    b_qmax = gl.full([BLOCK_H], 1.0, gl.float32, ROW)
    if UNITS:
        b_qmax = gl.max(gl.abs(b_q.to(gl.float32)), 1)
        b_qmax = gl.where(b_qmax > 0, gl.exp2(gl.minimum(gl.ceil(gl.log2(b_qmax)), 127.0)), 1.0)
        q_s.store((b_q.to(gl.float32) * (1.0 / b_qmax)[:, None]).to(gl.float16))
    else:
        q_s.store(b_q)
    if HAS_ROPE:
        p_qr = q_pe_ptr + i_t * stride_qp_t + o_hq.to(gl.int64)[:, None] * stride_qp_h
        qr_s.store(gl.load(p_qr + gl.arange(0, ROPE, gl.SliceLayout(0, G16))[None, :], mask=(o_hq < H)[:, None],
                           other=0.0))
    return b_qmax


@gluon.jit
def _row_range(topk_len_ptr, i_t, stride_tl, topk, topk_len2_ptr, stride_tl2, topk2, i_s, split_len,
               BLOCK_N: gl.constexpr, HAS_TOPK_LEN: gl.constexpr, HAS_EXTRA: gl.constexpr,
               HAS_TOPK_LEN2: gl.constexpr):
    """This program's part ``[n_start, n_end)`` of the row's list, the main list's length ``n_row``, where the
    extra list starts (``n_pad``: the main list padded to whole tiles, so that no tile mixes the two caches; as the
    tl kernel walks them) and the number of tiles."""
    n_row = topk
    if HAS_TOPK_LEN:
        n_row = gl.minimum(gl.maximum(gl.load(topk_len_ptr + i_t * stride_tl), 0), topk)
    n_all = n_row
    n_pad = n_row
    if HAS_EXTRA:
        n_pad = gl.cdiv(n_row, BLOCK_N) * BLOCK_N
        n_row2 = topk2
        if HAS_TOPK_LEN2:
            n_row2 = gl.minimum(gl.maximum(gl.load(topk_len2_ptr + i_t * stride_tl2), 0), topk2)
        n_all = n_pad + n_row2
    n_start = i_s * split_len
    n_end = gl.minimum(n_start + split_len, n_all)
    return n_start, n_end, n_row, n_pad, gl.cdiv(n_end - n_start, BLOCK_N)


@gluon.jit
def _prologue(i_t, n_start, n_end, n_row, n_pad, n_tiles, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots,
              block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k, num_slots2,
              block_size2, stride_kv2_blk, stride_kv2_row, raw_s, rope_s, sc_s, FMT: gl.constexpr,
              HAS_ROPE: gl.constexpr, HAS_EXTRA: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Tiles 0 .. STAGES-2 in flight; returns the slot ids of tile STAGES-1."""
    ROW: gl.constexpr = gl.SliceLayout(1, _gather_layout(8, gl.num_warps()))
    idx_nx = _ids_at(n_start, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k, num_slots,
                     block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t, stride_idx2_k,
                     num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, BLOCK_N, ROW, HAS_EXTRA)
    for u in gl.static_range(STAGES - 1):
        idx_u = idx_nx
        idx_nx = _ids_at(n_start + (u + 1) * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                         stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                         stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                         BLOCK_N, ROW, HAS_EXTRA)
        if u < n_tiles:
            _issue_at(n_start + u * BLOCK_N, idx_u, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                      stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                      stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s,
                      rope_s, sc_s, u, FMT, HAS_ROPE, HAS_EXTRA)
        _ac.commit_group()
    return idx_nx


@gluon.jit
def _softmax_step(b_s, idx_c, num_slots, qk_scale, b_m, b_l):
    """One tile of the online softmax (base 2): the scores ``b_s`` of invalid slot ids masked to -inf, then the
    tile's probabilities, the rescale ``b_alpha`` of what came before, and the running max and sum (a row with no
    valid entry yet keeps max -inf, sum 0)."""
    m_n = (idx_c >= 0) & (idx_c < num_slots)
    b_s = gl.where(m_n[None, :], b_s * qk_scale, float("-inf"))
    b_m_new = gl.maximum(b_m, gl.max(b_s, 1))
    b_m_use = gl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_alpha = gl.exp2(b_m - b_m_use)
    b_p = gl.exp2(b_s - b_m_use[:, None])
    return b_p, b_alpha, b_m_new, b_l * b_alpha + gl.sum(b_p, 1)


@gluon.jit
def _store_outputs(out_ptr, lse_ptr, sink_ptr, i_t, i_s, stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s,
                   stride_l_h, stride_sink, o_h, m_h, o_c, b_inv, b_lse2, b_a0, b_a1, b_a2, b_a3, s_run0, s_run1,
                   s_run2, s_run3, SPLIT: gl.constexpr, HAS_SINK: gl.constexpr):
    """Write the four output chunks (times ``b_inv`` and their units ``s_run``) and the lse: a split's partials
    (log2 lse, for the combine kernel), or the final row with the sink applied (natural-log lse)."""
    if SPLIT:
        p_o = out_ptr + i_t * stride_o_t + i_s.to(gl.int64) * stride_o_s + o_h[:, None].to(gl.int64) * stride_o_h
        gl.store(lse_ptr + i_t * stride_l_t + i_s.to(gl.int64) * stride_l_s + o_h * stride_l_h, b_lse2, mask=m_h)
    else:
        if HAS_SINK:
            b_sink = gl.load(sink_ptr + o_h * stride_sink, mask=m_h, other=0.0)
            # as in the tl kernel: an empty row stays 0, a -inf sink changes nothing
            b_inv = gl.where(b_lse2 == float("-inf"), 0.0,
                             b_inv / (1.0 + gl.exp2(b_sink * 1.4426950408889634 - b_lse2)))
        p_o = out_ptr + i_t * stride_o_t + o_h[:, None].to(gl.int64) * stride_o_h
        gl.store(lse_ptr + i_t * stride_l_t + o_h * stride_l_h, b_lse2 * 0.6931471805599453, mask=m_h)
    ty: gl.constexpr = out_ptr.dtype.element_ty
    gl.store(p_o + (0 * 128 + o_c)[None, :], (b_a0 * (b_inv * s_run0)[:, None]).to(ty), mask=m_h[:, None])
    gl.store(p_o + (1 * 128 + o_c)[None, :], (b_a1 * (b_inv * s_run1)[:, None]).to(ty), mask=m_h[:, None])
    gl.store(p_o + (2 * 128 + o_c)[None, :], (b_a2 * (b_inv * s_run2)[:, None]).to(ty), mask=m_h[:, None])
    gl.store(p_o + (3 * 128 + o_c)[None, :], (b_a3 * (b_inv * s_run3)[:, None]).to(ty), mask=m_h[:, None])


@gluon.jit(do_not_specialize=["T", "topk", "num_slots", "num_splits", "split_len", "topk2", "num_slots2"])
def _sparse_mla_fwd_mma2(
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
    i_ts = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_t = (i_ts // num_splits).to(gl.int64)
    i_s = i_ts % num_splits
    dt: gl.constexpr = q_nope_ptr.dtype.element_ty

    MMA: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_H)
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    ROW: gl.constexpr = gl.SliceLayout(1, _gather_layout(8, gl.num_warps()))

    # fp8_ds_mla with F16_DOT runs its latent dots in float16 (the tile as _dequant_tile leaves it, q over a power of
    # two, each chunk's output in units of its tile scale); without, on tiles of exact values in q's dtype
    UNITS: gl.constexpr = F16_DOT if FMT == 2 else False
    lt: gl.constexpr = gl.float16 if UNITS else dt
    q_s, qr_s, rope_s = _q_buffers(lt, dt, BLOCK_H, BLOCK_N, STAGES)
    raw_s, sc_s, lat_s = _tile_buffers(lt, dt, FMT, BLOCK_N, STAGES)
    b_qmax = _q_to_shared(q_nope_ptr, q_pe_ptr, i_t, i_hb, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H,
                          q_s, qr_s, UNITS, HAS_ROPE, BLOCK_H)
    if UNITS:
        b_qmax = gl.convert_layout(b_qmax, gl.SliceLayout(1, MMA))
    n_start, n_end, n_row, n_pad, n_tiles = _row_range(topk_len_ptr, i_t, stride_tl, topk, topk_len2_ptr,
                                                       stride_tl2, topk2, i_s, split_len, BLOCK_N, HAS_TOPK_LEN,
                                                       HAS_EXTRA, HAS_TOPK_LEN2)
    idx_nx = _prologue(i_t, n_start, n_end, n_row, n_pad, n_tiles, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
                       num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                       stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s, rope_s, sc_s,
                       FMT, HAS_ROPE, HAS_EXTRA, BLOCK_N, STAGES)
    ns_m = _mask_slots(num_slots, num_slots2, HAS_EXTRA)

    o_h = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, MMA))
    m_h = o_h < H
    o_c = gl.arange(0, 128, gl.SliceLayout(0, MMA))
    b_m = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, MMA))
    b_l = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, MMA))
    b_a0 = gl.zeros([BLOCK_H, 128], gl.float32, MMA)
    b_a1 = gl.zeros([BLOCK_H, 128], gl.float32, MMA)
    b_a2 = gl.zeros([BLOCK_H, 128], gl.float32, MMA)
    b_a3 = gl.zeros([BLOCK_H, 128], gl.float32, MMA)
    qk_scale = sm_scale_log2
    # fp8_ds_mla: accumulator c holds its output columns / s_run_c
    s_run0 = 1.0
    s_run1 = 1.0
    s_run2 = 1.0
    s_run3 = 1.0

    for t in range(0, n_tiles):
        st = t % STAGES
        if STAGES > 1:
            # this tile's slot ids in the score layout, for the masks (loaded STAGES - 1 steps ago: a cache hit),
            # requested before the wait; the one-buffer variant loads them after the dots, where they hold no
            # registers across them (each placement is the one measured faster for its variant)
            idx_c = _ids_at(n_start + t * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                            stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                            stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                            BLOCK_N, gl.SliceLayout(0, MMA), HAS_EXTRA)
        if STAGES == 1:  # one buffer: the other resident programs hide this tile's latency
            _barrier()  # every warp done with tile t - 1
            _issue_at(n_start + t * BLOCK_N, idx_nx, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t, stride_idx_k,
                      num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr, stride_idx2_t,
                      stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row, raw_s, rope_s, sc_s, 0,
                      FMT, HAS_ROPE, HAS_EXTRA)
            _ac.commit_group()
            idx_nx = _ids_at(n_start + (t + 1) * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                             stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                             stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                             BLOCK_N, ROW, HAS_EXTRA)
            _ac.wait_group(0)
            _barrier()
        else:
            _ac.wait_group(STAGES - 2)
            _barrier()  # tile t visible to every warp; every warp done with tile t - 1, whose stage is refilled now
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
        b_s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, MMA)
        if UNITS:
            s0, s1, s2, s3 = _chunk_scales(sc_s, st)
            _dequant_tile(raw_s, sc_s, lat_s.index(0), st, s0, s1, s2, s3, SW_FP8)
            _barrier()
            k_t = lat_s.index(0)
            b_s = _qk_chunk(q_s, k_t, b_s, s0, 0, DOT_A, DOT_B)
            b_s = _qk_chunk(q_s, k_t, b_s, s1, 1, DOT_A, DOT_B)
            b_s = _qk_chunk(q_s, k_t, b_s, s2, 2, DOT_A, DOT_B)
            b_s = _qk_chunk(q_s, k_t, b_s, s3, 3, DOT_A, DOT_B)
            b_s = b_s * b_qmax[:, None]
        else:
            if FMT >= 2:
                _dequant_tile_exact(raw_s, sc_s, rope_s, lat_s.index(0), st, FMT, SW_FP8)
                _barrier()
                k_t = lat_s.index(0)
            else:
                k_t = lat_s.index(st)
            for c in gl.static_range(LATENT // 64):
                b_s = ampere.mma_v2(q_s.slice(c * 64, 64, dim=1).load(DOT_A),
                                    k_t.slice(c * 64, 64, dim=1).permute([1, 0]).load(DOT_B), b_s)
        if HAS_ROPE:
            b_s = ampere.mma_v2(qr_s.load(DOT_A), rope_s.index(st).permute([1, 0]).load(DOT_B), b_s)
        if STAGES == 1:
            idx_c = _ids_at(n_start + t * BLOCK_N, i_t, n_end, n_row, n_pad, kv_ptr, idx_ptr, stride_idx_t,
                            stride_idx_k, num_slots, block_size, stride_kv_blk, stride_kv_row, kv2_ptr, idx2_ptr,
                            stride_idx2_t, stride_idx2_k, num_slots2, block_size2, stride_kv2_blk, stride_kv2_row,
                            BLOCK_N, gl.SliceLayout(0, MMA), HAS_EXTRA)
        b_p, b_alpha, b_m, b_l = _softmax_step(b_s, idx_c, ns_m, qk_scale, b_m, b_l)
        b_pa = gl.convert_layout(b_p.to(lt), DOT_A)
        if UNITS:  # each accumulator moves to the units of its chunk's scale in this tile
            b_a0 = ampere.mma_v2(b_pa, k_t.slice(0 * 128, 128, dim=1).load(DOT_B),
                                 b_a0 * (b_alpha * (s_run0 / s0))[:, None])
            b_a1 = ampere.mma_v2(b_pa, k_t.slice(1 * 128, 128, dim=1).load(DOT_B),
                                 b_a1 * (b_alpha * (s_run1 / s1))[:, None])
            b_a2 = ampere.mma_v2(b_pa, k_t.slice(2 * 128, 128, dim=1).load(DOT_B),
                                 b_a2 * (b_alpha * (s_run2 / s2))[:, None])
            b_a3 = ampere.mma_v2(b_pa, k_t.slice(3 * 128, 128, dim=1).load(DOT_B),
                                 b_a3 * (b_alpha * (s_run3 / s3))[:, None])
            s_run0 = s0
            s_run1 = s1
            s_run2 = s2
            s_run3 = s3
        else:
            b_a0 = ampere.mma_v2(b_pa, k_t.slice(0 * 128, 128, dim=1).load(DOT_B), b_a0 * b_alpha[:, None])
            b_a1 = ampere.mma_v2(b_pa, k_t.slice(1 * 128, 128, dim=1).load(DOT_B), b_a1 * b_alpha[:, None])
            b_a2 = ampere.mma_v2(b_pa, k_t.slice(2 * 128, 128, dim=1).load(DOT_B), b_a2 * b_alpha[:, None])
            b_a3 = ampere.mma_v2(b_pa, k_t.slice(3 * 128, 128, dim=1).load(DOT_B), b_a3 * b_alpha[:, None])
    _ac.wait_group(0)  # no copy may outlive the program's shared memory
    if PDL:  # the combine kernel may start (and wait for this grid) once every program has left its loop
        _launch_dependents()

    # Normalise; an empty range (no valid entry) gives 0 and lse -inf.
    b_inv = gl.where(b_l > 0, 1.0 / b_l, 0.0)
    b_lse2 = gl.where(b_l > 0, b_m + gl.log2(b_l), float("-inf"))
    _store_outputs(out_ptr, lse_ptr, sink_ptr, i_t, i_s, stride_o_t, stride_o_s, stride_o_h, stride_l_t, stride_l_s,
                   stride_l_h, stride_sink, o_h, m_h, o_c, b_inv, b_lse2, b_a0, b_a1, b_a2, b_a3, s_run0, s_run1,
                   s_run2, s_run3, SPLIT, HAS_SINK)


launch_fwd_mma2 = CachedLauncher(_sparse_mla_fwd_mma2)


__all__ = ["launch_fwd_mma2"]

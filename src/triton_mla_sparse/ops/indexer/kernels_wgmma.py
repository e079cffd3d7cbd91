"""Gluon kernel of the DSA indexer's logits on Hopper (sm90): decode rows, e4m3 q, vLLM's fp8 indexer cache.

Same arguments, program grid and results as :func:`.kernels._indexer_logits_kernel` with ``ROWS = 1``: one program
per (query row, chunk of ``chunk`` request-local positions, a multiple of 64); ``logits[t, p] = Σ_h w[t, h] ·
relu(<q[t, h], k[p]> · kscale[p])`` for ``p <= positions[t]``, -inf past it and wherever the request id, the block
column or the table entry is out of range (never read); ``ZERO_WS`` zeroes the row's split-select workspace. It
serves the case that dominates decode, e4m3 q over vLLM's fp8 cache in 64-token blocks (``block_size`` must be 64,
rows 128 bytes apart, blocks 16-byte aligned: :func:`.configs.wgmma_refusal` decides), with the memory pipeline
written out instead of left to Triton's pipeliner:

* a tile is one cache block: its 64 rows of 128 e4m3 bytes (8 KiB, contiguous) and its 64 float32 scales (right
  after them), copied with ``cp.async`` in 16-byte vectors into a ring of ``STAGES`` shared buffers, ``STAGES - 1``
  tiles in flight while one is computed; the rows (and scales) past the query row's position, and all of an invalid
  block, are zero-filled instead of read; each tile's block-table entry is loaded one step before its copies are
  issued;
* q of the row sits in shared memory (heads padded to ``BLOCK_H`` with zeros) and each tile's scores are one
  warpgroup MMA ``k [64, 128] · qᵀ [128, BLOCK_H]`` on e4m3 operands, both K-major as fp8 wgmma requires;
* the epilogue keeps each position's heads in one row of the accumulator (one thread and its three neighbour
  lanes): times the position's scale, ReLU, times the weights, the sum over heads, masked, stored as 64 float32
  logits.

Four warps (one warpgroup) per program; shared memory ``STAGES · (8192 + 256) + BLOCK_H · 128`` bytes.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _ac
from triton.runtime.jit import constexpr_function

from ..._common.launch import CachedLauncher

# Names that changed between triton 3.6 (the H200's) and 3.9 (the CI's).
_async_load = getattr(_ac, "async_load", None) or _ac.async_copy_global_to_shared
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

TILE = gl.constexpr(64)  # positions per tile: one block of vLLM's indexer cache
D = gl.constexpr(128)  # index head dim: e4m3 bytes per cache row
FILL = gl.constexpr(512)  # positions per store of the -inf fill
WS_STEP = gl.constexpr(1024)  # int32 per store of the workspace zeroing


@constexpr_function
def _acc_layout(block_h):
    """The scores [64 positions, BLOCK_H heads]: a wgmma accumulator of one warpgroup, 16 rows per warp."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, block_h, 32])


@constexpr_function
def _rows_layout(num_warps):
    """[rows, 128 bytes]: 16-byte vectors over 8 lanes per row, 4 rows per warp."""
    return gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])


@constexpr_function
def _vec_layout(num_warps):
    """1-D runs of 16-byte vectors (four 32-bit values per thread)."""
    return gl.BlockedLayout([4], [32], [num_warps], [0])


@constexpr_function
def _scale_layout(num_warps):
    """A tile's 64 scales: one per thread (each masked by its own row)."""
    return gl.BlockedLayout([1], [32], [num_warps], [0])


@gluon.jit
def _table_entry(bt_row, j, n_tiles, col0, max_blocks, stride_bt_c):
    """Block-table entry of tile ``j`` (column ``col0 + j``); -1 for tiles past ``n_tiles`` or the table."""
    col = col0 + j
    m = (j < n_tiles) & (col < max_blocks)
    return gl.load(bt_row + gl.where(m, col, 0).to(gl.int64) * stride_bt_c, mask=m, other=-1)


@gluon.jit
def _issue(k_ptr, blk, ok, kk, hi, stride_k_blk, k_s, sc_s, st):
    """Start the copies of the tile at position ``kk`` (block ``blk``, valid if ``ok``) into stage ``st``: its rows
    below ``hi`` and their scales; the rest of the stage is zero-filled, not read."""
    RL: gl.constexpr = _rows_layout(gl.num_warps())
    p_blk = k_ptr + gl.where(ok, blk, 0).to(gl.int64) * stride_k_blk
    o_r = gl.arange(0, TILE, gl.SliceLayout(1, RL))
    o_c = gl.arange(0, D, gl.SliceLayout(0, RL))
    m_r = ok & (kk + o_r < hi)
    p_k = (p_blk + (o_r * D)[:, None] + o_c[None, :]).to(gl.pointer_type(gl.float8e4nv))
    _async_load(k_s.index(st), p_k, mask=m_r[:, None])
    o_s = gl.arange(0, TILE, _scale_layout(gl.num_warps()))
    p_sc = (p_blk + TILE * D).to(gl.pointer_type(gl.float32)) + o_s
    _async_load(sc_s.index(st), p_sc, mask=ok & (kk + o_s < hi))


@gluon.jit(do_not_specialize=["T", "max_len", "num_blocks", "R", "max_blocks", "n_chunks", "chunk", "ws_width"])
def _indexer_logits_wgmma(
    q_ptr, w_ptr, k_ptr, bt_ptr, req_ptr, pos_ptr, out_ptr, ws_ptr,
    stride_q_t, stride_q_h, stride_w_t, stride_w_h,
    stride_k_blk, stride_k_row,
    stride_bt_r, stride_bt_c, stride_req, stride_pos, stride_o_t, stride_o_p, stride_ws_t,
    T, Hi, max_len, block_size, num_blocks, R, max_blocks, n_chunks, chunk, ws_width,
    BLOCK_H: gl.constexpr, STAGES: gl.constexpr, ZERO_WS: gl.constexpr,
):
    """One program per (query row, chunk of ``chunk`` positions); ``q_ptr`` and ``k_ptr`` are bytes (e4m3 values
    and vLLM's fp8 blocks); ``block_size`` (64) and ``stride_k_row`` (128) are the layout the launch checked."""
    gl.static_assert(gl.num_warps() == 4, "one warpgroup: the wgmma tile is 64 positions")
    gl.static_assert(STAGES >= 2 and STAGES <= 32, "a ring of 2 to 32 stages (one validity bit per stage)")
    pid = gl.program_id(0)
    t = (pid // n_chunks).to(gl.int64)
    i_c = pid % n_chunks
    k0 = i_c * chunk
    k1 = gl.minimum(k0 + chunk, max_len)  # this program writes columns [k0, k1)
    ACC: gl.constexpr = _acc_layout(BLOCK_H)
    RL: gl.constexpr = _rows_layout(gl.num_warps())
    VL: gl.constexpr = _vec_layout(gl.num_warps())
    SH8: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    SH1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    k_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, TILE, D], SH8)
    sc_s = gl.allocate_shared_memory(gl.float32, [STAGES, TILE], SH1)
    q_s = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, D], SH8)

    pos = gl.load(pos_ptr + t * stride_pos)
    req = gl.load(req_ptr + t * stride_req)
    req_ok = (req >= 0) & (req < R)
    # candidate columns of this program: [k0, hi)
    hi = gl.maximum(gl.where(req_ok, gl.minimum(k1 - 1, pos) + 1, k0), k0)
    n_tiles = gl.cdiv(hi - k0, TILE)
    bt_row = bt_ptr + gl.where(req_ok, req, 0).to(gl.int64) * stride_bt_r
    col0 = k0 // TILE

    # tiles 0 .. STAGES-2 in flight; bit s of ``ok_bits``: stage s holds a valid block
    blk_nx = _table_entry(bt_row, 0, n_tiles, col0, max_blocks, stride_bt_c)
    ok_bits = n_tiles * 0
    for u in gl.static_range(STAGES - 1):
        blk_u = blk_nx
        blk_nx = _table_entry(bt_row, u + 1, n_tiles, col0, max_blocks, stride_bt_c)
        ok_u = (blk_u >= 0) & (blk_u < num_blocks)  # -1 past the chunk's tiles
        if u < n_tiles:
            _issue(k_ptr, blk_u, ok_u, k0 + u * TILE, hi, stride_k_blk, k_s, sc_s, u)
        ok_bits = ok_bits | (ok_u.to(gl.int32) << u)
        _ac.commit_group()

    # while the first copies are in flight: q to shared memory (padded heads 0), the weights, the -inf columns
    # past the candidates, the workspace row
    o_hq = gl.arange(0, BLOCK_H, gl.SliceLayout(1, RL))
    o_d = gl.arange(0, D, gl.SliceLayout(0, RL))
    b_q = gl.load(q_ptr + t * stride_q_t + o_hq.to(gl.int64)[:, None] * stride_q_h + o_d[None, :],
                  mask=(o_hq < Hi)[:, None], other=0)
    q_s.store(b_q.to(gl.float8e4nv, bitcast=True))
    o_h = gl.arange(0, BLOCK_H, gl.SliceLayout(0, ACC))
    b_w = gl.load(w_ptr + t * stride_w_t + o_h * stride_w_h, mask=o_h < Hi, other=0.0)
    out_row = out_ptr + t * stride_o_t
    o_f = gl.arange(0, FILL, VL)
    for kk in range(k0 + n_tiles * TILE, k1, FILL):
        gl.store(out_row + (kk + o_f).to(gl.int64) * stride_o_p, gl.full([FILL], float("-inf"), gl.float32, VL),
                 mask=kk + o_f < k1)
    if ZERO_WS:
        if i_c == 0:
            o_z = gl.arange(0, WS_STEP, VL)
            for z in range(0, ws_width, WS_STEP):
                gl.store(ws_ptr + t * stride_ws_t + z + o_z, gl.zeros([WS_STEP], gl.int32, VL),
                         mask=z + o_z < ws_width)

    o_p = gl.arange(0, TILE, gl.SliceLayout(1, ACC))
    q_t = q_s.permute([1, 0])
    for i in range(0, n_tiles):
        st = i % STAGES
        _ac.wait_group(STAGES - 2)
        # each thread's cp.async data (and, first, its q stores) ordered before the wgmma reads: fence, then barrier
        hopper.fence_async_shared()
        _barrier()  # tile i visible to every warp; every warp done with tile i - 1, whose stage is refilled now
        j = i + STAGES - 1
        s_j = j % STAGES
        blk_j = blk_nx
        ok_j = (blk_j >= 0) & (blk_j < num_blocks)
        if j < n_tiles:
            _issue(k_ptr, blk_j, ok_j, k0 + j * TILE, hi, stride_k_blk, k_s, sc_s, s_j)
        _ac.commit_group()
        ok_bits = (ok_bits & ~(1 << s_j)) | (ok_j.to(gl.int32) << s_j)
        blk_nx = _table_entry(bt_row, j + 1, n_tiles, col0, max_blocks, stride_bt_c)

        b_s = hopper.warpgroup_mma(k_s.index(st), q_t, gl.zeros([TILE, BLOCK_H], gl.float32, ACC), use_acc=False)
        # relu of the scaled score, as the reference (a negative or non-finite scale gives what it gives)
        b_sc = sc_s.index(st).load(gl.SliceLayout(1, ACC))
        b_v = gl.sum(gl.maximum(b_s * b_sc[:, None], 0.0) * b_w[None, :], 1)
        o_k = k0 + i * TILE + o_p
        ok_i = ((ok_bits >> st) & 1) != 0
        gl.store(out_row + o_k.to(gl.int64) * stride_o_p, gl.where(ok_i & (o_k < hi), b_v, float("-inf")),
                 mask=o_k < k1)
    _ac.wait_group(0)  # no copy may outlive the program's shared memory


launch_logits_wgmma = CachedLauncher(_indexer_logits_wgmma)

__all__ = ["launch_logits_wgmma"]

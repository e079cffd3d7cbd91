"""Triton kernels for sparse MLA attention.

One program handles one query row, a block of ``BLOCK_H`` heads and a range of that row's top-k list. Per step it
gathers ``BLOCK_N`` cache rows through the slot ids, dequantises them in registers (bf16/fp16 as stored, fp8 by a
bit-cast and a scale), computes the scores for all heads of the block with tensor-core dots over the 512 latent +
64 RoPE dims, runs an online softmax in base 2 and accumulates ``p · V`` (V = the same latent rows) into four
``[BLOCK_H, 128]`` float32 tiles. All heads of a row share one gather, so a cache row is read once per row and
head block, not once per 16 heads.

* fp8_ds_mla with ``F16_DOT``: the e4m3 bytes go to float16 as they are (one conversion per two values, exact) and
  the tile scales are applied to the scores and to the probabilities instead of to every value: q is taken to
  float16 once, divided by a power of two >= each head's largest |q| (exact, and no q overflows float16; the scores
  are multiplied back), and each head's weights ``p · scale`` of a chunk are divided by their largest magnitude
  before the float16 dot and the chunk's ``p · V`` multiplied by it, in float32.
* ``LOW_REG`` (RDNA's table entries: wave32 has 256 VGPRs and no accumulation registers): q and each cache chunk are
  loaded where their dot needs them instead of being held across the step, the scores are summed in 64-column
  parts and V is gathered a second time (from cache) for ``p · V``.
* prefill mode (``SPLIT=False``): the program covers the row's whole list and writes the final output and lse.
* decode mode (``SPLIT=True``): the list is split across ``num_splits`` programs that write float32 partial
  outputs and base-2 lse values; :func:`_combine_kernel` merges them with an exact log-sum-exp merge (or, for the
  wgmma_t kernel with ``AttentionConfig.merge``, the row's last split does, in the kernel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..._common.fp8 import e4m3_to_f32 as _e4m3_to_f32
from ..._common.counters import take as take_counters
from ..._common.launch import CachedLauncher
from .configs import MERGE_SPLITS

if TYPE_CHECKING:
    import torch

    from .api import AttentionProblem
    from .configs import AttentionConfig

# kv_format codes (constexpr)
FMT_NATIVE = 0  # bf16 / fp16 rows, loaded as stored
FMT_FP8 = 1  # float8_e4m3fn rows (passed as uint8), one per-tensor scale
FMT_FP8_DS_MLA = 2  # 656-byte rows: 512 e4m3 + 4 float32 tile scales + 64 bf16 rope
FMT_FP8_V4 = 3  # DeepSeek-V4 pages: rows of 448 e4m3 + 64 bf16, then a footer of 7 UE8M0 exponents per row

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _slot_ids(idx_ptr, i_t, stride_idx_t, stride_idx_k, o_k, n_end, num_slots):
    """Slot ids [BLOCK_N] of list entries ``o_k`` and their validity (inside the range, 0 <= slot < num_slots);
    invalid entries get slot 0 (masked everywhere by the caller)."""
    m_k = o_k < n_end
    b_idx = tl.load(idx_ptr + i_t * stride_idx_t + o_k.to(tl.int64) * stride_idx_k, mask=m_k, other=-1)
    m_n = m_k & (b_idx >= 0) & (b_idx < num_slots)
    return tl.where(m_n, b_idx, 0), m_n


@triton.jit
def _rows(idx_ptr, i_t, stride_idx_t, stride_idx_k, o_k, n_end, num_slots, block_size, kv_ptr, stride_kv_blk,
          stride_kv_row):
    """Row pointers [BLOCK_N] of list entries ``o_k`` and their validity (:func:`_slot_ids`); invalid entries point
    at slot 0 and are masked everywhere."""
    b_idx, m_n = _slot_ids(idx_ptr, i_t, stride_idx_t, stride_idx_k, o_k, n_end, num_slots)
    i_blk = b_idx // block_size
    i_off = b_idx - i_blk * block_size
    p_row = kv_ptr + i_blk.to(tl.int64) * stride_kv_blk + i_off.to(tl.int64) * stride_kv_row
    return p_row, m_n


@triton.jit
def _rows_v4(idx_ptr, i_t, stride_idx_t, stride_idx_k, o_k, n_end, num_slots, block_size, kv_ptr, stride_kv_blk):
    """:func:`_rows` for DeepSeek-V4 pages: pointers [BLOCK_N] to the entries' 576-byte rows (at 576 · offset in
    their page) and to their 8 footer bytes (at 576 · block_size + 8 · offset), and the entries' validity; invalid
    entries point at slot 0 and are masked everywhere."""
    b_idx, m_n = _slot_ids(idx_ptr, i_t, stride_idx_t, stride_idx_k, o_k, n_end, num_slots)
    i_blk = b_idx // block_size
    i_off = b_idx - i_blk * block_size
    p_page = kv_ptr + i_blk.to(tl.int64) * stride_kv_blk
    p_row = p_page + i_off.to(tl.int64) * 576
    p_foot = p_page + (block_size.to(tl.int64) * 576 + i_off.to(tl.int64) * 8)
    return p_row, p_foot, m_n


@triton.jit
def _ue8m0(p_foot, m_n, G: tl.constexpr):
    """float32 scale 2^(byte - 127) of NoPE group G (64 values) of the rows [BLOCK_N], exact: the byte as a float32
    exponent (byte 0: 2^-127, a subnormal; 255: inf, as the float32 reference computes it)."""
    b_e = tl.load(p_foot + G, mask=m_n, other=127).to(tl.int32)
    return tl.where(b_e > 0, b_e << 23, 0x400000).to(tl.float32, bitcast=True)


@triton.jit
def _v4_chunk(p_row, p_foot, o_c, m_n, C: tl.constexpr, SW_FP8: tl.constexpr, dt: tl.constexpr):
    """Columns [128·C, 128·C + 128) of DeepSeek-V4 rows as real values in ``dt`` (0 for invalid rows): e4m3 bytes
    times their group's scale; chunk 3 is NoPE group 6 (columns 384–447) and the 64 bf16 RoPE values."""
    m_lo = (o_c < 64)[None, :]
    if C < 3:
        b_raw = tl.load(p_row[:, None] + (C * 128 + o_c)[None, :], mask=m_n[:, None], other=0)
        b_sc = tl.where(m_lo, _ue8m0(p_foot, m_n, 2 * C)[:, None], _ue8m0(p_foot, m_n, 2 * C + 1)[:, None])
        b_k = _e4m3_to_f32(b_raw, SW_FP8) * b_sc
    else:
        o_g = o_c % 64
        b_raw = tl.load(p_row[:, None] + (384 + o_g)[None, :], mask=m_n[:, None] & m_lo, other=0)
        p_rope = (p_row + 448).to(tl.pointer_type(tl.bfloat16))
        b_rope = tl.load(p_rope[:, None] + o_g[None, :], mask=m_n[:, None] & ~m_lo, other=0.0)
        b_k = tl.where(m_lo, _e4m3_to_f32(b_raw, SW_FP8) * _ue8m0(p_foot, m_n, 6)[:, None], b_rope.to(tl.float32))
    return b_k.to(dt)


@triton.jit
def _gather_chunk(p_row, o_c, m_n, C: tl.constexpr):
    """Latent values at columns ``C * 128 + o_c`` of the gathered rows as stored (bytes for fp8 formats); 0 when
    invalid."""
    return tl.load(p_row[:, None] + (C * 128 + o_c)[None, :], mask=m_n[:, None], other=0)


@triton.jit
def _gather_scale(p_row, m_n, C: tl.constexpr, FMT: tl.constexpr):
    """float32 scale of latent tile C of fp8_ds_mla rows [BLOCK_N] (1.0 for other formats: unused)."""
    if FMT == 2:
        return tl.load((p_row + 512).to(tl.pointer_type(tl.float32)) + C, mask=m_n, other=0.0)
    else:
        return tl.full(m_n.shape, 1.0, tl.float32)


@triton.jit
def _gather_rope(p_row, o_r, m_n, FMT: tl.constexpr):
    """RoPE part of the gathered rows as stored: bf16 for fp8_ds_mla, the cache's element type otherwise."""
    if FMT == 2:
        p = (p_row + 528).to(tl.pointer_type(tl.bfloat16))[:, None] + o_r[None, :]
    else:
        p = p_row[:, None] + (512 + o_r)[None, :]
    return tl.load(p, mask=m_n[:, None], other=0)


@triton.jit
def _dequant(raw, scale, FMT: tl.constexpr, CONVERT: tl.constexpr, SW_FP8: tl.constexpr, dt: tl.constexpr):
    """Stored values -> ``dt`` in registers: e4m3 bytes are decoded and (fp8_ds_mla) scaled per tile."""
    if FMT == 2:
        vals = (_e4m3_to_f32(raw, SW_FP8) * scale[:, None]).to(dt)
    elif FMT == 1:
        vals = _e4m3_to_f32(raw, SW_FP8).to(dt)
    elif CONVERT:
        vals = raw.to(tl.float32).to(dt)
    else:
        vals = raw
    return vals


@triton.jit
def _dequant_rope(raw, FMT: tl.constexpr, CONVERT: tl.constexpr, SW_FP8: tl.constexpr, dt: tl.constexpr):
    if FMT == 1:
        vals = _e4m3_to_f32(raw, SW_FP8).to(dt)
    elif FMT == 2 or CONVERT:
        vals = raw.to(tl.float32).to(dt)
    else:
        vals = raw
    return vals


@triton.jit
def _e4m3_to_f16(raw, SW_FP8: tl.constexpr):
    """float8_e4m3fn bytes -> float16, exact; with SW_FP8 the integer decode's float16, i.e. the value / 256
    (:func:`~triton_mla_sparse._common.fp8.e4m3_to_f32`): the caller multiplies the scale by 256."""
    if SW_FP8:
        x = raw.to(tl.int16)
        return (((x & 0x80) << 8) | ((x & 0x7F) << 7)).to(tl.float16, bitcast=True)
    else:
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _softmax_step(b_s, m_n, b_m, b_l, qk_scale):
    """The online softmax over one tile's raw scores: ``(running max, running sum, p, rescale of the old sums)``,
    in base 2; invalid rows score -inf, and a head with no valid row so far keeps max -inf without a NaN."""
    b_s = tl.where(m_n[None, :], b_s * qk_scale, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1))
    b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_alpha = tl.exp2(b_m - b_m_use)
    b_p = tl.exp2(b_s - b_m_use[:, None])
    return b_m_new, b_l * b_alpha + tl.sum(b_p, 1), b_p, b_alpha


@triton.jit
def _q_f16(b_q, b_qinv):
    """F16_DOT: q times the power of two ``b_qinv`` per head, in float16 (exact)."""
    return (b_q.to(tl.float32) * b_qinv[:, None]).to(tl.float16)


@triton.jit
def _chunk_pv(b_p, sc, b_v, b_a, b_alpha):
    """One latent chunk's ``p · V`` for unscaled float16 V rows with per-row scales ``sc``: each head's weights
    p · sc divided by their largest magnitude (so float16 holds them, the head's main terms at full precision), the
    dot's result multiplied back (a head with no weight in the tile adds 0)."""
    b_w = b_p * sc[None, :]
    w_max = tl.max(tl.abs(b_w), 1)
    inv = tl.where(w_max > 0, 1.0 / w_max, 0.0)
    b_pc = (b_w * inv[:, None]).to(tl.float16)
    return b_a * b_alpha[:, None] + tl.dot(b_pc, b_v) * w_max[:, None]


@triton.jit
def _attend_f16(b_q0, b_q1, b_q2, b_q3, b_qr, b_qmax, b_k0, b_k1, b_k2, b_k3, sc0, sc1, sc2, sc3, b_kr, m_n,
                b_m, b_l, b_a0, b_a1, b_a2, b_a3, qk_scale, HAS_ROPE: tl.constexpr):
    """:func:`_attend` for fp8_ds_mla with ``F16_DOT`` (see the module docstring): q chunks float16 / b_qmax, K = V
    chunks float16 unscaled, ``sc*`` the rows' tile scales (x 256 for the integer decode)."""
    b_s = tl.dot(b_q0, tl.trans(b_k0)) * sc0[None, :]
    b_s += tl.dot(b_q1, tl.trans(b_k1)) * sc1[None, :]
    b_s += tl.dot(b_q2, tl.trans(b_k2)) * sc2[None, :]
    b_s += tl.dot(b_q3, tl.trans(b_k3)) * sc3[None, :]
    b_s = b_s * b_qmax[:, None]
    if HAS_ROPE:
        b_s = tl.dot(b_qr, tl.trans(b_kr), b_s)
    b_m_new, b_l, b_p, b_alpha = _softmax_step(b_s, m_n, b_m, b_l, qk_scale)
    b_a0 = _chunk_pv(b_p, sc0, b_k0, b_a0, b_alpha)
    b_a1 = _chunk_pv(b_p, sc1, b_k1, b_a1, b_alpha)
    b_a2 = _chunk_pv(b_p, sc2, b_k2, b_a2, b_alpha)
    b_a3 = _chunk_pv(b_p, sc3, b_k3, b_a3, b_alpha)
    return b_m_new, b_l, b_a0, b_a1, b_a2, b_a3


@triton.jit
def _qk_chunk(p_q, p_row, m_h, m_n, keep, b_s, C: tl.constexpr, W: tl.constexpr, FMT: tl.constexpr,
              CONVERT: tl.constexpr, SW_FP8: tl.constexpr, dt: tl.constexpr):
    """LOW_REG: the scores of latent columns [C·W, C·W + W): q's part loaded here (``keep`` is always true but
    depends on the loop, so the load is not hoisted out of it) and the cache part dropped after the dot."""
    o_w = C * W + tl.arange(0, W)
    b_qc = tl.load(p_q + o_w[None, :], mask=m_h[:, None] & keep[None, :], other=0.0)
    b_kc = _dequant(_gather_chunk(p_row, o_w, m_n, 0), _gather_scale(p_row, m_n, C * W // 128, FMT), FMT, CONVERT,
                    SW_FP8, dt)
    return tl.dot(b_qc, tl.trans(b_kc), b_s)


@triton.jit
def _pv_chunk(b_pc, p_row, o_c, m_n, b_a, b_alpha, C: tl.constexpr, FMT: tl.constexpr, CONVERT: tl.constexpr,
              SW_FP8: tl.constexpr, dt: tl.constexpr):
    """LOW_REG: one latent chunk's ``p · V``, V gathered again (from cache) rather than kept from the scores."""
    b_vc = _dequant(_gather_chunk(p_row, o_c, m_n, C), _gather_scale(p_row, m_n, C, FMT), FMT, CONVERT, SW_FP8, dt)
    return tl.dot(b_pc, b_vc, b_a * b_alpha[:, None])


@triton.jit
def _qk_chunk_f16(p_q, p_row, m_h, m_n, keep, b_s, b_qinv, sw_factor, C: tl.constexpr, W: tl.constexpr,
                  FMT: tl.constexpr, SW_FP8: tl.constexpr):
    """LOW_REG with F16_DOT: :func:`_qk_chunk` on float16 q / pow2 and unscaled e4m3 values, the scale after."""
    o_w = C * W + tl.arange(0, W)
    b_qc = tl.load(p_q + o_w[None, :], mask=m_h[:, None] & keep[None, :], other=0.0)
    b_qc = _q_f16(b_qc, b_qinv)
    b_kc = _e4m3_to_f16(_gather_chunk(p_row, o_w, m_n, 0), SW_FP8)
    return b_s + tl.dot(b_qc, tl.trans(b_kc)) * (_gather_scale(p_row, m_n, C * W // 128, FMT) * sw_factor)[None, :]


@triton.jit
def _pv_chunk_f16(b_p, p_row, o_c, m_n, b_a, b_alpha, sw_factor, C: tl.constexpr, FMT: tl.constexpr,
                  SW_FP8: tl.constexpr):
    """LOW_REG with F16_DOT: :func:`_pv_chunk` through :func:`_chunk_pv`."""
    b_vc = _e4m3_to_f16(_gather_chunk(p_row, o_c, m_n, C), SW_FP8)
    return _chunk_pv(b_p, _gather_scale(p_row, m_n, C, FMT) * sw_factor, b_vc, b_a, b_alpha)


@triton.jit
def _attend(b_q0, b_q1, b_q2, b_q3, b_qr, b_k0, b_k1, b_k2, b_k3, b_kr, m_n, b_m, b_l, b_a0, b_a1, b_a2, b_a3,
            qk_scale, HAS_ROPE: tl.constexpr, dt: tl.constexpr):
    """One tile of the online softmax: scores of the block's heads against the tile's rows, then p·V."""
    b_s = tl.dot(b_q0, tl.trans(b_k0))
    b_s = tl.dot(b_q1, tl.trans(b_k1), b_s)
    b_s = tl.dot(b_q2, tl.trans(b_k2), b_s)
    b_s = tl.dot(b_q3, tl.trans(b_k3), b_s)
    if HAS_ROPE:
        b_s = tl.dot(b_qr, tl.trans(b_kr), b_s)
    b_m_new, b_l, b_p, b_alpha = _softmax_step(b_s, m_n, b_m, b_l, qk_scale)
    b_pc = b_p.to(dt)
    b_a0 = tl.dot(b_pc, b_k0, b_a0 * b_alpha[:, None])
    b_a1 = tl.dot(b_pc, b_k1, b_a1 * b_alpha[:, None])
    b_a2 = tl.dot(b_pc, b_k2, b_a2 * b_alpha[:, None])
    b_a3 = tl.dot(b_pc, b_k3, b_a3 * b_alpha[:, None])
    return b_m_new, b_l, b_a0, b_a1, b_a2, b_a3


@triton.jit(do_not_specialize=["T", "topk", "num_slots", "num_splits", "split_len", "topk2", "num_slots2"])
def _sparse_mla_fwd_kernel(
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
    FMT: tl.constexpr, CONVERT: tl.constexpr, HAS_ROPE: tl.constexpr,
    HAS_TOPK_LEN: tl.constexpr, HAS_SINK: tl.constexpr, K_SCALE_PTR: tl.constexpr,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, SW_FP8: tl.constexpr,
    F16_DOT: tl.constexpr, LOW_REG: tl.constexpr, PDL: tl.constexpr,
    HAS_EXTRA: tl.constexpr, HAS_TOPK_LEN2: tl.constexpr,
):
    i_ts = tl.program_id(0)
    i_hb = tl.program_id(1)
    i_t = (i_ts // num_splits).to(tl.int64)
    i_s = i_ts % num_splits
    dt = q_nope_ptr.dtype.element_ty

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_c = tl.arange(0, 128)
    o_r = tl.arange(0, 64)
    o_n = tl.arange(0, BLOCK_N)

    # q for this row and head block: four latent chunks and the rope part, held in registers.
    p_q = q_nope_ptr + i_t * stride_qn_t + o_h[:, None].to(tl.int64) * stride_qn_h
    b_q0 = tl.load(p_q + (0 * 128 + o_c)[None, :], mask=m_h[:, None], other=0.0)
    b_q1 = tl.load(p_q + (1 * 128 + o_c)[None, :], mask=m_h[:, None], other=0.0)
    b_q2 = tl.load(p_q + (2 * 128 + o_c)[None, :], mask=m_h[:, None], other=0.0)
    b_q3 = tl.load(p_q + (3 * 128 + o_c)[None, :], mask=m_h[:, None], other=0.0)
    if HAS_ROPE:
        p_qr = q_pe_ptr + i_t * stride_qp_t + o_h[:, None].to(tl.int64) * stride_qp_h + o_r[None, :]
        b_qr = tl.load(p_qr, mask=m_h[:, None], other=0.0)

    # This program's part of the row's list. With an extra cache the list is the row's main list, padded to whole
    # tiles (n_pad), then its extra list: a tile never mixes the two caches.
    n_row = topk
    if HAS_TOPK_LEN:
        n_row = tl.minimum(tl.maximum(tl.load(topk_len_ptr + i_t * stride_tl), 0), topk)
    n_all = n_row
    n_pad = n_row
    if HAS_EXTRA:
        n_pad = tl.cdiv(n_row, BLOCK_N) * BLOCK_N
        n_row2 = topk2
        if HAS_TOPK_LEN2:
            n_row2 = tl.minimum(tl.maximum(tl.load(topk_len2_ptr + i_t * stride_tl2), 0), topk2)
        n_all = n_pad + n_row2
    n_start = i_s * split_len
    n_end = tl.minimum(n_start + split_len, n_all)

    b_m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BLOCK_H], dtype=tl.float32)
    b_a0 = tl.zeros([BLOCK_H, 128], dtype=tl.float32)
    b_a1 = tl.zeros([BLOCK_H, 128], dtype=tl.float32)
    b_a2 = tl.zeros([BLOCK_H, 128], dtype=tl.float32)
    b_a3 = tl.zeros([BLOCK_H, 128], dtype=tl.float32)
    qk_scale = sm_scale_log2
    if FMT == 1:
        if K_SCALE_PTR:
            k_scale = tl.load(k_scale_ptr)
        qk_scale = qk_scale * k_scale

    if not HAS_ROPE:
        b_qr = b_q0  # unused
    if F16_DOT:
        b_qmax = tl.maximum(tl.maximum(tl.max(tl.abs(b_q0.to(tl.float32)), 1), tl.max(tl.abs(b_q1.to(tl.float32)), 1)),
                            tl.maximum(tl.max(tl.abs(b_q2.to(tl.float32)), 1), tl.max(tl.abs(b_q3.to(tl.float32)), 1)))
        # a power of two >= the largest |q| of each head: q / b_qmax is exact in float16 (bf16 and fp16 q alike)
        b_qmax = tl.where(b_qmax > 0, tl.exp2(tl.minimum(tl.ceil(tl.log2(b_qmax)), 127.0)), 0.0)
        b_qinv = tl.where(b_qmax > 0, 1.0 / b_qmax, 0.0)
        b_h0 = _q_f16(b_q0, b_qinv)
        b_h1 = _q_f16(b_q1, b_qinv)
        b_h2 = _q_f16(b_q2, b_qinv)
        b_h3 = _q_f16(b_q3, b_qinv)
        sw_factor = 1.0
        if SW_FP8:
            sw_factor = 256.0  # the integer decode's float16 is the value / 256
    for n0 in range(n_start, n_end, BLOCK_N):
        if FMT == 3:  # DeepSeek-V4 pages: 512-wide rows (the RoPE values their last 64), V the whole row
            # the tile's list (main or extra) chosen as scalars, so that one gather serves both
            c_idx, c_st, c_sk, c_k0, c_end = idx_ptr, stride_idx_t, stride_idx_k, n0, tl.minimum(n_end, n_row)
            c_ns, c_bs, c_kv, c_kb = num_slots, block_size, kv_ptr, stride_kv_blk
            if HAS_EXTRA:
                if n0 >= n_pad:
                    c_idx, c_st, c_sk, c_k0, c_end = idx2_ptr, stride_idx2_t, stride_idx2_k, n0 - n_pad, n_end - n_pad
                    c_ns, c_bs, c_kv, c_kb = num_slots2, block_size2, kv2_ptr, stride_kv2_blk
            p_row, p_foot, m_n = _rows_v4(c_idx, i_t, c_st, c_sk, c_k0 + o_n, c_end, c_ns, c_bs, c_kv, c_kb)
            b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _attend(
                b_q0, b_q1, b_q2, b_q3, b_qr,
                _v4_chunk(p_row, p_foot, o_c, m_n, 0, SW_FP8, dt), _v4_chunk(p_row, p_foot, o_c, m_n, 1, SW_FP8, dt),
                _v4_chunk(p_row, p_foot, o_c, m_n, 2, SW_FP8, dt), _v4_chunk(p_row, p_foot, o_c, m_n, 3, SW_FP8, dt),
                b_qr, m_n, b_m, b_l, b_a0, b_a1, b_a2, b_a3, qk_scale, False, dt)
        else:
            if HAS_EXTRA and n0 >= n_pad:
                p_row, m_n = _rows(idx2_ptr, i_t, stride_idx2_t, stride_idx2_k, n0 - n_pad + o_n, n_end - n_pad,
                                   num_slots2, block_size2, kv2_ptr, stride_kv2_blk, stride_kv2_row)
            else:
                p_row, m_n = _rows(idx_ptr, i_t, stride_idx_t, stride_idx_k, n0 + o_n, tl.minimum(n_end, n_row),
                                   num_slots, block_size, kv_ptr, stride_kv_blk, stride_kv_row)
            if HAS_ROPE:
                b_kr = _dequant_rope(_gather_rope(p_row, o_r, m_n, FMT), FMT, CONVERT, SW_FP8, dt)
            else:
                b_kr = b_qr  # unused: NoPE rows end after the latent and must not be read past it
            if LOW_REG:
                QK_W: tl.constexpr = 64  # score columns per dot: half a latent chunk, for the registers
                keep = (tl.zeros([1], dtype=tl.int32) + n0) >= n_start  # always true; [1] so masks broadcast
                b_s = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
                if F16_DOT:
                    for c in tl.static_range(0, 512 // QK_W):
                        b_s = _qk_chunk_f16(p_q, p_row, m_h, m_n, keep, b_s, b_qinv, sw_factor, c, QK_W, FMT, SW_FP8)
                    b_s = b_s * b_qmax[:, None]
                else:
                    for c in tl.static_range(0, 512 // QK_W):
                        b_s = _qk_chunk(p_q, p_row, m_h, m_n, keep, b_s, c, QK_W, FMT, CONVERT, SW_FP8, dt)
                if HAS_ROPE:
                    b_qrl = tl.load(p_qr, mask=m_h[:, None] & keep[None, :], other=0.0)
                    b_s = tl.dot(b_qrl, tl.trans(b_kr), b_s)
                b_m, b_l, b_p, b_alpha = _softmax_step(b_s, m_n, b_m, b_l, qk_scale)
                if F16_DOT:
                    b_a0 = _pv_chunk_f16(b_p, p_row, o_c, m_n, b_a0, b_alpha, sw_factor, 0, FMT, SW_FP8)
                    b_a1 = _pv_chunk_f16(b_p, p_row, o_c, m_n, b_a1, b_alpha, sw_factor, 1, FMT, SW_FP8)
                    b_a2 = _pv_chunk_f16(b_p, p_row, o_c, m_n, b_a2, b_alpha, sw_factor, 2, FMT, SW_FP8)
                    b_a3 = _pv_chunk_f16(b_p, p_row, o_c, m_n, b_a3, b_alpha, sw_factor, 3, FMT, SW_FP8)
                else:
                    b_pc = b_p.to(dt)
                    b_a0 = _pv_chunk(b_pc, p_row, o_c, m_n, b_a0, b_alpha, 0, FMT, CONVERT, SW_FP8, dt)
                    b_a1 = _pv_chunk(b_pc, p_row, o_c, m_n, b_a1, b_alpha, 1, FMT, CONVERT, SW_FP8, dt)
                    b_a2 = _pv_chunk(b_pc, p_row, o_c, m_n, b_a2, b_alpha, 2, FMT, CONVERT, SW_FP8, dt)
                    b_a3 = _pv_chunk(b_pc, p_row, o_c, m_n, b_a3, b_alpha, 3, FMT, CONVERT, SW_FP8, dt)
            elif F16_DOT:
                b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _attend_f16(
                    b_h0, b_h1, b_h2, b_h3, b_qr, b_qmax,
                    _e4m3_to_f16(_gather_chunk(p_row, o_c, m_n, 0), SW_FP8),
                    _e4m3_to_f16(_gather_chunk(p_row, o_c, m_n, 1), SW_FP8),
                    _e4m3_to_f16(_gather_chunk(p_row, o_c, m_n, 2), SW_FP8),
                    _e4m3_to_f16(_gather_chunk(p_row, o_c, m_n, 3), SW_FP8),
                    _gather_scale(p_row, m_n, 0, FMT) * sw_factor, _gather_scale(p_row, m_n, 1, FMT) * sw_factor,
                    _gather_scale(p_row, m_n, 2, FMT) * sw_factor, _gather_scale(p_row, m_n, 3, FMT) * sw_factor,
                    b_kr, m_n, b_m, b_l, b_a0, b_a1, b_a2, b_a3, qk_scale, HAS_ROPE)
            else:
                b_m, b_l, b_a0, b_a1, b_a2, b_a3 = _attend(
                    b_q0, b_q1, b_q2, b_q3, b_qr,
                    _dequant(_gather_chunk(p_row, o_c, m_n, 0), _gather_scale(p_row, m_n, 0, FMT), FMT, CONVERT, SW_FP8,
                             dt),
                    _dequant(_gather_chunk(p_row, o_c, m_n, 1), _gather_scale(p_row, m_n, 1, FMT), FMT, CONVERT, SW_FP8,
                             dt),
                    _dequant(_gather_chunk(p_row, o_c, m_n, 2), _gather_scale(p_row, m_n, 2, FMT), FMT, CONVERT, SW_FP8,
                             dt),
                    _dequant(_gather_chunk(p_row, o_c, m_n, 3), _gather_scale(p_row, m_n, 3, FMT), FMT, CONVERT, SW_FP8,
                             dt),
                    b_kr, m_n, b_m, b_l, b_a0, b_a1, b_a2, b_a3, qk_scale, HAS_ROPE, dt)

    if PDL:  # the combine kernel may start (and wait for this grid) once every program has left its loop
        gdc_launch_dependents()
    # Normalise; an empty range (no valid entry) gives 0 and lse -inf.
    b_inv = tl.where(b_l > 0, 1.0 / b_l, 0.0)
    if FMT == 1:
        b_inv = b_inv * k_scale
    b_lse2 = tl.where(b_l > 0, b_m + tl.log2(b_l), float("-inf"))
    if SPLIT:
        b_f = b_inv
        p_o = out_ptr + i_t * stride_o_t + i_s.to(tl.int64) * stride_o_s + o_h[:, None].to(tl.int64) * stride_o_h
        tl.store(lse_ptr + i_t * stride_l_t + i_s.to(tl.int64) * stride_l_s + o_h * stride_l_h, b_lse2, mask=m_h)
    else:
        if HAS_SINK:
            b_sink = tl.load(sink_ptr + o_h * stride_sink, mask=m_h, other=0.0)
            # exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + exp(sink - lse)); an empty row stays 0 (b_inv is 0;
            # the where keeps a -inf sink from making exp2(-inf - -inf) = NaN there).
            b_inv = tl.where(b_lse2 == float("-inf"), 0.0,
                             b_inv / (1.0 + tl.exp2(b_sink * 1.4426950408889634 - b_lse2)))
        b_f = b_inv
        p_o = out_ptr + i_t * stride_o_t + o_h[:, None].to(tl.int64) * stride_o_h
        tl.store(lse_ptr + i_t * stride_l_t + o_h * stride_l_h, b_lse2 * 0.6931471805599453, mask=m_h)
    ty = out_ptr.dtype.element_ty
    tl.store(p_o + (0 * 128 + o_c)[None, :], (b_a0 * b_f[:, None]).to(ty), mask=m_h[:, None])
    tl.store(p_o + (1 * 128 + o_c)[None, :], (b_a1 * b_f[:, None]).to(ty), mask=m_h[:, None])
    tl.store(p_o + (2 * 128 + o_c)[None, :], (b_a2 * b_f[:, None]).to(ty), mask=m_h[:, None])
    tl.store(p_o + (3 * 128 + o_c)[None, :], (b_a3 * b_f[:, None]).to(ty), mask=m_h[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _combine_kernel(
    part_o_ptr, part_lse_ptr, sink_ptr, out_ptr, lse_ptr,
    stride_po_t, stride_po_s, stride_po_h, stride_pl_t, stride_pl_s, stride_pl_h,
    stride_o_t, stride_o_h, stride_l_t, stride_l_h, stride_sink,
    H, num_splits,
    HAS_SINK: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    """Merge the float32 partials of one row and block of heads: lse = log2-sum-exp2 over splits, out =
    Σ_s 2^(lse_s - lse) · o_s (empty splits carry lse -inf and o 0). With ``PDL`` (a programmatic dependent launch)
    it starts while the split kernel runs and waits here for that grid's writes."""
    if PDL:
        gdc_wait()
    i_t = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1)
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_d = tl.arange(0, 512)
    b_m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for i_s in range(0, num_splits):
        b_ls = tl.load(part_lse_ptr + i_t * stride_pl_t + i_s * stride_pl_s + o_h * stride_pl_h, mask=m_h,
                       other=float("-inf"))
        b_m = tl.maximum(b_m, b_ls)
    b_m_use = tl.where(b_m == float("-inf"), 0.0, b_m)
    b_w = tl.zeros([BLOCK_H], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_H, 512], dtype=tl.float32)
    for i_s in range(0, num_splits):
        b_ls = tl.load(part_lse_ptr + i_t * stride_pl_t + i_s * stride_pl_s + o_h * stride_pl_h, mask=m_h,
                       other=float("-inf"))
        b_ws = tl.exp2(b_ls - b_m_use)
        p_po = part_o_ptr + i_t * stride_po_t + i_s * stride_po_s + o_h[:, None].to(tl.int64) * stride_po_h
        b_o = tl.load(p_po + o_d[None, :], mask=m_h[:, None] & (b_ws > 0)[:, None], other=0.0)
        b_acc += b_o * b_ws[:, None]
        b_w += b_ws
    b_lse2 = tl.where(b_w > 0, b_m_use + tl.log2(b_w), float("-inf"))
    b_inv = tl.where(b_w > 0, 1.0 / b_w, 0.0)
    if HAS_SINK:
        b_sink = tl.load(sink_ptr + o_h * stride_sink, mask=m_h, other=0.0)
        b_inv = tl.where(b_lse2 == float("-inf"), 0.0, b_inv / (1.0 + tl.exp2(b_sink * 1.4426950408889634 - b_lse2)))
    p_o = out_ptr + i_t * stride_o_t + o_h[:, None].to(tl.int64) * stride_o_h + o_d[None, :]
    tl.store(p_o, (b_acc * b_inv[:, None]).to(out_ptr.dtype.element_ty), mask=m_h[:, None])
    tl.store(lse_ptr + i_t * stride_l_t + o_h * stride_l_h, b_lse2 * 0.6931471805599453, mask=m_h)


_launch_fwd = CachedLauncher(_sparse_mla_fwd_kernel)
_launch_combine = CachedLauncher(_combine_kernel)

_FMT_CODES = {"bf16": FMT_NATIVE, "fp16": FMT_NATIVE, "fp8_e4m3": FMT_FP8, "fp8_ds_mla": FMT_FP8_DS_MLA,
              "fp8_ds_mla_v4": FMT_FP8_V4}
V4_ROW_STRIDE = 576  # bytes between the rows of a DeepSeek-V4 page (formats.V4_ROW_BYTES)


def _row_stride(kv: torch.Tensor, fmt: int) -> int:
    """The stride between a block's rows as the kernel takes it: a DeepSeek-V4 page ([num_blocks, block_size ·
    584] bytes) has its rows 576 bytes apart (the kernel reads the footer through the block size)."""
    return V4_ROW_STRIDE if fmt == FMT_FP8_V4 else kv.stride(1)


def _rows_16b_aligned(kv: torch.Tensor) -> bool:
    """The cache's rows can be copied in 16-byte vectors: a 16-byte aligned pointer and both row strides multiples
    of 16 elements (what Triton specialises on; a stride of 16 bytes but fewer elements compiles to no copy)."""
    return kv.data_ptr() % 16 == 0 and kv.stride(0) % 16 == 0 and kv.stride(1) % 16 == 0


def _gluon_reads(kv: torch.Tensor, fmt: int, convert: bool, q_dtype: torch.dtype) -> bool:
    """The Gluon kernels read this cache: rows copyable in 16-byte vectors, bf16/fp16 rows in q's dtype or
    fp8_ds_mla rows or DeepSeek-V4 pages with bf16 q (their RoPE part is bf16, dotted as stored). V4 pages: a
    16-byte aligned start and page stride (rows are 576 bytes apart, footers 8)."""
    import torch

    if fmt == FMT_FP8_V4:
        return q_dtype == torch.bfloat16 and kv.data_ptr() % 16 == 0 and kv.stride(0) % 16 == 0
    if not _rows_16b_aligned(kv):
        return False
    if fmt == FMT_FP8_DS_MLA:
        return q_dtype == torch.bfloat16
    return fmt == FMT_NATIVE and not convert


def _cache_view(p: AttentionProblem) -> tuple[torch.Tensor, int, bool]:
    """The cache as the kernels read it (fp8_e4m3 as bytes), its format code, and whether 16-bit rows are converted
    to q's dtype on the fly."""
    kv = _read_view(p, p.kv)
    fmt = _FMT_CODES[p.kv_format]
    return kv, fmt, fmt == FMT_NATIVE and kv.dtype != p.q_nope.dtype


def gluon_reads_problem(p: AttentionProblem) -> bool:
    """The Gluon kernels can read this problem's cache and its extra cache, if any (:func:`_gluon_reads`); the API
    runs the tl kernel otherwise, chosen from its own table entry."""
    kv, fmt, convert = _cache_view(p)
    if not _gluon_reads(kv, fmt, convert, p.q_nope.dtype):
        return False
    return p.kv2 is None or _gluon_reads(_read_view(p, p.kv2), fmt, convert, p.q_nope.dtype)


def _read_view(p: AttentionProblem, cache: torch.Tensor) -> torch.Tensor:
    """A cache of the problem (``p.kv`` or ``p.kv2``) as the kernels read it: fp8_e4m3 rows as bytes."""
    import torch

    return cache.view(torch.uint8) if p.kv_format == "fp8_e4m3" else cache


def ws_build(cfg: AttentionConfig) -> tuple[dict, int, int | None]:
    """How the warp-specialised kernel is built for ``cfg`` (launch and ahead-of-time builds alike): its partition
    constexprs — producer warps (``num_warps`` - 4) and their registers per thread, 232 for 4 and 128 for 8, the
    largest without spills (the compile matrix); the consumer takes the rest —, the launch's warps (the consumer's
    4: the producers are a constexpr) and its maxnreg (``cfg.max_registers``, else with 12 warps the register file
    split over all of them)."""
    warps = cfg.num_warps - 4
    regs = cfg.max_registers
    if regs is None and cfg.num_warps > 8:
        regs = 65536 // (32 * cfg.num_warps) // 8 * 8
    return dict(WS_WARPS=warps, WS_REGS=232 if warps == 4 else 128), 4, regs


def launch_sparse_mla(p: AttentionProblem, cfg: AttentionConfig, out: torch.Tensor,
                      lse: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the kernel(s) of ``cfg`` for the validated problem ``p`` (an ``AttentionProblem``), writing ``out``
    [T, H, 512] and ``lse`` [T, H] float32 (allocated when None); returns ``lse``. No host synchronisation (except
    once per device: the first merging decode zeroes the arrival counters, _common/counters.py); the decode kernel
    allocates one float32 workspace of T · splits · H · 513 values (+ T · H for an unrequested lse).
    ``cfg`` names a Gluon family only where :func:`gluon_reads_problem` holds, and its decode splits cover
    ``p.list_len(cfg.block_n)`` entries (the API chooses so)."""
    import torch

    T, H = p.T, p.H
    kv, fmt, convert = _cache_view(p)
    q_nope = p.q_nope
    q_pe = p.q_pe if p.q_pe is not None else q_nope
    has_rope = p.q_pe is not None
    k_scale_ptr = isinstance(p.k_scale, torch.Tensor)
    k_scale_t = p.k_scale if k_scale_ptr else q_nope  # dummy pointer when unused
    k_scale_f = float(p.k_scale) if (p.k_scale is not None and not k_scale_ptr) else 1.0
    topk_len = p.topk_length if p.topk_length is not None else p.indices
    n_hb = triton.cdiv(H, cfg.block_h)
    ns = cfg.num_splits if cfg.kernel == "decode" else 1  # the API's count covers p.list_len(cfg.block_n)
    if cfg.kernel == "decode":
        # one allocation: partial outputs, partial lse values and (when the caller did not ask for it) the lse
        n_o, n_l = T * ns * H * 512, -(-T * ns * H // 4) * 4  # 16-byte aligned pieces
        work = torch.empty(n_o + n_l + (T * H if lse is None else 0), dtype=torch.float32, device=out.device)
        part_o = work[:n_o].view(T, ns, H, 512)
        part_lse = work[n_o:n_o + T * ns * H].view(T, ns, H)
        if lse is None:
            lse = work[n_o + n_l:].view(T, H)
    elif lse is None:
        lse = torch.empty(T, H, dtype=torch.float32, device=out.device)
    sink = p.attn_sink if p.attn_sink is not None else lse
    common = dict(
        FMT=fmt, CONVERT=convert, HAS_ROPE=has_rope, HAS_TOPK_LEN=p.topk_length is not None,
        HAS_SINK=p.attn_sink is not None, K_SCALE_PTR=k_scale_ptr,
        BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, SW_FP8=cfg.sw_fp8,
        F16_DOT=cfg.f16_dot and fmt == FMT_FP8_DS_MLA, LOW_REG=cfg.low_reg,
        HAS_EXTRA=p.kv2 is not None, HAS_TOPK_LEN2=p.topk_length2 is not None,
    )
    pdl = cfg.pdl and cfg.kernel == "decode"
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    launch = _launch_fwd
    if cfg.family != "tl":
        if cfg.family == "wgmma":
            from .kernels_wgmma import launch_fwd_wgmma as launch
        elif cfg.family == "wgmma_t":
            from .kernels_wgmma_t import launch_fwd_wgmma_t as launch
        elif cfg.family == "wgmma_ws":
            from .kernels_wgmma_ws import launch_fwd_wgmma_ws as launch
        elif cfg.dsplit and p.kv2 is None:
            from .kernels_mma2d import launch_fwd_mma2d as launch
        else:
            from .kernels_mma2 import launch_fwd_mma2 as launch

        common = dict(FMT=fmt, HAS_ROPE=has_rope, HAS_TOPK_LEN=p.topk_length is not None,
                      HAS_SINK=p.attn_sink is not None, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                      STAGES=cfg.num_stages, SW_FP8=cfg.sw_fp8, F16_DOT=cfg.f16_dot and fmt == FMT_FP8_DS_MLA,
                      HAS_EXTRA=p.kv2 is not None, HAS_TOPK_LEN2=p.topk_length2 is not None)
        if cfg.family == "wgmma_t":
            common["OVERLAP"] = cfg.overlap and fmt in (FMT_FP8_DS_MLA, FMT_FP8_V4)
            common["MERGE"] = False  # (set below, once the launch has its counters)
        opts = dict(num_warps=cfg.num_warps, num_stages=1)
    regs = cfg.max_registers
    if cfg.family == "wgmma_ws":
        ws_const, opts["num_warps"], regs = ws_build(cfg)
        common.update(ws_const)
    if regs is not None:
        opts["maxnreg"] = regs
    args = (q_nope, q_pe, kv, p.indices, topk_len, sink, k_scale_t)
    qstrides = (q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
                kv.stride(0), _row_stride(kv, fmt), p.indices.stride(0), p.indices.stride(1), topk_len.stride(0),
                sink.stride(0))
    sizes = (T, H, p.topk, p.num_slots, p.block_size)
    scales = (p.softmax_scale * LOG2E, k_scale_f)
    if p.kv2 is None:  # the extra-cache arguments (dummies without one)
        extra = (kv, p.indices, topk_len, 0, 0, 0, 0, 0, 0, 0, 1)
    else:
        kv2 = _read_view(p, p.kv2)
        tl2 = p.topk_length2 if p.topk_length2 is not None else p.indices2
        extra = (kv2, p.indices2, tl2, kv2.stride(0), _row_stride(kv2, fmt), p.indices2.stride(0),
                 p.indices2.stride(1), tl2.stride(0), p.topk2, p.num_slots2, p.block_size2)
    # wgmma_t: the in-kernel merge's final output, lse and arrival counters (dummies when it does not merge)
    counters = None
    if cfg.family == "wgmma_t":
        # (one split: the combine kernel, measured faster than the merge at B = 256: benchmarks/NOTES.md)
        if cfg.merge and cfg.kernel == "decode" and 2 <= ns <= MERGE_SPLITS:
            counters = take_counters(out.device, T * n_hb)
        fin = (out, lse, counters if counters is not None else p.indices,
               out.stride(0), out.stride(1), lse.stride(0), lse.stride(1))
        extra = (*extra, *fin)
        common["MERGE"] = counters is not None
    if cfg.kernel == "prefill":
        launch((T, n_hb), (
            *args, out, lse, *qstrides,
            out.stride(0), 0, out.stride(1), lse.stride(0), 0, lse.stride(1),
            *sizes, 1, p.list_len(cfg.block_n), *scales, *extra), dict(common, SPLIT=False, PDL=False), **opts)
        return lse
    launch((T * ns, n_hb), (
        *args, part_o, part_lse, *qstrides,
        part_o.stride(0), part_o.stride(1), part_o.stride(2),
        part_lse.stride(0), part_lse.stride(1), part_lse.stride(2),
        *sizes, ns, cfg.split_len, *scales, *extra), dict(common, SPLIT=True, PDL=pdl and counters is None), **opts)
    if counters is not None:  # the last split of each row merged: no combine kernel (nor its dependent launch)
        return lse
    _launch_combine((T, triton.cdiv(H, cfg.combine_block_h)), (
        part_o, part_lse, sink, out, lse,
        part_o.stride(0), part_o.stride(1), part_o.stride(2),
        part_lse.stride(0), part_lse.stride(1), part_lse.stride(2),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1), sink.stride(0),
        H, ns), dict(HAS_SINK=p.attn_sink is not None, BLOCK_H=cfg.combine_block_h, PDL=pdl),
        num_warps=cfg.combine_warps, **({"launch_pdl": True} if pdl else {}))
    return lse

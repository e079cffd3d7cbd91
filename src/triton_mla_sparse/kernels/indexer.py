"""Triton kernels for the DSA "lightning indexer": logits and a per-row top-k selection.

* :func:`_indexer_logits_kernel`: one program per (group of ``ROWS`` query rows, chunk of request-local positions).
  The group's q is loaded once as the transposed right operand [128, ROWS · heads]; per tile of ``BLOCK_K``
  positions it gathers the K rows through the block table (fp8 indexer layout: per block ``block_size · 128`` e4m3
  bytes, then ``block_size`` float32 scales; or bf16/fp16 rows), computes the scores ``k · qᵀ`` [BLOCK_K, heads] in
  float32 (fp8 × fp8 tensor-core dots where the GPU has them, otherwise both operands decoded exactly into
  fp16/bf16), scales each row by its K scale, applies relu and reduces over the heads with the weights inside each
  thread's rows. Rows of one request (prefill) share each K tile; decode rows (one per request) use ``ROWS = 1``.
  Positions past a row's own (or of a row with an invalid request id) get -inf and are never read.
* :func:`_topk_bound_kernel` + :func:`_topk_hist_kernel` + :func:`_topk_split_select_kernel` (the split select,
  many programs per row): on long rows a counting bound first (a key with at least top-k candidates at or above it,
  from the smallest group maximum of each chunk, and the row maximum), then a histogram of the sortable keys
  (float32 bits with the sign handled; every NaN highest) of the candidates from the bound on — 2048 bins from the
  bound to the row maximum, or the top 11 key bits on short rows —, whose last program per row finds the threshold
  bin holding the k-th largest (-inf is not a candidate); positions above it go straight to the output, those in it
  to a boundary buffer from which the row's last program takes the rest by a radix select on the bits below the
  bin (256-bin histogram passes); the rest of the row is -1. No sorting, no host
  synchronisation, no data-dependent allocation (CUDA-graph safe). ``indexer_topk`` uses it for decode rows on sm90
  (measured faster than ``torch.topk`` there) and ``torch.topk`` elsewhere (benchmarks/NOTES.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .attention import _e4m3_to_f32
from .configs import interpreting
from .launch import CachedLauncher

D_INDEX = 128  # index head dim


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


@triton.jit
def _sortable_key32(x):
    """float32 -> int32 with the order of the floats (signed compare; -inf lowest); every NaN (only from non-finite
    inputs) maps to the largest key, as torch.topk and the reference rank it."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(x != x, 2147483647, tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF))


@triton.jit
def _sortable_key(x):
    """float32 -> int64 in [0, 2^32): :func:`_sortable_key32` shifted to unsigned (-inf is ``KEY_NINF``)."""
    return _sortable_key32(x).to(tl.int64) + 2147483648


NBINS = 2048  # histogram bins of the split select (over [bound, row max], or the top 11 bits of the sortable key)
NREP = 8  # copies of each row's histogram (program c adds into copy c % NREP): spreads same-bin atomics
KEY_NINF = 8388607  # _sortable_key(-inf)
MAX_SPLIT_BLOCK = 1 << 14  # positions per select step: two of its counts share one int32 in the select's scan
_KEY_FIRST = tl.constexpr(KEY_NINF + 1)  # the lowest key counted: the one just above -inf
# The split select's workspace per row: NREP * NBINS histogram counts, then these int32 slots (all zeroed first).
WS_EXTRA = 24  # room for the slots below (0-2, 5-18)
_CNT_GT = tl.constexpr(0)  # output slots claimed by positions above the threshold bin
_CNT_EQ = tl.constexpr(1)  # boundary-buffer entries claimed
_DONE = tl.constexpr(2)  # select programs finished (the last resolves the boundary bin)
_HDONE = tl.constexpr(5)  # histogram programs finished (the last finds the threshold bin)
_THR = tl.constexpr(6)  # the threshold bin
_ABOVE = tl.constexpr(7)  # counted candidates in higher bins
_NEED = tl.constexpr(8)  # positions to select: min(topk, counted candidates)
_NBOUND = tl.constexpr(9)  # counted candidates in the threshold bin
_BOUND = tl.constexpr(10)  # 4 pairs (u, n) of the bound pass: group size 16 · 2^j positions, j = 0..3
_KMAX = tl.constexpr(18)  # the bound pass's largest candidate key of the row (unsigned; 0: no bound pass/candidate)
BOUND_GROUP = 16  # positions per group at the bound pass's finest level
BOUND_GROUP_C = tl.constexpr(BOUND_GROUP)


@triton.jit
def _count_from(p_s, topk, CHUNK: tl.constexpr):
    """The smallest key the split select counts: past -inf, and from the bound pass's tightest valid bound on.

    For groups of 16 · 2^j positions (j = 0..3), slot pair j holds n = the chunks all of whose groups hold a
    candidate and u = the max over them of 2^32 - 1 - (their smallest group maximum): each such chunk has
    CHUNK / (16 · 2^j) distinct candidates at or above 2^32 - 1 - u, so when n of them vouch for topk together,
    every position the select can take lies at or above that key."""
    lo = tl.zeros([], dtype=tl.int64) + _KEY_FIRST
    for j in tl.static_range(4):
        n = tl.load(p_s + _BOUND + 2 * j + 1)
        u = tl.load(p_s + _BOUND + 2 * j).to(tl.int64) & 4294967295
        valid = n.to(tl.int64) * (CHUNK // (BOUND_GROUP_C << j)) >= topk
        lo = tl.where(valid, tl.maximum(lo, 4294967295 - u), lo)
    return lo


@triton.jit
def _bins(p_s, lo):
    """(base, shift) of the histogram bins, bin = (key - base) >> shift: with the bound pass's row maximum, 2048
    bins spanning [lo, max] (a power-of-two width: the narrowest whose bins cover it); without (no bound pass, or no
    candidate), the top 11 bits of the key (base 0, shift 21)."""
    hi = tl.load(p_s + _KMAX).to(tl.int64) & 4294967295
    span = tl.maximum(hi - lo, 0)
    shift = tl.zeros([], dtype=tl.int32)
    for s in tl.static_range(21):
        shift += ((span >> s) >= 2048).to(tl.int32)
    ok = hi >= lo
    return tl.where(ok, lo, 0), tl.where(ok, shift, 21)


@triton.jit(do_not_specialize=["L", "n_chunks"])
def _topk_bound_kernel(x_ptr, ws_ptr, stride_x_t, stride_x_p, stride_w_t, L, n_chunks,
                       CHUNK: tl.constexpr, NB: tl.constexpr, NREP: tl.constexpr):
    """Split select, step 0 (one program per row and chunk): a counting bound. The chunk's keys are split into
    groups of 16 · 2^j consecutive positions (j = 0..3); when every group holds a candidate (a logit above -inf),
    the chunk vouches for one distinct candidate per group at or above its smallest group maximum, and adds that
    key (as a max of 2^32 - 1 - key) and itself to slot pair j; and the chunk's largest candidate key to the row's
    maximum. Read by :func:`_count_from` and :func:`_bins`."""
    pid = tl.program_id(0)
    i_t = (pid // n_chunks).to(tl.int64)
    p_start = (pid % n_chunks) * CHUNK
    o_p = p_start + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + i_t * stride_x_t + o_p.to(tl.int64) * stride_x_p, mask=o_p < L, other=float("-inf"))
    key = tl.where(x == float("-inf"), -2147483648, _sortable_key32(x))  # -inf: below every candidate
    m = tl.max(tl.reshape(key, [CHUNK // BOUND_GROUP_C, BOUND_GROUP_C]), 1)
    p_s = ws_ptr + i_t * stride_w_t + NREP * NB + _BOUND
    top = tl.max(m, 0)
    if top > -2147483648:
        tl.atomic_max((p_s + (_KMAX - _BOUND)).to(tl.pointer_type(tl.uint32)),
                      (top.to(tl.int64) + 2147483648).to(tl.uint32), sem="relaxed")
    for j in tl.static_range(4):
        if j > 0:
            m = tl.max(tl.reshape(m, [CHUNK // (BOUND_GROUP_C << j), 2]), 1)
        tau = tl.min(m, 0)
        if tau > -2147483648:
            u = (4294967295 - (tau.to(tl.int64) + 2147483648)).to(tl.uint32)
            tl.atomic_max((p_s + 2 * j).to(tl.pointer_type(tl.uint32)), u, sem="relaxed")
            tl.atomic_add(p_s + 2 * j + 1, 1, sem="relaxed")


@triton.jit(do_not_specialize=["L", "n_chunks", "topk"])
def _topk_hist_kernel(x_ptr, ws_ptr, stride_x_t, stride_x_p, stride_w_t, L, n_chunks, topk,
                      CHUNK: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr, NREP: tl.constexpr):
    """Split select, step 1 (one program per row and chunk): count the row's candidates from the counting bound on
    (logits above -inf, and at or above step 0's bound when it holds) per bin (:func:`_bins`: 2048 bins from the
    bound to step 0's row maximum, or the top 11 key bits without step 0) with global atomics, into copy
    ``chunk % NREP`` of the row's histogram (``ws[row, copy · NBINS + bin]``: logits crowd into few bins, and one
    copy per row serialised their atomics). The row's last program (an acq_rel
    counter) sums the copies and stores the threshold bin b (holding the need-th largest counted key, need =
    min(topk, counted)), the counts above and in it, and need, for step 2."""
    pid = tl.program_id(0)
    i_t = (pid // n_chunks).to(tl.int64)
    i_c = pid % n_chunks
    p_start = i_c * CHUNK
    p_row = ws_ptr + i_t * stride_w_t
    p_s = p_row + NREP * NB
    p_ws = p_row + (i_c % NREP) * NB
    lo = _count_from(p_s, topk, CHUNK)
    kbase, shift = _bins(p_s, lo)
    o_b = tl.arange(0, BLOCK)
    ones = tl.full([BLOCK], 1, dtype=tl.int32)
    p_end = tl.minimum(p_start + CHUNK, L)
    for i_b in tl.static_range(CHUNK // BLOCK):  # unrolled: the chunk's loads are in flight together
        o_p = p_start + i_b * BLOCK + o_b
        x = tl.load(x_ptr + i_t * stride_x_t + o_p.to(tl.int64) * stride_x_p, mask=o_p < p_end, other=float("-inf"))
        key = _sortable_key(x)
        tl.atomic_add(p_ws + ((key - kbase) >> shift), ones, mask=key >= lo, sem="relaxed")
    tl.debug_barrier()  # every thread's atomics precede the release below
    done = tl.atomic_add(p_s + _HDONE, 1, sem="acq_rel")
    if done == n_chunks - 1:
        bins = tl.arange(0, NB)
        hist = tl.load(p_row + bins)
        for i_r in tl.static_range(1, NREP):
            hist += tl.load(p_row + i_r * NB + bins)
        total = tl.sum(hist, 0)
        need = tl.minimum(total, topk)
        above = total - tl.cumsum(hist, 0)  # counted candidates in higher bins
        b_thr = tl.max(tl.where(above + hist >= need, bins, 0), 0)
        tl.store(p_s + _THR, b_thr)
        tl.store(p_s + _ABOVE, tl.sum(tl.where(bins == b_thr, above, 0), 0))
        tl.store(p_s + _NEED, need)
        tl.store(p_s + _NBOUND, tl.sum(tl.where(bins == b_thr, hist, 0), 0))


@triton.jit(do_not_specialize=["L", "topk", "n_chunks"])
def _topk_split_select_kernel(x_ptr, out_ptr, ws_ptr, buf_ptr, stride_x_t, stride_x_p, stride_o_t, stride_o_k,
                              stride_w_t, stride_b_t, L, topk, n_chunks,
                              CHUNK: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr, NREP: tl.constexpr):
    """Split select, step 2 (one program per row and chunk), from step 1's threshold bin b: every program writes
    the positions of its counted candidates above b straight into the output (slots claimed with an atomic
    counter) and those in b into the row's boundary buffer. The row's last program to finish (an acq_rel counter)
    then takes the largest ``need - above(b)`` boundary keys by a radix select on the bits below the bin (up to 3
    passes over the buffer, usually a small fraction of the row), appends them, and pads the rest of the row with
    -1."""
    pid = tl.program_id(0)
    i_t = (pid // n_chunks).to(tl.int64)
    p_start = (pid % n_chunks) * CHUNK
    o_b = tl.arange(0, BLOCK)
    p_s = ws_ptr + i_t * stride_w_t + NREP * NB
    p_x = x_ptr + i_t * stride_x_t
    p_o = out_ptr + i_t * stride_o_t
    p_buf = buf_ptr + i_t * stride_b_t
    lo = _count_from(p_s, topk, CHUNK)
    kbase, shift = _bins(p_s, lo)
    b_thr = tl.load(p_s + _THR)
    n_above = tl.load(p_s + _ABOVE)
    need = tl.load(p_s + _NEED)
    n_bound = tl.load(p_s + _NBOUND)

    p_end = tl.minimum(p_start + CHUNK, L)
    for p0 in range(p_start, p_end, BLOCK):
        o_p = p0 + o_b
        key = _sortable_key(tl.load(p_x + o_p.to(tl.int64) * stride_x_p, mask=o_p < p_end, other=float("-inf")))
        cand = key >= lo
        b = ((key - kbase) >> shift).to(tl.int32)
        gt = (cand & (b > b_thr)).to(tl.int32)
        eq = (cand & (b == b_thr)).to(tl.int32)
        # both counters claimed at once (their round trips overlap); one scan ranks both: gt in the low 16 bits, eq
        # above (a block holds at most 2^14 positions, so neither half overflows)
        base_gt = tl.atomic_add(p_s + _CNT_GT, tl.sum(gt, 0), sem="relaxed")
        base_eq = tl.atomic_add(p_s + _CNT_EQ, tl.sum(eq, 0), sem="relaxed")
        both = tl.cumsum(gt + (eq << 16), 0)
        tl.store(p_o + (base_gt + (both & 0xFFFF) - 1).to(tl.int64) * stride_o_k, o_p, mask=gt != 0)
        tl.store(p_buf + (base_eq + (both >> 16) - 1).to(tl.int64), o_p, mask=eq != 0)

    tl.debug_barrier()  # every thread's buffer writes precede the release below (explicit on every Triton version)
    done = tl.atomic_add(p_s + _DONE, 1, sem="acq_rel")
    if done == n_chunks - 1:
        # The boundary bin: n_bound candidate positions in buf; take `take` of them with the largest keys.
        take = need - n_above
        prefix = b_thr.to(tl.int64) << shift  # offsets key - kbase; the bin fixes all but the low `shift` bits
        left = take
        for d in range(0, (shift + 7) // 8):  # radix passes of up to 8 bits, from the top of the low bits
            sh = tl.maximum(shift - 8 * (d + 1), 0)
            width = shift - 8 * d - sh
            hist2 = tl.zeros([256], dtype=tl.int32)
            for j0 in range(0, n_bound, BLOCK):
                o_j = j0 + o_b
                m_j = o_j < n_bound
                pos = tl.load(p_buf + o_j.to(tl.int64), mask=m_j, other=0)
                off = _sortable_key(tl.load(p_x + pos.to(tl.int64) * stride_x_p, mask=m_j, other=float("-inf")))
                off = off - kbase
                match = m_j & ((off >> (sh + width)) == (prefix >> (sh + width)))
                hist2 += tl.histogram(((off >> sh) & ((1 << width) - 1)).to(tl.int32), 256, mask=match)
            r_above = tl.sum(hist2, 0) - tl.cumsum(hist2, 0)
            o_256 = tl.arange(0, 256)
            bb = tl.max(tl.where(r_above + hist2 >= left, o_256, 0), 0)
            left = left - tl.sum(tl.where(o_256 == bb, r_above, 0), 0)
            prefix = prefix | (bb.to(tl.int64) << sh)
        tau = kbase + prefix  # the take-th largest boundary key; `left` keys equal to it are taken, in buffer order
        base = n_above
        eq_seen = tl.zeros([], dtype=tl.int32)
        for j0 in range(0, n_bound, BLOCK):
            o_j = j0 + o_b
            m_j = o_j < n_bound
            pos = tl.load(p_buf + o_j.to(tl.int64), mask=m_j, other=0)
            key = _sortable_key(tl.load(p_x + pos.to(tl.int64) * stride_x_p, mask=m_j, other=float("-inf")))
            is_eq = m_j & (key == tau)
            eq_rank = eq_seen + tl.cumsum(is_eq.to(tl.int32), 0) - 1
            sel = m_j & ((key > tau) | (is_eq & (eq_rank < left)))
            sel_i = sel.to(tl.int32)
            dst = base + tl.cumsum(sel_i, 0) - 1
            tl.store(p_o + dst.to(tl.int64) * stride_o_k, pos, mask=sel & (dst < topk))
            base += tl.sum(sel_i, 0)
            eq_seen += tl.sum(is_eq.to(tl.int32), 0)
        for j0 in range(0, topk, BLOCK):
            o_j = j0 + o_b
            tl.store(p_o + o_j.to(tl.int64) * stride_o_k, tl.full([BLOCK], -1, dtype=tl.int32),
                     mask=(o_j >= need) & (o_j < topk))


_launch_logits = CachedLauncher(_indexer_logits_kernel)
_launch_bound = CachedLauncher(_topk_bound_kernel)
_launch_hist = CachedLauncher(_topk_hist_kernel)
_launch_split_select = CachedLauncher(_topk_split_select_kernel)


def launch_indexer_logits(p, out, cfg, ws=None):
    """Logits of the validated problem ``p`` (an ``IndexerProblem``) into ``out`` float32 [T, max_len]; with ``ws``
    (an int32 [T, W] workspace, unit last stride) the kernel also zeroes ``ws`` (see :func:`launch_split_select`)."""
    import torch

    T, max_len = p.T, out.shape[1]
    chunk = cfg.block_k * cfg.chunk_tiles
    n_chunks = triton.cdiv(max_len, chunk)
    if T == 0 or n_chunks == 0:
        return
    if ws is not None and (ws.dtype != torch.int32 or ws.dim() != 2 or ws.shape[0] != T or ws.stride(1) != 1):
        raise ValueError(f"ws: expected an int32 tensor [{T}, W] with a unit last stride, got {ws.dtype} "
                         f"{tuple(ws.shape)} strides {ws.stride()}")
    rows = cfg.rows_per_program
    q = p.q.view(torch.uint8) if p.q_fp8 else p.q
    _launch_logits((triton.cdiv(T, rows) * n_chunks,), (
        q, p.weights, p.k, p.block_table, p.req_id_per_token, p.positions, out, out if ws is None else ws,
        q.stride(0), q.stride(1), p.weights.stride(0), p.weights.stride(1),
        p.k_block_stride, p.k_row_stride,
        p.block_table.stride(0), p.block_table.stride(1), p.req_id_per_token.stride(0), p.positions.stride(0),
        out.stride(0), out.stride(1), 0 if ws is None else ws.stride(0),
        T, p.Hi, max_len, p.block_size, p.num_blocks, p.block_table.shape[0], p.block_table.shape[1], n_chunks,
        chunk, 0 if ws is None else ws.shape[1]),
        dict(Q_FP8=p.q_fp8, K_FP8=p.k_fp8, USE_FP8_DOT=cfg.use_fp8_dot, DOT_BF16=cfg.dot_bf16, SW_FP8=cfg.sw_fp8,
             BLOCK_H=cfg.block_h, BLOCK_K=cfg.block_k, ROWS=rows, ZERO_WS=ws is not None),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg and not interpreting() else {}))


WS_WIDTH = NREP * NBINS + WS_EXTRA  # int32 per row of the split select's workspace


def split_select_workspace(T, L, device):
    """The split select's workspace for ``T`` rows of ``L`` logits: a zeroed int32 [T, WS_WIDTH] (histograms,
    counters, bounds, the threshold) and an int32 [T, max(L, 1)] boundary buffer."""
    import torch

    ws = torch.zeros(T, WS_WIDTH, dtype=torch.int32, device=device)
    return ws, _boundary_buffer(T, L, device)


def _boundary_buffer(T, L, device):
    import torch

    return torch.empty(T, max(L, 1), dtype=torch.int32, device=device)


def launch_split_select(logits, out, topk, cfg, ws=None):
    """Per-row top-k of ``logits`` float32 [T, L] into ``out`` int32 [T, topk] with many programs per row (the split
    select): a bound pass (``cfg.bound``, on rows of at least ``cfg.bound_min_chunks`` chunks), a histogram pass
    counting the candidates at or above the bound, then a pass that writes the rows' positions above the threshold
    bin and resolves the boundary bin. ``cfg.split_chunk`` / ``cfg.split_block``: positions per program / per step,
    powers of two (block at most ``MAX_SPLIT_BLOCK``). Returns the workspace ``(ws, buf)`` (for inspection), or None
    for no rows. ``ws``: a zeroed int32 [T, WS_WIDTH] workspace (e.g. zeroed by the logits launch); None: a new one.
    """
    import torch

    T, L = logits.shape
    if T == 0:
        return None
    chunk, block = cfg.split_chunk, cfg.split_block
    if not 1 <= block <= MAX_SPLIT_BLOCK or block & (block - 1):
        raise ValueError(f"split_block ({block}) must be a power of 2 up to {MAX_SPLIT_BLOCK} (the select ranks two "
                         f"counts of a block in one int32)")
    if chunk < block or chunk & (chunk - 1):
        raise ValueError(f"split_chunk ({chunk}) must be a power of 2 and a multiple of split_block ({block})")
    if cfg.bound and chunk < BOUND_GROUP * 8:
        raise ValueError(f"split_chunk ({chunk}) must be at least {BOUND_GROUP * 8} with the bound pass")
    n_chunks = max(1, triton.cdiv(L, chunk))
    if ws is None:
        ws, buf = split_select_workspace(T, L, logits.device)
    else:
        if ws.dtype != torch.int32 or tuple(ws.shape) != (T, WS_WIDTH) or ws.stride(1) != 1:
            raise ValueError(f"ws: expected a zeroed int32 tensor [{T}, {WS_WIDTH}] with a unit last stride, got "
                             f"{ws.dtype} {tuple(ws.shape)} strides {ws.stride()}")
        buf = _boundary_buffer(T, L, logits.device)
    grid = (T * n_chunks,)
    if cfg.bound and n_chunks >= cfg.bound_min_chunks:
        _launch_bound(grid, (logits, ws, logits.stride(0), logits.stride(1), ws.stride(0), L, n_chunks),
                      dict(CHUNK=chunk, NB=NBINS, NREP=NREP), num_warps=8)
    const = dict(CHUNK=chunk, BLOCK=block, NB=NBINS, NREP=NREP)
    _launch_hist(grid, (logits, ws, logits.stride(0), logits.stride(1), ws.stride(0), L, n_chunks, topk), const,
                 num_warps=8)
    _launch_split_select(grid, (logits, out, ws, buf, logits.stride(0), logits.stride(1), out.stride(0),
                                out.stride(1), ws.stride(0), buf.stride(0), L, topk, n_chunks), const, num_warps=8)
    return ws, buf

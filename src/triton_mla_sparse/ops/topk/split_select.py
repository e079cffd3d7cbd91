"""The split select: a per-row top-k of float32 logits with many programs per row, in Triton.

:func:`_topk_bound_kernel` + :func:`_topk_hist_kernel` + :func:`_topk_split_select_kernel`: on long rows a counting
bound first (a key with at least top-k candidates at or above it, from the smallest group maximum of each chunk,
and the row maximum), then a histogram of the sortable keys (float32 bits with the sign handled; every NaN highest)
of the candidates from the bound on — 2048 bins from the bound to the row maximum, or the top 11 key bits on short
rows —, whose last program per row finds the threshold bin holding the k-th largest (-inf is not a candidate);
positions above it go straight to the output, those in it to a boundary buffer from which the row's last program
takes the rest by a radix select on the bits below the bin (256-bin histogram passes); the rest of the row is -1.
No sorting, no host synchronisation, no data-dependent allocation (CUDA-graph safe). Where it runs instead of
``torch.topk`` (decode rows on sm90, measured faster there) is :func:`~.configs.select_config_for`'s choice; the
launch goes through :func:`~.api.launch_select`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from ..._common.launch import CachedLauncher

if TYPE_CHECKING:
    import torch

    from .configs import SelectConfig

__all__ = ["MAX_SPLIT_BLOCK", "SPLIT_WARPS", "WS_WIDTH", "launch_split_select", "split_select_workspace"]


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


@triton.jit
def _cand_bin(x, lo, kbase, shift):
    """(counted candidate, histogram bin) of logits ``x`` from :func:`_count_from`'s ``lo`` and :func:`_bins`'s
    ``(kbase, shift)``, on 32-bit keys (the 64-bit keys' order less 2^31: half the registers and instructions of
    the passes over the row); a non-candidate's bin is meaningless."""
    key = _sortable_key32(x)
    off = (key - (kbase - 2147483648).to(tl.int32)).to(tl.uint32, bitcast=True)  # key - kbase, mod 2^32
    return key >= (lo - 2147483648).to(tl.int32), (off >> shift.to(tl.uint32)).to(tl.int32, bitcast=True)


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
SPLIT_WARPS = 8  # warps per program of the three kernels (launch and ahead-of-time builds)


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
        cand, b = _cand_bin(x, lo, kbase, shift)
        tl.atomic_add(p_ws + b, ones, mask=cand, sem="relaxed")
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


@triton.jit
def _bin_keys(b_thr, lo, kbase, shift):
    """Threshold bin ``b_thr`` of :func:`_bins`'s ``(kbase, shift)`` as bounds on :func:`_sortable_key32`'s keys: a
    counted candidate's bin is above ``b_thr`` iff ``any_gt`` and its key is at least ``key_gt``, and is ``b_thr``
    iff it is not above and its key is at least ``key_eq`` (which is never below ``lo``: no uncounted key)."""
    k_hi = kbase + ((b_thr + 1).to(tl.int64) << shift)  # bins are (key - kbase) >> shift on candidates (key >= lo)
    # (clamped to the key range: with nothing to take, need 0, the bin can start past it)
    k_lo = tl.minimum(tl.maximum(kbase + (b_thr.to(tl.int64) << shift), lo), 4294967295)
    any_gt = k_hi <= 4294967295  # past the top of the key range no key is above the bin
    key_gt = (tl.minimum(tl.maximum(k_hi, lo), 4294967295) - 2147483648).to(tl.int32)
    return any_gt, key_gt, (k_lo - 2147483648).to(tl.int32)


@triton.jit
def _digit_hist(off, m_j, prefix, sh, width):
    """The histogram of the ``width``-bit digit at bit ``sh`` of the boundary keys ``off`` (relative to the bins'
    base; ``m_j``: present) that share ``prefix`` above it."""
    match = m_j & ((off >> (sh + width)) == (prefix >> (sh + width)))
    return tl.histogram(((off >> sh) & ((1 << width) - 1)).to(tl.int32), 256, mask=match)


@triton.jit
def _pick_digit(hist2, prefix, sh, left):
    """The digit (at bit ``sh``) of the ``left``-th largest key in ``hist2``, added to ``prefix``, and how many keys
    at that digit are still to take."""
    r_above = tl.sum(hist2, 0) - tl.cumsum(hist2, 0)
    o_256 = tl.arange(0, 256)
    bb = tl.max(tl.where(r_above + hist2 >= left, o_256, 0), 0)
    return prefix | (bb.to(tl.int64) << sh), left - tl.sum(tl.where(o_256 == bb, r_above, 0), 0)


@triton.jit
def _boundary_keys(p_buf, p_x, stride_x_p, o_j, n_bound):
    """Entries ``o_j`` of the row's boundary buffer (its first ``n_bound`` hold positions): which are present, their
    positions and their logits' sortable keys."""
    m_j = o_j < n_bound
    pos = tl.load(p_buf + o_j.to(tl.int64), mask=m_j, other=0)
    return m_j, pos, _sortable_key(tl.load(p_x + pos.to(tl.int64) * stride_x_p, mask=m_j, other=float("-inf")))


@triton.jit
def _emit(key, pos, m_j, tau, left, eq_seen, base, p_o, stride_o_k, topk):
    """Append the positions ``pos`` whose keys are above ``tau``, and those equal to it while fewer than ``left``
    were taken (``eq_seen`` before these), at output slot ``base`` on; returns the new ``base`` and ``eq_seen``."""
    is_eq = m_j & (key == tau)
    eq_rank = eq_seen + tl.cumsum(is_eq.to(tl.int32), 0) - 1
    sel = m_j & ((key > tau) | (is_eq & (eq_rank < left)))
    sel_i = sel.to(tl.int32)
    dst = base + tl.cumsum(sel_i, 0) - 1
    tl.store(p_o + dst.to(tl.int64) * stride_o_k, pos, mask=sel & (dst < topk))
    return base + tl.sum(sel_i, 0), eq_seen + tl.sum(is_eq.to(tl.int32), 0)


@triton.jit
def _step_keys(p_x, stride_x_p, o_p, p_end, any_gt, key_gt, key_eq):
    """A select step's positions ``o_p`` (those from ``p_end`` on absent): which are above the threshold bin
    (:func:`_bin_keys`' bounds) and which are taken (above it or in it: ``key_gt >= key_eq``)."""
    key = _sortable_key32(tl.load(p_x + o_p.to(tl.int64) * stride_x_p, mask=o_p < p_end, other=float("-inf")))
    return (key >= key_gt) & any_gt, key >= key_eq


@triton.jit(do_not_specialize=["L", "topk", "n_chunks"])
def _topk_split_select_kernel(x_ptr, out_ptr, ws_ptr, buf_ptr, stride_x_t, stride_x_p, stride_o_t, stride_o_k,
                              stride_w_t, stride_b_t, L, topk, n_chunks,
                              CHUNK: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr, NB: tl.constexpr,
                              NREP: tl.constexpr, ATOMIC: tl.constexpr):
    """Split select, step 2 (one program per row and chunk), from step 1's threshold bin b: every program writes
    the positions of its counted candidates above b straight into the output and those in b into the row's
    boundary buffer, claiming slots from two atomic counters: per position where b holds fewer than ``ATOMIC``
    keys, else per step for the step's positions, ranked by a block scan (``ATOMIC`` 0: always per step; the
    per-position branch is still built). The row's last program to finish (an acq_rel counter) then takes the
    largest ``need - above(b)`` boundary keys by a radix select on the bits below the bin (up to 3 passes; a
    boundary bin of at most ``TAIL`` keys, the usual case, is read once and resolved in registers), appends them,
    and pads the rest of the row with -1."""
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

    # the threshold bin as bounds on 32-bit keys: compares, not a bin per position
    any_gt, key_gt, key_eq = _bin_keys(b_thr, lo, kbase, shift)
    p_end = tl.minimum(p_start + CHUNK, L)
    if n_bound < ATOMIC:
        # few keys to claim (at most topk above the bin, fewer than ATOMIC in it): a claim per taken position, no
        # block-wide sum, scan or barrier per step (a crowded bin, e.g. a row of equal logits, would serialise its
        # claims on one counter: the scan below)
        ones = tl.full([BLOCK], 1, dtype=tl.int32)
        for p0 in range(p_start, p_end, BLOCK):
            o_p = p0 + o_b
            gt, taken = _step_keys(p_x, stride_x_p, o_p, p_end, any_gt, key_gt, key_eq)
            slot = tl.atomic_add(tl.where(gt, p_s + _CNT_GT, p_s + _CNT_EQ), ones, mask=taken, sem="relaxed")
            dst = tl.where(gt, p_o + slot.to(tl.int64) * stride_o_k, p_buf + slot.to(tl.int64))
            tl.store(dst, o_p, mask=taken)
    else:
        for p0 in range(p_start, p_end, BLOCK):
            o_p = p0 + o_b
            gt, taken = _step_keys(p_x, stride_x_p, o_p, p_end, any_gt, key_gt, key_eq)
            # gt counted in the low 16 bits, those in the bin above (a block holds at most 2^14 positions, so
            # neither half overflows): one sum claims both counters (their round trips overlap), one scan ranks both
            both = tl.where(gt, 1, tl.where(taken, 65536, 0))
            n_both = tl.sum(both, 0)
            base_gt = tl.atomic_add(p_s + _CNT_GT, n_both & 0xFFFF, sem="relaxed")
            base_eq = tl.atomic_add(p_s + _CNT_EQ, n_both >> 16, sem="relaxed")
            rank = tl.cumsum(both, 0)
            # one store a position: above the bin to the output, in it to the boundary buffer
            dst = tl.where(gt, p_o + (base_gt + (rank & 0xFFFF) - 1).to(tl.int64) * stride_o_k,
                           p_buf + (base_eq + (rank >> 16) - 1).to(tl.int64))
            tl.store(dst, o_p, mask=taken)

    tl.debug_barrier()  # every thread's buffer writes precede the release below (explicit on every Triton version)
    done = tl.atomic_add(p_s + _DONE, 1, sem="acq_rel")
    if done == n_chunks - 1:
        # The boundary bin: n_bound candidate positions in buf; take the `left` = need - n_above of them with the
        # largest keys. The bin fixes all but the low `shift` bits of the offsets key - kbase; radix digits of up to
        # 8 bits below.
        left = need - n_above
        prefix = b_thr.to(tl.int64) << shift
        o_j = tl.arange(0, TAIL)
        if n_bound <= TAIL:  # one read of the bin's keys, every pass on registers
            m_j, pos, key = _boundary_keys(p_buf, p_x, stride_x_p, o_j, n_bound)
            for d in range(0, (shift + 7) // 8):
                sh = tl.maximum(shift - 8 * (d + 1), 0)
                hist2 = _digit_hist(key - kbase, m_j, prefix, sh, shift - 8 * d - sh)
                prefix, left = _pick_digit(hist2, prefix, sh, left)
            _emit(key, pos, m_j, kbase + prefix, left, 0, n_above, p_o, stride_o_k, topk)
        else:  # a crowded bin: each pass reads it again, TAIL keys at a time
            for d in range(0, (shift + 7) // 8):
                sh = tl.maximum(shift - 8 * (d + 1), 0)
                width = shift - 8 * d - sh
                hist2 = tl.zeros([256], dtype=tl.int32)
                for j0 in range(0, n_bound, TAIL):
                    m_j, pos, key = _boundary_keys(p_buf, p_x, stride_x_p, j0 + o_j, n_bound)
                    hist2 += _digit_hist(key - kbase, m_j, prefix, sh, width)
                prefix, left = _pick_digit(hist2, prefix, sh, left)
            tau = kbase + prefix  # the take-th largest boundary key; `left` keys equal to it are taken, in order
            base = n_above
            eq_seen = tl.zeros([], dtype=tl.int32)
            for j0 in range(0, n_bound, TAIL):
                m_j, pos, key = _boundary_keys(p_buf, p_x, stride_x_p, j0 + o_j, n_bound)
                base, eq_seen = _emit(key, pos, m_j, tau, left, eq_seen, base, p_o, stride_o_k, topk)
        for j0 in range(0, topk, TAIL):
            tl.store(p_o + (j0 + o_j).to(tl.int64) * stride_o_k, tl.full([TAIL], -1, dtype=tl.int32),
                     mask=(j0 + o_j >= need) & (j0 + o_j < topk))


_launch_bound = CachedLauncher(_topk_bound_kernel)
_launch_hist = CachedLauncher(_topk_hist_kernel)
_launch_split_select = CachedLauncher(_topk_split_select_kernel)


WS_WIDTH = NREP * NBINS + WS_EXTRA  # int32 per row of the split select's workspace


def split_select_workspace(T: int, L: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The split select's workspace for ``T`` rows of ``L`` logits: a zeroed int32 [T, WS_WIDTH] (histograms,
    counters, bounds, the threshold) and an int32 [T, max(L, 1)] boundary buffer."""
    import torch

    ws = torch.zeros(T, WS_WIDTH, dtype=torch.int32, device=device)
    return ws, _boundary_buffer(T, L, device)


def _boundary_buffer(T: int, L: int, device: torch.device) -> torch.Tensor:
    import torch

    return torch.empty(T, max(L, 1), dtype=torch.int32, device=device)


def launch_split_select(logits: torch.Tensor, out: torch.Tensor, topk: int, cfg: SelectConfig,
                        ws: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per-row top-k of ``logits`` float32 [T, L] into ``out`` int32 [T, topk] with many programs per row (the split
    select): a bound pass (``cfg.bound``, on rows of at least ``cfg.bound_min_chunks`` chunks), a histogram pass
    counting the candidates at or above the bound, then a pass that writes the rows' positions above the threshold
    bin and resolves the boundary bin. ``cfg.split_chunk`` / ``cfg.split_block`` / ``cfg.split_tail``: positions per
    program / per step / boundary keys per step of a row's last program, powers of two (block and tail at most
    ``MAX_SPLIT_BLOCK``); ``cfg.split_atomic`` (an int >= 0): rows whose boundary bin holds fewer keys claim their
    output and boundary slots per position (atomics) rather than per step (block scans); ``cfg.select`` is not
    read. Returns the workspace ``(ws, buf)`` (for inspection), or None for no rows. ``ws``: a zeroed int32
    [T, WS_WIDTH] workspace (e.g. zeroed by the logits launch); None: a new one.
    """
    import torch

    T, L = logits.shape
    if T == 0:
        return None
    chunk, block = cfg.split_chunk, cfg.split_block
    if not 1 <= block <= MAX_SPLIT_BLOCK or block & (block - 1):
        raise ValueError(f"split_block ({block}) must be a power of 2 up to {MAX_SPLIT_BLOCK} (the select ranks two "
                         f"counts of a block in one int32)")
    if not 1 <= cfg.split_tail <= MAX_SPLIT_BLOCK or cfg.split_tail & (cfg.split_tail - 1):
        raise ValueError(f"split_tail ({cfg.split_tail}) must be a power of 2 up to {MAX_SPLIT_BLOCK}")
    if chunk < block or chunk & (chunk - 1):
        raise ValueError(f"split_chunk ({chunk}) must be a power of 2 and a multiple of split_block ({block})")
    if isinstance(cfg.split_atomic, bool) or not isinstance(cfg.split_atomic, int) or cfg.split_atomic < 0:
        raise ValueError(f"split_atomic: expected an int >= 0 (a boundary-bin size in keys), got "
                         f"{cfg.split_atomic!r}")
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
                      dict(CHUNK=chunk, NB=NBINS, NREP=NREP), num_warps=SPLIT_WARPS)
    const = dict(CHUNK=chunk, BLOCK=block, NB=NBINS, NREP=NREP)
    _launch_hist(grid, (logits, ws, logits.stride(0), logits.stride(1), ws.stride(0), L, n_chunks, topk), const,
                 num_warps=SPLIT_WARPS)
    _launch_split_select(grid, (logits, out, ws, buf, logits.stride(0), logits.stride(1), out.stride(0),
                                out.stride(1), ws.stride(0), buf.stride(0), L, topk, n_chunks),
                         dict(const, TAIL=cfg.split_tail, ATOMIC=cfg.split_atomic),
                         num_warps=SPLIT_WARPS)
    return ws, buf

"""The DSA indexer (logits kernel + top-k selection kernel) against the float64 reference, on the CPU through
Triton's interpreter (or a GPU when there is one).

Cases: vLLM's fp8 indexer layout (flat, its [nb, bs, 1, 132] view, a padded block stride) and fp16 caches; fp8 and
fp16 q; 1, 4 and 32 index heads; rows of several requests with different lengths (prefill rows with increasing
positions, decode rows), positions at block edges, top-k longer than a request (-1 padding), invalid request ids,
table entries and columns past the table (never dereferenced: -inf / -1), NaN/sentinel-filled outputs, the output
fed to ``topk_to_slots``, and bad arguments. Top-k results are compared as sets of selected logit values (robust to
ties); bf16 runs only on the GPU (the interpreter's bf16 dots are garbage).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import DEVICE

import triton_mla_sparse as tms
from triton_mla_sparse import reference

D = 128
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def quantize_indexer_cache(values: torch.Tensor, *, block_pad: int = 0) -> torch.Tensor:
    """Real values float32 [nb, bs, 128] -> vLLM's fp8 indexer layout uint8 [nb, bs·132]: per block the bs·128 e4m3
    values (token-major), then bs float32 scales (scale = amax/448 per token). ``block_pad`` spare NaN bytes after
    each block (a block stride larger than bs·132; a multiple of 4)."""
    nb, bs, d = values.shape
    assert d == D and block_pad % 4 == 0
    scale = (values.abs().amax(-1) / 448.0).clamp_min(1e-8).float()  # [nb, bs]
    q8 = (values / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    buf = torch.full((nb, bs * (D + 4) + block_pad), 0xFF, dtype=torch.uint8)
    buf[:, :bs * D] = q8.view(torch.uint8).reshape(nb, bs * D)
    buf[:, bs * D:bs * (D + 4)] = scale.contiguous().view(torch.uint8).reshape(nb, bs * 4)
    buf = buf.to(DEVICE)
    return buf[:, :bs * (D + 4)] if block_pad else buf


def make_case(*, k_fmt="fp8", q_dtype=torch.float16, Hi=4, bs=16, lengths=(37, 16, 64), extra_cols=2, seed=0):
    """Requests of the given lengths, each with its rows: prefill rows at block edges / increasing positions and
    one decode row (its last token). Returns a dict of indexer arguments (without max_len/topk)."""
    g = torch.Generator().manual_seed(seed)
    R = len(lengths)
    max_blocks = max(-(-n // bs) for n in lengths) + extra_cols
    nb = sum(-(-n // bs) for n in lengths) + 3  # spare blocks nobody uses
    values = torch.randn(nb, bs, D, generator=g) * torch.empty(nb, bs, 1).uniform_(0.2, 3.0, generator=g)
    perm = torch.randperm(nb, generator=g)
    bt = torch.full((R, max_blocks), INT32_MAX, dtype=torch.int64)  # garbage past each request's blocks
    used = 0
    for r, n in enumerate(lengths):
        k = -(-n // bs)
        bt[r, :k] = perm[used:used + k]
        used += k
    req, pos = [], []
    for r, n in enumerate(lengths):
        cand = {0, n - 1, bs - 1, bs, 2 * bs - 1, n // 2} | set(range(max(0, n - 3), n))
        for p in sorted(x for x in cand if 0 <= x < n):
            req.append(r)
            pos.append(p)
    T = len(req)
    if k_fmt == "fp16":
        k_cache = values.to(torch.float16).to(DEVICE)
    elif k_fmt == "fp16_4d":
        k_cache = values.to(torch.float16).unsqueeze(2).to(DEVICE)
    elif k_fmt == "fp8":
        k_cache = quantize_indexer_cache(values)
    elif k_fmt == "fp8_4d":
        k_cache = quantize_indexer_cache(values).view(nb, bs, 1, D + 4)
    elif k_fmt == "fp8_padded":
        k_cache = quantize_indexer_cache(values, block_pad=64)
    else:
        raise AssertionError(k_fmt)
    q = torch.randn(T, Hi, D, generator=g)
    if q_dtype == torch.float8_e4m3fn:
        q = (q * 40).clamp(-448, 448).to(torch.float8_e4m3fn)  # raw e4m3; its scale lives in the weights
        w = torch.randn(T, Hi, generator=g) * Hi**-0.5 / 40
    else:
        q = q.to(q_dtype)
        w = torch.randn(T, Hi, generator=g) * Hi**-0.5
    return dict(q=q.to(DEVICE), weights=w.to(DEVICE), k_cache=k_cache, block_table=bt.to(torch.int32).to(DEVICE),
                req_id_per_token=torch.tensor(req, dtype=torch.int32, device=DEVICE),
                positions=torch.tensor(pos, dtype=torch.int32, device=DEVICE))


def args(case):
    return (case["q"], case["weights"], case["k_cache"], case["block_table"], case["req_id_per_token"],
            case["positions"])


def assert_logits_match(ours, ref, tol=1e-5, what=""):
    ref = ref.to(torch.float64).cpu()
    ours = ours.to(torch.float64).cpu()
    ninf = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(ours), ninf), f"{what}: -inf pattern differs"
    assert torch.isfinite(ours[~ninf]).all(), what
    if (~ninf).any():
        diff = (ours[~ninf] - ref[~ninf]).norm() / ref[~ninf].norm().clamp_min(1e-30)
        assert diff < tol, f"{what}: rel err {diff:.3g}"
        scale = ref[~ninf].abs().max()
        assert (ours[~ninf] - ref[~ninf]).abs().max() <= 1e-4 * scale + 1e-6, what


def assert_topk_matches(sel, ref_logits, topk, what="", exact=False):
    """``sel`` int32 [T, topk] against reference logits [T, L]: the selected positions are distinct candidates,
    -1 exactly for the missing ones, and their sorted logit values equal the reference's top values (within
    1e-5 · the row's largest magnitude, for kernel-computed logits; ``exact`` when the selection ran on
    ``ref_logits`` itself)."""
    sel = sel.cpu().long()
    ref_logits = ref_logits.cpu().to(torch.float64)
    T, L = ref_logits.shape
    assert sel.shape == (T, topk) and sel.dtype == torch.int64
    for t in range(T):
        row = ref_logits[t]
        n = int((~torch.isneginf(row)).sum())
        k = min(topk, n)
        s = sel[t]
        valid = s >= 0
        assert int(valid.sum()) == k, f"{what} row {t}: {int(valid.sum())} positions, expected {k}"
        assert bool((s[~valid] == -1).all()), f"{what} row {t}: padding must be -1"
        pos = s[valid]
        assert bool((pos < L).all()) and len(set(pos.tolist())) == k, f"{what} row {t}: bad/duplicate positions"
        got = row[pos]
        assert not torch.isneginf(got).any(), f"{what} row {t}: selected a non-candidate"
        want = torch.topk(row, k).values if k else row[:0]
        got_sorted, want_sorted = torch.sort(got).values, torch.sort(want).values
        if exact:
            assert torch.equal(got_sorted.nan_to_num(nan=7.5), want_sorted.nan_to_num(nan=7.5)), f"{what} row {t}"
            continue
        tol = 1e-5 * float(row[~torch.isneginf(row)].abs().max()) if n else 0.0
        assert torch.allclose(got_sorted, want_sorted, rtol=0, atol=tol + 1e-7), f"{what} row {t}"


CACHES = ("fp8", "fp8_4d", "fp16")
QS = {"fp8": torch.float8_e4m3fn, "fp16": torch.float16}
HEADS = (1, 4, 32)
TOPKS = (1, 20, 70)  # 70 > every request's length: -1 padding


@pytest.mark.parametrize("Hi", HEADS)
@pytest.mark.parametrize("q_name", QS)
@pytest.mark.parametrize("k_fmt", CACHES)
def test_logits_and_topk_match_reference(k_fmt, q_name, Hi):
    case = make_case(k_fmt=k_fmt, q_dtype=QS[q_name], Hi=Hi, seed=hash((k_fmt, q_name, Hi)) % 1000)
    bs = 16
    max_len = case["block_table"].shape[1] * bs
    what = f"{k_fmt} q={q_name} Hi={Hi}"
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    out = torch.full((len(case["positions"]), max_len), math.nan, dtype=torch.float32, device=DEVICE)
    got = tms.indexer_logits(*args(case), max_len, out=out)
    assert got is out
    assert_logits_match(got, ref, what=what)
    topk = TOPKS[(CACHES.index(k_fmt) + list(QS).index(q_name) + HEADS.index(Hi)) % len(TOPKS)]
    for select in ("split", "torch"):
        sel = tms.indexer_topk(*args(case), topk, select=select)
        assert sel.dtype == torch.int32 and sel.device.type == DEVICE.type
        assert_topk_matches(sel, ref, topk, what=f"{what} topk={topk} select={select}")
    ref_sel = reference.indexer_topk(*args(case), 70, compute_dtype=torch.float64)
    assert_topk_matches(ref_sel, ref, 70, what=f"reference {what}")


@pytest.mark.parametrize("k_fmt", ("fp8_padded", "fp16_4d"))
def test_layouts(k_fmt):
    case = make_case(k_fmt=k_fmt, Hi=4, bs=8, lengths=(9, 24, 3))
    max_len = case["block_table"].shape[1] * 8
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    assert_logits_match(tms.indexer_logits(*args(case), max_len), ref, what=k_fmt)
    assert_topk_matches(tms.indexer_topk(*args(case), 16), ref, 16, what=k_fmt)


def test_invalid_entries_are_masked():
    """Rows with an invalid request id or a negative position, table entries outside [0, num_blocks), a max_len
    past the table: those positions are -inf (never read: the cache around them is NaN) and top-k gives -1."""
    bs = 16
    case = make_case(k_fmt="fp8", Hi=4, bs=bs, lengths=(40, 20), extra_cols=0)
    bt = case["block_table"].clone()
    nb = case["k_cache"].shape[0]
    bt[0, 1] = nb  # out of range block id: positions 16..31 of request 0 are not candidates
    bt[1, 0] = INT32_MIN
    T = len(case["positions"])
    req = case["req_id_per_token"].clone()
    pos = case["positions"].clone()
    req[0], req[1] = -1, 2  # invalid request ids
    pos[2] = -1
    pos[-1] = INT32_MAX  # runs past the table
    case.update(block_table=bt, req_id_per_token=req, positions=pos)
    max_len = bt.shape[1] * bs + 5  # columns past the table
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    got = tms.indexer_logits(*args(case), max_len)
    assert_logits_match(got, ref)
    assert torch.isneginf(got[:3].cpu()).all()
    assert torch.isneginf(got[:, bt.shape[1] * bs:].cpu()).all()
    row0 = (case["req_id_per_token"].cpu() == 0).nonzero()[0, 0]
    assert torch.isneginf(got[row0, 16:32].cpu()).all()
    sel = tms.indexer_topk(*args(case), 64, max_len=max_len)
    assert_topk_matches(sel, ref, 64)
    assert (sel[:3].cpu() == -1).all() and T > 3


def test_ties_and_empty_rows():
    """Zero weights make every candidate's logit 0 (all tied): any min(topk, n) distinct candidates."""
    case = make_case(k_fmt="fp16", Hi=4, lengths=(30, 5))
    case["weights"][::2] = 0.0
    ref = reference.indexer_logits(*args(case), 32, compute_dtype=torch.float64)
    for topk in (3, 10):
        sentinel = torch.full((len(case["positions"]), topk), 12345, dtype=torch.int32, device=DEVICE)
        sel = tms.indexer_topk(*args(case), topk, max_len=32, out=sentinel)
        assert sel is sentinel
        assert_topk_matches(sel, ref, topk)


def test_select_kernel_special_values():
    """The split selection alone on crafted rows: ±0, +inf, huge and tiny magnitudes, negatives, many ties, a row
    of equal values (its whole width in one histogram bin)."""
    from triton_mla_sparse.kernels.indexer import launch_split_select

    rows = [
        [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, 3e38, -3e38, 1e-40, -1e-40],
        [-5.0] * 7 + [-math.inf] * 3,
        [-math.inf] * 10,
        [2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, -math.inf, 0.5],
    ]
    x = torch.tensor(rows, dtype=torch.float32)
    x = torch.cat([x, torch.randn(3, 10)], 0)
    x = torch.cat([x, torch.full((x.shape[0], 190), -math.inf)], 1)  # several chunks
    x = x[:, torch.randperm(200)].contiguous().to(DEVICE)

    class Four:
        split_chunk, split_block, bound, bound_min_chunks = 64, 32, False, 1  # 200 columns: four chunks of two steps

    class Thirteen:
        # more chunks than histogram copies (NREP = 8)
        split_chunk, split_block, bound, bound_min_chunks = 16, 16, False, 1

    class Bounded:
        split_chunk, split_block, bound, bound_min_chunks = 128, 32, True, 1  # with the bound pass: two chunks

    ties = torch.full((2, 200), 1.5)
    ties[1, ::3] = -math.inf
    x = torch.cat([x, ties.to(DEVICE)], 0)  # one boundary bin holding the whole row
    for cfg in (Four, Thirteen, Bounded):
        for topk in (1, 3, 6, 9, 12, 150):
            out = torch.full((x.shape[0], topk), 777, dtype=torch.int32, device=DEVICE)
            launch_split_select(x, out, topk, cfg)
            assert_topk_matches(out, x, topk, what=f"{cfg.__name__} topk={topk}", exact=True)


def test_split_select_rejects_bad_chunks():
    from triton_mla_sparse.kernels.indexer import launch_split_select

    class Bad:
        split_chunk, split_block, bound, bound_min_chunks = 48, 32, False, 1

    class BigBlock:  # two of its counts would not fit one int32
        split_chunk, split_block, bound, bound_min_chunks = 32768, 32768, False, 1

    class NotPow2:
        split_chunk, split_block, bound, bound_min_chunks = 384, 128, True, 1

    x = torch.arange(100, dtype=torch.float32, device=DEVICE)[None]
    for cfg, match in ((Bad, "multiple of split_block"), (BigBlock, "split_block .32768. must be a power of 2 up to"),
                       (NotPow2, "must be a power of 2")):
        with pytest.raises(ValueError, match=match):
            launch_split_select(x, torch.empty(1, 10, dtype=torch.int32, device=DEVICE), 10, cfg)


def test_bound_with_a_partial_last_chunk():
    """The bound pass's last chunk runs past the row (masked positions are not candidates): a falling row whose
    short last chunk holds only small logits still selects the first positions."""
    from triton_mla_sparse.kernels.indexer import launch_split_select

    class Cfg:
        split_chunk, split_block, bound, bound_min_chunks = 128, 32, True, 1

    x = torch.cat([-1 - torch.arange(128) / 128, torch.full((72,), -10.0)])[None].repeat(2, 1)
    x[1, 128:] = -math.inf
    x = x.to(DEVICE)
    for topk in (1, 2, 5):
        out = torch.full((2, topk), 777, dtype=torch.int32, device=DEVICE)
        launch_split_select(x, out, topk, Cfg)
        assert out.cpu().sort(1).values.tolist() == [list(range(topk))] * 2, topk


def test_select_nan_ranks_highest_like_the_reference():
    """A NaN logit (only non-finite inputs produce one) ranks above every number, whatever its sign bit, in both
    selections, as in torch.topk / the reference; -inf is never selected."""
    from triton_mla_sparse.indexer import _torch_select
    from triton_mla_sparse.kernels.indexer import launch_split_select

    neg_nan = torch.tensor([-math.nan]).view(torch.int32)[0].item() | (1 << 31)
    nan_neg = torch.tensor([neg_nan], dtype=torch.int32).view(torch.float32)[0].item()
    x = torch.tensor([[1.0, math.nan, 2.0, -math.inf, nan_neg, 0.5]], dtype=torch.float32, device=DEVICE)

    class Cfg:
        split_chunk, split_block, bound, bound_min_chunks = 128, 32, True, 1

    for topk in (2, 4, 6):
        want = [1, 4, 2, 0, 5][:topk]  # the candidates (all but the -inf at 3), largest first: NaNs, 2, 1, 0.5
        for name in ("split", "torch"):
            out = torch.full((1, topk), 777, dtype=torch.int32, device=DEVICE)
            if name == "torch":
                _torch_select(x, out, topk)
            else:
                launch_split_select(x, out, topk, Cfg)
            got = out[0].tolist()
            assert sorted(v for v in got if v >= 0) == sorted(want), (name, topk, got)
            assert got.count(-1) == topk - len(want), (name, topk, got)


def test_one_row_per_request():
    """Decode-shaped calls (rows <= requests: one row per program group) against the reference."""
    case = make_case(k_fmt="fp8", q_dtype=torch.float8_e4m3fn, Hi=4, lengths=(37, 16, 64))
    req = case["req_id_per_token"].cpu()
    last = torch.tensor([int((req == r).nonzero().max()) for r in range(int(req.max()) + 1)])
    sub = {k: (v[last.to(v.device)] if k in ("q", "weights", "req_id_per_token", "positions") else v)
           for k, v in case.items()}
    assert len(sub["positions"]) <= sub["block_table"].shape[0]
    max_len = sub["block_table"].shape[1] * 16
    ref = reference.indexer_logits(*args(sub), max_len, compute_dtype=torch.float64)
    assert_logits_match(tms.indexer_logits(*args(sub), max_len), ref, what="one row per request")
    for select in ("split", "torch"):
        assert_topk_matches(tms.indexer_topk(*args(sub), 20, select=select), ref, 20, what=select)


@pytest.mark.parametrize("rows", ("decode", "prefill"))
def test_logits_launch_zeroes_the_select_workspace(rows):
    """``indexer_topk`` leaves zeroing the split select's workspace to its logits launch (no memset): every row's
    ws must come back zero (prefill: groups of rows per program, the last group partial), the logits unchanged."""
    from triton_mla_sparse.indexer import check_indexer_inputs, choose_indexer_config
    from triton_mla_sparse.kernels.indexer import WS_WIDTH, launch_indexer_logits

    case = make_case(k_fmt="fp8", q_dtype=torch.float8_e4m3fn, Hi=4, lengths=(37, 16, 64))
    if rows == "decode":
        case = _decode_rows(case)
    p = check_indexer_inputs(*args(case))
    cfg = choose_indexer_config(p)
    assert (cfg.rows_per_program > 1) == (rows == "prefill") and (p.T % cfg.rows_per_program or rows == "decode")
    max_len = case["block_table"].shape[1] * 16
    out = torch.full((p.T, max_len), float("nan"), device=DEVICE)
    ws = torch.full((p.T + 1, WS_WIDTH), -7, dtype=torch.int32, device=DEVICE)  # one row past T: not touched
    launch_indexer_logits(p, out, cfg, ws[:p.T])
    assert bool((ws[:p.T] == 0).all()) and bool((ws[p.T] == -7).all())
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    assert_logits_match(out, ref, what=f"logits with the workspace zeroing ({rows})")


def test_topk_select_gets_a_zeroed_workspace(monkeypatch):
    """``indexer_topk`` allocates the split select's workspace uninitialised and relies on its logits launch to zero
    it: with every fresh int32/float32 allocation poisoned, the select must still receive an all-zero workspace and
    the result must match the reference."""
    from triton_mla_sparse.kernels import indexer as K

    real_empty, real_select = torch.empty, K.launch_split_select
    seen = []

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.dtype == torch.int32:
            t.fill_(0x5A5A5A5A)
        elif t.dtype == torch.float32:
            t.fill_(float("nan"))
        return t

    def checking_select(logits, out, topk, cfg, ws=None):
        seen.append(ws is not None and bool((ws == 0).all()))
        return real_select(logits, out, topk, cfg, ws)

    case = _decode_rows(make_case(k_fmt="fp8", q_dtype=torch.float8_e4m3fn, Hi=4, lengths=(37, 16, 64)))
    max_len = case["block_table"].shape[1] * 16
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    monkeypatch.setattr(torch, "empty", poisoned_empty)
    monkeypatch.setattr(K, "launch_split_select", checking_select)
    sel = tms.indexer_topk(*args(case), 20, select="split")
    monkeypatch.undo()
    assert seen == [True]
    assert_topk_matches(sel, ref, 20, what="poisoned allocations")


def _sortable_keys(x: torch.Tensor) -> torch.Tensor:
    """The split select's unsigned 32-bit order keys (int64) of float32 logits: -inf lowest, NaN highest."""
    bits = x.contiguous().view(torch.int32).long()
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF) + 2**31
    return torch.where(torch.isnan(x), torch.full_like(key, 2**32 - 1), key)


def _decode_rows(case):
    """The case's last row of each request (decode-shaped: one row per request)."""
    req = case["req_id_per_token"].cpu()
    last = torch.tensor([int((req == r).nonzero().max()) for r in range(int(req.max()) + 1)])
    return {k: (v[last.to(v.device)] if k in ("q", "weights", "req_id_per_token", "positions") else v)
            for k, v in case.items()}


@pytest.mark.parametrize("topk", (1, 7, 30, 150))
def test_topk_bound_counts_enough(topk):
    """The split select's bound pass: per group size, the chunks all of whose groups hold a candidate take part;
    the bound the histogram counts from has at least min(topk, candidates) logits at or above it; on iid rows and
    small top-k it excludes most of the row (or the pass would be useless); the selection stays exact."""
    from triton_mla_sparse.kernels import indexer as K

    class Cfg:
        split_chunk, split_block, bound, bound_min_chunks = 256, 64, True, 8

    g = torch.Generator().manual_seed(topk)
    L = 2048
    x = torch.randn(6, L, generator=g)
    x[1, 1500:] = -math.inf  # a shorter row: its last chunks vouch for nothing
    x[2, ::3] = -math.inf  # gaps: groups of 16 still hold candidates
    x[3, 100:116] = -math.inf  # one empty 16-group: that chunk only vouches at 32 positions per group and up
    x[4] = torch.linspace(-3, 3, L)  # rising: the large logits in the last chunk
    x[5, 3:] = -math.inf  # fewer candidates than most top-k
    # one large logit per 128 positions, the rest small: the 128-groups vouch for 16 in all, the 64-groups for 32
    # (a bound that over-counts what a level vouches for drops needed positions at topk 30)
    big = torch.arange(0, L, 128) + torch.randint(0, 128, (L // 128,), generator=g)
    spiky = torch.randn(L, generator=g) * 0.01 - 5
    spiky[big] = torch.randn(L // 128, generator=g) + 5
    x = torch.cat([x, spiky[None]], 0)
    T = x.shape[0]
    x = x.to(DEVICE)
    out = torch.full((T, topk), 777, dtype=torch.int32, device=DEVICE)
    ws, _ = K.launch_split_select(x, out, topk, Cfg)
    assert_topk_matches(out, x, topk, what=f"topk={topk}", exact=True)
    slots = ws[:, K.NREP * K.NBINS + 10:K.NREP * K.NBINS + 18].cpu().long()
    counted = ws[:, :K.NREP * K.NBINS].sum(1).cpu()
    in_bin = ws[:, K.NREP * K.NBINS + 9].cpu()
    keys = _sortable_keys(x.cpu())
    cand = keys > K.KEY_NINF
    for t in range(T):
        lo = K.KEY_NINF + 1
        for j in range(4):
            size = K.BOUND_GROUP << j
            full = sum(bool(cand[t, c:c + 256].view(-1, size).any(1).all()) for c in range(0, L, 256))
            assert int(slots[t, 2 * j + 1]) == full, (t, j)
            if full * (256 // size) >= topk:
                lo = max(lo, 2**32 - 1 - (int(slots[t, 2 * j]) & 0xFFFFFFFF))
        assert int((cand[t] & (keys[t] >= lo)).sum()) >= min(topk, int(cand[t].sum())), t
        assert int(counted[t]) == int((cand[t] & (keys[t] >= lo)).sum()), t  # the kernels count from that bound
        kmax = int(ws[t, K.NREP * K.NBINS + 18]) & 0xFFFFFFFF  # the row maximum the bins span up to
        assert kmax == (int(keys[t][cand[t]].max()) if cand[t].any() else 0), t
        if t == 0 and topk <= 30:
            assert int((keys[t] >= lo).sum()) < L // 4, "the bound excluded too little of an iid row"
            # bins from the bound to the maximum: a few candidates share the threshold bin (top-11-bit bins would
            # hold dozens of these N(0, 1) logits)
            assert int(in_bin[t]) <= 8, int(in_bin[t])


@pytest.mark.parametrize("order", ("rising", "falling", "middle"))
def test_topk_skewed_rows(order):
    """Decode rows whose largest logits crowd into one end (or the middle) of the context, through indexer_topk:
    the selection stays exact (these short rows take the bound only for small top-k; the bound pass on long skewed
    rows is in test_topk_bound_counts_enough)."""
    case = _decode_rows(make_case(k_fmt="fp16", Hi=4, bs=16, lengths=(256, 200, 97), seed=3))
    k = case["k_cache"].float()
    nb, bs = k.shape[:2]
    bt = case["block_table"].cpu().long()
    gain = torch.ones(nb, bs)
    for r in range(bt.shape[0]):
        for c in range(bt.shape[1]):
            b = int(bt[r, c])
            if 0 <= b < nb:
                pos = torch.arange(c * bs, (c + 1) * bs, dtype=torch.float32)
                gain[b] = {"rising": 1 + pos / 8, "falling": 40 - pos / 8,
                           "middle": 1 + 30 * torch.exp(-((pos - 100) / 20) ** 2)}[order].clamp_min(0.5)
    case["k_cache"] = (k * gain[..., None].to(k.device)).to(torch.float16)
    case["weights"] = case["weights"].abs()  # positive weights: larger keys give larger logits
    max_len = case["block_table"].shape[1] * bs
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    for topk in (5, 33, 120):
        assert_topk_matches(tms.indexer_topk(*args(case), topk), ref, topk, what=f"{order} topk={topk}")


def test_plugs_into_topk_to_slots():
    bs = 16
    case = make_case(k_fmt="fp8", Hi=4, bs=bs, lengths=(37, 16))
    sel = tms.indexer_topk(*args(case), 24)
    slots = tms.topk_to_slots(sel, case["req_id_per_token"], case["block_table"], bs)
    assert slots.shape == sel.shape and slots.dtype == torch.int32
    s, p = slots.cpu().long(), sel.cpu().long()
    assert torch.equal(s < 0, p < 0)
    bt = case["block_table"].cpu().long()
    req = case["req_id_per_token"].cpu().long()
    for t in range(s.shape[0]):
        for j in range(s.shape[1]):
            if p[t, j] >= 0:
                assert s[t, j] == bt[req[t], p[t, j] // bs] * bs + p[t, j] % bs


def test_empty_shapes():
    case = make_case(k_fmt="fp8", Hi=4, lengths=(5,))
    assert tms.indexer_logits(*args(case), 0).shape == (len(case["positions"]), 0)
    sel = tms.indexer_topk(*args(case), 4, max_len=0)
    assert (sel.cpu() == -1).all()
    empty = {k: (v[:0] if k in ("q", "weights", "req_id_per_token", "positions") else v) for k, v in case.items()}
    assert tms.indexer_logits(*args(empty), 16).shape == (0, 16)
    assert tms.indexer_topk(*args(empty), 8).shape == (0, 8)


# ----------------------------------------------------------------------------------------------------------------
# Validation: one ValueError naming the argument, for the Triton functions and the reference alike.

def _bad_cases():
    def mod(**kw):
        return kw

    meta = torch.device("meta")
    return {
        "q dtype": ("q", mod(q=lambda c: c["q"].float())),
        "q Di": ("q", mod(q=lambda c: c["q"][..., :64])),
        "q heads": ("q", mod(q=lambda c: torch.zeros(c["q"].shape[0], 65, D, dtype=torch.float16, device=DEVICE),
                             weights=lambda c: torch.zeros(c["q"].shape[0], 65, device=DEVICE))),
        "q 2d": ("q", mod(q=lambda c: c["q"][:, 0])),
        "weights dtype": ("weights", mod(weights=lambda c: c["weights"].half())),
        "weights shape": ("weights", mod(weights=lambda c: c["weights"][:, :2])),
        "weights device": ("weights", mod(weights=lambda c: c["weights"].to(meta))),
        "k dtype": ("k_cache", mod(k_cache=lambda c: torch.zeros(4, 16, D, device=DEVICE))),
        "k fp8 width": ("k_cache", mod(k_cache=lambda c: torch.zeros(4, 16 * 130, dtype=torch.uint8, device=DEVICE))),
        "k fp16 Di": ("k_cache", mod(k_cache=lambda c: torch.zeros(4, 16, 64, dtype=torch.float16, device=DEVICE))),
        "k bf16 vs fp16 q": ("k_cache", mod(k_cache=lambda c: torch.zeros(4, 16, D, dtype=torch.bfloat16,
                                                                         device=DEVICE))),
        "k device": ("k_cache", mod(k_cache=lambda c: c["k_cache"].to(meta))),
        "k misaligned": ("k_cache", mod(k_cache=lambda c: torch.zeros(4 * 16 * 132 + 1, dtype=torch.uint8,
                                                                      device=DEVICE)[1:].view(4, 16 * 132))),
        "table int64": ("block_table", mod(block_table=lambda c: c["block_table"].long())),
        "table 1d": ("block_table", mod(block_table=lambda c: c["block_table"][0])),
        "table device": ("block_table", mod(block_table=lambda c: c["block_table"].to(meta))),
        "req dtype": ("req_id_per_token", mod(req_id_per_token=lambda c: c["req_id_per_token"].long())),
        "req shape": ("req_id_per_token", mod(req_id_per_token=lambda c: c["req_id_per_token"][:-1])),
        "positions dtype": ("positions", mod(positions=lambda c: c["positions"].float())),
        "positions shape": ("positions", mod(positions=lambda c: c["positions"][:, None])),
    }


BAD = _bad_cases()


@pytest.mark.parametrize("fn", ["triton", "reference"])
@pytest.mark.parametrize("name", list(BAD))
def test_bad_inputs(name, fn):
    arg, changes = BAD[name]
    case = make_case(k_fmt="fp8", q_dtype=torch.float16, Hi=4, lengths=(20,))
    for k, f in changes.items():
        case[k] = f(case)
    mod = tms if fn == "triton" else reference
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        mod.indexer_logits(*args(case), 32)
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        mod.indexer_topk(*args(case), 8)


def test_not_a_gpu_tensor():
    case = {k: v.to("meta") for k, v in make_case(k_fmt="fp8", Hi=4, lengths=(20,)).items()}
    with pytest.raises(ValueError, match="^q: expected CUDA tensors"):
        tms.indexer_logits(*args(case), 32)
    with pytest.raises(ValueError, match="^q: expected CUDA tensors"):
        tms.indexer_topk(*args(case), 8)


@pytest.mark.parametrize("fn", ["triton", "reference"])
def test_bad_scalars_and_out(fn):
    case = make_case(k_fmt="fp8", Hi=4, lengths=(20,))
    T = len(case["positions"])
    mod = tms if fn == "triton" else reference
    for bad in (-1, True, 3.0, None):
        with pytest.raises(ValueError, match="^max_len: expected"):
            mod.indexer_logits(*args(case), bad)
    for bad in (0, -3, False, 2.5):
        with pytest.raises(ValueError, match="^topk: expected"):
            mod.indexer_topk(*args(case), bad)
    for bad in (torch.zeros(T, 32, dtype=torch.float16, device=DEVICE), torch.zeros(T, 31, device=DEVICE)):
        with pytest.raises(ValueError, match="^out: expected"):
            mod.indexer_logits(*args(case), 32, out=bad)
    for bad in (torch.zeros(T, 8, device=DEVICE), torch.zeros(T + 1, 8, dtype=torch.int32, device=DEVICE)):
        with pytest.raises(ValueError, match="^out: expected"):
            mod.indexer_topk(*args(case), 8, out=bad)

"""The DSA indexer (logits kernel + top-k selection kernel) against the float64 reference, on the CPU through
Triton's interpreter (or a GPU when there is one).

Cases: vLLM's fp8 indexer layout (flat, its [nb, bs, 1, 132] view, a padded block stride) and fp16 caches; fp8 and
fp16 q; 1, 4 and 32 index heads; rows of several requests with different lengths (prefill rows with increasing
positions, decode rows), positions at block edges, top-k longer than a request (-1 padding), invalid request ids,
table entries and columns past the table (never dereferenced: -inf / -1), NaN/sentinel-filled outputs, the output
fed to ``topk_to_slots``, and bad arguments. Top-k results are compared as sets of selected logit values (robust to
ties); bf16 runs only on the GPU (the interpreter's bf16 dots are garbage). The split select's own cases (crafted
rows, its bound pass) are in tests/ops/topk/test_split_select.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import DEVICE, poisoned_allocations_probe_select
from topk_checks import assert_topk_matches

import triton_mla_sparse as tms
from triton_mla_sparse import reference
from triton_mla_sparse.formats import D_INDEX, FP8_E4M3_MAX, INDEXER_ROW_BYTES, quantize_indexer_cache
from triton_mla_sparse.testing import assert_close

D = D_INDEX
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def fp8_cache(values: torch.Tensor, *, block_pad: int = 0) -> torch.Tensor:
    """Real values float32 [nb, bs, 128] -> vLLM's fp8 indexer layout uint8 [nb, bs·132] on DEVICE
    (:func:`triton_mla_sparse.formats.quantize_indexer_cache`); ``block_pad`` spare NaN bytes after each block (a
    block stride larger than bs·132; a multiple of 4)."""
    packed = quantize_indexer_cache(values).to(DEVICE)
    if not block_pad:
        return packed
    assert block_pad % 4 == 0
    nb, width = packed.shape
    buf = torch.full((nb, width + block_pad), 0xFF, dtype=torch.uint8, device=DEVICE)
    buf[:, :width] = packed
    return buf[:, :width]


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
        k_cache = fp8_cache(values)
    elif k_fmt == "fp8_4d":
        k_cache = fp8_cache(values).view(nb, bs, 1, INDEXER_ROW_BYTES)
    elif k_fmt == "fp8_padded":
        k_cache = fp8_cache(values, block_pad=64)
    else:
        raise AssertionError(k_fmt)
    q = torch.randn(T, Hi, D, generator=g)
    if q_dtype == torch.float8_e4m3fn:
        q = (q * 40).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)  # raw e4m3; its scale lives in the weights
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
    """:func:`triton_mla_sparse.testing.assert_close`: -inf (and NaN, +inf) at exactly the reference's positions,
    then over the finite ones a relative L2 error <= tol and every |ours - ref| <= 1e-4 · max|ref| + 1e-6."""
    ref = ref.to(torch.float64).cpu()
    fin = torch.isfinite(ref)
    scale = ref[fin].abs().max().item() if fin.any() else 0.0
    assert_close(ours, ref, tol=tol, atol=1e-4 * scale + 1e-6, what=what)


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
    from triton_mla_sparse.ops.indexer.api import check_indexer_inputs
    from triton_mla_sparse.ops.indexer.configs import choose_indexer_config
    from triton_mla_sparse.ops.indexer.kernels import launch_indexer_logits
    from triton_mla_sparse.ops.topk.split_select import WS_WIDTH

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


def test_topk_select_gets_a_zeroed_workspace():
    """``indexer_topk`` allocates the split select's workspace uninitialised and relies on its logits launch to zero
    it: with every fresh int32/float32 allocation poisoned, the select must still receive an all-zero workspace and
    the result must match the reference."""
    case = _decode_rows(make_case(k_fmt="fp8", q_dtype=torch.float8_e4m3fn, Hi=4, lengths=(37, 16, 64)))
    max_len = case["block_table"].shape[1] * 16
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    with poisoned_allocations_probe_select() as seen:
        sel = tms.indexer_topk(*args(case), 20, select="split")
    assert seen == [True]
    assert_topk_matches(sel, ref, 20, what="poisoned allocations")


def _decode_rows(case):
    """The case's last row of each request (decode-shaped: one row per request)."""
    req = case["req_id_per_token"].cpu()
    last = torch.tensor([int((req == r).nonzero().max()) for r in range(int(req.max()) + 1)])
    return {k: (v[last.to(v.device)] if k in ("q", "weights", "req_id_per_token", "positions") else v)
            for k, v in case.items()}


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


@pytest.mark.parametrize("q_name", QS)
def test_deterministic_rows_equal_rows_alone(q_name):
    """``deterministic=True``: a prefill-shaped call's rows equal (exactly) each row computed alone, also with a
    wider ``max_len``, and match the reference."""
    case = make_case(k_fmt="fp8", q_dtype=QS[q_name], Hi=32, lengths=(300, 70, 130), seed=11)
    T, bs = len(case["positions"]), 16
    max_len = case["block_table"].shape[1] * bs
    assert T > case["block_table"].shape[0]  # rows share K tiles without the flag
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    both = tms.indexer_topk(*args(case), 64, max_len=max_len, deterministic=True)
    assert_topk_matches(both, ref, 64, what="deterministic")
    for t in range(T):
        one = {k: (v[t:t + 1] if k in ("q", "weights", "req_id_per_token", "positions") else v)
               for k, v in case.items()}
        alone = tms.indexer_topk(*args(one), 64, max_len=max_len, deterministic=True)
        assert torch.equal(alone[0], both[t]), t
        wider = tms.indexer_topk(*args(one), 64, max_len=max_len + 2 * bs, deterministic=True)
        assert set(wider[0].tolist()) == set(both[t].tolist()), t


def test_deterministic_logits_equal_rows_alone():
    """``indexer_logits(deterministic=True)``: a prefill-shaped call's rows equal (bit for bit) each row computed
    alone, and match the reference; the flag is checked."""
    case = make_case(k_fmt="fp8", q_dtype=QS["fp16"], Hi=32, lengths=(300, 70, 130), seed=12)
    T, bs = len(case["positions"]), 16
    max_len = case["block_table"].shape[1] * bs
    assert T > case["block_table"].shape[0]  # rows share K tiles without the flag
    ref = reference.indexer_logits(*args(case), max_len, compute_dtype=torch.float64)
    both = torch.full((T, max_len), math.nan, dtype=torch.float32, device=DEVICE)
    tms.indexer_logits(*args(case), max_len, out=both, deterministic=True)
    assert_logits_match(both, ref, what="deterministic")
    for t in range(0, T, 7):
        one = {k: (v[t:t + 1] if k in ("q", "weights", "req_id_per_token", "positions") else v)
               for k, v in case.items()}
        alone = tms.indexer_logits(*args(one), max_len, deterministic=True)
        assert torch.equal(alone[0], both[t]), t
    with pytest.raises(ValueError, match="^deterministic: expected a bool"):
        tms.indexer_logits(*args(case), max_len, deterministic="yes")


def test_deterministic_argument_checks():
    case = make_case(k_fmt="fp8", Hi=4, lengths=(20,))
    with pytest.raises(ValueError, match="^select: expected None or 'torch' with deterministic=True"):
        tms.indexer_topk(*args(case), 8, select="split", deterministic=True)
    with pytest.raises(ValueError, match="^deterministic: expected a bool"):
        tms.indexer_topk(*args(case), 8, deterministic=1)
    assert tms.indexer_topk(*args(case), 8, select="torch", deterministic=True).shape == (len(case["positions"]), 8)

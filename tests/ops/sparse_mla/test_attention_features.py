"""Semantics of the Triton path beyond the shape matrix: invalid indices, topk_length, duplicates, q forms, NoPE,
attn_sink, out=, return_lse, k_scale forms, fp8_ds_mla scale formats, cache layouts, decode splits, empty batches
and many heads. Small cases are checked against an independent Python-loop oracle as well as the reference."""

import math

import pytest
import torch

import triton_mla_sparse as tms
from helpers import (DEVICE, FORMATS, INT32_MAX, INT32_MIN, LAYOUTS, LSE_ATOL, REL_TOL, Problem,
                     assert_matches, encode, kv_values, make_problem, manual_attention, nan_out, place, real_rows,
                     rel_err, run_kernel, run_reference, stored_rows)
from triton_mla_sparse import reference
from triton_mla_sparse.ops.sparse_mla.api import sparse_mla_attention_with_config

KERNELS = ("decode", "prefill")


def i32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE)


def check_both(prob: Problem, kernel: str, *, what="", **call):
    """Kernel vs manual oracle and vs reference; reference vs manual oracle. Returns the kernel's (out, lse)."""
    out, lse = run_kernel(prob, kernel, **call)
    ref_out, ref_lse = run_reference(prob, **{k: v for k, v in call.items() if k != "out"})
    man_out, man_lse = manual_attention(prob, topk_length=call.get("topk_length"), attn_sink=call.get("attn_sink"))
    assert_matches(out.cpu(), lse.cpu(), man_out, man_lse, **prob.tol, what=f"{what} kernel vs manual")
    assert_matches(out.cpu(), lse.cpu(), ref_out.cpu(), ref_lse.cpu(), **prob.tol, what=f"{what} kernel vs ref")
    assert rel_err(ref_out.cpu(), man_out) < 1e-12, f"{what}: reference disagrees with the manual oracle"
    return out, lse


# ---------------------------------------------------------------------------------------------------------------
# invalid indices, topk_length, duplicates


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_invalid_index_values(fmt, kernel):
    """-1, other negatives, num_slots, beyond, INT32_MIN and INT32_MAX are skipped; valid ones still count."""
    prob = make_problem(fmt, 5, 3, 24, 16, num_blocks=2, invalid_frac=0.0)
    S = prob.num_slots
    assert S == 32
    idx = prob.indices.clone()
    bad = [-1, -2, INT32_MIN, INT32_MAX, S, S + 1, -S, INT32_MIN + 1, INT32_MAX - 1]
    idx[0, :len(bad)] = i32(bad)  # invalid first, valid after
    idx[1, -len(bad):] = i32(bad)  # valid first, invalid after
    idx[2, ::2] = i32([bad[i % len(bad)] for i in range(12)])  # interleaved
    idx[3, :] = INT32_MAX  # nothing valid
    idx[3, 17] = S - 1  # ... but one entry: the last slot
    idx[4, :] = i32([bad[i % len(bad)] for i in range(24)])  # nothing valid at all
    prob.indices = idx
    out, lse = check_both(prob, kernel, what=f"{fmt} {kernel}")
    assert torch.isneginf(lse[4]).all() and (out[4] == 0).all()
    assert torch.isfinite(lse[:4]).all()


@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_row_without_valid_index(kernel, with_sink):
    """A row whose entries are all invalid gives out exactly 0 (written over NaN) and lse -inf, next to normal rows."""
    prob = make_problem("fp16", 4, 16, 40, 16, num_blocks=3, invalid_frac=0.0)
    prob.indices[1] = -1
    prob.indices[2] = i32([INT32_MIN, INT32_MAX, prob.num_slots, -5] * 10)
    call = {"attn_sink": torch.randn(16, device=DEVICE)} if with_sink else {}
    buf = nan_out(4, 16)
    out, lse = run_kernel(prob, kernel, out=buf, **call)
    assert out is buf
    assert (out[1:3] == 0).all()
    assert torch.isneginf(lse[1:3]).all()
    assert torch.isfinite(lse[[0, 3]]).all() and torch.isfinite(out).all()
    ref_out, ref_lse = run_reference(prob, **call)
    assert_matches(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", ["fp16", "fp8_ds_mla"])
def test_topk_length(fmt, kernel):
    """topk_length is clamped to [0, topk]: 0 and negatives give an empty row, > topk the whole row."""
    topk = 37
    lengths = [0, topk, topk + 5, -3, 2, INT32_MAX, INT32_MIN, 1, 20]
    prob = make_problem(fmt, len(lengths), 3, topk, 16, num_blocks=4, invalid_frac=0.1)
    prob.indices[1, 5] = -1  # an invalid entry inside a used prefix
    tl = i32(lengths)
    out, lse = check_both(prob, kernel, what=f"{fmt} {kernel}", topk_length=tl, out=nan_out(len(lengths), 3))
    for t in (0, 3, 6):
        assert torch.isneginf(lse[t]).all() and (out[t] == 0).all()
    # Same as truncating the lists by hand.
    trunc = prob.indices.clone()
    for t, n in enumerate(lengths):
        trunc[t, min(max(n, 0), topk):] = -1
    out2, lse2 = run_kernel(Problem(**{**prob.__dict__, "indices": trunc}), kernel)
    assert_matches(out, lse, out2.double(), lse2.double(), tol=REL_TOL)


@pytest.mark.parametrize("kernel", KERNELS)
def test_topk_length_zero_everywhere(kernel):
    prob = make_problem("bf16", 3, 3, 20, 16, invalid_frac=0.0)
    out, lse = run_kernel(prob, kernel, topk_length=torch.zeros(3, dtype=torch.int32, device=DEVICE),
                          out=nan_out(3, 3))
    assert (out == 0).all() and torch.isneginf(lse).all()


@pytest.mark.parametrize("kernel", KERNELS)
def test_duplicates_count_per_occurrence(kernel):
    """A slot listed k times weighs k times: checked against the closed form for two distinct slots."""
    prob = make_problem("fp16", 2, 2, 5, 16, num_blocks=1, invalid_frac=0.0)
    a, b = 3, 11
    prob.indices = i32([[a, a, a, b, -1], [b, a, -1, b, b]])
    out, lse = check_both(prob, kernel, what=kernel)
    K = real_rows(prob)
    q = prob.q.double().cpu()
    dedup_gap = 0.0
    for t, (na, nb) in enumerate([(3, 1), (1, 3)]):
        sa = (q[t] @ K[a]) * prob.softmax_scale  # [H]
        sb = (q[t] @ K[b]) * prob.softmax_scale
        z = na * sa.exp() + nb * sb.exp()
        want_out = (na * sa.exp()[:, None] * K[a, :512] + nb * sb.exp()[:, None] * K[b, :512]) / z[:, None]
        assert (lse[t].double().cpu() - z.log()).abs().max() < LSE_ATOL
        assert rel_err(out[t].cpu(), want_out) < REL_TOL
        dedup_gap = max(dedup_gap, (z.log() - torch.logaddexp(sa, sb)).abs().max().item())
    assert dedup_gap > 0.3  # the case does tell counting from de-duplicating (one row has the heavier slot x3)


@pytest.mark.parametrize("kernel", KERNELS)
def test_topk_larger_than_cache(kernel):
    """topk 48 over a cache of 16 slots: every slot appears several times."""
    prob = make_problem("fp8_e4m3", 3, 3, 48, 16, num_blocks=1, invalid_frac=0.2)
    check_both(prob, kernel, what=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_cache(kernel):
    """num_blocks = 0: every index is out of range."""
    prob = make_problem("fp16", 2, 3, 9, 16, num_blocks=2)
    prob.kv_cache = prob.kv_cache[:0]
    prob.indices = i32([[0, 1, 2, -1, 5, 6, 7, 8, 9]] * 2)
    out, lse = run_kernel(prob, kernel, out=nan_out(2, 3))
    assert (out == 0).all() and torch.isneginf(lse).all()


def _poison_unreferenced(prob: Problem, topk_length=None):
    """Fill every cache slot that no valid (and, with topk_length, used) entry references with NaN bytes.
    Returns the set of referenced slots."""
    S = prob.num_slots
    used = set()
    for t, row in enumerate(prob.indices.cpu().tolist()):
        n = len(row) if topk_length is None else min(max(int(topk_length[t]), 0), len(row))
        used.update(i for i in row[:n] if 0 <= i < S)
    kv = prob.kv_cache[:, :, 0] if prob.kv_cache.dim() == 4 else prob.kv_cache
    flat = kv.reshape(-1, kv.shape[-1])
    assert flat.data_ptr() == kv.data_ptr()  # a view: writes reach the cache
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    for s in range(S):
        if s not in used:
            raw[s] = 0xFF
    return used


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_never_reads_unreferenced_slots(fmt, kernel):
    """Slots reached only through invalid ids (including slot 0, where a clamped id would land) or past topk_length
    hold NaN: the result must not see them."""
    prob = make_problem(fmt, 4, 3, 30, 16, num_blocks=4, invalid_frac=0.3)
    prob.indices[prob.indices == 0] = 1
    prob.indices[:, 0] = i32([-1, INT32_MIN, INT32_MAX, prob.num_slots])
    tl = i32([30, 12, 0, 25])
    used = _poison_unreferenced(prob, tl)
    assert 0 not in used and len(used) < prob.num_slots
    out, lse = run_kernel(prob, kernel, topk_length=tl, out=nan_out(4, 3))
    man_out, man_lse = manual_attention(prob, topk_length=tl)
    assert_matches(out.cpu(), lse.cpu(), man_out, man_lse, **prob.tol, what=f"{fmt} {kernel}")


def test_reference_never_reads_unreferenced_slots():
    """The reference's contract: an invalid id "is skipped and its row is never read". Garbage (NaN) in slot 0 of
    a cache must therefore not reach the result of rows that hold an invalid id."""
    prob = make_problem("fp16", 2, 3, 8, 16, num_blocks=2, invalid_frac=0.0)
    prob.indices = i32([[-1, 3, 5, 7, 9, 11, 13, 15], [2, 4, 6, INT32_MAX, 8, 10, 12, 14]])
    _poison_unreferenced(prob)  # slot 0 (and every other unused slot) is NaN
    out, lse = reference.sparse_mla_attention(*prob.args(), **prob.kwargs(), return_lse=True,
                                              compute_dtype=torch.float64, out_dtype=torch.float64)
    man_out, man_lse = manual_attention(prob)
    assert not bool(torch.isnan(out).any()), "reference: NaN from slot 0, which only invalid indices point at"
    assert_matches(out.float(), lse.float(), man_out, man_lse)


# ---------------------------------------------------------------------------------------------------------------
# decode splits


@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("fmt", ["fp16", "fp8_ds_mla"])
def test_decode_splits_with_empty_splits(fmt, with_sink):
    """Four splits of 16 entries; several splits of a row hold only invalid ids, or lie past topk_length."""
    prob = make_problem(fmt, 5, 3, 64, 16, num_blocks=8, invalid_frac=0.0)
    idx = prob.indices
    idx[0, 16:32] = -1  # split 1 empty
    idx[0, 48:64] = INT32_MAX  # split 3 empty
    idx[1, :48] = i32([-1, INT32_MIN, prob.num_slots] * 16)  # only split 3 valid
    idx[2, 1:] = -1  # only the first entry of split 0
    idx[3, :] = -1  # nothing
    tl = i32([64, 64, 64, 64, 20])  # row 4: splits 2 and 3 are past the end
    call = {"topk_length": tl}
    if with_sink:
        call["attn_sink"] = torch.randn(3, device=DEVICE)
    out, lse, cfg = run_kernel(prob, "decode", block_n=16, num_splits=4, return_config=True, out=nan_out(5, 3),
                               **call)
    assert (cfg.kernel, cfg.num_splits, cfg.split_len) == ("decode", 4, 16)
    ref_out, ref_lse = run_reference(prob, **call)
    assert_matches(out, lse, ref_out, ref_lse, **prob.tol)
    man_out, man_lse = manual_attention(prob, **call)
    assert_matches(out, lse, man_out, man_lse, **prob.tol)
    assert (out[3] == 0).all() and torch.isneginf(lse[3]).all()


@pytest.mark.parametrize("num_splits", [1, 2, 3, 5, 9])
def test_decode_split_counts_agree(num_splits):
    """Any split count gives the same result as the prefill kernel (within float16 output rounding)."""
    prob = make_problem("fp8_e4m3", 2, 3, 130, 16)
    out_p, lse_p = run_kernel(prob, "prefill")
    out_d, lse_d, cfg = run_kernel(prob, "decode", num_splits=num_splits, return_config=True)
    assert cfg.num_splits == min(num_splits, 9)
    ref_out, ref_lse = run_reference(prob)
    assert_matches(out_d, lse_d, ref_out, ref_lse)
    assert rel_err(out_d, out_p) < REL_TOL
    assert (lse_d - lse_p)[torch.isfinite(lse_p)].abs().max() < LSE_ATOL


@pytest.mark.parametrize("block_n", [16, 32, 64])
@pytest.mark.parametrize("kernel", KERNELS)
def test_block_n(kernel, block_n):
    prob = make_problem("fp16", 2, 3, 100, 16)
    out, lse = run_kernel(prob, kernel, block_n=block_n)
    assert_matches(out, lse, *run_reference(prob))


# ---------------------------------------------------------------------------------------------------------------
# q forms and NoPE


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_tuple_q_non_contiguous(fmt, kernel):
    """(q_nope, q_pe) with q_nope a slice of a wider buffer and q_pe a transposed view equals the fused q."""
    T, H = 3, 5
    prob = make_problem(fmt, T, H, 40, 16)
    q = prob.q
    buf = torch.full((T, H, 640), float("nan"), dtype=torch.float16, device=DEVICE)
    buf[..., 8:520] = q[..., :512]
    q_nope = buf[..., 8:520]
    q_pe = q[..., 512:].transpose(0, 1).contiguous().transpose(0, 1)
    assert not q_nope.is_contiguous() and not q_pe.is_contiguous()
    out_f, lse_f = run_kernel(prob, kernel)
    out_t, lse_t = run_kernel(Problem(**{**prob.__dict__, "q": (q_nope, q_pe)}), kernel)
    assert torch.equal(out_t, out_f) and torch.equal(lse_t, lse_f)
    # a fused q that is itself a non-contiguous view ([H, T, 576] transposed, and a slice of [T, H, 600])
    for qv in (q.transpose(0, 1).contiguous().transpose(0, 1),
               torch.cat([q, torch.full((T, H, 24), float("nan"), dtype=q.dtype, device=DEVICE)], -1)[..., :576]):
        out_v, lse_v = run_kernel(Problem(**{**prob.__dict__, "q": qv}), kernel)
        assert torch.equal(out_v, out_f) and torch.equal(lse_v, lse_f)
    assert_matches(out_t, lse_t, *run_reference(prob), **prob.tol)


@pytest.mark.parametrize("q_form", ["tensor512", "tuple_none", "tuple_empty"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_nope(fmt, kernel, q_form):
    """D_qk 512: caches of 512-wide rows; fp8_ds_mla keeps its 656-byte rows and the rope bytes (NaN here) are
    never read."""
    T, H = 3, 3
    prob = make_problem(fmt, T, H, 33, 16, d_qk=512)
    if fmt == "fp8_ds_mla":
        assert prob.kv_cache.shape[-1] == 656
        assert torch.isnan(stored_rows(prob.kv_cache)[:, 528:].contiguous().view(torch.bfloat16)).all()
    else:
        assert prob.kv_cache.shape[-1] == 512
    q = prob.q
    if q_form == "tuple_none":
        prob.q = (q, None)
    elif q_form == "tuple_empty":
        prob.q = (q, q.new_empty(T, H, 0))
    buf = nan_out(T, H)
    out, lse = check_both(prob, kernel, what=f"{fmt} {kernel} {q_form}", out=buf)
    assert out is buf


# ---------------------------------------------------------------------------------------------------------------
# attn_sink, out=, return_lse


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_attn_sink(fmt, kernel):
    """lse is returned without the sink; out is scaled by sigmoid(lse - sink); an empty row stays 0."""
    T, H = 4, 6
    prob = make_problem(fmt, T, H, 50, 16)
    prob.indices[2] = -1
    sink = torch.tensor([0.0, 30.0, -30.0, 1.5, -2.0, 4.0], device=DEVICE)
    out0, lse0 = run_kernel(prob, kernel)
    out1, lse1 = run_kernel(prob, kernel, attn_sink=sink, out=nan_out(T, H))
    assert torch.equal(lse1, lse0)
    assert (out1[2] == 0).all()
    factor = torch.sigmoid(lse0.double() - sink.double())
    factor[2] = 0
    want = out0.double() * factor[..., None]
    assert rel_err(out1, want) < REL_TOL
    for h in range(H):  # per head, so the heads scaled to ~0 are checked too
        assert rel_err(out1[:, h], want[:, h]) < 2 * REL_TOL or want[:, h].abs().max() < 1e-6
    assert out1[:, 1].abs().max() < 1e-6  # sink 30 >> lse
    ref_out, ref_lse = run_reference(prob, attn_sink=sink)
    assert_matches(out1, lse1, ref_out, ref_lse, **prob.tol)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("view", ["slice", "transposed"])
def test_out_view(kernel, view):
    """out= may be any view with a unit last stride: it is returned as is, fully written, nothing around it."""
    T, H = 3, 5
    prob = make_problem("fp8_ds_mla", T, H, 40, 16)
    if view == "slice":
        buf = torch.full((T, H, 600), float("nan"), dtype=torch.float16, device=DEVICE)
        out_v = buf[..., 40:552]
        outside = torch.cat([buf[..., :40], buf[..., 552:]], -1)
    else:
        buf = torch.full((H + 1, T, 512), float("nan"), dtype=torch.float16, device=DEVICE)
        out_v = buf[1:].transpose(0, 1)
        outside = buf[0]
    res, lse = run_kernel(prob, kernel, out=out_v)
    assert res is out_v
    assert torch.isnan(outside).all(), "the kernel wrote outside out="
    if view == "slice":
        assert torch.isnan(buf[..., :40]).all() and torch.isnan(buf[..., 552:]).all()
    else:
        assert torch.isnan(buf[0]).all()
    assert_matches(res, lse, *run_reference(prob), **prob.tol)


@pytest.mark.parametrize("kernel", ["auto", *KERNELS])
def test_return_forms(kernel):
    prob = make_problem("fp16", 2, 3, 20, 16)
    res = sparse_mla_attention_with_config(*prob.args(), **prob.kwargs(), kernel=kernel)
    assert isinstance(res, torch.Tensor) and res.shape == (2, 3, 512) and res.dtype == torch.float16
    res2 = sparse_mla_attention_with_config(*prob.args(), **prob.kwargs(), kernel=kernel, return_lse=True)
    assert isinstance(res2, tuple) and len(res2) == 2
    out, lse = res2
    assert lse.shape == (2, 3) and lse.dtype == torch.float32
    assert torch.equal(out, res)
    res3 = sparse_mla_attention_with_config(*prob.args(), **prob.kwargs(), kernel=kernel, return_config=True)
    assert len(res3) == 2 and torch.equal(res3[0], res)
    assert kernel == "auto" or res3[1].kernel == kernel
    ref = reference.sparse_mla_attention(*prob.args(), **prob.kwargs())
    assert isinstance(ref, torch.Tensor) and ref.dtype == torch.float16
    assert rel_err(res, ref) < REL_TOL


def test_public_entry_point():
    """triton_mla_sparse.sparse_mla_attention (auto kernel) for a decode-like and a prefill-like batch."""
    for T, H, topk in ((1, 16, 64), (20, 16, 32)):
        prob = make_problem("fp8_ds_mla", T, H, topk, 64)
        out, lse = tms.sparse_mla_attention(*prob.args(), **prob.kwargs(), return_lse=True)
        assert_matches(out, lse, *run_reference(prob), **prob.tol)
        out2 = tms.sparse_mla_attention(*prob.args(), **prob.kwargs())
        assert torch.equal(out2, out)


@pytest.mark.parametrize("T", [1, 4, 16])
def test_auto_kernel(T):
    prob = make_problem("fp16", T, 16, 64, 16)
    out, lse, cfg = run_kernel(prob, "auto", return_config=True)
    assert cfg.kernel in KERNELS
    assert_matches(out, lse, *run_reference(prob))


# ---------------------------------------------------------------------------------------------------------------
# cache formats, scales, layouts, indices forms


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scale_format", ["pow2", "fp32"])
def test_fp8_ds_mla_scale_formats(scale_format, kernel):
    """Tiles of very different magnitudes per row, so every tile has its own scale."""
    T, H, nb, bs = 3, 4, 3, 16
    vals = kv_values(nb * bs)
    gains = torch.tensor([1e-2, 1.0, 30.0, 0.2]).repeat_interleave(128)
    vals[:, :512] *= gains[torch.randperm(512) // 128 * 128 + torch.arange(512) % 128]  # shuffled per tile
    stored, _ = encode(vals.reshape(nb, bs, 576), "fp8_ds_mla", scale_format=scale_format)
    scales = stored.reshape(-1, 656)[:, 512:528].contiguous().view(torch.float32)
    assert scales.unique().numel() > 4
    if scale_format == "pow2":
        assert (torch.frexp(scales).mantissa == 0.5).all()
    q = torch.randn(T, H, 576).half().to(DEVICE) * 0.05
    prob = Problem(q=q, kv_cache=place(stored, "3d"), indices=torch.randint(-1, nb * bs, (T, 30), dtype=torch.int32,
                                                                             device=DEVICE),
                   softmax_scale=192 ** -0.5, kv_format="fp8_ds_mla", num_slots=nb * bs, scale_format=scale_format)
    check_both(prob, kernel, what=f"{scale_format} {kernel}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_fp8_ds_mla_fp32_scales_as_float16_cache(kernel):
    """With fp32 scales the kernel computes with e4m3 · scale rounded to float16 (q's dtype): it then matches the
    reference on a float16 cache of those rounded values to the tolerance of the exact formats."""
    prob = make_problem("fp8_ds_mla", 4, 16, 64, 16, scale_format="fp32")
    rounded = real_rows(prob).half().reshape(prob.kv_cache.shape[0], prob.kv_cache.shape[1], 576)
    as_fp16 = Problem(**{**prob.__dict__, "kv_cache": place(rounded, "3d"), "kv_format": "fp16"})
    out, lse = run_kernel(prob, kernel)
    assert_matches(out, lse, *run_reference(as_fp16), tol=REL_TOL, lse_atol=LSE_ATOL)


def _ds_mla_problem(magnitude: float, scale_format: str) -> Problem:
    """fp8_ds_mla cache whose latents have the given magnitude; softmax_scale keeps the scores' spread fixed."""
    prob = make_problem("fp8_ds_mla", 3, 16, 64, 16, scale_format=scale_format)
    vals = kv_values(prob.num_slots).reshape(-1, 16, 576) * magnitude
    prob.kv_cache = place(encode(vals, "fp8_ds_mla", scale_format=scale_format)[0], "3d")
    prob.softmax_scale = 192 ** -0.5 / magnitude
    return prob


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("magnitude", [1e-2, 1e-3])
def test_fp8_ds_mla_small_latents(magnitude, kernel):
    """Latents of magnitude 1e-2..1e-3 (tile scales ~1e-5..1e-6) with float16 q: the kernel dequantises e4m3 ·
    scale before its dots, so it is as accurate as at magnitude 1."""
    prob = _ds_mla_problem(magnitude, "pow2")
    out, lse = run_kernel(prob, kernel)
    assert_matches(out, lse, *run_reference(prob), **prob.tol)


@pytest.mark.parametrize("kernel", KERNELS)
def test_k_scale_forms(kernel):
    """k_scale as a float, a [1] tensor, a 0-dim tensor and a one-element view at an offset: identical results."""
    prob = make_problem("fp8_e4m3", 3, 3, 40, 16)
    ks = prob.k_scale
    assert isinstance(ks, float) and math.frexp(ks)[0] != 0.5
    out0, lse0 = run_kernel(prob, kernel)
    big = torch.tensor([7.0, ks, 3.0], dtype=torch.float32, device=DEVICE)
    for form in (torch.tensor([ks], dtype=torch.float32, device=DEVICE),
                 torch.tensor(ks, dtype=torch.float32, device=DEVICE), big[1:2]):
        out1, lse1 = run_kernel(prob, kernel, k_scale=form)
        assert rel_err(out1, out0) < 1e-3 and (lse1 - lse0).abs().max() < 1e-5
        assert_matches(out1, lse1, *run_reference(prob, k_scale=form))
    assert_matches(out0, lse0, *run_reference(prob))
    # the scale really is applied: doubling it changes the scores
    out2, lse2 = run_kernel(prob, kernel, k_scale=2 * ks)
    assert_matches(out2, lse2, *run_reference(prob, k_scale=2 * ks))
    assert rel_err(out2, 2 * out0.double()) > 1e-2


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_cache_layouts_identical(fmt, kernel):
    """3D, 4D, flat 2D and padded layouts (block stride > block_size · row, NaN padding) give bitwise equal results."""
    nb, bs, T, H = 3, 16, 3, 3
    stored, k_scale = encode(kv_values(nb * bs).reshape(nb, bs, 576), fmt)
    q = torch.randn(T, H, 576).half().to(DEVICE)
    idx = torch.randint(-3, nb * bs + 3, (T, 35), dtype=torch.int32, device=DEVICE)
    results = {}
    for layout in LAYOUTS:
        kv = place(stored, layout)
        if layout == "padded":
            assert kv.stride(0) > bs * kv.stride(1) and kv.stride(1) > kv.shape[-1]
        prob = Problem(q=q, kv_cache=kv, indices=idx, softmax_scale=0.1, kv_format=fmt, k_scale=k_scale,
                       num_slots=nb * bs)
        results[layout] = run_kernel(prob, kernel)
        if layout == "3d":
            assert_matches(*results[layout], *run_reference(prob), **prob.tol)
    for layout in LAYOUTS[1:]:
        assert torch.equal(results[layout][0], results["3d"][0]), layout
        assert torch.equal(results[layout][1], results["3d"][1]), layout


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("block_size", [1, 2, 5, 64])
def test_odd_block_sizes_with_padding(block_size, kernel):
    """Block sizes that are not powers of two or 16, with a padded block stride."""
    prob = make_problem("bf16", 3, 3, 30, block_size, layout="padded")
    assert_matches(*run_kernel(prob, kernel), *run_reference(prob))


@pytest.mark.parametrize("kernel", KERNELS)
def test_indices_forms(kernel):
    """indices [T, 1, topk] (FlashMLA's shape) and non-contiguous views give the contiguous result."""
    prob = make_problem("fp16", 3, 3, 40, 16)
    out0, lse0 = run_kernel(prob, kernel)
    idx = prob.indices
    wide = torch.full((3, 50), 0, dtype=torch.int32, device=DEVICE)
    wide[:, 5:45] = idx
    for form in (idx[:, None, :], wide[:, 5:45], idx.t().contiguous().t()):
        out1, lse1 = run_kernel(Problem(**{**prob.__dict__, "indices": form}), kernel)
        assert torch.equal(out1, out0) and torch.equal(lse1, lse0)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["topk_length", "attn_sink"])
def test_strided_topk_length_and_attn_sink(name, kernel):
    """topk_length and attn_sink given as strided views (a column of a [T, 2] / [H, 2] tensor): validation accepts
    them, so the result must honour their strides (or validation must reject them with a ValueError naming them)."""
    T, H = 4, 3
    prob = make_problem("fp16", T, H, 24, 16, invalid_frac=0.0)
    if name == "topk_length":
        arg = i32([[3, 0], [24, 0], [9, 0], [1, 0]])[:, 0]
    else:
        arg = torch.tensor([[0.5, 100.0], [-1.0, 100.0], [2.0, 100.0]], device=DEVICE)[:, 0]
    assert arg.stride() == (2,)
    try:
        out, lse = run_kernel(prob, kernel, **{name: arg})
    except ValueError as e:
        assert name in str(e)
        return
    ref_out, ref_lse = run_reference(prob, **{name: arg})
    assert_matches(out, lse, ref_out, ref_lse, what=f"strided {name}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_extreme_scores(kernel):
    """Large softmax_scale (nearly one-hot weights, scores in the hundreds) and a tiny one (uniform weights)."""
    for scale in (10.0, 1e-6):
        prob = make_problem("fp16", 2, 3, 70, 16, softmax_scale=scale)
        assert_matches(*run_kernel(prob, kernel), *run_reference(prob), lse_atol=LSE_ATOL * max(1.0, scale))


# ---------------------------------------------------------------------------------------------------------------
# empty batch, many heads


@pytest.mark.parametrize("kernel", ["auto", *KERNELS])
@pytest.mark.parametrize("topk", [8, 40])
def test_empty_batch(kernel, topk):
    """T = 0 (also with a top-k long enough for "auto" to pick the decode kernel) returns empty outputs."""
    prob = make_problem("fp16", 0, 3, topk, 16)
    out, lse = run_kernel(prob, kernel)
    assert out.shape == (0, 3, 512) and out.dtype == torch.float16
    assert lse.shape == (0, 3) and lse.dtype == torch.float32
    buf = nan_out(0, 3)
    out2, _ = run_kernel(prob, kernel, out=buf)
    assert out2 is buf
    ref_out, ref_lse = run_reference(prob)
    assert ref_out.shape == (0, 3, 512) and ref_lse.shape == (0, 3)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("H,fmt,block_h", [(70, "fp16", None), (70, "fp8_ds_mla", 16), (128, "fp8_e4m3", None)])
def test_many_heads(H, fmt, block_h, kernel):
    """Several head blocks, the last one partly masked (70 heads)."""
    prob = make_problem(fmt, 2, H, 20, 16)
    over = {"block_h": block_h} if block_h else {}
    out, lse, cfg = run_kernel(prob, kernel, out=nan_out(2, H), return_config=True, **over)
    assert -(-H // cfg.block_h) >= 2
    assert_matches(out, lse, *run_reference(prob), **prob.tol)


@pytest.mark.parametrize("fmt", FORMATS)
def test_prefill_kernel_rows_do_not_depend_on_the_batch(fmt):
    """The one-program-per-row kernel (vLLM's batch-invariant mode uses it for every batch): each row's out and lse
    equal, bitwise, the row computed alone."""
    prob = make_problem(fmt, 6, 16, 96, 16)
    out, lse = run_kernel(prob, "prefill")
    ref_out, ref_lse = run_reference(prob)
    assert_matches(out, lse, ref_out, ref_lse, **prob.tol, what=fmt)
    q, idx = prob.q, prob.indices
    for t in range(6):
        prob.q, prob.indices = q[t:t + 1], idx[t:t + 1]
        one, one_lse = run_kernel(prob, "prefill")
        assert torch.equal(one, out[t:t + 1]) and torch.equal(one_lse, lse[t:t + 1]), (fmt, t)
    prob.q, prob.indices = q, idx

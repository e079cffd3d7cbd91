"""The extra cache (DeepSeek-V4's second list: FlashMLA's extra_k_cache / extra_indices_in_kvcache /
extra_topk_length): one softmax over a row's valid main and extra entries, each read from its own cache. The kernel
against the float64 reference, and the reference against itself on one concatenated cache (an independent oracle:
both lists' rows in one slot space)."""

import math

import pytest
import torch

from helpers import DEVICE, FORMATS, assert_matches, encode, make_indices, make_problem, nan_out, place, run_kernel, \
    run_reference
from triton_mla_sparse import reference
from triton_mla_sparse.formats import infer_kv_format
from triton_mla_sparse.testing import kv_values

KERNELS = ("decode", "prefill")


def i32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE)


def add_extra(prob, fmt, topk2, block_size2, *, num_blocks2=3, lengths=None, layout="3d", d_qk=576):
    """A second cache of ``prob``'s format (fp8_e4m3: its k_scale) with its own block size, and its slot ids."""
    values = kv_values(num_blocks2 * block_size2, d_qk).reshape(num_blocks2, block_size2, d_qk) * 1.7
    stored, _ = encode(values, fmt, **({"k_scale": prob.k_scale} if fmt == "fp8_e4m3" else {}))
    kv2 = place(stored, layout)
    idx2 = make_indices(prob.T, topk2, num_blocks2 * block_size2, 0.2)
    prob.extra = dict(extra_kv_cache=kv2, extra_indices=idx2,
                      **({"extra_topk_length": lengths} if lengths is not None else {}))
    return prob


def concatenated(prob, topk_length=None):
    """The same problem on one cache: the extra cache's rows after the main cache's, the extra slot ids shifted past
    the main slots, entries outside each list's length made invalid (-1)."""
    fmt = prob.kv_format_name
    kv1 = prob.kv_cache.reshape(-1, prob.kv_cache.shape[-1])
    kv2 = prob.extra["extra_kv_cache"].reshape(-1, kv1.shape[-1])
    n1 = kv1.shape[0]

    def clip(idx, lengths, n_slots):
        idx = torch.where((idx >= 0) & (idx < n_slots), idx, -1)
        if lengths is not None:
            pos = torch.arange(idx.shape[1], device=idx.device)[None, :]
            idx = torch.where(pos < lengths.clamp(0, idx.shape[1])[:, None], idx, -1)
        return idx

    idx1 = clip(prob.indices, topk_length, n1)
    idx2 = clip(prob.extra["extra_indices"], prob.extra.get("extra_topk_length"), kv2.shape[0])
    idx2 = torch.where(idx2 >= 0, idx2 + n1, -1)
    kv = torch.cat([kv1, kv2]).contiguous()
    return kv, torch.cat([idx1, idx2], dim=1).to(torch.int32), fmt


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_extra_cache_against_the_reference_and_one_concatenated_cache(fmt, kernel):
    torch.manual_seed(11)
    prob = make_problem(fmt, 3, 16, 37, 16)
    tl1 = i32([37, 9, 0])
    add_extra(prob, fmt, 21, 8, lengths=i32([0, 21, 13]))
    sink = torch.tensor([math.inf, -math.inf] + [0.5] * 14, device=DEVICE)
    out, lse = run_kernel(prob, kernel, out=nan_out(3, 16), topk_length=tl1, attn_sink=sink)
    ref_out, ref_lse = run_reference(prob, topk_length=tl1, attn_sink=sink)
    assert_matches(out, lse, ref_out, ref_lse, **prob.tol, what=f"{fmt} {kernel}")
    kv, idx, fmt_name = concatenated(prob, tl1)
    one_out, one_lse = reference.sparse_mla_attention(prob.q, kv, idx, prob.softmax_scale, kv_format=fmt_name,
                                                      k_scale=prob.k_scale, attn_sink=sink, return_lse=True,
                                                      compute_dtype=torch.float64, out_dtype=torch.float64)
    assert torch.allclose(ref_out, one_out, rtol=1e-12, atol=1e-12) and torch.equal(torch.isinf(ref_lse),
                                                                                   torch.isinf(one_lse))
    fin = torch.isfinite(one_lse)
    assert torch.allclose(ref_lse[fin], one_lse[fin], rtol=0, atol=1e-12)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 5, 8])
def test_decode_splits_across_the_two_lists(num_splits):
    """Split ranges start and end anywhere in the main list, its padding to whole tiles, and the extra list."""
    torch.manual_seed(num_splits)
    prob = make_problem("bf16", 4, 20, 45, 16)
    add_extra(prob, "bf16", 30, 16, lengths=i32([30, 1, 0, 17]))
    tl1 = i32([45, 0, 3, 44])
    out, lse = run_kernel(prob, "decode", out=nan_out(4, 20), topk_length=tl1, num_splits=num_splits)
    assert_matches(out, lse, *run_reference(prob, topk_length=tl1), **prob.tol, what=f"splits {num_splits}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_nope_512_rows_where_v_is_the_whole_row(kernel):
    """DeepSeek-V4's shape: 512-wide q and rows, V the whole row, two caches and a sink."""
    torch.manual_seed(3)
    prob = make_problem("bf16", 3, 8, 24, 64, d_qk=512)
    add_extra(prob, "bf16", 40, 64, num_blocks2=2, d_qk=512)
    sink = torch.full((8,), -0.25, device=DEVICE)
    out, lse = run_kernel(prob, kernel, out=nan_out(3, 8), attn_sink=sink)
    assert_matches(out, lse, *run_reference(prob, attn_sink=sink), **prob.tol, what=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_lists(kernel):
    """No valid entry in either list: out 0, lse -inf (whatever the sink); only the extra list: its softmax."""
    torch.manual_seed(5)
    prob = make_problem("fp16", 2, 16, 16, 16)
    add_extra(prob, "fp16", 16, 16)
    prob.indices = torch.full_like(prob.indices, -1)
    prob.extra["extra_indices"] = torch.where(torch.arange(2, device=DEVICE)[:, None] == 0,
                                              prob.extra["extra_indices"], -1).to(torch.int32)
    sink = torch.full((16,), math.inf, device=DEVICE)
    out, lse = run_kernel(prob, kernel, out=nan_out(2, 16), attn_sink=sink)
    ref_out, ref_lse = run_reference(prob, attn_sink=sink)
    assert torch.isneginf(lse[1]).all() and (out[1] == 0).all()
    assert_matches(out, lse, ref_out, ref_lse, **prob.tol, what=kernel)
    out, lse = run_kernel(prob, kernel, out=nan_out(2, 16), extra_topk_length=i32([0, 0]))
    assert torch.isneginf(lse).all() and (out == 0).all()


def test_extra_arguments_are_checked():
    prob = make_problem("bf16", 2, 16, 8, 16)
    kv2 = prob.kv_cache.clone()
    idx2 = prob.indices.clone()
    cases = [
        (dict(extra_indices=idx2), "extra_indices"),
        (dict(extra_topk_length=i32([1, 1])), "extra_topk_length"),
        (dict(extra_kv_cache=kv2), "extra_indices"),
        (dict(extra_kv_cache=kv2.to(torch.float16), extra_indices=idx2), "extra_kv_cache"),
        (dict(extra_kv_cache=kv2[..., :512], extra_indices=idx2), "extra_kv_cache"),
        (dict(extra_kv_cache=kv2, extra_indices=idx2.long()), "extra_indices"),
        (dict(extra_kv_cache=kv2, extra_indices=idx2[:1]), "extra_indices"),
        (dict(extra_kv_cache=kv2, extra_indices=idx2, extra_topk_length=i32([1])), "extra_topk_length"),
    ]
    for kw, arg in cases:
        for fn in (run_kernel, run_reference):
            with pytest.raises(ValueError, match=f"^{arg}"):
                fn(prob, **kw)
    assert infer_kv_format(kv2) == "bf16"


def test_split_len_must_keep_tiles_whole():
    """A split_len that is not a multiple of the tile would let a tile straddle the two lists (its extra entries
    then lost): refused, as is 0 or a negative one."""
    prob = make_problem("fp16", 2, 16, 20, 16)
    add_extra(prob, "fp16", 20, 16)
    for bad in (24, 0, -16):
        with pytest.raises(ValueError, match="^split_len"):
            run_kernel(prob, "decode", split_len=bad)
    out, lse = run_kernel(prob, "decode", out=nan_out(2, 16), split_len=16)
    assert_matches(out, lse, *run_reference(prob), **prob.tol, what="split_len 16")


def test_the_reported_split_count_covers_the_padded_list():
    """``return_config``'s num_splits is the count the launch runs: the main list padded to whole tiles, then the
    extra list, split_len each."""
    from triton_mla_sparse.ops.sparse_mla.api import sparse_mla_attention_with_config

    prob = make_problem("fp16", 2, 16, 20, 16)
    add_extra(prob, "fp16", 20, 16)
    _, cfg = sparse_mla_attention_with_config(*prob.args(), **prob.kwargs(), kernel="decode", num_splits=3,
                                              return_config=True)
    n_list = -(-20 // cfg.block_n) * cfg.block_n + 20
    assert (cfg.num_splits - 1) * cfg.split_len < n_list <= cfg.num_splits * cfg.split_len


@pytest.mark.parametrize("arg", ["kv_cache", "extra_kv_cache"])
def test_a_block_size_of_zero_is_refused(arg):
    prob = make_problem("bf16", 2, 16, 8, 16)
    add_extra(prob, "bf16", 8, 16)
    empty = prob.kv_cache[:, :0]
    if arg == "kv_cache":
        prob.kv_cache = empty
    else:
        prob.extra["extra_kv_cache"] = empty
    for fn in (run_kernel, run_reference):
        with pytest.raises(ValueError, match=f"^{arg}: expected a block size"):
            fn(prob)

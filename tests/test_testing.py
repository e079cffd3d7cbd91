"""The shared fixtures (triton_mla_sparse.testing) do what their docstrings say: the tests, the bench, ``check`` and
``demo`` all rest on them."""

from __future__ import annotations

import math

import pytest
import torch

from triton_mla_sparse import formats, reference, testing


def test_rel_err_semantics():
    ref = torch.tensor([3.0, 4.0])
    assert testing.rel_err(ref, ref) == 0.0
    assert testing.rel_err(torch.tensor([3.0, 5.0]), ref) == pytest.approx(0.2)
    assert testing.rel_err(torch.zeros(2), torch.zeros(2)) == 0.0
    assert testing.rel_err(torch.ones(2), torch.zeros(2)) == math.inf
    assert testing.rel_err(torch.tensor([3.0, math.nan]), ref) == math.inf
    assert testing.rel_err(torch.tensor([3.0, math.inf]), ref) == math.inf
    assert testing.rel_err(ref, torch.tensor([3.0, math.nan])) == math.inf
    with pytest.raises(ValueError, match="shape"):
        testing.rel_err(torch.ones(2, 1), torch.ones(2, 5))


@pytest.mark.parametrize("special", [math.nan, math.inf, -math.inf])
def test_assert_close_requires_the_same_special_positions(special):
    expected = torch.tensor([1.0, 2.0, special, 4.0])
    testing.assert_close(expected.clone(), expected, tol=0.0, atol=0.0)
    moved = torch.tensor([1.0, special, 3.0, 4.0])
    with pytest.raises(AssertionError, match="positions differ"):
        testing.assert_close(moved, expected, tol=10.0)
    with pytest.raises(AssertionError, match="positions differ"):
        testing.assert_close(torch.tensor([1.0, 2.0, 3.0, 4.0]), expected, tol=10.0)


def test_assert_close_tolerances_apply_to_the_finite_part():
    expected = torch.tensor([1.0, -math.inf, 100.0])
    actual = torch.tensor([1.0, -math.inf, 101.0])
    err = testing.assert_close(actual, expected, tol=1e-2, atol=1.0)
    assert err == pytest.approx(1 / math.hypot(1.0, 100.0))
    with pytest.raises(AssertionError, match="relative error"):
        testing.assert_close(actual, expected, tol=1e-3)
    with pytest.raises(AssertionError, match="max abs error"):
        testing.assert_close(actual, expected, atol=0.5)
    with pytest.raises(AssertionError, match="shape"):
        testing.assert_close(actual[:2], expected, tol=1.0)
    with pytest.raises(ValueError, match="tol, atol"):
        testing.assert_close(actual, expected)


def test_nan_filled_every_element_and_byte():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert torch.isnan(testing.nan_filled((3, 5), dtype)).all()
    assert (testing.nan_filled((2, 7), torch.uint8) == 0xFF).all()


@pytest.mark.parametrize("layout", testing.LAYOUTS)
def test_place_keeps_slot_ids(layout):
    stored = torch.randn(3, 4, 10)
    cache = testing.place(stored, layout)
    rows = cache[:, :, 0] if cache.dim() == 4 else cache
    assert torch.equal(rows.reshape(-1, 10), stored.reshape(-1, 10))
    if layout in ("padded", "flat_padded"):
        assert not cache.is_contiguous()
    with pytest.raises(ValueError, match="layout"):
        testing.place(stored, "5d")


@pytest.mark.parametrize("kv_format", formats.KV_FORMATS)
def test_encode_cache_round_trips_through_the_reference_reader(kv_format):
    values = testing.kv_values(64).reshape(4, 16, 576)
    stored, k_scale = testing.encode_cache(values, kv_format)
    assert stored.dtype == formats.KV_FORMAT_DTYPES[kv_format]
    assert (k_scale is not None) == (kv_format == "fp8_e4m3")
    # One valid slot per row: the reference's output is that row's latent as it reads it from the cache.
    q = torch.zeros(64, 1, 576, dtype=torch.float32)
    idx = torch.arange(64, dtype=torch.int32)[:, None]
    out = reference.sparse_mla_attention(q.half(), stored, idx, 1.0, kv_format=kv_format, k_scale=k_scale,
                                         compute_dtype=torch.float64, out_dtype=torch.float64)
    tol = 1e-2 if kv_format == "fp16" else (4e-3 if kv_format == "bf16" else 7e-2)
    assert testing.rel_err(out[:, 0], values.reshape(64, 576)[:, :512].double()) < tol


def test_encode_cache_nope_poisons_the_rope_bytes():
    stored, _ = testing.encode_cache(torch.randn(2, 8, 512), "fp8_ds_mla")
    assert stored.shape == (2, 8, formats.FP8_DS_MLA_BYTES)
    assert (stored[..., 528:] == 0xFF).all()
    with pytest.raises(ValueError, match="kv_format"):
        testing.encode_cache(torch.randn(2, 576), "int8")


def test_random_topk_positions_distinct_and_causal():
    rows, ctx, topk = 6, 64, 10
    row_pos = torch.arange(ctx - rows, ctx)
    pos = testing.random_topk_positions(rows, ctx, topk, "cpu", row_positions=row_pos, chunk=4)
    assert pos.dtype == torch.int32 and pos.shape == (rows, topk)
    for t in range(rows):
        assert len(set(pos[t].tolist())) == topk
        assert pos[t].max() <= row_pos[t]
    with pytest.raises(ValueError, match="topk"):
        testing.random_topk_positions(1, 4, 5, "cpu")
    with pytest.raises(ValueError, match="row_positions"):
        testing.random_topk_positions(2, 64, 5, "cpu", row_positions=torch.tensor([10, 3]))


def test_random_block_table_scatters_distinct_blocks():
    bt = testing.random_block_table(3, 5, "cpu", pool_blocks=40)
    assert bt.dtype == torch.int32 and bt.shape == (3, 5)
    assert len(set(bt.flatten().tolist())) == 15 and bt.max() < 40
    with pytest.raises(ValueError, match="pool_blocks"):
        testing.random_block_table(3, 5, "cpu", pool_blocks=14)


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_sparse_mla_inputs(kind):
    rows, requests = (4, 4) if kind == "decode" else (8, 1)
    inp = testing.sparse_mla_inputs(kind, rows=rows, heads=2, ctx=128, topk=16, requests=requests, block_size=16,
                                    kv_format="fp16", q_dtype=torch.float16, seed=5)
    assert inp.q.shape == (rows, 2, 576) and inp.indices.shape == (rows, 16)
    slots = inp.kv_cache.shape[0] * inp.kv_cache.shape[1]
    assert ((inp.indices >= 0) & (inp.indices < slots)).all()
    # Every slot of a row belongs to that row's request (its blocks in the block table).
    for t in range(rows):
        req = t if kind == "decode" else 0
        assert set((inp.indices[t] // 16).tolist()) <= set(inp.block_table[req].tolist())
    again = testing.sparse_mla_inputs(kind, rows=rows, heads=2, ctx=128, topk=16, requests=requests, block_size=16,
                                      kv_format="fp16", q_dtype=torch.float16, seed=5)
    assert torch.equal(again.indices, inp.indices) and torch.equal(again.q, inp.q)
    with pytest.raises(ValueError, match="block_size"):
        testing.sparse_mla_inputs(kind, rows=rows, heads=2, ctx=100, topk=16, requests=requests, block_size=16)


def test_indexer_inputs_fold_q_scales_into_the_weights():
    inp = testing.indexer_inputs("prefill", rows=8, heads=4, ctx=64, requests=1, block_size=16, seed=1)
    assert inp.q.dtype == torch.float8_e4m3fn and inp.k_cache.shape == (4, 16 * formats.INDEXER_ROW_BYTES)
    assert inp.positions.tolist() == list(range(56, 64))
    logits = reference.indexer_logits(inp.q, inp.weights, inp.k_cache, inp.block_table, inp.req_id_per_token,
                                      inp.positions, 64)
    assert torch.isneginf(logits[0, 57:]).all() and torch.isfinite(logits[-1]).all()
    with pytest.raises(ValueError, match="phase"):
        testing.indexer_inputs("extend", rows=1, heads=1, ctx=16, requests=1, block_size=16)


def test_quantize_indexer_q_per_row_and_head():
    q = torch.randn(3, 2, 128) * torch.tensor([1.0, 100.0])[None, :, None]
    q8, scale = testing.quantize_indexer_q(q)
    assert q8.dtype == torch.float8_e4m3fn and scale.shape == (3, 2)
    assert testing.rel_err(q8.float() * scale[..., None], q) < 0.05
    assert torch.allclose(q8.float().abs().amax(-1), torch.full((3, 2), 448.0))


def test_encode_cache_given_k_scale_and_empty_values():
    values = torch.randn(4, 576)
    stored, k_scale = testing.encode_cache(values, "fp8_e4m3", k_scale=0.01)
    assert k_scale == 0.01
    assert torch.equal(stored, (values / 0.01).clamp(-448, 448).to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="k_scale"):
        testing.encode_cache(values, "bf16", k_scale=0.01)
    for kv_format in formats.KV_FORMATS:
        stored, k_scale = testing.encode_cache(torch.empty(0, 16, 576), kv_format)
        assert stored.shape == (0, 16, formats.kv_row_width(kv_format))
        assert stored.dtype == formats.KV_FORMAT_DTYPES[kv_format]
        assert (k_scale == 1.0) if kv_format == "fp8_e4m3" else (k_scale is None)


@pytest.mark.parametrize("kv_format, row_bytes", [("bf16", 1152), ("fp16", 1152), ("fp8_e4m3", 576),
                                                   ("fp8_ds_mla", 656)])
def test_unique_bytes_counts_rows_q_and_out_once(kv_format, row_bytes):
    inp = testing.sparse_mla_inputs("decode", rows=3, heads=2, ctx=64, topk=8, requests=3, block_size=16,
                                    kv_format=kv_format, q_dtype=torch.float16)
    assert inp.unique_rows == 24  # distinct positions of three requests' own blocks
    assert inp.unique_bytes == 24 * row_bytes + 3 * 2 * 576 * 2 + 3 * 2 * 512 * 2

"""The case lists and which methods apply to a case."""

from __future__ import annotations

import pytest

from triton_mla_sparse import bench


def test_method_applies():
    dec_bf16 = bench.decode_case(16, 64, "bf16")
    dec_fp8 = bench.decode_case(16, 64, "fp8_ds_mla")
    pre_fp8 = bench.prefill_case(64, "fp8_ds_mla")
    assert [m for m in bench.METHOD_KEYS if bench.method_applies(m, dec_bf16)] == [
        "ours", "torch", "page1_triton", "fa3_page1", "flashmla_bf16"]
    assert [m for m in bench.METHOD_KEYS if bench.method_applies(m, dec_fp8)] == ["ours", "torch", "flashmla_fp8"]
    assert [m for m in bench.METHOD_KEYS if bench.method_applies(m, pre_fp8)] == ["ours", "torch", "flashmla_fp8"]
    for phase in ("decode", "prefill"):
        idx = bench.indexer_case(32, phase)
        assert [m for m in bench.INDEXER_METHOD_KEYS if bench.method_applies(m, idx)] == list(
            bench.INDEXER_METHOD_KEYS)
        assert not any(bench.method_applies(m, idx) for m in ("page1_triton", "fa3_page1", "flashmla_bf16",
                                                              "flashmla_fp8"))
    # DeepSeek-V4 (two caches, a sink): ours and FlashMLA's V4 kernel only
    v4 = bench.v4_decode_case(8, 64)
    assert [m for m in bench.METHOD_KEYS if bench.method_applies(m, v4)] == ["ours", "flashmla_fp8"]


def test_case_list_covers_the_issue():
    attn = bench.bench_cases(kinds="attention")
    names = [c.name for c in attn]
    assert len(names) == 26 and all(bench.case_group(c) == "attention" for c in attn)
    for h in (8, 16, 32, 64, 128):
        for f in ("bf16", "fp8_ds_mla"):
            assert f"decode h{h} B=64 ctx8K {f}" in names
    assert "decode h16 B=256 ctx8K bf16" in names and "decode h128 B=1 ctx64K fp8_ds_mla" in names
    for h in (8, 16, 64, 128):
        assert f"prefill h{h} T=4096 ctx32K bf16" in names
    # issue #19: DeepSeek-V4 decode, 8 and 64 heads, B = 64 and 256, window 128 + 512 compressed entries
    v4 = [c for c in attn if c.kv_format == "fp8_ds_mla_v4"]
    assert [c.name for c in v4] == [f"decode v4 h{h} B={b} swa128+c512 ctx8K fp8_ds_mla_v4" for h in (8, 64)
                                    for b in (64, 256)]
    assert all(c.topk == 128 and c.extra_topk == 512 and c.softmax_scale == 512 ** -0.5 for c in v4)
    assert v4[0].flops == 2 * 8 * (128 + 512) * (512 + 512) * 64
    assert all(c.topk == 2048 and c.block_size == 64 for c in bench.bench_cases() if c not in v4)
    assert 0 < len(bench.bench_cases(quick=True)) < 10
    # The indexer cases of issue #6: decode B=64, block 64, Hi 64 and 32, 32K and 128K; prefill 4096 rows over 32K.
    idx = bench.bench_cases(kinds=["indexer"])
    assert [c.name for c in idx] == [
        "indexer decode h64 B=64 ctx32K", "indexer decode h64 B=64 ctx128K", "indexer decode h32 B=64 ctx32K",
        "indexer decode h32 B=64 ctx128K", "indexer prefill h64 T=4096 ctx32K", "indexer prefill h32 T=4096 ctx32K"]
    assert all(c.kind == "indexer" and c.topk == 2048 and c.block_size == 64 and c.kv_format == "fp8_indexer"
               for c in idx)
    assert [c.name for c in bench.bench_cases()] == names + [c.name for c in idx]  # the default runs both
    assert any(c.kind == "indexer" for c in bench.bench_cases(quick=True))
    pre = idx[4]  # rows at positions 28672 .. 32767: 4096 · 28672 + 4096 · 4097 / 2 scored pairs (the anchors' FLOPs)
    assert pre.pairs == 4096 * 28672 + 4096 * 4097 // 2 and pre.flops == 2 * 64 * 128 * pre.pairs
    with pytest.raises(ValueError, match="kinds"):
        bench.bench_cases(kinds="attention,nope")

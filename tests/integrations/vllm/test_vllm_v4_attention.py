"""DeepSeek-V4's attention layer on this package's kernels (:mod:`triton_mla_sparse.integrations.vllm.v4_attention`)
against the reference, from vLLM 0.33's own metadata classes, on the CPU (Triton interpreter, float16 q: small
sizes). The layer's forward is given a vLLM-shaped layer (caches, sink, compress ratio, the indexer's top-k
buffer) and vLLM's ``DeepseekSparseSWAMetadata`` / ``DeepseekV4FlashMLAMetadata`` for a batch of decode rows then
prefill rows; vLLM's ``compute_global_topk_indices_and_lens`` (a Triton kernel the interpreter cannot run) is
replaced by :func:`global_topk`, its semantics in torch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from triton_mla_sparse import formats as F
from triton_mla_sparse import reference
from triton_mla_sparse.integrations.vllm import v4_attention as VA
from triton_mla_sparse.testing import place_v4, rel_err, v4_values

SCALE = 512 ** -0.5
H, SWA_BS, CMP_BS, WINDOW, TOPK = 8, 16, 4, 16, 24
TOL = 5e-3


def global_topk(local, token_to_req, block_table, block_size, is_valid):
    """vLLM's ``compute_global_topk_indices_and_lens`` in torch: request-local compressed entries -> global slots
    through the request's block table (-1 stays -1), and each row's count of valid entries (0 on padding rows)."""
    ok = local >= 0
    blk = torch.where(ok, local // block_size, 0).long()
    rows = block_table[token_to_req.long()]
    slots = torch.gather(rows, 1, blk) * block_size + local % block_size
    lens = torch.where(is_valid, ok.sum(1), 0).to(torch.int32)
    return torch.where(ok, slots, -1).to(torch.int32), lens


def _pages(nb, bs, seed):
    g = torch.Generator().manual_seed(seed)
    return place_v4(F.quantize_fp8_ds_mla_v4(v4_values(nb, bs, generator=g)), bs, "vllm")


def _layer(compress_ratio, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    swa = _pages(6, SWA_BS, seed + 1)
    cmp = _pages(8, CMP_BS, seed + 2) if compress_ratio > 1 else None
    local = torch.randint(0, 8 * CMP_BS, (T, TOPK), generator=g, dtype=torch.int32)
    local[:, -3:] = -1  # fewer candidates than top-k: -1 padded at the end
    return SimpleNamespace(prefix="model.layers.0.attn", compress_ratio=compress_ratio, kv_cache=cmp, scale=SCALE,
                           attn_sink=torch.randn(H, generator=g),
                           swa_cache_layer=SimpleNamespace(prefix="model.layers.0.attn.swa", kv_cache=swa),
                           topk_indices_buffer=local if compress_ratio == 4 else None)


def _metadata(layer, nd, npf, seed=1):
    """vLLM's metadata objects for ``nd`` decode rows (one per request) then ``npf`` prefill rows of one request."""
    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLAMetadata
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    g = torch.Generator().manual_seed(seed)
    T = nd + npf
    n_swa = layer.swa_cache_layer.kv_cache.shape[0] * SWA_BS
    swa_idx = torch.randint(0, n_swa, (T, WINDOW), generator=g, dtype=torch.int32)
    swa_idx[0, 5] = -1  # an invalid window entry
    swa_lens = torch.randint(1, WINDOW + 1, (T,), generator=g, dtype=torch.int32)
    reqs = nd + (1 if npf else 0)
    token_to_req = torch.tensor(list(range(nd)) + [nd] * npf, dtype=torch.int32)
    is_valid = torch.ones(T, dtype=torch.bool)
    is_valid[-1] = False  # a padding row: its compressed list is empty
    swa = DeepseekSparseSWAMetadata(
        block_table=torch.zeros(reqs, 1, dtype=torch.int32), slot_mapping=torch.zeros(T, dtype=torch.int64),
        block_size=SWA_BS, is_valid_token=is_valid, token_to_req_indices=token_to_req,
        decode_swa_indices=swa_idx[:nd], decode_swa_lens=swa_lens[:nd],
        prefill_swa_indices=swa_idx[nd:].unsqueeze(1), prefill_swa_lens=swa_lens[nd:],
        num_decodes=nd, num_prefills=1 if npf else 0, num_decode_tokens=nd, num_prefill_tokens=npf)
    md = {layer.swa_cache_layer.prefix: swa}
    if layer.compress_ratio > 1:
        block_table = torch.stack([torch.randperm(8, generator=g) for _ in range(reqs)]).to(torch.int32)
        meta = DeepseekV4FlashMLAMetadata(
            num_reqs=reqs, max_query_len=max(npf, 1), max_seq_len=1, num_actual_tokens=T,
            query_start_loc=torch.zeros(reqs + 1, dtype=torch.int32), slot_mapping=torch.zeros(T, dtype=torch.int64),
            block_table=block_table, req_id_per_token=token_to_req, block_size=CMP_BS * layer.compress_ratio,
            topk_tokens=TOPK)
        if layer.compress_ratio == 128:  # vLLM precomputes the C128A lists
            local = torch.randint(0, 8 * CMP_BS, (T, TOPK), generator=g, dtype=torch.int32)
            gi, gl = global_topk(local[:nd], token_to_req[:nd], block_table, CMP_BS, is_valid[:nd])
            meta.c128a_global_decode_topk_indices, meta.c128a_decode_topk_lens = gi.unsqueeze(1), gl
            meta.c128a_prefill_topk_indices = local[nd:]
        md[layer.prefix] = meta
    return md, swa_idx, swa_lens


def _expected(layer, md, q, swa_idx, swa_lens, nd):
    """The reference over the same lists, with the compressed ones built the way vLLM builds them."""
    swa, meta = md[layer.swa_cache_layer.prefix], md.get(layer.prefix)
    extra = {}
    if layer.compress_ratio == 4:
        idx, lens = global_topk(layer.topk_indices_buffer, swa.token_to_req_indices, meta.block_table, CMP_BS,
                                swa.is_valid_token)
        extra = dict(extra_kv_cache=layer.kv_cache, extra_indices=idx, extra_topk_length=lens)
    elif layer.compress_ratio == 128:
        pi, pl = global_topk(meta.c128a_prefill_topk_indices, swa.token_to_req_indices[nd:], meta.block_table,
                             CMP_BS, swa.is_valid_token[nd:])
        extra = dict(extra_kv_cache=layer.kv_cache,
                     extra_indices=torch.cat([meta.c128a_global_decode_topk_indices.squeeze(1), pi]),
                     extra_topk_length=torch.cat([meta.c128a_decode_topk_lens, pl]))
    return reference.sparse_mla_attention(q, layer.swa_cache_layer.kv_cache, swa_idx, SCALE,
                                          kv_format="fp8_ds_mla_v4", topk_length=swa_lens,
                                          attn_sink=layer.attn_sink, out_dtype=torch.float32, **extra)


@pytest.mark.parametrize("compress_ratio", [1, 4, 128], ids=["swa-only", "c4a", "c128a"])
@pytest.mark.parametrize("nd,npf", [(3, 0), (0, 4), (2, 3)], ids=["decode", "prefill", "mixed"])
def test_forward_matches_the_reference(compress_ratio, nd, npf):
    T = nd + npf
    layer = _layer(compress_ratio, T)
    md, swa_idx, swa_lens = _metadata(layer, nd, npf)
    q = torch.randn(T, H, 512, dtype=torch.float16)
    out = torch.full((T, H, 512), float("nan"), dtype=torch.float16)
    VA.forward_v4(layer, q, out, md, global_topk)
    want = _expected(layer, md, q, swa_idx, swa_lens, nd)
    assert torch.isfinite(out).all()
    assert rel_err(out, want) <= TOL


def test_run_v4_attention_takes_vllms_shapes_and_refuses_other_caches():
    """FlashMLA-shaped slot ids ``[T, 1, W]``, a sink padded beyond the heads (as vLLM may allocate it); a cache that
    is not vLLM's uint8 fp8_ds_mla pages is refused by the API's validation, before any kernel."""
    g = torch.Generator().manual_seed(3)
    pages = _pages(4, SWA_BS, 0)
    T = 3
    q = torch.randn(T, H, 512, generator=g).to(torch.float16)
    idx = torch.randint(0, 4 * SWA_BS, (T, 1, WINDOW), generator=g, dtype=torch.int32)
    out = torch.full((T, H, 512), float("nan"), dtype=torch.float16)
    sink = torch.randn(H + 2, generator=g)
    VA.run_v4_attention(q, out, scale=SCALE, sink=sink, swa_cache=pages, swa_indices=idx, swa_lens=None)
    want = reference.sparse_mla_attention(q, pages, idx[:, 0], SCALE, kv_format="fp8_ds_mla_v4", attn_sink=sink[:H],
                                          out_dtype=torch.float32)
    assert rel_err(out, want) <= TOL
    rows = torch.randn(4, SWA_BS, 512, generator=g).to(torch.float16)
    with pytest.raises(ValueError, match="kv_cache"):
        VA.run_v4_attention(q, out, scale=SCALE, sink=sink, swa_cache=rows, swa_indices=idx, swa_lens=None)
    with pytest.raises(ValueError, match="extra_indices"):
        VA.run_v4_attention(q, out, scale=SCALE, sink=sink, swa_cache=pages, swa_indices=idx, swa_lens=None,
                            extra_cache=pages)


def test_the_layer_class(cuda_platform_module):
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention

    cls = VA.triton_attention_cls()
    assert cls is VA.triton_attention_cls()
    assert issubclass(cls, DeepseekV4Attention) and cls.use_fp8_ds_mla_layout
    assert cls.get_padded_num_q_heads(8) == 8 and cls.get_padded_num_q_heads(64) == 64  # no padding
    assert cls.backend_cls.get_name() == "FLASHINFER_MLA_SPARSE_DSV4"  # the metadata forward_v4 reads
    assert not getattr(cls, "__abstractmethods__", None)


def test_the_layer_builds_from_a_v4_config(cuda_platform_module, tmp_path):
    """vLLM's own DeepseekV4Attention constructor on the plugin's class (a V4 config from transformers, one
    process of tensor parallel 1 over gloo, in a child process: vLLM's distributed state stays out of this one):
    8 heads unpadded (FlashMLA's class pads them to 64), the fp8_ds_mla pages (uint8) for ``--kv-cache-dtype
    fp8``, the sink per head."""
    from v4_layer_build import build_v4_layer

    got = build_v4_layer(tmp_path, """
        swa_spec = layer.swa_cache_layer.get_kv_cache_spec(vc)
        print(json.dumps(dict(heads=layer.n_local_heads, padded=layer.padded_heads, ratio=layer.compress_ratio,
                              dtype=layer.kv_cache_dtype, torch_dtype=str(layer.kv_cache_torch_dtype),
                              sink=list(layer.attn_sink.shape), scale=layer.scale,
                              swa_dtype=str(getattr(swa_spec, "dtype", None)),
                              backend=layer.get_attn_backend().get_name())))
    """, capability=(12, 0))
    assert (got["heads"], got["padded"], got["ratio"], got["sink"]) == (8, 8, 1, [8])
    assert (got["dtype"], got["torch_dtype"], got["swa_dtype"]) == ("fp8_ds_mla", "torch.uint8", "torch.uint8")
    assert got["backend"] == "FLASHINFER_MLA_SPARSE_DSV4" and abs(got["scale"] - 512 ** -0.5) < 1e-12


def _v41_layer(compress_ratio, T, seed=0):
    """A V4.1-shaped layer: compressed layers (ratio 1 or 2) read the kv-source layer's cache
    (``_compressed_kv_cache()``, its metadata under ``compressed_cache_prefix``) and the index source's top-k."""
    layer = _layer(4 if compress_ratio else 1, T, seed)  # the caches and a top-k buffer of V4's C4A shape
    cmp = _pages(8, CMP_BS, seed + 2) if compress_ratio else None
    layer.compress_ratio = compress_ratio
    layer.kv_cache = None  # a consumer layer owns no compressed cache
    layer.compressed_cache_prefix = "model.layers.0.attn.compressor" if compress_ratio else None
    layer._compressed_kv_cache = lambda: cmp
    layer.topk_indices_buffer = layer.topk_indices_buffer if compress_ratio else None
    return layer


@pytest.mark.parametrize("compress_ratio", [0, 1, 2], ids=["swa-only", "c1a", "c2a"])
@pytest.mark.parametrize("nd,npf", [(3, 0), (0, 4), (2, 3)], ids=["decode", "prefill", "mixed"])
def test_v41_forward_matches_the_reference(compress_ratio, nd, npf):
    from vllm.models.deepseek_v41.sparse_mla import DeepseekV4FlashMLAMetadata

    T = nd + npf
    layer = _v41_layer(compress_ratio, T)
    md, swa_idx, swa_lens = _metadata(SimpleNamespace(**{**vars(layer), "compress_ratio": 1}), nd, npf)
    extra = {}
    if compress_ratio:
        swa = md[layer.swa_cache_layer.prefix]
        reqs = swa.block_table.shape[0]
        g = torch.Generator().manual_seed(5)
        block_table = torch.stack([torch.randperm(8, generator=g) for _ in range(reqs)]).to(torch.int32)
        md[layer.compressed_cache_prefix] = DeepseekV4FlashMLAMetadata(
            num_reqs=reqs, max_query_len=max(npf, 1), max_seq_len=1, num_actual_tokens=T,
            query_start_loc=torch.zeros(reqs + 1, dtype=torch.int32), slot_mapping=torch.zeros(T, dtype=torch.int64),
            block_table=block_table, req_id_per_token=swa.token_to_req_indices, block_size=CMP_BS * compress_ratio,
            topk_tokens=TOPK)
        idx, lens = global_topk(layer.topk_indices_buffer, swa.token_to_req_indices, block_table, CMP_BS,
                                swa.is_valid_token)
        extra = dict(extra_kv_cache=layer._compressed_kv_cache(), extra_indices=idx, extra_topk_length=lens)
    q = torch.randn(T, H, 512, dtype=torch.float16)
    out = torch.full((T, H, 512), float("nan"), dtype=torch.float16)
    VA.forward_v41(layer, q, out, md, global_topk)
    want = reference.sparse_mla_attention(q, layer.swa_cache_layer.kv_cache, swa_idx, SCALE,
                                          kv_format="fp8_ds_mla_v4", topk_length=swa_lens,
                                          attn_sink=layer.attn_sink, out_dtype=torch.float32, **extra)
    assert torch.isfinite(out).all()
    assert rel_err(out, want) <= TOL
    if compress_ratio:  # the compressed metadata is the kv source's: without it the layer refuses to run
        del md[layer.compressed_cache_prefix]
        with pytest.raises(ValueError, match="a compressed layer needs its metadata"):
            VA.forward_v41(layer, q, out, md, global_topk)


def test_the_v41_layer_class(cuda_platform_module):
    from vllm.models.deepseek_v41.attention import DeepseekV4Attention

    cls = VA.triton_attention_cls_v41()
    assert cls is VA.triton_attention_cls_v41() and cls is not VA.triton_attention_cls()
    assert issubclass(cls, DeepseekV4Attention) and cls.use_fp8_ds_mla_layout
    assert cls.get_padded_num_q_heads(8) == 8 and cls.get_padded_num_q_heads(64) == 64  # no padding
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend

    from triton_mla_sparse.integrations.vllm.simulated_platform import cuda_platform_for

    assert issubclass(cls.backend_cls, fi.DeepseekV4FlashInferMLASparseBackend)  # V4.1's builders and layout
    assert cls.backend_cls.get_name() == "FLASHINFER_MLA_SPARSE_DSV41"
    assert cls.backend_cls.get_builder_cls() is fi.DeepseekV4FlashInferMLASparseBackend.get_builder_cls()
    assert not getattr(cls, "__abstractmethods__", None)
    # the pages V4.1's indexer cache takes on each GPU (64 tokens on SM 9.0: packed 128-token blocks cannot be split
    # for it), not FlashInfer's kernel's 128
    for capability, pages in (((8, 0), [128]), ((8, 6), [128]), ((9, 0), [64]), ((12, 0), [128])):
        with cuda_platform_for(cuda_platform_module, *capability, True):
            assert cls.backend_cls.get_supported_kernel_block_sizes() == pages, capability
            assert DeepseekV41IndexerBackend.get_supported_kernel_block_sizes() == pages, capability

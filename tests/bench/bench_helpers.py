"""Shared pieces of the bench tests (not collected): fake peer modules that check the argument shapes the harness
passes and answer correctly, and hand-made results documents for the reports."""

from __future__ import annotations

import types

import torch

from triton_mla_sparse import reference

REQUIRED_TOP = ("device", "date", "torch", "triton", "commit", "ceilings", "cases", "peers")
REQUIRED_CASE = ("name", "kind", "rows", "heads", "topk", "ctx", "kv_format", "methods")
TIMED = ("ms", "tflops", "gbps", "rel_err")


def _ref(q, kv, idx, scale, fmt):
    return reference.sparse_mla_attention(q, kv, idx, scale, kv_format=fmt, compute_dtype=torch.float32,
                                          out_dtype=torch.float32).to(q.dtype)


def _fake_flashmla(calls):
    """Stands in for FlashMLA's interface: checks the argument shapes the harness passes, answers correctly."""

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale):
        assert kv.dim() == 3 and kv.shape[1] == 1 and indices.shape[1] == 1 and q.shape[1] in (8, 16, 32, 64, 128)
        calls.append(("sparse_fwd", tuple(q.shape)))
        out = _ref(q, kv.view(-1, 1, kv.shape[-1]), indices[:, 0], sm_scale, None)
        return out, None, None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, softmax_scale=None,
                               is_fp8_kvcache=False, indices=None, topk_length=None, attn_sink=None,
                               extra_k_cache=None, extra_indices_in_kvcache=None, extra_topk_length=None):
        assert is_fp8_kvcache and block_table is None and head_dim_v == 512 and meta is not None
        T, s_q, hp, _ = q.shape
        assert s_q == 1 and hp in (64, 128) and indices.shape[:2] == (T, 1)
        if k_cache.shape[-1] == 584:  # DeepSeek-V4: the window cache, the compressed one as extra_*, a sink
            assert k_cache.shape[2:] == (1, 584) and extra_k_cache.shape[2:] == (1, 584) and q.shape[-1] == 512
            assert extra_indices_in_kvcache.shape[:2] == (T, 1) and attn_sink.shape == (hp,)
            assert topk_length.shape == extra_topk_length.shape == (T,)
            calls.append(("kvcache_fp8_v4", tuple(q.shape)))
            out = reference.sparse_mla_attention(
                q[:, 0], k_cache[:, :, 0], indices[:, 0], softmax_scale, kv_format="fp8_ds_mla_v4",
                topk_length=topk_length, attn_sink=attn_sink, extra_kv_cache=extra_k_cache[:, :, 0],
                extra_indices=extra_indices_in_kvcache[:, 0], extra_topk_length=extra_topk_length,
                out_dtype=q.dtype)
            return out.view(T, 1, hp, 512), None
        assert k_cache.shape[2:] == (1, 656) and topk_length is None and extra_k_cache is None
        calls.append(("kvcache_fp8", tuple(q.shape)))
        out = _ref(q[:, 0], k_cache[:, :, 0], indices[:, 0], softmax_scale, "fp8_ds_mla")
        return out.view(T, 1, hp, 512), None

    return types.SimpleNamespace(flash_mla_sparse_fwd=flash_mla_sparse_fwd, get_mla_metadata=lambda: (object(), None),
                                 flash_mla_with_kvcache=flash_mla_with_kvcache)


def _fake_page1():
    """Stands in for vLLM's decode_attention_fwd: right with k/v scale tensors given (the main call), zeros without
    (the sweep.py variant), so the variant must be refused by the accuracy check and left untimed."""

    def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits, num_kv_splits,
                             sm_scale, page_size=1, is_mla=False, k_scale=None, v_scale=None):
        assert page_size == 1 and is_mla and num_kv_splits == attn_logits.shape[2] == 4
        assert k_buffer.shape[1:] == (1, 576) and v_buffer.shape[1:] == (1, 512) and (b_seq_len == 64).all()
        if k_scale is None:
            o.zero_()
        else:
            o.copy_(_ref(q, k_buffer, req_to_token, sm_scale, None))

    return types.SimpleNamespace(decode_attention_fwd=decode_attention_fwd)


def _fake_fa3(calls):
    """Stands in for the peers folder's fa3_page1.py (FLASH_ATTN_MLA_SPARSE's FlashAttention-3 call): checks the
    cache rows, the compacted slots and their counts, answers with the reference over the counted slots."""

    def prepare(q, kv_rows, slots, softmax_scale, seqused=None, out=None):
        assert kv_rows.dim() == 2 and kv_rows.shape[1] == 576 and slots.dtype == torch.int32
        assert seqused is not None and seqused.dtype == torch.int32 and seqused.shape == (q.shape[0],)
        calls.append(("fa3", tuple(q.shape)))
        keep = torch.arange(slots.shape[1])[None, :] < seqused[:, None].cpu()
        idx = torch.where(keep.to(slots.device), slots, torch.full_like(slots, -1))

        def call():
            return _ref(q, kv_rows.view(-1, 1, 576), idx, softmax_scale, None)

        return call

    return types.SimpleNamespace(prepare=prepare)


def _fake_deepgemm(calls):
    """Stands in for DeepGEMM (vLLM 0.33's copy): checks the arguments the harness passes as its kernels require
    them, answers with the right logits at the candidate positions and garbage (1e30, which an unmasked top-k would
    pick) past each row's length and in the padding columns, as the real kernels leave them uncleaned."""
    fp8 = torch.float8_e4m3fn

    def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
        assert context_lens.dtype == torch.int32 and context_lens.dim() == 2 and context_lens.shape[1] == 1
        assert context_lens.is_contiguous() and num_sms == 7
        calls.append(("meta", block_kv))
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len):
        q8, q_sf = q
        B, next_n, H, D = q8.shape
        assert q_sf is None and q8.dtype == fp8 and next_n == 1 and D == 128
        nb, bs = kv_cache.shape[:2]
        assert kv_cache.dtype == torch.uint8 and kv_cache.shape[2:] == (1, 132) and kv_cache.stride(1) == 132
        assert weights.dtype == torch.float32 and weights.shape == (B, H) and context_lens.shape == (B, 1)
        assert block_table.dtype == torch.int32 and block_table.shape[0] == B and schedule_meta.shape == (8, 2)
        calls.append(("paged", B, H, max_context_len))
        ref = reference.indexer_logits(q8[:, 0], weights, kv_cache.view(nb, bs * 132), block_table,
                                       torch.arange(B, dtype=torch.int32), context_lens[:, 0] - 1, max_context_len)
        out = torch.full((B, max_context_len + 16), 1e30)  # a padded logits stride
        out[:, :max_context_len] = ref.masked_fill(torch.isneginf(ref), 1e30)
        return out

    def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k):
        (q8, q_sf), (k8, k_sf) = q, kv
        M, H, D = q8.shape
        assert q_sf is None and q8.dtype == fp8 and k8.dtype == fp8 and k8.is_contiguous() and k8.shape[1] == D
        assert k_sf.dtype == torch.float32 and k_sf.shape == (k8.shape[0],) and weights.shape == (M, H)
        ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
        assert ks.dtype == ke.dtype == torch.int32 and ks.shape == ke.shape == (M,) and bool((ks == 0).all())
        calls.append(("prefill", M, H, max_seqlen_k))
        s = torch.einsum("mhd,nd->mhn", q8.float(), k8.float() * k_sf[:, None]).relu()
        out = (s * weights[:, :, None]).sum(1)[:, :max_seqlen_k]  # every key scored: future ones are garbage here
        return out.masked_fill(torch.arange(max_seqlen_k)[None, :] >= ke[:, None] + 3, 1e30)

    return types.SimpleNamespace(get_num_sms=lambda: 7, get_paged_mqa_logits_metadata=get_paged_mqa_logits_metadata,
                                 fp8_fp4_paged_mqa_logits=fp8_fp4_paged_mqa_logits,
                                 fp8_fp4_mqa_logits=fp8_fp4_mqa_logits)


def _m(ms, graph=None, **kw):
    d = {"ms": ms, "tflops": 1.0, "gbps": 1.0, "rel_err": 1e-3, **kw}
    if graph is not None:
        d["graph_ms"] = graph
    return d


def _c(kind, heads, rows, fmt, **methods):
    ctx = 65536 if rows == 1 else (32768 if kind == "prefill" else 8192)
    name = f"{kind} h{heads} {'T' if kind == 'prefill' else 'B'}={rows} {fmt}"
    return {"name": name, "kind": kind, "rows": rows, "heads": heads, "topk": 2048, "ctx": ctx, "kv_format": fmt,
            "methods": methods}


def _doc(cases, **kw):
    return {"device": "NVIDIA H200", "date": "2026-12-01", "torch": "2.11", "triton": "3.6", "commit": "abc",
            "ceilings": {"copy_gbps": 4000.0, "bf16_tflops": 700.0}, "peers": {}, "cases": cases, **kw}


def _new_doc():
    return _doc([
        _c("decode", 8, 64, "bf16", ours=_m(0.05, 0.04), torch=_m(0.2, 0.19), page1_triton=_m(0.21, 0.2),
           flashmla_bf16=_m(0.25, 0.2)),
        _c("decode", 16, 64, "bf16", ours=_m(0.09, 0.07), torch=_m(0.2), page1_triton={"error": "not available: x"},
           flashmla_bf16=_m(0.25)),
        _c("decode", 8, 64, "fp8_ds_mla", ours=_m(0.05), flashmla_fp8=_m(0.1)),
        _c("decode", 16, 64, "fp8_ds_mla", ours=_m(0.063, 0.05), flashmla_fp8=_m(0.09, 0.08)),
        _c("decode", 16, 256, "bf16", ours=_m(0.2), flashmla_bf16=_m(0.25), page1_triton=_m(0.5)),
        _c("decode", 128, 64, "bf16", ours=_m(0.12), flashmla_bf16=_m(0.08)),
        _c("decode", 128, 64, "fp8_ds_mla", ours=_m(0.2), flashmla_fp8={"error": "accuracy: rel err 0.5 > 0.02"}),
        _c("prefill", 128, 4096, "bf16", ours=_m(6.0), flashmla_bf16=_m(4.0)),
        _c("prefill", 16, 4096, "bf16", ours=_m(2.0), flashmla_bf16=_m(2.6), page1_triton=_m(6.5)),
    ])


def _ic(phase, heads, ctx, **methods):
    rows = 64 if phase == "decode" else 4096
    name = f"indexer {phase} h{heads} {'B' if phase == 'decode' else 'T'}={rows} ctx{ctx // 1024}K"
    return {"name": name, "kind": "indexer", "phase": phase, "rows": rows, "heads": heads, "topk": 2048, "ctx": ctx,
            "kv_format": "fp8_indexer", "methods": methods}


def _indexer_doc():
    na = {"error": "not available: no DeepGEMM folder"}
    return _doc([
        _ic("decode", 64, 32768, ours=_m(0.10, 0.09), ours_logits=_m(0.08, 0.07), deepgemm=_m(0.082, 0.08),
            deepgemm_topk=_m(0.194, 0.18), torch=_m(1.8)),
        _ic("decode", 64, 131072, ours=_m(0.4), ours_logits=_m(0.30), deepgemm=_m(0.284), deepgemm_topk=_m(0.476)),
        _ic("decode", 32, 32768, ours=_m(0.2), ours_logits=_m(0.2), deepgemm=na, deepgemm_topk=na),
        _ic("prefill", 64, 32768, ours=_m(3.0), ours_logits=_m(2.5), deepgemm=_m(2.13), deepgemm_topk=_m(4.03)),
        _ic("prefill", 32, 32768, ours=_m(3.0), ours_logits=_m(3.0), deepgemm=_m(1.15), deepgemm_topk=_m(3.07)),
    ])

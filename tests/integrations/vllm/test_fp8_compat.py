"""The software-e4m3 router (:mod:`triton_mla_sparse.integrations.vllm.fp8_compat`) against vLLM 0.33's real DSA
kernels (``vllm.models.deepseek_v32.common.kernels``), DeepSeek-V4's (``vllm.models.deepseek_v4.common.ops``) and
DeepSeek-V4.1's (``vllm.models.deepseek_v41.common.ops``, ``vllm.models.deepseek_v41.common.engram``).

The compile cases AOT-build ``_fused_norm_rope_kernel`` and ``_fused_q_kernel`` for sm80 and sm86 with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", cap, 32))`` in every constexpr combination a bf16
DeepSeek-V3.2 / GLM-5 layer reaches on such a GPU (MLA cache none/bfloat16/fp8_ds_mla/fp8, with and without the
indexer, both index-RoPE styles; fused_q with a bf16 query, the only kind our backend takes), and every DeepSeek-V4
kernel that casts to e4m3 (:data:`V4_CASES`: SWA-cache insert and gather, the head-512 compressor stores, the
head-128 indexer compressor, indexer q quant, inverse-RoPE fp8 quant) with the constexprs vLLM's launchers pass for
V4 (head 512 = 448 NoPE + 64 RoPE, 584-byte fp8_ds_mla tokens, quant blocks 64/128), and every DeepSeek-V4.1 kernel
that names e4m3 (:data:`V41_CASES`: compressor cache stores, SWA insert, the gathers, indexer K store, Engram lookup)
as vLLM launches them for V4.1 off SM 10.x (V4's 584-byte record, a 132-byte indexer K token) plus SM 10.x's
MXFP8/NVFP4 records; one of those, the NVFP4 store, cannot be built below SM 10.x (:data:`SM100_ONLY`). They run in
a subprocess (this file run as a script) without Triton's interpreter, with ``CUDA_VISIBLE_DEVICES=""`` so that vLLM
keeps real Triton on a GPU-less host, and with a fresh Triton cache directory. Compile-tested only: none of it runs a
kernel.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ARCHS = (80, 86)
MODELS = {  # q_lora_rank, index heads, attention heads per GPU at TP 8
    "dsv32": dict(q_dim=1536, index_heads=64, heads=16),
    "glm5": dict(q_dim=2048, index_heads=32, heads=8),
}
CACHES = ("none", "bfloat16", "fp8_ds_mla", "fp8", "fp8-scaled")
# e4m3 encodes (cvt.rn.satfinite.e4m3x2.f32) and decodes (cvt.rn.f16x2.e4m3x2)
E4M3_CVT = re.compile(r"cvt\.[a-z0-9.]*e4m3")


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def norm_rope_case(model: str, cache: str, has_indexer: bool, interleave: bool) -> tuple[dict, dict]:
    """(signature, constexprs) of the launch ``fused_norm_rope`` makes for this layer (bf16 activations)."""
    m = MODELS[model]
    with_cache = cache != "none"
    ds_mla = cache == "fp8_ds_mla"
    fp8 = cache.startswith("fp8") and not ds_mla
    none = "constexpr"
    sig = {
        "pos_ptr": "*i64", "q_c_ptr": "*bf16", "q_c_stride": "i32", "q_rms_norm_w_ptr": "*bf16",
        "q_rms_eps": "fp32", "q_c_out_ptr": "*bf16", "q_c_out_stride": "i32",
        "kv_ptr": "*bf16", "kv_stride": "i32", "kv_rms_norm_w_ptr": "*bf16", "kv_rms_eps": "fp32",
        "kv_out_ptr": "*bf16", "kv_out_stride": "i32",
        "kpe_ptr": "*bf16", "kpe_stride": "i32", "kpe_rope_cos_sin_cache_ptr": "*bf16",
        "kpe_rope_cos_sin_cache_stride": "i32", "kpe_out_ptr": "*bf16", "kpe_out_stride": "i32",
        "index_k_ptr": "*bf16", "index_k_stride": "i32", "index_k_layer_norm_w_ptr": "*fp32",
        "index_k_layer_norm_bias_ptr": "*fp32", "index_k_layer_norm_eps": "fp32",
        "index_k_rope_cos_sin_cache_ptr": "*bf16", "index_k_rope_cos_sin_cache_stride": "i32",
        "index_k_out_ptr": none, "index_k_out_stride": "i32",
        "slot_mapping_ptr": "*i64" if with_cache else none,
        "indexer_slot_mapping_ptr": "*i64" if with_cache and has_indexer else none,
        "indexer_cache_ptr": "*fp8e4nv" if with_cache and has_indexer else none,
        "indexer_cache_scale_ptr": "*fp32" if with_cache and has_indexer else none,
        "indexer_cache_block_size": "i32", "indexer_cache_stride": "i32",
        "mla_cache_ptr": "*fp8e4nv" if with_cache and (ds_mla or fp8) else "*bf16",
        "mla_cache_block_stride": "i32", "mla_cache_entry_stride": "i32",
        "mla_cache_scale_ptr": "*fp32", "mla_cache_ds_scale_ptr": "*fp32", "mla_cache_ds_rope_ptr": "*bf16",
        "topk_indices_ptr": "*i32", "topk_indices_stride": "i32",
    }
    const = {
        "index_k_out_ptr": None,
        "Q_DIM": m["q_dim"], "Q_BLOCK_SIZE": _next_pow2(m["q_dim"]), "KV_DIM": 512, "KPE_HALF_ROT_DIM": 32,
        "INDEX_K_DIM": 128, "INDEX_K_BLOCK_SIZE": 128, "INDEX_K_HALF_ROT_DIM": 32,
        "INDEXER_CACHE_SHUFFLE": False, "INDEXER_CACHE_BLOCK_TILE": 16, "INDEXER_CACHE_HEAD_TILE": 16,
        "INDEXER_CACHE_MX_SCALE": False,
        "MLA_CACHE_BLOCK_SIZE": 64 if with_cache else 1, "MLA_CACHE_FP8": fp8, "SKIP_MLA_SCALE": cache == "fp8",
        "MLA_CACHE_DS_MLA": ds_mla, "MLA_CACHE_NVFP4": False, "MLA_NUM_TILES": 4 if ds_mla else 1,
        "MLA_TILE_DIM": 128 if ds_mla else 1,
        "TOPK": 2048, "TOPK_BLOCK_SIZE": 1024, "HAS_INDEXER": has_indexer, "INDEX_ROPE_INTERLEAVE": interleave,
        "USE_PDL": False, "FP8_MAX": 448.0, "USE_FNUZ": False,
    }
    for name, ty in sig.items():
        if ty == none:
            const.setdefault(name, None)
    return sig, const


def fused_q_case(model: str, has_indexer: bool, interleave: bool) -> tuple[dict, dict]:
    """(signature, constexprs) of the launch ``fused_q`` makes with a bf16 query (``quantize_mqa=False``)."""
    m = MODELS[model]
    sig = {
        "pos_ptr": "*i64", "q_pe_ptr": "*bf16", "q_pe_stride0": "i32", "q_pe_stride1": "i32",
        "q_pe_cos_sin_ptr": "*bf16", "q_pe_cos_sin_stride": "i32",
        "index_q_ptr": "*bf16", "index_q_stride0": "i32", "index_q_stride1": "i32",
        "index_q_cos_sin_ptr": "*bf16", "index_q_cos_sin_stride": "i32",
        "index_q_fp8_ptr": "*fp8e4nv", "index_q_fp8_stride0": "i32", "index_q_fp8_stride1": "i32",
        "ql_nope_ptr": "*bf16", "ql_nope_stride0": "i32", "ql_nope_stride1": "i32",
        "mqa_q_fp8_ptr": "*bf16", "mqa_q_fp8_stride0": "i32", "mqa_q_fp8_stride1": "i32", "q_scale_ptr": "*fp32",
        "q_pe_out_ptr": "*bf16", "q_pe_out_stride0": "i32", "q_pe_out_stride1": "i32",
        "index_weights_ptr": "*bf16" if has_indexer else "*fp32", "index_weights_stride": "i32",
        "index_weights_softmax_scale": "fp32", "index_weights_head_scale": "fp32",
        "index_weights_out_ptr": "*fp32", "index_weights_out_stride": "i32",
    }
    const = {
        "NUM_Q_HEADS": m["heads"], "Q_PE_HALF_ROT_DIM": 32, "NUM_INDEX_Q_HEADS": m["index_heads"] if has_indexer else 1,
        "INDEX_Q_HALF_ROT_DIM": 32, "INDEX_Q_HEAD_DIM": 128 if has_indexer else 1, "QL_NOPE_DIM": 512,
        "QL_NOPE_BLOCK": 512, "HAS_INDEXER": has_indexer, "INDEX_ROPE_INTERLEAVE": interleave,
        "QUANTIZE_MQA": False, "USE_PDL": False, "FP8_MAX": 448.0, "USE_FNUZ": False,
    }
    return sig, const


def all_cases() -> list[tuple[str, str, tuple]]:
    """(id, kernel, case args) of every combination."""
    out = []
    for model in MODELS:
        for ix in (True, False):
            for il in ((False, True) if model == "glm5" else (False,)):  # DeepSeek-V3.2's index RoPE is NeoX
                for cache in CACHES:
                    out.append((f"norm_rope-{model}-{cache}-ix{int(ix)}-il{int(il)}", "norm_rope",
                                (model, cache, ix, il)))
                out.append((f"fused_q-{model}-ix{int(ix)}-il{int(il)}", "fused_q", (model, ix, il)))
    return out


# DeepSeek-V4 (vllm.models.deepseek_v4.common.ops): head dim 512 = 448 fp8 NoPE + 64 bf16 RoPE; the fp8_ds_mla token
# is 576 data bytes + 8 UE8M0 scale bytes (584), a cache block pads block_size * 584 bytes up to a multiple of 576.
V4_OPS = "vllm.models.deepseek_v4.common.ops."


def _v4_block_stride(tokens: int, token_bytes: int, scale_bytes: int, align: int = 576) -> int:
    return -(-tokens * (token_bytes + scale_bytes) // align) * align


def v4_swa_insert_case(block_size: int) -> tuple[dict, dict]:
    """``quantize_and_insert_k_cache`` (cache_utils): the SWA K-cache insert, UE8M0 quant block 64."""
    sig = {"k_ptr": "*bf16", "slot_mapping_ptr": "*i64", "k_cache_ptr": "*u8", "num_tokens": "i32"}
    const = dict(input_dim=512, fp8_dim=448, bf16_dim=64, scale_dim=8, quant_block=64, cache_block_size=block_size,
                 token_data_size=576, block_stride=_v4_block_stride(block_size, 576, 8), fp8_max=448.0,
                 n_quant_blocks=8, use_fnuz=False)
    return sig, const


def v4_gather_case(block_size: int, has_gather_lens: bool) -> tuple[dict, dict]:
    """``DequantizeAndGatherKCacheKernel`` (cache_utils): bitcast of the cache bytes to fp8e4nv, then a decode."""
    sig = {"out_ptr": "*bf16", "out_stride0": "i32", "out_stride1": "i32", "k_cache_ptr": "*u8",
           "seq_lens_ptr": "*i32", "block_table_ptr": "*i32", "offset": "i32",
           "gather_lens_ptr": "*i32" if has_gather_lens else "constexpr"}
    const = dict(max_blocks_per_seq=1024, fp8_dim=448, bf16_dim=64, scale_dim=8, quant_block=64,
                 cache_block_size=block_size, token_data_size=576, block_stride=_v4_block_stride(block_size, 576, 8),
                 output_dim=512, fp8_max=448.0, n_quant_blocks=7, use_fnuz=False)
    if not has_gather_lens:
        const["gather_lens_ptr"] = None
    return sig, const


_V4_COMPRESS_SIG = {
    "state_cache_ptr": "*fp32", "state_cache_stride0": "i32", "state_cache_stride1": "i32",
    "token_to_req_indices_ptr": "*i32", "positions_ptr": "*i64", "slot_mapping_ptr": "*i64",
    "block_table_ptr": "*i32", "block_table_stride": "i32", "block_size": "i32",
    "rms_norm_weight_ptr": "*bf16", "rms_norm_eps": "fp32", "cos_sin_cache_ptr": "*fp32", "cos_sin_stride": "i32",
    "k_cache_ptr": "*u8", "kv_slot_mapping_ptr": "*i64", "kv_cache_block_size": "i32",
}


def v4_compress_case(compress_ratio: int) -> tuple[dict, dict]:
    """``compress_norm_rope_store_triton`` with head 512 (``_fused_kv_compress_norm_rope_insert_sparse_attn``):
    state width = (1 + overlap) * 512, quant block 64, 576-byte token stride, 8 scale bytes; the compressed cache holds
    256 / compress_ratio tokens a block."""
    overlap = compress_ratio == 4
    const = dict(HEAD_SIZE=512, TRITON_BLOCK_SIZE=512, STATE_WIDTH=512 * (1 + overlap), COMPRESS_RATIO=compress_ratio,
                 OVERLAP=overlap, ROPE_HEAD_DIM=64, FP8_MAX=448.0, QUANT_BLOCK=64, TOKEN_STRIDE=576, SCALE_DIM=8,
                 KV_BLOCK_STRIDE=_v4_block_stride(256 // compress_ratio, 576, 8), SANITIZE_CACHE_NANS=False)
    return dict(_V4_COMPRESS_SIG), const


def v4_finalize_case() -> tuple[dict, dict]:
    """The two-stage head-512 compressor's second stage (``_finalize_norm_rope_quant_store_sparse_attn``), cr 128."""
    sig = {"scratch_ptr": "*fp32", "scratch_stride": "i32", "positions_ptr": "*i64", "slot_mapping_ptr": "*i64",
           "rms_norm_weight_ptr": "*bf16", "rms_norm_eps": "fp32", "cos_sin_cache_ptr": "*fp32",
           "cos_sin_stride": "i32", "k_cache_ptr": "*u8", "kv_slot_mapping_ptr": "*i64", "kv_cache_block_size": "i32"}
    const = dict(HEAD_SIZE=512, TRITON_BLOCK_SIZE=512, COMPRESS_RATIO=128, ROPE_HEAD_DIM=64, FP8_MAX=448.0,
                 QUANT_BLOCK=64, TOKEN_STRIDE=576, SCALE_DIM=8, KV_BLOCK_STRIDE=_v4_block_stride(2, 576, 8),
                 SANITIZE_CACHE_NANS=False)
    return sig, const


def v4_indexer_compress_case() -> tuple[dict, dict]:
    """The head-128 indexer compressor (``_fused_kv_compress_norm_rope_insert_indexer_attn``), cr 4 with overlap:
    one quant block of 128, an fp32 scale (``MX_SCALE`` is for SM 10.x), fp8_ds_mla cache alignment 576."""
    const = dict(HEAD_SIZE=128, TRITON_BLOCK_SIZE=128, STATE_WIDTH=256, COMPRESS_RATIO=4, OVERLAP=True,
                 ROPE_HEAD_DIM=64, FP8_MAX=448.0, QUANT_BLOCK=128, TOKEN_STRIDE=128, SCALE_DIM=4,
                 KV_BLOCK_STRIDE=_v4_block_stride(64, 128, 4), MX_SCALE=False)
    return dict(_V4_COMPRESS_SIG), const


def v4_indexer_q_case() -> tuple[dict, dict]:
    """``FusedIndexerQRopeQuantTritonKernel``: 64 index heads of 128 (64 RoPE), OCP e4m3."""
    sig = {"pos_ptr": "*i64", "index_q_ptr": "*bf16", "index_q_stride0": "i32", "index_q_stride1": "i32",
           "index_q_cos_sin_ptr": "*fp32", "index_q_cos_sin_stride": "i32", "index_q_fp8_ptr": "*fp8e4nv",
           "index_q_fp8_stride0": "i32", "index_q_fp8_stride1": "i32", "index_weights_ptr": "*bf16",
           "index_weights_stride": "i32", "index_weights_softmax_scale": "fp32", "index_weights_head_scale": "fp32",
           "index_weights_out_ptr": "*fp32", "index_weights_out_stride": "i32"}
    const = dict(INDEX_Q_HALF_ROT_DIM=32, INDEX_Q_HEAD_DIM=128, FP8_MAX=448.0, USE_FNUZ=False, USE_EXPLICIT_FMA=False)
    return sig, const


def v4_inv_rope_case() -> tuple[dict, dict]:
    """``FusedInvRopeFP8QuantKernel`` as below SM 10.x: 8 heads per o-group, quant group 128 (4 per 512-wide head),
    fp32 scales (no TMA-aligned packing), no PDL."""
    sig = {"o_ptr": "*bf16", "positions_ptr": "*i64", "cos_sin_cache_ptr": "*fp32", "out_ptr": "*fp8e4nv",
           "scale_ptr": "*fp32", "num_tokens": "i32", "o_stride_token": "i32", "o_stride_head": "i32",
           "cache_stride_pos": "i32", "out_stride_group": "i32", "out_stride_token": "i32",
           "scale_stride_group": "i32", "scale_stride_k": "i32"}
    const = dict(heads_per_group=8, fp8_max=448.0, eps=1e-10, QUANT_GROUP_SIZE=128, CHUNKS_PER_HEAD=4, NOPE_DIM=448,
                 HALF_ROPE=32, QUANTIZE=True, TMA_ALIGNED_SCALES=False, launch_pdl=False)
    return sig, const


#: id -> (module, kernel attribute path, case factory, its args, num_warps) for DeepSeek-V4's kernels.
V4_CASES = {
    "v4-swa_insert-bs64": ("cache_utils", "quantize_and_insert_k_kernel", v4_swa_insert_case, (64,), 4),
    "v4-gather-bs64-lens1": ("cache_utils", "DequantizeAndGatherKCacheKernel.kernel", v4_gather_case, (64, True), 4),
    "v4-gather-bs16-lens0": ("cache_utils", "DequantizeAndGatherKCacheKernel.kernel", v4_gather_case, (16, False), 4),
    "v4-compress-cr4": ("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_sparse_attn",
                        v4_compress_case, (4,), 4),
    "v4-compress-cr128": ("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_sparse_attn",
                          v4_compress_case, (128,), 4),
    "v4-compress_finalize-cr128": ("fused_compress_quant_cache", "_finalize_norm_rope_quant_store_sparse_attn",
                                   v4_finalize_case, (), 4),
    "v4-indexer_compress-cr4": ("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_indexer_attn",
                                v4_indexer_compress_case, (), 1),
    "v4-indexer_q": ("fused_indexer_q", "FusedIndexerQRopeQuantTritonKernel.kernel", v4_indexer_q_case, (), 1),
    "v4-inv_rope_fp8": ("fused_inv_rope_fp8_quant", "FusedInvRopeFP8QuantKernel.kernel", v4_inv_rope_case, (), 1),
}


def _kernel(module: str, path: str):
    import importlib

    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)  # a class body's staticmethod comes back as the JITFunction
    assert obj.__module__ == module, (path, obj.__module__)
    return obj


def _v4_kernel(module: str, path: str):
    return _kernel(V4_OPS + module, path)


# DeepSeek-V4.1 (vllm.models.deepseek_v41) off SM 10.x writes V4's 584-byte fp8_ds_mla record (448 e4m3 + 64 bf16,
# then 8 UE8M0 scale bytes) in pages padded to a multiple of 576 bytes; the sliding-window cache holds 32 tokens a
# block, the compressed and indexer caches 128 / compress_ratio off SM 9.0 (64-token kernel blocks on SM 9.0; V4.1
# compresses by 1 or 2). The indexer K cache is 128 e4m3 + one fp32 scale (132 bytes) a token. The MXFP8
# (528-byte) and NVFP4 (288-byte) records are SM 10.x's; their kernels are compile-tested too.
V41 = "vllm.models.deepseek_v41."
V41_BLOCK = 128
V41_SWA_BLOCK = 32
# Engram geometry is not in vLLM: 8 hash heads x 3 n-gram orders (2..4) of 256 dims (a public V4.1 reference's
# defaults), UE8M0 scales per 32 dims, 2 Engram layers.
V41_ENGRAM = dict(cols=24, dim=256, quant_block=32, layers=2)


def v41_rope_insert_case(compress_ratio: int, record: int) -> tuple[dict, dict]:
    """``rope_quant_insert`` into a paged uint8 cache (fused_compress_quant_cache): ``_rope_quant_insert_kernel`` for
    the 584-byte record, ``_rope_quant_insert_mxfp8_kernel`` (528) and ``_rope_quant_insert_nvfp4_kernel`` (288)
    for SM 10.x's; 128 / compress_ratio tokens a page."""
    tokens = V41_BLOCK // compress_ratio
    stride = _v4_block_stride(tokens, 576, 8) if record == 584 else _v4_block_stride(tokens, record, 0, align=512)
    sig = {"latent": "*bf16", "positions": "*i64", "cos_sin": "*fp32", "cache": "*u8", "cache_slots": "*i64"}
    const = dict(COS_STRIDE=64, CACHE_STRIDE=stride, CACHE_BLOCK=tokens, COMPRESS_RATIO=compress_ratio,
                 SANITIZE_CACHE_NANS=False)
    return sig, const


def v41_rope_plain_fp8_case(compress_ratio: int) -> tuple[dict, dict]:
    """``rope_quant_insert`` into a plain-row per-tensor-fp8 cache (``_rope_plain_insert_kernel``, STORE_FP8)."""
    tokens = V41_BLOCK // compress_ratio
    sig = {"latent": "*bf16", "positions": "*i64", "cos_sin": "*fp32", "cache": "*fp8e4nv", "cache_slots": "*i64",
           "fp8_scale": "*fp32"}
    const = dict(COS_STRIDE=64, CACHE_STRIDE=tokens * 512, ROW_STRIDE=512, CACHE_BLOCK=tokens,
                 COMPRESS_RATIO=compress_ratio, STORE_FP8=True)
    return sig, const


def v41_swa_insert_case(block_size: int) -> tuple[dict, dict]:
    """V4.1's ``quantize_and_insert_k_cache`` (cache_utils), 584-byte record: as V4's."""
    return v4_swa_insert_case(block_size)


def v41_swa_insert_mxfp8_case(block_size: int) -> tuple[dict, dict]:
    """``_quantize_and_insert_k_mxfp8_kernel``: SM 10.x's 528-byte record (512 e4m3, 16 UE8M0 scales of 32)."""
    sig = {"k_ptr": "*bf16", "slot_mapping_ptr": "*i64", "k_cache_ptr": "*u8", "num_tokens": "i32"}
    const = dict(head_dim=512, scale_dim=16, quant_block=32, cache_block_size=block_size,
                 block_stride=_v4_block_stride(block_size, 528, 0, align=512), fp8_max=448.0, use_fnuz=False)
    return sig, const


_V41_GATHER_SIG = {"out_ptr": "*bf16", "out_stride0": "i32", "out_stride1": "i32", "k_cache_ptr": "*u8",
                   "seq_lens_ptr": "*i32", "block_table_ptr": "*i32", "offset": "i32", "gather_lens_ptr": "*i32"}


def v41_gather_case(block_size: int, has_gather_lens: bool) -> tuple[dict, dict]:
    """V4.1's ``dequantize_and_gather_k_cache_triton``, 584-byte record (``_dequantize_and_gather_k_kernel`` on CUDA,
    ``_dequantize_and_gather_k_one_pass_kernel`` on ROCm): the compressed cache without gather lengths, the SWA
    cache with."""
    sig = dict(_V41_GATHER_SIG)
    const = dict(max_blocks_per_seq=1024, fp8_dim=448, bf16_dim=64, scale_dim=8, quant_block=64,
                 cache_block_size=block_size, token_data_size=576, block_stride=_v4_block_stride(block_size, 576, 8),
                 output_dim=512, fp8_max=448.0, n_quant_blocks=7, use_fnuz=False)
    if not has_gather_lens:
        sig["gather_lens_ptr"] = "constexpr"
        const["gather_lens_ptr"] = None
    return sig, const


def v41_gather_sm100_case(record: int, block_size: int) -> tuple[dict, dict]:
    """The gathers of SM 10.x's records: ``_dequantize_and_gather_k_mxfp8_kernel`` (528: 16 UE8M0 scales of 32) and
    ``_dequantize_and_gather_k_nvfp4_kernel`` (288: e2m1 pairs decoded with integer operations, 32 e4m3 scales of
    16 bitcast and decoded)."""
    stride = _v4_block_stride(block_size, record, 0, align=512)
    const = dict(max_blocks_per_seq=1024, head_dim=512, scale_dim=16 if record == 528 else 32,
                 quant_block=32 if record == 528 else 16, cache_block_size=block_size, block_stride=stride)
    if record == 528:
        const["use_fnuz"] = False
    return dict(_V41_GATHER_SIG), const


def v41_indexer_k_store_case(compress_ratio: int) -> tuple[dict, dict]:
    """``indexer_k_norm_rope_store`` (indexer_k_store) with the FP8 indexer cache (vLLM's default): 128 e4m3 and one
    fp32 scale (``MX_SCALE`` is SM 10.x's), row-major (``SHUFFLE`` is ROCm's), 576-aligned pages."""
    tokens = V41_BLOCK // compress_ratio
    sig = {"k_pre_ptr": "*bf16", "k_pre_stride": "i32", "positions_ptr": "*i64", "rms_norm_weight_ptr": "*bf16",
           "rms_norm_eps": "fp32", "cos_sin_cache_ptr": "*fp32", "cos_sin_stride": "i32", "k_cache_ptr": "*u8",
           "kv_slot_mapping_ptr": "*i64", "kv_cache_block_size": "i32"}
    const = dict(HEAD_SIZE=128, ROPE_HEAD_DIM=64, COMPRESS_RATIO=compress_ratio, TOKEN_STRIDE=128, SCALE_DIM=4,
                 KV_BLOCK_STRIDE=_v4_block_stride(tokens, 128, 4), FP8_MAX=448.0, USE_FP4=False, MX_SCALE=False,
                 SHUFFLE=False, BLOCK_TILE_SIZE=16, HEAD_TILE_SIZE=16)
    return sig, const


def v41_engram_lookup_case(layout: str) -> tuple[dict, dict]:
    """``ParallelEngramEmbedding.lookup`` (engram ``_engram_lookup_kernel``): ``tp8`` reads this rank's 3 heads of an
    e4m3 table (HBM or pinned host) into bf16; ``peer`` (TP 1, DP 8, GPU tables in symmetric memory) reads all 24
    through a table of peer addresses cast to an fp8e4nv pointer; ``packed`` (EngramBatch, TP 1, DP 8, SM 10.x's
    MXFP8 wkv) copies the bytes and scales. SORTED is a runtime flag on CUDA."""
    e = V41_ENGRAM
    local = e["cols"] if layout == "peer" else e["cols"] // 8
    packed = layout == "packed"
    sig = {"weight": "*i64" if layout == "peer" else "*fp8e4nv", "scales": "*u8", "ids": "*i32",
           "sorted_dst": "*i32", "out": "*u8" if packed else "*bf16", "vocab_start": "i32", "vocab_end": "i32",
           "num_rows": "i32", "ids_stride_t": "i32", "ids_stride_h": "i32", "GRID": "i32", "SORTED": "i1"}
    width = e["dim"] + e["dim"] // e["quant_block"]
    const = dict(HEAD_START=local if layout == "tp8" else 0, LOCAL_HEADS=local, TOTAL_HEADS=e["cols"], DIM=e["dim"],
                 QUANT_BLOCK=e["quant_block"], BLOCK_R=16, PACKED=packed,
                 OUT_STRIDE=e["layers"] * local * width if packed else local * e["dim"],
                 PEER_ROWS=-(-e["cols"] * 1_000_003 // 8) if layout == "peer" else 0)
    return sig, const


#: id -> (module under vllm.models.deepseek_v41, kernel attribute path, case factory, its args, num_warps).
V41_CASES = {
    "v41-compress_insert-cr1": ("common.ops.fused_compress_quant_cache", "_rope_quant_insert_kernel",
                                v41_rope_insert_case, (1, 584), 4),
    "v41-compress_insert-cr2": ("common.ops.fused_compress_quant_cache", "_rope_quant_insert_kernel",
                                v41_rope_insert_case, (2, 584), 4),
    "v41-compress_insert_plain_fp8-cr2": ("common.ops.fused_compress_quant_cache", "_rope_plain_insert_kernel",
                                          v41_rope_plain_fp8_case, (2,), 4),
    "v41-compress_insert_mxfp8-cr2": ("common.ops.fused_compress_quant_cache", "_rope_quant_insert_mxfp8_kernel",
                                      v41_rope_insert_case, (2, 528), 4),
    "v41-compress_insert_nvfp4-cr2": ("common.ops.fused_compress_quant_cache", "_rope_quant_insert_nvfp4_kernel",
                                      v41_rope_insert_case, (2, 288), 4),
    "v41-swa_insert-bs32": ("common.ops.cache_utils", "quantize_and_insert_k_kernel", v41_swa_insert_case,
                            (V41_SWA_BLOCK,), 4),
    "v41-swa_insert_mxfp8-bs32": ("common.ops.cache_utils", "_quantize_and_insert_k_mxfp8_kernel",
                                  v41_swa_insert_mxfp8_case, (V41_SWA_BLOCK,), 4),
    "v41-gather-bs32-lens1": ("common.ops.cache_utils", "_dequantize_and_gather_k_kernel", v41_gather_case,
                              (V41_SWA_BLOCK, True), 4),
    "v41-gather-bs64-lens0": ("common.ops.cache_utils", "_dequantize_and_gather_k_kernel", v41_gather_case,
                              (V41_BLOCK // 2, False), 4),
    "v41-gather_one_pass-bs32-lens1": ("common.ops.cache_utils", "_dequantize_and_gather_k_one_pass_kernel",
                                       v41_gather_case, (V41_SWA_BLOCK, True), 4),
    "v41-gather_mxfp8-bs32": ("common.ops.cache_utils", "_dequantize_and_gather_k_mxfp8_kernel",
                              v41_gather_sm100_case, (528, V41_SWA_BLOCK), 4),
    "v41-gather_nvfp4-bs64": ("common.ops.cache_utils", "_dequantize_and_gather_k_nvfp4_kernel",
                              v41_gather_sm100_case, (288, V41_BLOCK // 2), 4),
    "v41-indexer_k_store-cr1": ("common.ops.indexer_k_store", "_indexer_k_norm_rope_quant_store_kernel",
                                v41_indexer_k_store_case, (1,), 1),
    "v41-indexer_k_store-cr2": ("common.ops.indexer_k_store", "_indexer_k_norm_rope_quant_store_kernel",
                                v41_indexer_k_store_case, (2,), 1),
    "v41-engram_lookup-tp8": ("common.engram", "_engram_lookup_kernel", v41_engram_lookup_case, ("tp8",), 4),
    "v41-engram_lookup-peer": ("common.engram", "_engram_lookup_kernel", v41_engram_lookup_case, ("peer",), 4),
    "v41-engram_lookup-packed": ("common.engram", "_engram_lookup_kernel", v41_engram_lookup_case, ("packed",), 4),
}


def _compile(kernel, sig: dict, const: dict, arch: int, num_warps: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = [p.name for p in kernel.params]
    full = {n: ("constexpr" if n in const else sig[n]) for n in names}
    consts = {(names.index(k),): v for k, v in const.items()}
    src = ASTSource(fn=kernel, signature=full, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps))


def _scan(package: str) -> None:
    """Subprocess entry ``scan PACKAGE``: one JSON row per ``@triton.jit`` function reachable from the package's
    modules (module level or a class body's; a kernel made inside a function is not reachable), with whether its
    source names ``float8e4nv`` and uses ``tl.cast``."""
    import importlib
    import inspect
    import pkgutil

    import triton

    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__, package + "."):
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            found = [(name, obj)]
            if inspect.isclass(obj) and obj.__module__ == info.name:
                found = [(f"{name}.{a}", getattr(obj, a)) for a in vars(obj)]
            for path, fn in found:
                if isinstance(fn, triton.runtime.jit.JITFunction) and fn.__module__ == info.name:
                    # the definition's name (a class attribute may alias a module-level kernel)
                    path = fn.fn.__qualname__.replace("<locals>.", "")
                    print(json.dumps(dict(module=info.name, path=path, e4nv="float8e4nv" in fn.src,
                                          tl_cast="tl.cast(" in fn.src)), flush=True)


def _main(argv: list[str]) -> None:
    """Subprocess entry: ``MODE ARCHS CASE_IDS`` (MODE: off | auto | always; comma-separated lists)."""
    if argv[0] == "scan":
        return _scan(argv[1])
    mode, archs, ids = argv[0], [int(a) for a in argv[1].split(",")], set(argv[2].split(","))
    import vllm.models.deepseek_v32.common.kernels as k

    from triton_mla_sparse.integrations.vllm import fp8_compat

    if mode == "auto":  # this GPU-less host is no CUDA platform; on an A100 it is
        from vllm.platforms import current_platform

        current_platform.is_cuda = lambda: True
    if mode != "off":
        assert fp8_compat.install(mode), "the router did not install"
    kernels = {"norm_rope": (k._fused_norm_rope_kernel, norm_rope_case, 4),
               "fused_q": (k._fused_q_kernel, fused_q_case, 1)}
    todo = [(cid, *kernels[kname], args) for cid, kname, args in all_cases()]
    if "all" in ids or any(i.startswith("v4-") for i in ids):
        todo += [(cid, _v4_kernel(mod, path), make, warps, args)
                 for cid, (mod, path, make, args, warps) in V4_CASES.items() if cid in ids or "all" in ids]
    if "all" in ids or any(i.startswith("v41-") for i in ids):
        todo += [(cid, _kernel(V41 + mod, path), make, warps, args)
                 for cid, (mod, path, make, args, warps) in V41_CASES.items() if cid in ids or "all" in ids]
    for cid, fn, make, warps, args in todo:
        if cid not in ids and "all" not in ids:
            continue
        for arch in archs:
            row = dict(id=cid, arch=arch)
            printed = io.StringIO()  # where ptxas fails, Triton prints the PTX it was given
            try:
                with contextlib.redirect_stdout(printed):
                    c = _compile(fn, *make(*args), arch=arch, num_warps=warps)
                ptx = c.asm["ptx"]
                row.update(ok=True, e4m3_cvt=len(E4M3_CVT.findall(ptx)), traps=ptx.count("trap;"),
                           hash=c.hash)
            except Exception as e:  # noqa: BLE001 - a failed build is the result
                ptx = printed.getvalue()
                row.update(ok=False, error=f"{type(e).__name__}: {e}"[-1500:], ptx=f".target sm_{arch}" in ptx,
                           e4m3_cvt=len(E4M3_CVT.findall(ptx)))
            print(json.dumps(row), flush=True)


def run_compiles(mode: str, archs, ids, cache_dir) -> list[dict]:
    """The rows of one subprocess per arch (run side by side)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_MLA_SPARSE_SOFT_FP8")}
    env.update(CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=str(cache_dir))
    procs = [subprocess.Popen([sys.executable, __file__, mode, str(a), ",".join(ids)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for a in archs]
    rows = []
    for p in procs:
        out, err = p.communicate(timeout=1500)
        got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert got, f"no result from the compile subprocess (rc {p.returncode}):\n{err[-3000:]}"
        rows += got
    return rows


ALL_IDS = [c[0] for c in all_cases()] + list(V4_CASES) + list(V41_CASES)
#: Cases whose routed build gets through Triton's front end but that ptxas refuses below SM 10.x for something other
#: than an e4m3 cast, with its message: the NVFP4 compressor store packs e2m1 with inline
#: ``cvt.rn.satfinite.e2m1x2.f32`` (V4.1 takes the NVFP4 record only on SM 10.x).
SM100_ONLY = {"v41-compress_insert_nvfp4-cr2": "Instruction 'cvt with .e2m1x2' not supported on .target"}


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    rows = run_compiles("auto", ARCHS, ["all"], tmp_path_factory.mktemp("triton-cache"))
    return {(r["id"], r["arch"]): r for r in rows}


@pytest.mark.parametrize("arch", ARCHS, ids=[f"sm{a}" for a in ARCHS])
@pytest.mark.parametrize("cid", ALL_IDS)
def test_routed_kernels_compile_without_native_e4m3(routed, cid, arch):
    row = routed.get((cid, arch))
    assert row is not None, f"{cid} sm{arch}: no result"
    if cid in SM100_ONLY:  # ptxas stops it; the PTX it got holds no e4m3 conversion
        assert not row["ok"] and SM100_ONLY[cid] in row["error"] and "fp8e4nv" not in row["error"], row
        assert row["ptx"] and row["e4m3_cvt"] == 0, row
        return
    assert row["ok"], f"{cid} sm{arch}: {row.get('error')}"
    assert row["e4m3_cvt"] == 0 and row["traps"] == 0, row


def test_without_the_router_the_same_builds_fail(tmp_path):
    ids = ["norm_rope-dsv32-fp8_ds_mla-ix1-il0", "fused_q-dsv32-ix1-il0", "norm_rope-glm5-bfloat16-ix1-il1"]
    ids += list(V4_CASES) + list(V41_CASES)  # every DeepSeek-V4 and V4.1 case
    rows = run_compiles("off", [80], ids, tmp_path)
    assert len(rows) == len(ids)
    for r in rows:
        assert not r["ok"], f"{r['id']} compiled for sm80 without the router"
        assert "fp8e4nv not supported in this architecture" in r["error"], r["error"]


def test_cache_keys_differ_between_routed_and_native_builds(tmp_path):
    """sm90 builds the casts natively; ``always`` routes them: same source and options, different cache entries.
    (The V4 SWA gather is the decode side: bitcast to fp8e4nv, then fp8e4nv -> float32.)"""
    ids = ["fused_q-dsv32-ix1-il0", "v4-gather-bs64-lens1", "v4-inv_rope_fp8", "v41-engram_lookup-peer"]
    native = run_compiles("auto", [90], ids, tmp_path)  # auto leaves sm90 alone
    soft = {r["id"]: r for r in run_compiles("always", [90], ids, tmp_path)}  # the same cache directory
    assert len(native) == len(soft) == len(ids)
    for n in native:
        s = soft[n["id"]]
        assert n["ok"] and s["ok"], (n, s)
        assert n["e4m3_cvt"] > 0 and s["e4m3_cvt"] == 0, (n, s)
        assert n["hash"] != s["hash"]


def test_every_v4_kernel_that_casts_to_e4m3_is_routed_and_compile_tested():
    """Every ``@triton.jit`` function of ``vllm.models.deepseek_v4.common.ops`` whose source names ``float8e4nv``
    lives in a routed module, has a compile case above, and casts with ``.to`` only (``tl.cast`` is not routed)."""
    from triton_mla_sparse.integrations.vllm.fp8_compat import ROUTED_MODULES

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    env.update(CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, __file__, "scan", V4_OPS.rstrip(".")], capture_output=True, text=True,
                          env=env, timeout=600)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert rows, proc.stderr[-3000:]
    casting = {(r["module"], r["path"]) for r in rows if r["e4nv"]}
    tested = {(V4_OPS + mod, path) for mod, path, *_ in V4_CASES.values()}
    assert casting == tested, (casting, tested)
    assert {m for m, _ in casting} <= set(ROUTED_MODULES)
    assert "vllm.models.deepseek_v32.common.kernels" in ROUTED_MODULES
    assert not [r for r in rows if r["tl_cast"]]


def _source_scan(package: str) -> tuple[list[dict], list[str]]:
    """Every ``@triton.jit`` function defined in the package's source files (read, not imported: nested kernels and
    modules that do not import on this host count too), as rows like :func:`_scan`'s, and the places where
    ``triton.jit`` is called other than as a decorator (a kernel made so would escape the scan)."""
    top = package.split(".")[0]
    root = pathlib.Path(importlib.util.find_spec(top).origin).parent.joinpath(*package.split(".")[1:])
    assert root.is_dir(), root

    def is_jit(node) -> bool:
        f = node.func if isinstance(node, ast.Call) else node
        return (isinstance(f, ast.Attribute) and f.attr == "jit") or (isinstance(f, ast.Name) and f.id == "jit")

    rows, calls = [], []
    for file in sorted(root.rglob("*.py")):
        module = ".".join([package, *file.relative_to(root).with_suffix("").parts]).removesuffix(".__init__")
        src = file.read_text()
        tree = ast.parse(src)
        decorators = set()

        def walk(node, qual, src=src, module=module, decorators=decorators):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    path = [*qual, child.name]
                    decorators.update(id(d) for d in child.decorator_list)
                    if not isinstance(child, ast.ClassDef) and any(is_jit(d) for d in child.decorator_list):
                        text = ast.get_source_segment(src, child)
                        rows.append(dict(module=module, path=".".join(path), e4nv="float8e4nv" in text,
                                         tl_cast="tl.cast(" in text))
                    walk(child, path)
                else:
                    walk(child, qual)

        walk(tree, [])
        calls += [f"{module}:{n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and is_jit(n) and id(n) not in decorators]
    return rows, calls


def test_every_v41_kernel_that_casts_to_e4m3_is_routed_and_compile_tested():
    """Every ``@triton.jit`` function under ``vllm.models.deepseek_v41`` whose source names ``float8e4nv`` lives in a
    routed module, has a compile case above (:data:`V41_CASES`), and casts with ``.to`` only."""
    from triton_mla_sparse.integrations.vllm.fp8_compat import ROUTED_MODULES

    rows, calls = _source_scan(V41.rstrip("."))
    assert len(rows) > 30 and not calls, (len(rows), calls)
    casting = {(r["module"], r["path"]) for r in rows if r["e4nv"]}
    tested = {(V41 + mod, path) for mod, path, *_ in V41_CASES.values()}
    assert casting == tested, (casting ^ tested)
    assert {m for m, _ in casting} <= set(ROUTED_MODULES)
    assert not [r for r in rows if r["e4nv"] and r["tl_cast"]]


# In-process tests of the switch (no compile: the interpreter is on in this tier).


@pytest.fixture
def fc(monkeypatch):
    from triton_mla_sparse.integrations.vllm import fp8_compat

    monkeypatch.delenv("TRITON_MLA_SPARSE_SOFT_FP8", raising=False)
    fp8_compat.uninstall()
    yield fp8_compat
    fp8_compat.uninstall()


def test_mode_env(fc, monkeypatch):
    from triton_mla_sparse.integrations.vllm.policy import soft_fp8_mode

    assert soft_fp8_mode() == "auto"
    monkeypatch.setenv("TRITON_MLA_SPARSE_SOFT_FP8", " Always ")
    assert soft_fp8_mode() == "always"
    monkeypatch.setenv("TRITON_MLA_SPARSE_SOFT_FP8", "sometimes")
    with pytest.raises(ValueError, match=r"TRITON_MLA_SPARSE_SOFT_FP8: expected one of \('auto', 'always', 'off'\)"):
        soft_fp8_mode()
    from triton_mla_sparse.integrations.vllm import register

    with pytest.raises(ValueError, match="TRITON_MLA_SPARSE_SOFT_FP8"):
        register()


def _interpreted() -> bool:
    import triton

    from triton_mla_sparse._common.fp8 import f32_to_e4m3

    return not isinstance(f32_to_e4m3, triton.runtime.jit.JITFunction)


def test_under_the_interpreter_it_refuses_with_one_warning(fc, caplog):
    if not _interpreted():
        pytest.skip("Triton's interpreter is off")
    with caplog.at_level("WARNING", logger="vllm.plugins.triton_mla_sparse"):
        assert not fc.install("always") and not fc.install("always")
    assert not fc.installed()
    assert sum("not routing vLLM's DSA fp8 casts" in r.message for r in caplog.records) <= 1


def test_the_routed_decode_keeps_nan(fc):
    """The fp8e4nv -> float side of the router (interpreter): exact on every finite byte, NaN codes stay NaN."""
    if not _interpreted():
        pytest.skip("needs Triton's interpreter")
    import torch
    import triton
    import triton.language as tl

    global _routed_decode
    _routed_decode = fc._e4m3_decode  # the interpreter resolves a kernel's names in its module, not its closure

    @triton.jit
    def decode_all(dst):
        o = tl.arange(0, 256)
        tl.store(dst + o, _routed_decode(o.to(tl.uint8)))

    out = torch.zeros(256)
    decode_all[(1,)](out)
    ref = torch.arange(256).to(torch.uint8).view(torch.float8_e4m3fn).float()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and int(torch.isnan(out).sum()) == 2
    keep = ~torch.isnan(ref)
    assert torch.equal(out[keep], ref[keep]) and torch.equal(torch.signbit(out[keep]), torch.signbit(ref[keep]))


def test_routes_only_routed_modules_and_targets(fc):
    from types import SimpleNamespace

    kernel = SimpleNamespace(__module__="vllm.models.deepseek_v32.common.kernels")
    v4 = SimpleNamespace(__module__="vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant")
    v4_other = SimpleNamespace(__module__="vllm.models.deepseek_v4.common.ops.save_partial_states")
    v41 = SimpleNamespace(__module__="vllm.models.deepseek_v41.common.engram")
    v41_other = SimpleNamespace(__module__="vllm.models.deepseek_v41.common.ops.query_quant")
    other = SimpleNamespace(__module__="vllm.v1.attention.ops.triton_decode_attention")
    sm = {a: SimpleNamespace(arch=f"sm{a}") for a in (80, 86, 89, 90)}
    hip = SimpleNamespace(arch="gfx942")
    assert not any(fc.routes(kernel, o) for o in sm.values())  # not installed: mode off
    fc.state.mode = "auto"
    assert [fc.routes(kernel, sm[a]) for a in (80, 86, 89, 90)] == [True, True, False, False]
    assert [fc.routes(v4, sm[a]) for a in (80, 86, 89, 90)] == [True, True, False, False]
    assert [fc.routes(v41, sm[a]) for a in (80, 86, 89, 90)] == [True, True, False, False]
    assert not fc.routes(v4_other, sm[80]) and not fc.routes(v41_other, sm[80])
    assert not fc.routes(other, sm[80]) and not fc.routes(kernel, hip)
    fc.state.mode = "always"
    assert all(fc.routes(kernel, o) for o in sm.values()) and not fc.routes(other, sm[90])
    assert not fc.routes(kernel, hip)


def test_auto_installs_only_on_cuda(fc, monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda", lambda: False)
    assert not fc.install("auto") and not fc.installed()
    assert not fc.install("off") and not fc.installed()


def test_register_with_off_installs_nothing(fc, monkeypatch):
    from triton_mla_sparse.integrations.vllm import register

    monkeypatch.setenv("TRITON_MLA_SPARSE_SOFT_FP8", "off")
    register()
    assert not fc.installed()


_SCRIPT = r"""
import json, sys
import triton, triton.language as tl
import triton.compiler.compiler as cc
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_mla_sparse.integrations.vllm import fp8_compat, register

@triton.jit
def cast_kernel(x, o):
    i = tl.arange(0, 128)
    tl.store(o + i, tl.load(x + i).to(tl.float8e4nv))

@triton.jit
def plain_kernel(x, o):
    i = tl.arange(0, 128)
    tl.store(o + i, tl.load(x + i).to(tl.float16))

def build(fn, out_ty):
    return triton.compile(ASTSource(fn, {"x": "*fp32", "o": out_ty}), target=GPUTarget("cuda", 80, 32))

def hooks():
    return (cc.ASTSource.make_ir, tl.core.tensor.to, cc.get_cache_key)

res = {}
before = hooks()
plain = build(plain_kernel, "*fp16")
register()  # TRITON_MLA_SPARSE_SOFT_FP8=always
res["installed"] = fp8_compat.installed() and fp8_compat.state.mode == "always"
after = hooks()
res["patched"] = all(getattr(f, fp8_compat._MARK, False) for f in after)
register()
res["idempotent"] = fp8_compat.install("always") and hooks() == after
again = build(plain_kernel, "*fp16")
res["plain_same"] = again.asm["ptx"] == plain.asm["ptx"] and again.hash == plain.hash
try:
    build(cast_kernel, "*fp8e4nv")
    res["cast"] = "compiled"
except Exception as e:
    res["cast"] = str(e)
fp8_compat.uninstall()
res["restored"] = hooks() == before
print(json.dumps(res))
"""


def test_register_installs_it_idempotently_and_unrouted_kernels_are_unaffected(tmp_path):
    """In a process without the interpreter: ``register()`` with ``always`` installs the hooks once; a kernel
    outside the routed module that casts to fp8e4nv still fails on sm80 with Triton's own error, and one that does
    not cast builds the same bytes under the same cache key; ``uninstall`` restores Triton's functions."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    env.update(CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=str(tmp_path), TRITON_MLA_SPARSE_SOFT_FP8="always")
    script = tmp_path / "unrouted.py"  # @triton.jit needs its source in a file
    script.write_text(_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    assert line, proc.stderr[-3000:]
    res = json.loads(line[-1])
    assert "fp8e4nv not supported in this architecture" in res.pop("cast")
    assert res == dict(installed=True, patched=True, idempotent=True, plain_same=True, restored=True)


if __name__ == "__main__":
    _main(sys.argv[1:])

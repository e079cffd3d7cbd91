"""Tiny DSA model folders (a local ``config.json``, weights from vLLM's dummy loader, then :mod:`.weights`).

Shapes follow the real models per GPU at tensor-parallel 8: DeepSeek-V3.2 (128 heads, 16 per GPU) and GLM-5
(64 heads, 8 per GPU; qk_nope 192, v 256); two layers (one dense, one MoE) keep start-up short, and the indexer
keeps its real head count and top-k 2048 so that prompts longer than 2048 tokens attend sparsely.

DeepSeek-V4 (family ``dsv4``, written from transformers' ``DeepseekV4Config`` fields): V4-Flash's attention shape
(q / k 512 wide, one KV head, window 128, indexer 64 heads × 128, top-k 512 compressed entries, mHC 4) at 8 heads
(V4-Flash at TP 8) and 64 heads (all of them); three layers, one of each attention kind — window only, C4A (the
indexer's top-k of every 4th-token entry) and C128A (every 128th-token entry) — so that every path of the layer runs.

DeepSeek-V4.1 (family ``dsv41``, read by vLLM 0.33's ``vllm.models.deepseek_v41`` through ``DeepseekV41Config``, which
flattens the checkpoint's ``text_config`` onto the top level): the same attention shape at 8 and 64 heads, and five
layers whose plan (:data:`DSV41_PLAN`) has every kind of V4.1 layer — window only (compress ratio 0), a ratio-2 group
(its kv and index source, and a layer that only reads that source's compressed cache and top-k), and a ratio-1
group whose kv and index source writes the two-level candidate blocks that the next index source (sharing its
cache and index keys) masks its logits to. No vision tower, engram, MTP layer or quantization.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_COMMON: dict[str, Any] = {
    "dtype": "bfloat16",
    "vocab_size": 2048,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "index_topk": 2048,
    "index_head_dim": 128,
    "num_nextn_predict_layers": 0,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}

_FAMILIES: dict[str, dict[str, Any]] = {
    "dsv32": {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "moe_layer_freq": 1,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "head_dim": 64,
        "index_n_heads": 64,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "rope_interleave": True,
    },
    "glm5": {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "q_lora_rank": 2048,
        "qk_nope_head_dim": 192,
        "v_head_dim": 256,
        "index_n_heads": 32,
        "indexer_rope_interleave": True,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}


_DSV4: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "dtype": "bfloat16",
    "vocab_size": 2048,
    "hidden_size": 1024,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 3,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    "mlp_layer_types": ["hash_moe", "moe", "moe"],
    "num_key_value_heads": 1,
    "head_dim": 512,
    "q_lora_rank": 512,
    "o_lora_rank": 256,
    "n_routed_experts": 16,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "topk_method": "noaux_tc",  # V4 checkpoints' routing: sqrtsoftplus scores plus a correction bias
    "sliding_window": 128,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "hc_mult": 4,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}

#: The model family of DeepSeek-V4 variants (its attention is a whole layer class, not an attention backend).
V4_FAMILY = "dsv4"
#: The model family of DeepSeek-V4.1 variants (a layer class too, from vLLM's ``deepseek_v41`` model).
V41_FAMILY = "dsv41"

#: DeepSeek-V4.1's layer plan, keys of its text config (vLLM 0.33, ``models/deepseek_v41/attention.py``): per layer
#: the compress ratio (0: window only, 1: a compressed entry per token, 2: per 2 tokens); only kv sources own a
#: compressor and compressed cache, only index sources an indexer (one that is not a kv source scores the index keys
#: of the kv source below it), every other layer reads the nearest source below it. Layer 3 is the candidate source,
#: layer 4 masks to its candidates; 64 × 16 = 1,024 candidate positions per row, twice the top-k, so the 2,500- to
#: 16,000-token prompts (as many ratio-1 entries) select within candidates and prompts up to 512 tokens take every
#: entry.
DSV41_PLAN: dict[str, Any] = {
    "num_hidden_layers": 5,
    "compress_ratios": [0, 2, 2, 1, 1],
    "kv_source_layer_ids": [1, 3],
    "index_source_layer_ids": [1, 3, 4],
    "candidate_source_layer_id": 3,
    "candidate_block_size": 64,
    "candidate_topk_blocks": 16,
}

#: DeepSeek-V4.1's text config beside :data:`DSV41_PLAN`: V4-Flash's attention, mHC and MoE shape as in ``_DSV4``,
#: spelled out because ``DeepseekV41Config`` has no defaults (the values are transformers' ``DeepseekV4Config``
#: defaults where ``_DSV4`` leaves them to it).
_DSV41_TEXT: dict[str, Any] = {
    "vocab_size": 2048,
    "hidden_size": 1024,
    "moe_intermediate_size": 256,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 512,
    "o_lora_rank": 256,
    "sliding_window": 128,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "hc_mult": 4,
    "hc_eps": 1e-06,
    "hc_sinkhorn_iters": 20,
    "n_routed_experts": 16,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "topk_method": "noaux_tc",  # the gate's correction bias, as V4's
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "num_nextn_predict_layers": 0,  # no MTP layer: compress_ratios has no entry for one
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    **DSV41_PLAN,
}


@dataclass(frozen=True)
class Variant:
    """One tiny model: ``family`` (dsv32 | glm5 | dsv4 | dsv41) with ``heads`` attention heads (one GPU's share at
    TP 8)."""

    name: str
    family: str
    heads: int
    what: str


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("dsv32-h128", "dsv32", 128, "DeepSeek-V3.2 shape, all 128 heads (one GPU, no TP)"),
    Variant("dsv32-h16", "dsv32", 16, "DeepSeek-V3.2 at TP 8 (16 heads per GPU)"),
    Variant("glm5-h8", "glm5", 8, "GLM-5 at TP 8 (8 heads per GPU)"),
    Variant("dsv4-h8", V4_FAMILY, 8, "DeepSeek-V4-Flash at TP 8 (8 heads per GPU; FlashMLA pads them to 64)"),
    Variant("dsv4-h64", V4_FAMILY, 64, "DeepSeek-V4-Flash shape, all 64 heads (one GPU, no TP)"),
    Variant("dsv41-h8", V41_FAMILY, 8, "DeepSeek-V4.1, V4-Flash's attention at TP 8 (8 heads per GPU)"),
    Variant("dsv41-h64", V41_FAMILY, 64, "DeepSeek-V4.1, V4-Flash's attention, all 64 heads (one GPU, no TP)"),
)}


def is_v4(variant: str) -> bool:
    """Whether ``variant`` is a DeepSeek-V4 model (a key of :data:`VARIANTS`)."""
    return VARIANTS[variant].family == V4_FAMILY


def is_v41(variant: str) -> bool:
    """Whether ``variant`` is a DeepSeek-V4.1 model (a key of :data:`VARIANTS`)."""
    return VARIANTS[variant].family == V41_FAMILY


def uses_v4_layer(variant: str) -> bool:
    """Whether ``variant``'s attention is a DeepSeek-V4-style layer class (V4 or V4.1: chosen by the plugin's
    ``TRITON_MLA_SPARSE_DSV4`` switch or named as vLLM's layer), not an attention backend of a layer."""
    return VARIANTS[variant].family in (V4_FAMILY, V41_FAMILY)


def model_config(variant: str, *, max_position_embeddings: int, tensor_parallel_size: int = 1) -> dict[str, Any]:
    """The ``config.json`` of ``variant`` (a key of :data:`VARIANTS`); a DeepSeek-V4.1 one nests its model under
    ``text_config``, as V4.1 checkpoints do. ``tensor_parallel_size`` t: the model whose t-way split gives each GPU
    ``variant``'s heads (t times its heads; V4's output groups follow)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    if not isinstance(max_position_embeddings, int) or max_position_embeddings < 4096:
        raise ValueError(f"max_position_embeddings must be an int >= 4096, got {max_position_embeddings!r}")
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tensor_parallel_size!r}")
    v = VARIANTS[variant]
    v = Variant(v.name, v.family, v.heads * tensor_parallel_size, v.what)
    if v.family == V41_FAMILY:  # o_groups as V4's below
        text = {**_DSV41_TEXT, "num_attention_heads": v.heads, "o_groups": max(1, v.heads // 8),
                "max_position_embeddings": max_position_embeddings}
        return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "dtype": "bfloat16",
                "text_config": text}
    if v.family == V4_FAMILY:
        # o_groups: V4-Flash's 8 groups of 8 heads; one group on a GPU's 8-head share at TP 8
        cfg = {**_DSV4, "num_attention_heads": v.heads, "o_groups": max(1, v.heads // 8)}
    else:
        cfg = {**_COMMON, **_FAMILIES[v.family]}
        cfg["num_attention_heads"] = v.heads
        cfg["num_key_value_heads"] = v.heads
    cfg["max_position_embeddings"] = max_position_embeddings
    return cfg


def write_model(variant: str, root: str | Path, *, max_position_embeddings: int = 40960,
                tensor_parallel_size: int = 1) -> Path:
    """Write ``root/<variant>/config.json`` (``root/<variant>-tp<t>`` for a ``tensor_parallel_size`` t > 1: see
    :func:`model_config`; idempotent) and return the folder."""
    folder = Path(root) / (variant if tensor_parallel_size == 1 else f"{variant}-tp{tensor_parallel_size}")
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(model_config(variant, max_position_embeddings=max_position_embeddings,
                                   tensor_parallel_size=tensor_parallel_size), indent=2, sort_keys=True) + "\n"
    path = folder / "config.json"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return folder

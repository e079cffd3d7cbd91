"""Tiny DSA model folders (a local ``config.json``, weights from vLLM's dummy loader, then :mod:`.weights`).

Shapes follow the real models per GPU at tensor-parallel 8: DeepSeek-V3.2 (128 heads, 16 per GPU) and GLM-5
(64 heads, 8 per GPU; qk_nope 192, v 256); two layers (one dense, one MoE) keep start-up short, and the indexer
keeps its real head count and top-k 2048 so that prompts longer than 2048 tokens attend sparsely.

DeepSeek-V4 (family ``dsv4``, written from transformers' ``DeepseekV4Config`` fields): V4-Flash's attention shape
(q / k 512 wide, one KV head, window 128, indexer 64 heads × 128, top-k 512 compressed entries, mHC 4) at 8 heads
(V4-Flash at TP 8) and 64 heads (all of them); three layers, one of each attention kind — window only, C4A (the
indexer's top-k of every 4th-token entry) and C128A (every 128th-token entry) — so that every path of the layer runs.
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


@dataclass(frozen=True)
class Variant:
    """One tiny model: ``family`` (dsv32 | glm5 | dsv4) with ``heads`` attention heads (one GPU's share at TP 8)."""

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
)}


def is_v4(variant: str) -> bool:
    """Whether ``variant`` is a DeepSeek-V4 model (a key of :data:`VARIANTS`)."""
    return VARIANTS[variant].family == V4_FAMILY


def model_config(variant: str, *, max_position_embeddings: int) -> dict[str, Any]:
    """The ``config.json`` of ``variant`` (a key of :data:`VARIANTS`)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    if not isinstance(max_position_embeddings, int) or max_position_embeddings < 4096:
        raise ValueError(f"max_position_embeddings must be an int >= 4096, got {max_position_embeddings!r}")
    v = VARIANTS[variant]
    if v.family == V4_FAMILY:
        # o_groups: V4-Flash's 8 groups of 8 heads; one group on a GPU's 8-head share at TP 8
        cfg = {**_DSV4, "num_attention_heads": v.heads, "o_groups": max(1, v.heads // 8)}
    else:
        cfg = {**_COMMON, **_FAMILIES[v.family]}
        cfg["num_attention_heads"] = v.heads
        cfg["num_key_value_heads"] = v.heads
    cfg["max_position_embeddings"] = max_position_embeddings
    return cfg


def write_model(variant: str, root: str | Path, *, max_position_embeddings: int = 40960) -> Path:
    """Write ``root/<variant>/config.json`` (idempotent) and return the folder."""
    folder = Path(root) / variant
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(model_config(variant, max_position_embeddings=max_position_embeddings), indent=2,
                      sort_keys=True) + "\n"
    path = folder / "config.json"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return folder

"""Old path of the Triton DSA indexer for vLLM: a re-export of :mod:`triton_mla_sparse.integrations.vllm.indexer`.

Imports vLLM (as that module does). The names are the same objects as there; to patch the indexer's behaviour
(e.g. ``deep_gemm_usable`` in a test), patch :mod:`triton_mla_sparse.integrations.vllm.indexer`, which its
functions read.
"""

from __future__ import annotations

from .vllm.indexer import (
    CALL_SITES,
    INDEXER_ENV,
    INDEXER_MODES,
    OP_NAME,
    TritonSparseAttnIndexer,
    decide,
    deep_gemm_usable,
    indexer_mode,
    install,
    route_vllm_call_sites,
    sparse_attn_indexer,
    unsupported_reasons,
    use_triton_indexer,
)

__all__ = [
    "INDEXER_ENV",
    "INDEXER_MODES",
    "indexer_mode",
    "decide",
    "deep_gemm_usable",
    "use_triton_indexer",
    "unsupported_reasons",
    "TritonSparseAttnIndexer",
    "sparse_attn_indexer",
    "install",
    "route_vllm_call_sites",
    "OP_NAME",
    "CALL_SITES",
]

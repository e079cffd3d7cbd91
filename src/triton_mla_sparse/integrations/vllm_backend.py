"""Old path of the vLLM backend classes: a re-export of :mod:`triton_mla_sparse.integrations.vllm.backend`.

Imports vLLM (as that module does). vLLM's registry names the class by its new path
(:data:`triton_mla_sparse.integrations.vllm.BACKEND_CLASS_PATH`); the classes here are the same objects.
"""

from __future__ import annotations

from .vllm.backend import (
    KV_CACHE_FORMATS,
    TritonMLASparseBackend,
    TritonMLASparseImpl,
    TritonMLASparseMetadata,
    TritonMLASparseMetadataBuilder,
)

__all__ = [
    "TritonMLASparseBackend",
    "TritonMLASparseMetadata",
    "TritonMLASparseMetadataBuilder",
    "TritonMLASparseImpl",
    "KV_CACHE_FORMATS",
]

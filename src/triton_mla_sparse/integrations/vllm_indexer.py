"""Old path of the Triton DSA indexer for vLLM: a re-export of :mod:`triton_mla_sparse.integrations.vllm.indexer`.

Imports vLLM (as that module does). The names are the same objects as there; to patch the indexer's behaviour
(e.g. ``deep_gemm_usable`` in a test), patch :mod:`triton_mla_sparse.integrations.vllm.indexer`, which its
functions read.
"""

from __future__ import annotations

from .vllm import indexer as _indexer
from .vllm.indexer import *  # noqa: F403  (the old path's names are the new module's)
from .vllm.indexer import CALL_SITES, OP_NAME

__all__ = [*_indexer.__all__, "CALL_SITES", "OP_NAME"]

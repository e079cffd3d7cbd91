"""The DSA "lightning indexer": :func:`indexer_logits`, :func:`indexer_topk` (selected by the top-k operator,
:mod:`triton_mla_sparse.ops.topk`) and :func:`topk_to_slots` (its request-local positions as global cache slots).

``api`` (validation and dispatch), ``configs`` (launch parameters), ``kernels`` (the logits kernel; importing it
imports triton), ``reference`` (plain torch, the contract), ``slots`` and ``aot`` (ahead-of-time builds).
"""

from __future__ import annotations

from .api import indexer_logits, indexer_topk
from .slots import topk_to_slots

__all__ = ["indexer_logits", "indexer_topk", "topk_to_slots"]

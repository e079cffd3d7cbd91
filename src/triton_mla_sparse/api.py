"""Old path of the attention entry points: a re-export of :mod:`triton_mla_sparse.ops.sparse_mla.api`."""

from __future__ import annotations

from .ops.sparse_mla.api import sparse_mla_attention, sparse_mla_attention_with_config

__all__ = ["sparse_mla_attention", "sparse_mla_attention_with_config"]

"""Sparse MLA attention: :func:`sparse_mla_attention` over a paged cache and per-row slot lists.

``api`` (validation, capability check, configuration, dispatch), ``configs`` (the launch table), ``kernels`` (the
Triton kernels; importing it imports triton), ``reference`` (plain torch, the contract) and ``aot`` (ahead-of-time
builds).
"""

from __future__ import annotations

from .api import sparse_mla_attention, sparse_mla_attention_with_config

__all__ = ["sparse_mla_attention", "sparse_mla_attention_with_config"]

"""Old path of :func:`topk_to_slots`: a re-export of :mod:`triton_mla_sparse.ops.indexer.slots`."""

from __future__ import annotations

from .ops.indexer.slots import topk_to_slots

__all__ = ["topk_to_slots"]

"""Old path of the indexer: a re-export of :mod:`triton_mla_sparse.ops.indexer` (api and configs)."""

from __future__ import annotations

from .formats import D_INDEX
from .formats import INDEXER_ROW_BYTES as FP8_ROW_BYTES
from .ops.indexer.api import (
    MAX_INDEX_HEADS,
    MAX_LEN,
    IndexerProblem,
    check_indexer_inputs,
    check_indexer_topk_inputs,
    indexer_logits,
    indexer_topk,
)
from .ops.indexer.configs import SELECTS, IndexerConfig, choose_indexer_config, indexer_config_for

__all__ = ["D_INDEX", "FP8_ROW_BYTES", "MAX_INDEX_HEADS", "MAX_LEN", "SELECTS", "IndexerConfig", "IndexerProblem",
           "check_indexer_inputs", "check_indexer_topk_inputs", "choose_indexer_config", "indexer_config_for",
           "indexer_logits", "indexer_topk"]

"""Plain-PyTorch reference implementations: the executable specification of this library.

Every kernel in the package is tested against these functions. They run on any device, in float32 by default
(``compute_dtype=torch.float64`` when asked), and favour clarity over speed. Each operator holds its own
(``triton_mla_sparse.ops.<op>.reference``); this module gathers the public ones, attention's and the indexer's (the
top-k select's contract is ``indexer_topk``'s selection step, ``torch.topk`` with -1 padding:
``triton_mla_sparse.ops.topk.torch_select``).
"""

from __future__ import annotations

from .ops.indexer.reference import indexer_logits, indexer_topk
from .ops.sparse_mla.reference import dequantize_rows, sparse_mla_attention

__all__ = ["dequantize_rows", "indexer_logits", "indexer_topk", "sparse_mla_attention"]

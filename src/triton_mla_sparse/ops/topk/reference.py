"""The top-k select in plain torch: ``torch.topk`` with the operator's padding contract.

Row t of the result holds the positions of its ``min(topk, n_t)`` largest logits (``n_t``: the logits other than
-inf; a NaN ranks above every number), in any order, then -1. The indexer uses it as its ``"torch"`` select.
"""

from __future__ import annotations

import torch

__all__ = ["torch_select"]


def torch_select(logits: torch.Tensor, out: torch.Tensor, topk: int) -> None:
    """``torch.topk`` over the logits float32 [T, L] into ``out`` int32 [T, topk] with the contract's padding: -inf
    (not a candidate) and columns past ``L`` become -1."""
    k = min(topk, logits.shape[1])
    if k:
        vals, idx = torch.topk(logits, k, dim=1, sorted=False)
        out[:, :k] = idx.masked_fill_(vals == float("-inf"), -1)  # (three small launches after the top-k)
    if k < topk:
        out[:, k:] = -1

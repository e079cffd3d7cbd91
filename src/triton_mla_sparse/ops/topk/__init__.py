"""The per-row top-k select of float32 logits (-1 padded; -inf is not a candidate).

``split_select`` (the Triton split select, :func:`~.split_select.launch_split_select`; importing it imports triton)
and ``reference`` (:func:`~.reference.torch_select`, ``torch.topk`` with the same contract). The indexer's
``indexer_topk`` picks one of them per configuration.
"""

from __future__ import annotations

from .reference import torch_select

__all__ = ["torch_select"]

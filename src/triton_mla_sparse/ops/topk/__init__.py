"""The per-row top-k select of float32 logits (-1 padded; -inf is not a candidate).

:func:`topk_select` (validated), :func:`launch_select` and :func:`select_workspace` (for callers that validated
already, as the indexer's ``indexer_topk``) in ``api``; the launch parameters and their choice per device in
``configs`` (:class:`SelectConfig`, :func:`choose_select_config`); the Triton split select in ``split_select``
(importing it imports triton), ``torch.topk`` with the same contract in ``reference`` (:func:`torch_select`) and the
ahead-of-time builds in ``aot``.
"""

from __future__ import annotations

from .api import check_select, launch_select, select_workspace, topk_select
from .configs import SELECTS, SelectConfig, choose_select_config, select_config_for
from .reference import torch_select

__all__ = ["SELECTS", "SelectConfig", "check_select", "choose_select_config", "launch_select", "select_config_for",
           "select_workspace", "topk_select", "torch_select"]

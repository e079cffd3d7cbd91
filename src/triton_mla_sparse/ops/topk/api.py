"""The top-k select's entry points: validation, the choice between the split select and ``torch.topk``, and the
split select's workspace.

:func:`topk_select` is the public, validated call; :func:`launch_select` (with :func:`select_workspace`) is the
launch for callers that validated their arguments already (the indexer's ``indexer_topk``). Importing this module
touches neither CUDA nor triton (the split select's kernels are imported on first use).
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import torch

from ..._common.runtime import check_kernel_device, device_guard
from ..._common.validate import MAX_GRID, check_int, check_out, fail
from .configs import SELECTS, SelectConfig, choose_select_config
from .reference import torch_select

__all__ = ["check_select", "launch_select", "select_workspace", "topk_select"]

_SPLIT: ModuleType | None = None  # the split select's module once imported (a per-call import costs a microsecond)


def _split_select() -> ModuleType:
    global _SPLIT
    if _SPLIT is None:
        from . import split_select

        _SPLIT = split_select
    return _SPLIT


def check_select(select: object) -> None:
    """The ``select=`` argument: one of :data:`~.configs.SELECTS` or None (the configuration's choice)."""
    if select is not None and select not in SELECTS:
        fail("select", f"one of {SELECTS} or None", repr(select))


def select_workspace(cfg: SelectConfig, rows: int, device: torch.device) -> torch.Tensor | None:
    """The workspace :func:`launch_select` takes for ``rows`` rows under ``cfg``, uninitialised: an int32
    ``[rows, WS_WIDTH]`` for the split select, which the caller zeroes before the launch (the indexer's logits
    launch does: one launch fewer than a memset); None for ``torch.topk``, which needs none."""
    if cfg.select != "split":
        return None
    return torch.empty(rows, _split_select().WS_WIDTH, dtype=torch.int32, device=device)


def launch_select(logits: torch.Tensor, out: torch.Tensor, topk: int, cfg: SelectConfig,
                  ws: torch.Tensor | None = None) -> None:
    """Each row's ``topk`` largest of ``logits`` float32 [T, L] into ``out`` int32 [T, topk] with the select of
    ``cfg`` (arguments already validated, on the current device). ``ws``: the split select's zeroed workspace
    (:func:`select_workspace`); None: the split select allocates a zeroed one."""
    if cfg.select == "split":
        _split_select().launch_split_select(logits, out, topk, cfg, ws)
    else:
        torch_select(logits, out, topk)


def topk_select(logits: torch.Tensor, topk: int, *, out: torch.Tensor | None = None,
                select: str | None = None) -> torch.Tensor:
    """Positions int32 ``[T, topk]`` of each row's ``topk`` largest logits, in any order, then -1.

    ``logits``: float32 ``[T, L]``, any strides; -inf is not a candidate, a NaN ranks above every number (as in
    ``torch.topk``). Row t holds the positions of its ``min(topk, n_t)`` largest logits (``n_t``: those above -inf),
    then -1. ``out=`` (int32 ``[T, topk]``, any strides) receives the result when given. ``select``: ``"split"``
    (the Triton split select: CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``), ``"torch"``
    (``torch.topk``, any device) or None (the device's choice, :func:`~.configs.choose_select_config`). No host
    synchronisation; every allocation follows from the shapes (CUDA-graph capturable); the split select's workspace
    holds an int32 ``[T, L]`` boundary buffer, so for many long rows ``"torch"`` needs less memory.
    """
    if not isinstance(logits, torch.Tensor) or logits.dtype != torch.float32 or logits.dim() != 2:
        fail("logits", "a float32 tensor [T, L]", logits)
    check_select(select)
    device = logits.device
    cfg = choose_select_config(device)
    if select is not None and select != cfg.select:
        cfg = replace(cfg, select=select)
    T, L = logits.shape
    # positions, and for the split select a chunk past the last one, stay in int32 inside the kernels
    limit = MAX_GRID + 1 - (cfg.split_chunk if cfg.select == "split" else 0)
    if L > limit:
        fail("logits", f"at most {limit} columns (positions are int32)", logits)
    check_int("topk", topk, 1, limit)
    check_out(out, torch.int32, (T, topk), device, of="logits")
    if cfg.select == "split":
        check_kernel_device(device, "logits", 'select="torch" runs anywhere')
        if T * max(1, -(-L // cfg.split_chunk)) > MAX_GRID:
            fail("logits", f"rows · ceil(L / {cfg.split_chunk}) <= {MAX_GRID} programs (split the rows)", logits)
    result = out if out is not None else torch.empty(T, topk, dtype=torch.int32, device=device)
    if T:
        with device_guard(device):
            launch_select(logits, result, topk, cfg)
    return result

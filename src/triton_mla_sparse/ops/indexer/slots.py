"""Conversion of the indexer's request-local top-k positions into global cache slots."""

from __future__ import annotations

import torch

__all__ = ["topk_to_slots"]


def _int32(name: str, x: object, dims: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.dim() != dims:
        got = f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected an int32 tensor with {dims} dimension(s), got {got}")


def topk_to_slots(positions: torch.Tensor, req_id_per_token: torch.Tensor, block_table: torch.Tensor,
                  block_size: int, *, compact: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Map request-local token positions to global slot ids (``block · block_size + offset``).

    ``positions`` int32 ``[T, topk]``: request-local positions picked by the indexer, -1 (any negative) = none.
    ``req_id_per_token`` int32 ``[T]``: the request (row of ``block_table``) each query row belongs to.
    ``block_table`` int32 ``[R, max_blocks]``, ``block_size`` a positive int.

    ``slot[t, j] = block_table[req, p // block_size] · block_size + p % block_size`` for ``p = positions[t, j]``;
    -1 where ``p < 0``, the block column ``p // block_size`` is past the table (``>= max_blocks``), the request id
    is outside ``[0, R)``, or the table entry gives a slot outside ``[0, 2^31)`` (not an int32 slot id).
    Returns int32 ``[T, topk]``; with ``compact=True`` returns ``(slots, valid_counts)`` where each row's valid
    slots (>= 0) are moved to the front in their original order, the rest is -1, and ``valid_counts`` is int32
    ``[T]``. Pure tensor operations: no host synchronisation, usable under CUDA-graph capture.
    """
    _int32("positions", positions, 2)
    _int32("req_id_per_token", req_id_per_token, 1)
    _int32("block_table", block_table, 2)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    T = positions.shape[0]
    if req_id_per_token.shape[0] != T:
        raise ValueError(f"req_id_per_token: expected shape [{T}] (one entry per row of positions), "
                         f"got {tuple(req_id_per_token.shape)}")
    for name, x in (("req_id_per_token", req_id_per_token), ("block_table", block_table)):
        if x.device != positions.device:
            raise ValueError(f"{name}: expected device {positions.device} (the device of positions), got {x.device}")
    R, max_blocks = block_table.shape
    p = positions.long()
    req = req_id_per_token.long()[:, None].expand_as(p)
    col = torch.div(p, block_size, rounding_mode="floor")
    ok = (p >= 0) & (col < max_blocks) & (req >= 0) & (req < R)
    col = torch.where(ok, col, torch.zeros_like(col))
    req = torch.where(ok, req, torch.zeros_like(req))
    blocks = block_table.long()[req, col] if R and max_blocks else torch.zeros_like(p)
    slots = blocks * block_size + (p - col * block_size)
    slots = torch.where(ok & (slots >= 0) & (slots <= 2**31 - 1), slots, torch.full_like(p, -1))  # int32 result
    slots = slots.to(torch.int32)
    if not compact:
        return slots
    valid = slots >= 0
    # Stable sort on "is invalid" moves the valid entries to the front in their original order.
    order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices
    packed = torch.gather(slots, 1, order)
    counts = valid.sum(dim=1, dtype=torch.int32)
    packed = torch.where(torch.arange(packed.shape[1], device=packed.device)[None, :] < counts[:, None].long(),
                         packed, torch.full_like(packed, -1))
    return packed, counts

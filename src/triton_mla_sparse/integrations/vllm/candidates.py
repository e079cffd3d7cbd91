"""DeepSeek-V4.1's two-level candidate blocks on the Triton indexer's logits, in torch.

vLLM 0.33's V4.1 indexer (``sparse_attn_indexer`` with ``candidate_blocks``) scores every index-source layer densely,
then the layer at ``candidate_source_layer_id`` publishes each row's top ``candidate_topk_blocks`` blocks of
``candidate_block_size`` request-local compressed positions (``candidate_write``), and every later index source
masks its logits to those blocks before its own top-k. vLLM's kernels for both steps
(``vllm.model_executor.kernels.attention.dsa.candidate_blocks``) take CUDA tensors only; these two functions compute
what they compute on the FULL_WIDTH path (``torch.topk``; DeepSelect is SM 10.x only) for rows whose columns start at
0 (``row_starts=None``, vLLM's CUDA layout) and one context length per row (``row_repeat=1``), on any device, with
no host synchronisation (every allocation follows from the shapes: CUDA-graph capturable).
"""

from __future__ import annotations

import torch

__all__ = ["select_candidate_blocks", "apply_candidate_mask"]


def _check(logits: torch.Tensor, visible: torch.Tensor, block_size: int) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits: expected a float32 tensor [T, L], got {getattr(logits, 'dtype', logits)}")
    if not isinstance(visible, torch.Tensor) or visible.shape != (logits.shape[0],):
        raise ValueError(f"visible: expected one context length per row [{logits.shape[0]}], got "
                         f"{tuple(getattr(visible, 'shape', ()))}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")


def select_candidate_blocks(logits: torch.Tensor, visible: torch.Tensor, block_size: int,
                            out: torch.Tensor) -> None:
    """Write into ``out`` (int32 ``[T, K]``) each row's ``K`` best blocks of ``block_size`` columns of ``logits``
    (float32 ``[T, L]``), -1 padded: a block's score is the maximum of its columns below ``visible[t]`` (a NaN
    ranks first), the block holding column ``visible[t] - 1`` (the newest) scores +inf, blocks without a column
    above -inf are not candidates. The order is ``torch.topk``'s, as vLLM's."""
    _check(logits, visible, block_size)
    rows, width = logits.shape
    if not rows:
        return
    if not width:
        out.fill_(-1)
        return
    nblocks = -(-width // block_size)
    full = width // block_size
    # Block maxima straight from the logits (no [T, L] copy): every block before the newest lies wholly below
    # `visible`, the newest is pinned to +inf below, the ones after it are no candidates.
    parts = [logits[:, : full * block_size].unflatten(1, (full, block_size)).amax(-1)]
    if full < nblocks:
        parts.append(logits[:, full * block_size:].amax(-1, keepdim=True))
    scores = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    visible = visible.to(torch.int64)
    newest = torch.div(visible - 1, block_size, rounding_mode="floor")
    blocks = torch.arange(nblocks, device=logits.device)
    scores.masked_fill_(blocks > newest[:, None], float("-inf"))
    pin = (visible > 0) & (newest < nblocks)
    scores.masked_fill_((blocks == newest[:, None]) & pin[:, None], float("inf"))
    top = scores.topk(min(out.shape[1], nblocks), dim=-1)
    out[:, : top.indices.shape[1]] = torch.where(top.values != float("-inf"), top.indices, -1)
    out[:, top.indices.shape[1]:] = -1


def apply_candidate_mask(logits: torch.Tensor, visible: torch.Tensor, candidates: torch.Tensor,
                         block_size: int) -> None:
    """Set to -inf, in place, every column of ``logits`` (float32 ``[T, L]``) at or past ``visible[t]`` or outside
    row ``t``'s candidate blocks (``candidates`` int ``[T, K]``, -1 padded; block ``b`` holds columns
    ``b·block_size …``). A candidate block starting at or past ``L`` keeps column ``L - 1`` instead (vLLM's clamp
    for blocks beyond the logits width)."""
    _check(logits, visible, block_size)
    rows, width = logits.shape
    if not rows or not width:
        return
    if candidates.dim() != 2 or candidates.shape[0] != rows:
        raise ValueError(f"candidates: expected [{rows}, K] block ids, got {tuple(candidates.shape)}")
    nblocks = -(-width // block_size)
    blocks = candidates.to(torch.int64)
    # slot nblocks: a block past the width (keeps the last column); slot nblocks + 1: padding (-1), dropped
    slots = torch.where(blocks * block_size >= width, nblocks, blocks)
    slots = torch.where(blocks >= 0, slots, nblocks + 1)
    flags = torch.zeros(rows, nblocks + 2, dtype=torch.bool, device=logits.device)
    flags.scatter_(1, slots, True)
    cols = torch.arange(width, device=logits.device)
    keep = flags.index_select(1, torch.div(cols, block_size, rounding_mode="floor"))
    keep |= (cols == width - 1) & flags[:, nblocks:nblocks + 1]
    keep &= cols < visible.to(torch.int64)[:, None]
    logits.masked_fill_(~keep, float("-inf"))

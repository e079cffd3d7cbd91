"""Plain-PyTorch reference of the DSA indexer: the executable specification of the indexer kernels.

It runs on any device, in float32 by default (``compute_dtype=torch.float64`` when asked), and favours clarity over
speed; its validation is the Triton path's (:mod:`.api`). :mod:`triton_mla_sparse.reference` re-exports it.
"""

from __future__ import annotations

import math

import torch

from ..._common.validate import check_int, check_out
from ...formats import INDEXER_ROW_BYTES, unpack_indexer_cache
from .api import IndexerProblem, check_indexer_inputs, check_indexer_topk_inputs

__all__ = ["indexer_logits", "indexer_topk"]


def _indexer_keys(p: IndexerProblem, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Real K values ``[num_blocks, block_size, 128]`` and scales ``[num_blocks, block_size]`` of an indexer cache."""
    nb, bs = p.num_blocks, p.block_size
    if p.k_fp8:
        blocks = torch.as_strided(p.k, (nb, bs * INDEXER_ROW_BYTES), (p.k_block_stride, 1)) if nb else \
            p.k.new_zeros(0, bs * INDEXER_ROW_BYTES)
        vals, scales = unpack_indexer_cache(blocks)
        return vals.to(dtype), scales.to(dtype)
    return p.k.to(dtype), torch.ones(nb, bs, dtype=dtype, device=p.k.device)


def indexer_logits(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                   req_id_per_token: torch.Tensor, positions: torch.Tensor, max_len: int, *,
                   out: torch.Tensor | None = None, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    r"""DSA indexer logits (the "lightning indexer") over a paged K cache.

    Arguments
      q                 ``[T, Hi, 128]`` float8_e4m3fn (its scales folded into ``weights``), float16 or bfloat16;
                        1 <= Hi <= 64; unit last stride.
      weights           float32 ``[T, Hi]``.
      k_cache           vLLM's fp8 indexer layout: uint8 ``[num_blocks, block_size · 132]``, per block
                        ``block_size · 128`` e4m3 values (token-major) followed by ``block_size`` float32 scales (a
                        ``[num_blocks, block_size, 1, 132]`` view of the same bytes is accepted); or float16/bfloat16
                        ``[num_blocks, block_size, 128]`` (q's dtype, or any with fp8 q), scale 1. Any block stride.
      block_table       int32 ``[R, max_blocks]``: block ids of each request's pages.
      req_id_per_token  int32 ``[T]``: the request (row of ``block_table``) of each query row.
      positions         int32 ``[T]``: row t may use request-local tokens ``0 … positions[t]`` (inclusive).
      max_len           int >= 0: the output width.
      out               optional float32 ``[T, max_len]`` to write into.

    Result: float32 ``[T, max_len]`` (``compute_dtype`` float64 when asked),
    ``logits[t, p] = Σ_h weights[t, h] · relu(<q[t, h], k[p]> · kscale[p])`` where
    ``k[p] = cache row (block_table[req, p // block_size], p % block_size)`` — and **-inf** (not a candidate) where
    ``p > positions[t]``, the block column ``p // block_size >= max_blocks``, the request id is outside
    ``[0, R)``, or the table entry is outside ``[0, num_blocks)``. Such entries are never read. A row with
    ``positions[t] < 0`` is all -inf. Invalid arguments raise one ``ValueError`` naming the argument.
    """
    if compute_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"compute_dtype: expected torch.float32 or torch.float64, got {compute_dtype}")
    p = check_indexer_inputs(q, weights, k_cache, block_table, req_id_per_token, positions)
    check_int("max_len", max_len, 0)
    check_out(out, torch.float32, (p.T, max_len), p.device)
    cd = compute_dtype
    dev = p.device
    kv, ks = _indexer_keys(p, cd)
    R, max_blocks = p.block_table.shape
    pos_range = torch.arange(max_len, device=dev)
    col = pos_range // p.block_size
    off = pos_range % p.block_size
    res = torch.full((p.T, max_len), -math.inf, dtype=cd, device=dev)
    qf, wf = p.q.to(cd), p.weights.to(cd)
    chunk = max(1, (1 << 24) // max(1, max_len * 128))
    for t0 in range(0, p.T, chunk):
        sl = slice(t0, min(p.T, t0 + chunk))
        req = p.req_id_per_token[sl].long()
        ok = (pos_range[None, :] <= p.positions[sl].long()[:, None]) & (col[None, :] < max_blocks)
        ok &= ((req >= 0) & (req < R))[:, None]
        req_safe = torch.where((req >= 0) & (req < R), req, torch.zeros_like(req))
        col_safe = torch.where(col < max_blocks, col, torch.zeros_like(col))
        blk = p.block_table.long()[req_safe][:, col_safe] if R and max_blocks else \
            torch.zeros(req.shape[0], max_len, dtype=torch.long, device=dev)
        ok &= (blk >= 0) & (blk < p.num_blocks)
        blk = torch.where(ok, blk, torch.zeros_like(blk))
        offs = off[None, :].expand_as(blk)
        if p.num_blocks:
            k_rows, k_sc = kv[blk, offs], ks[blk, offs]  # [t, L, 128], [t, L]
        else:
            k_rows = torch.zeros(*blk.shape, 128, dtype=cd, device=dev)
            k_sc = torch.zeros(blk.shape, dtype=cd, device=dev)
        s = torch.einsum("thd,tld->thl", qf[sl], k_rows) * k_sc[:, None, :]
        val = (torch.relu(s) * wf[sl][:, :, None]).sum(dim=1)
        res[sl] = torch.where(ok, val, torch.full_like(val, -math.inf))
    if out is not None:
        out.copy_(res)
        return out
    return res


def indexer_topk(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                 req_id_per_token: torch.Tensor, positions: torch.Tensor, topk: int, *, max_len: int | None = None,
                 out: torch.Tensor | None = None, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    r"""Top-k request-local positions of the DSA indexer logits.

    Arguments as :func:`indexer_logits`; ``topk`` int >= 1; ``max_len`` bounds the positions considered (default:
    the block table's capacity, ``max_blocks · block_size``); ``out`` optional int32 ``[T, topk]``.

    Result: int32 ``[T, topk]``. Row t holds the positions of its ``min(topk, n_t)`` largest logits, where ``n_t``
    is the number of candidates (logits other than -inf, see :func:`indexer_logits`; a NaN logit, which only
    non-finite inputs produce, ranks above every number, as in ``torch.topk``), in any order, then ``-1`` for the
    remaining ``topk - n_t`` entries (wherever -1 appears it means "no token"). Ties at the threshold: any choice.
    The positions plug into :func:`triton_mla_sparse.topk_to_slots`.
    """
    p, max_len = check_indexer_topk_inputs(q, weights, k_cache, block_table, req_id_per_token, positions, topk,
                                           max_len, out)
    logits = indexer_logits(q, weights, k_cache, block_table, req_id_per_token, positions, max_len,
                            compute_dtype=compute_dtype)
    res = torch.full((p.T, topk), -1, dtype=torch.int64, device=p.device)
    kk = min(topk, max_len)
    if kk and p.T:
        vals, idx = torch.topk(logits, kk, dim=1)
        res[:, :kk] = torch.where(torch.isneginf(vals), torch.full_like(idx, -1), idx)
    res = res.to(torch.int32)
    if out is not None:
        out.copy_(res)
        return out
    return res

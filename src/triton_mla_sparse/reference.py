"""Plain-PyTorch reference implementations: the executable specification of this library.

Every kernel in the package is tested against these functions. They run on any device, in float32 by default
(``compute_dtype=torch.float64`` when asked), and favour clarity over speed.
"""

from __future__ import annotations

import math

import torch

from ._checks import AttentionProblem, check_attention_inputs
from .formats import D_V, dequantize_fp8_ds_mla_float

__all__ = ["dequantize_rows", "indexer_logits", "indexer_topk", "sparse_mla_attention"]


def dequantize_rows(p: AttentionProblem, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Real values ``[..., 512 + d_rope]`` of raw cache rows of ``p``'s format (``rows`` as stored)."""
    d_qk = D_V + p.d_rope
    if p.kv_format == "fp8_ds_mla":
        return dequantize_fp8_ds_mla_float(rows, dtype)[..., :d_qk]
    vals = rows.to(dtype)
    if p.kv_format == "fp8_e4m3":
        scale = p.k_scale.to(device=rows.device, dtype=dtype) if isinstance(p.k_scale, torch.Tensor) else p.k_scale
        vals = vals * scale
    return vals


def sparse_mla_attention(q, kv_cache, indices, softmax_scale, *, kv_format=None, k_scale=None, topk_length=None,
                         attn_sink=None, out=None, return_lse=False, compute_dtype=torch.float32, out_dtype=None):
    r"""Sparse MLA attention over a paged cache (absorbed MLA, one shared KV head).

    Arguments
      q             ``[T, H, D_qk]`` float16/bfloat16 with D_qk = 576 (512 latent + 64 RoPE) or 512 (NoPE), or a tuple
                    ``(q_nope [T, H, 512], q_pe [T, H, 64])`` (``q_pe`` may be None or have last dim 0 for NoPE).
                    Any strides with a unit last dimension.
      kv_cache      ``[num_blocks, block_size, row]``, ``[num_blocks, block_size, 1, row]`` or ``[num_slots, row]``,
                    any block stride >= block_size · row stride. Formats (see :mod:`triton_mla_sparse.formats`):
                    ``"bf16"``/``"fp16"`` rows of D_qk values; ``"fp8_e4m3"`` float8_e4m3fn rows of D_qk values,
                    real value = stored · ``k_scale``; ``"fp8_ds_mla"`` uint8 rows of 656 bytes (with D_qk = 512
                    the RoPE bytes are not read). ``kv_format=None`` infers the format from the dtype.
      indices       int32 ``[T, topk]`` (or ``[T, 1, topk]``), global slot ids ``block · block_size + offset``.
                    A value < 0 or >= num_slots (= num_blocks · block_size) means "no token": it is skipped and its
                    row is never read. Any topk >= 1. A slot listed twice counts twice.
      softmax_scale finite positive float; scores are ``softmax_scale · <q[t,h], K[s]>`` over all D_qk dims.
      k_scale       float or one-element float32 tensor: required for ``"fp8_e4m3"``, must be None otherwise.
      topk_length   optional int32 ``[T]``: row t uses only ``indices[t, :topk_length[t]]`` (values clamped to
                    [0, topk]).
      attn_sink     optional float32 ``[H]``: ``out[t, h] *= exp(lse) / (exp(lse) + exp(attn_sink[h]))``; lse is
                    returned without the sink.
      out           optional ``[T, H, 512]`` tensor of the output dtype to write into (any strides, unit last).
      return_lse    also return ``lse [T, H]`` float32 (float64 when computing in float64).

    Result, per row t and head h, over the valid entries j of row t (after topk_length):
      ``s_j = softmax_scale · <q[t,h], K[I[t,j]]>``, ``lse = ln Σ_j exp(s_j)`` (natural log),
      ``out[t,h] = Σ_j exp(s_j - lse) · K[I[t,j]][:512]`` (V is the latent part of the same row).
      A row with no valid entry gives ``out = 0`` and ``lse = -inf`` (vLLM's merge convention; FlashMLA returns
      +inf there).

    Returns ``out`` in ``out_dtype`` (default: q's dtype, like the Triton path), and ``(out, lse)`` when
    ``return_lse``. Arithmetic is in ``compute_dtype`` (float32 or float64). Invalid arguments raise one
    ``ValueError`` naming the argument before anything is written.
    """
    if compute_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"compute_dtype: expected torch.float32 or torch.float64, got {compute_dtype}")
    p = check_attention_inputs(q, kv_cache, indices, softmax_scale, kv_format=kv_format, k_scale=k_scale,
                               topk_length=topk_length, attn_sink=attn_sink, out=out)
    cd = compute_dtype
    T, H = p.T, p.H
    dev = p.device
    q_full = p.q_nope.to(cd) if p.q_pe is None else torch.cat([p.q_nope.to(cd), p.q_pe.to(cd)], dim=-1)
    idx = p.indices.long()
    valid = (idx >= 0) & (idx < p.num_slots)
    if p.topk_length is not None:
        n = p.topk_length.long().clamp(0, p.topk)
        valid &= torch.arange(p.topk, device=dev)[None, :] < n[:, None]
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    blk, off = safe // p.block_size, safe % p.block_size

    res = torch.empty(T, H, D_V, dtype=cd, device=dev)
    lse = torch.empty(T, H, dtype=cd, device=dev)
    # Gather in row chunks so a large problem (thousands of rows x topk 2048) stays within memory.
    chunk = max(1, (1 << 26) // max(1, p.topk * q_full.shape[-1]))
    for t0 in range(0, T, chunk):
        sl = slice(t0, min(T, t0 + chunk))
        if p.num_slots == 0:  # an empty cache: every entry is invalid, nothing to gather
            raw = p.kv.new_zeros(sl.stop - sl.start, p.topk, p.kv.shape[2])
        else:
            raw = p.kv[blk[sl], off[sl]]  # [t, topk, row] as stored
        k = dequantize_rows(p, raw, cd)  # [t, topk, D_qk]
        k = k.masked_fill(~valid[sl, :, None], 0.0)  # invalid entries read slot 0: never let its values leak
        s = torch.einsum("thd,tkd->thk", q_full[sl], k) * p.softmax_scale
        s = s.masked_fill(~valid[sl, None, :], -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)  # -inf for a row with no valid entry
        w = torch.exp(s - torch.where(torch.isinf(row_lse), torch.zeros_like(row_lse), row_lse)[..., None])
        res[sl] = torch.einsum("thk,tkd->thd", w, k[..., :D_V])
        lse[sl] = row_lse
    if p.attn_sink is not None:
        # exp(lse) / (exp(lse) + exp(sink)); a row without valid entries has out = 0 whatever the sink (the where
        # keeps sink = -inf from giving sigmoid(-inf - -inf) = NaN there).
        factor = torch.sigmoid(lse - p.attn_sink.to(cd)[None, :])
        res = res * torch.where(torch.isneginf(lse), torch.zeros_like(factor), factor)[..., None]
    result_dtype = out_dtype if out_dtype is not None else p.dtype
    if out is not None:
        out.copy_(res)
        result = out
    else:
        result = res.to(result_dtype)
    if return_lse:
        return result, lse
    return result


def _indexer_keys(p, dtype: torch.dtype):
    """Real K values ``[num_blocks, block_size, 128]`` and scales ``[num_blocks, block_size]`` of an indexer cache."""
    nb, bs = p.num_blocks, p.block_size
    if p.k_fp8:
        blocks = torch.as_strided(p.k, (nb, bs * 132), (p.k_block_stride, 1)) if nb else \
            p.k.new_zeros(0, bs * 132)
        vals = blocks[:, :bs * 128].contiguous().view(torch.float8_e4m3fn).reshape(nb, bs, 128).to(dtype)
        scales = blocks[:, bs * 128:].contiguous().view(torch.float32).reshape(nb, bs).to(dtype)
        return vals, scales
    return p.k.to(dtype), torch.ones(nb, bs, dtype=dtype, device=p.k.device)


def indexer_logits(q, weights, k_cache, block_table, req_id_per_token, positions, max_len, *, out=None,
                   compute_dtype=torch.float32):
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
    from .indexer import _check_int, _check_out, check_indexer_inputs

    if compute_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"compute_dtype: expected torch.float32 or torch.float64, got {compute_dtype}")
    p = check_indexer_inputs(q, weights, k_cache, block_table, req_id_per_token, positions)
    _check_int("max_len", max_len, 0)
    _check_out(out, torch.float32, (p.T, max_len), p.device)
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


def indexer_topk(q, weights, k_cache, block_table, req_id_per_token, positions, topk, *, max_len=None, out=None,
                 compute_dtype=torch.float32):
    r"""Top-k request-local positions of the DSA indexer logits.

    Arguments as :func:`indexer_logits`; ``topk`` int >= 1; ``max_len`` bounds the positions considered (default:
    the block table's capacity, ``max_blocks · block_size``); ``out`` optional int32 ``[T, topk]``.

    Result: int32 ``[T, topk]``. Row t holds the positions of its ``min(topk, n_t)`` largest logits, where ``n_t``
    is the number of candidates (logits other than -inf, see :func:`indexer_logits`; a NaN logit, which only
    non-finite inputs produce, ranks above every number, as in ``torch.topk``), in any order, then ``-1`` for the
    remaining ``topk - n_t`` entries (wherever -1 appears it means "no token"). Ties at the threshold: any choice.
    The positions plug into :func:`triton_mla_sparse.topk_to_slots`.
    """
    from .indexer import check_indexer_topk_inputs

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

"""Plain-PyTorch reference of sparse MLA attention: the executable specification of the attention kernels.

It runs on any device, in float32 by default (``compute_dtype=torch.float64`` when asked), and favours clarity over
speed. :mod:`triton_mla_sparse.reference` re-exports it.
"""

from __future__ import annotations

import math

import torch

from ...formats import (D_V, FP8_DS_MLA_V4, V4_FOOTER_BYTES, V4_ROW_BYTES, V4_TOKEN_BYTES, dequantize_fp8_ds_mla_float,
                        dequantize_fp8_ds_mla_v4)
from .api import AttentionProblem, Query, check_attention_inputs

__all__ = ["dequantize_rows", "sparse_mla_attention"]


def dequantize_rows(p: AttentionProblem, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Real values ``[..., 512 + d_rope]`` of raw cache rows of ``p``'s format (``rows`` as stored; for
    ``fp8_ds_mla_v4`` a token's 584-byte record: its 576-byte row, then its 8 footer bytes, read as a page of one
    token by :func:`~triton_mla_sparse.formats.dequantize_fp8_ds_mla_v4`)."""
    d_qk = D_V + p.d_rope
    if p.kv_format == FP8_DS_MLA_V4:
        records = rows.reshape(-1, V4_TOKEN_BYTES)
        return dequantize_fp8_ds_mla_v4(records, 1, dtype).reshape(*rows.shape[:-1], D_V)
    if p.kv_format == "fp8_ds_mla":
        return dequantize_fp8_ds_mla_float(rows, dtype)[..., :d_qk]
    vals = rows.to(dtype)
    if p.kv_format == "fp8_e4m3":
        scale = p.k_scale.to(device=rows.device, dtype=dtype) if isinstance(p.k_scale, torch.Tensor) else p.k_scale
        vals = vals * scale
    return vals


def _slots(kv: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None, num_slots: int,
           block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(kv, valid [T, topk], block, offset)`` of one list: an entry is valid inside its row's length and when
    0 <= slot < num_slots; invalid entries point at slot 0."""
    idx = indices.long()
    topk = idx.shape[1]
    valid = (idx >= 0) & (idx < num_slots)
    if topk_length is not None:
        n = topk_length.long().clamp(0, topk)
        valid &= torch.arange(topk, device=idx.device)[None, :] < n[:, None]
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    return kv, valid, safe // block_size, safe % block_size


def _gather(kv: torch.Tensor, blk: torch.Tensor, off: torch.Tensor, v4_block_size: int = 0) -> torch.Tensor:
    """Rows ``kv[blk, off]`` as stored (zeros from an empty cache: every entry is then invalid). DeepSeek-V4 pages
    (``v4_block_size`` > 0, kv uint8 ``[num_blocks, block_size · 584]``): each token's 584-byte record, its row (576
    bytes at 576 · offset) then its footer bytes (8 at 576 · block_size + 8 · offset)."""
    if v4_block_size:
        if kv.shape[0] == 0:
            return kv.new_zeros(*blk.shape, V4_TOKEN_BYTES)
        b = blk[..., None]
        row = kv[b, off[..., None] * V4_ROW_BYTES + torch.arange(V4_ROW_BYTES, device=kv.device)]
        foot = kv[b, v4_block_size * V4_ROW_BYTES + off[..., None] * V4_FOOTER_BYTES +
                  torch.arange(V4_FOOTER_BYTES, device=kv.device)]
        return torch.cat([row, foot], dim=-1)
    if kv.shape[0] * kv.shape[1] == 0:
        return kv.new_zeros(*blk.shape, kv.shape[2])
    return kv[blk, off]


def sparse_mla_attention(q: Query, kv_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float, *,
                         kv_format: str | None = None, k_scale: float | torch.Tensor | None = None,
                         topk_length: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
                         out: torch.Tensor | None = None, return_lse: bool = False,
                         compute_dtype: torch.dtype = torch.float32, out_dtype: torch.dtype | None = None,
                         extra_kv_cache: torch.Tensor | None = None, extra_indices: torch.Tensor | None = None,
                         extra_topk_length: torch.Tensor | None = None
                         ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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
                    ``"fp8_ds_mla_v4"`` (DeepSeek-V4, never inferred: name it): uint8 pages of ``block_size`` rows
                    of 576 bytes (448 e4m3 NoPE values, 64 bfloat16 RoPE values) then ``block_size`` × 8 footer
                    bytes (7 UE8M0 exponents, scale 2^(byte − 127) per 64 NoPE values), as vLLM holds them
                    (``[num_blocks, block_size, 584]``, strides (page stride >= block_size · 584, 584, 1)), as
                    FlashMLA takes them (``[num_blocks, block_size, 1, 584]``) or as vLLM's writer sees them
                    (``[num_blocks, block_size · 584]``, the page stride apart; a tensor of whole pages
                    ``[num_blocks, v4_page_bytes(block_size)]`` is refused: its width does not say the block
                    size). K = the 512 real values (e4m3 · scale, then the RoPE values), V = K; q must be 512 wide
                    (no RoPE part).
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
      extra_kv_cache, extra_indices, extra_topk_length
                    optional second cache (DeepSeek-V4's: FlashMLA's ``extra_k_cache``, ``extra_indices_in_kvcache``,
                    ``extra_topk_length``): a cache of the same format (and k_scale) with its own block size and
                    slot count, its int32 slot ids ``[T, topk2]`` (or ``[T, 1, topk2]``, any topk2 >= 1; the same
                    validity rule, against the extra cache's slots) and optional int32 lengths ``[T]``. Row t
                    attends to its valid main entries and its valid extra entries together: one softmax, one lse.
                    With D_qk = 512 (NoPE q) and 512-value rows, V is the whole row, as in DeepSeek-V4.

    Result, per row t and head h, over the valid entries j of row t (after topk_length; with an extra cache, those
    of both lists, each entry's row read from its own cache):
      ``s_j = softmax_scale · <q[t,h], K[I[t,j]]>``, ``lse = ln Σ_j exp(s_j)`` (natural log),
      ``out[t,h] = Σ_j exp(s_j - lse) · K[I[t,j]][:512]`` (V is the latent part of the same row; the whole row
      for 512-wide rows, e.g. ``fp8_ds_mla_v4``).
      A row with no valid entry gives ``out = 0`` and ``lse = -inf`` (vLLM's merge convention; FlashMLA returns
      +inf there).

    Returns ``out`` in ``out_dtype`` (default: q's dtype, like the Triton path), and ``(out, lse)`` when
    ``return_lse``. Arithmetic is in ``compute_dtype`` (float32 or float64). Invalid arguments raise one
    ``ValueError`` naming the argument before anything is written.
    """
    if compute_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"compute_dtype: expected torch.float32 or torch.float64, got {compute_dtype}")
    p = check_attention_inputs(q, kv_cache, indices, softmax_scale, kv_format=kv_format, k_scale=k_scale,
                               topk_length=topk_length, attn_sink=attn_sink, out=out, extra_kv_cache=extra_kv_cache,
                               extra_indices=extra_indices, extra_topk_length=extra_topk_length)
    cd = compute_dtype
    T, H = p.T, p.H
    dev = p.device
    q_full = p.q_nope.to(cd) if p.q_pe is None else torch.cat([p.q_nope.to(cd), p.q_pe.to(cd)], dim=-1)
    v4 = p.kv_format == FP8_DS_MLA_V4
    lists = [(*_slots(p.kv, p.indices, p.topk_length, p.num_slots, p.block_size), p.block_size * v4)]
    if p.kv2 is not None:
        lists.append((*_slots(p.kv2, p.indices2, p.topk_length2, p.num_slots2, p.block_size2), p.block_size2 * v4))
    valid = torch.cat([v for _, v, _, _, _ in lists], dim=1)
    n_all = valid.shape[1]

    res = torch.empty(T, H, D_V, dtype=cd, device=dev)
    lse = torch.empty(T, H, dtype=cd, device=dev)
    # Gather in row chunks so a large problem (thousands of rows x topk 2048) stays within memory.
    chunk = max(1, (1 << 26) // max(1, n_all * q_full.shape[-1]))
    for t0 in range(0, T, chunk):
        sl = slice(t0, min(T, t0 + chunk))
        raw = torch.cat([_gather(kv, blk[sl], off[sl], v4_bs) for kv, _, blk, off, v4_bs in lists],
                        dim=1)  # [t, n, row] as stored
        k = dequantize_rows(p, raw, cd)  # [t, n, D_qk]
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

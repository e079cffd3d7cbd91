"""FlashMLA adapters (``flash_mla_interface``): the only place their call shapes are written.

Padding q and viewing the cache happen once, outside the timed call, as vLLM does them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ...formats import D_QK, D_V, FP8_DS_MLA_BYTES
from ..inputs import CaseInputs
from ..methods import Prepared

Call = Callable[[], torch.Tensor]


def _pad_heads(q: torch.Tensor, hp: int) -> torch.Tensor:
    T, H, _ = q.shape
    return q if hp == H else torch.cat([q, q.new_zeros(T, hp - H, D_QK)], 1)


def flashmla_bf16_call(fmi: Any, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                       scale: float) -> tuple[Call, str]:
    """``flash_mla_sparse_fwd`` on the bf16 cache viewed as [slots, 1, 576]; heads padded to a multiple of 64
    unless 8/16/32 (SM90), output sliced back to q's heads. Returns ``(call, description)``."""
    T, H, _ = q.shape
    flat = kv.view(-1, 1, D_QK)
    hp = H if H in (8, 16, 32) or H % 64 == 0 else 64 * math.ceil(H / 64)
    qp = _pad_heads(q, hp)
    idx3 = indices.view(T, 1, -1)

    def call() -> torch.Tensor:
        return fmi.flash_mla_sparse_fwd(qp, flat, idx3, scale)[0][:, :H]

    return call, "flash_mla_sparse_fwd" + (f" heads {H}->{hp}" if hp != H else "")


def flashmla_fp8_call(fmi: Any, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                      scale: float) -> tuple[Call, str]:
    """``flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...)`` on the 656-byte cache viewed as [blocks,
    block_size, 1, 656]; heads padded to 64 (<= 64) or 128 as vLLM does, output sliced back. Every query row is
    its own batch entry of the decode kernel (how vLLM's fp8 path runs prefill too)."""
    T, H, _ = q.shape
    hp = 64 if H <= 64 else 128
    qp = _pad_heads(q, hp)
    meta = fmi.get_mla_metadata()[0] if hasattr(fmi, "get_mla_metadata") else None
    k4 = kv.view(kv.shape[0], kv.shape[1], 1, FP8_DS_MLA_BYTES)
    q4 = qp.view(T, 1, hp, D_QK)
    idx3 = indices.view(T, 1, -1)

    def call() -> torch.Tensor:
        o = fmi.flash_mla_with_kvcache(q4, k4, None, None, D_V, meta, softmax_scale=scale, is_fp8_kvcache=True,
                                       indices=idx3)[0]
        return o.view(T, hp, D_V)[:, :H]

    return call, "flash_mla_with_kvcache fp8" + (f" heads {H}->{hp}" if hp != H else "")


def flashmla_v4_call(fmi: Any, inp: CaseInputs) -> tuple[Call, str]:
    """DeepSeek-V4 decode as vLLM's FlashMLA layer makes it (``deepseek_v4/nvidia/flashmla.py``):
    ``flash_mla_with_kvcache`` on the sliding-window cache (main list, with lengths) and the compressed cache
    (``extra_*``), both viewed ``[blocks, block_size, 1, 584]``, the per-head sink, heads padded to 64 (<= 64) or
    128 as vLLM pads them, output sliced back."""
    q = inp.q
    T, H, D = q.shape
    hp = 64 if H <= 64 else 128
    qp = q if hp == H else torch.cat([q, q.new_zeros(T, hp - H, D)], 1)
    sink = inp.attn_sink
    sinkp = sink if hp == H else torch.cat([sink, sink.new_full((hp - H,), float("-inf"))])
    meta = fmi.get_mla_metadata()[0] if hasattr(fmi, "get_mla_metadata") else None
    q4 = qp.view(T, 1, hp, D)
    k4, e4 = inp.kv_cache.unsqueeze(-2), inp.extra_kv_cache.unsqueeze(-2)
    idx3, eidx3 = inp.indices.view(T, 1, -1), inp.extra_indices.view(T, 1, -1)
    scale, lens, elens = inp.softmax_scale, inp.topk_length, inp.extra_topk_length

    def call() -> torch.Tensor:
        o = fmi.flash_mla_with_kvcache(q4, k4, None, None, D_V, meta, softmax_scale=scale, is_fp8_kvcache=True,
                                       indices=idx3, topk_length=lens, attn_sink=sinkp, extra_k_cache=e4,
                                       extra_indices_in_kvcache=eidx3, extra_topk_length=elens)[0]
        return o.view(T, hp, D_V)[:, :H]

    return call, "flash_mla_with_kvcache V4 fp8 (swa + extra)" + (f" heads {H}->{hp}" if hp != H else "")


def build_flashmla_bf16(fmi: Any, inp: CaseInputs) -> Prepared:
    """The ``flashmla_bf16`` method on a case's inputs."""
    call, desc = flashmla_bf16_call(fmi, inp.q, inp.kv_cache, inp.indices, inp.softmax_scale)
    return Prepared(fn=call, config=desc)


def build_flashmla_fp8(fmi: Any, inp: CaseInputs) -> Prepared:
    """The ``flashmla_fp8`` method (prefill: the decode kernel, each row its own batch entry; DeepSeek-V4 cases:
    :func:`flashmla_v4_call`)."""
    if inp.extra_kv_cache is not None:
        call, desc = flashmla_v4_call(fmi, inp)
        return Prepared(fn=call, config=desc)
    call, desc = flashmla_fp8_call(fmi, inp.q, inp.kv_cache, inp.indices, inp.softmax_scale)
    if inp.case.kind == "prefill":
        desc += ", rows as batch"
    return Prepared(fn=call, config=desc)

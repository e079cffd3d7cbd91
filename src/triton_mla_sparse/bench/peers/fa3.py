"""FlashAttention-3 as vLLM 0.33's FLASH_ATTN_MLA_SPARSE calls it on SM90 (``fa3_page1.py`` of the peers folder,
made by ``get-peers.sh``): the cache rows as pages of one token, each row's slot list as its block table, valid
slots first and their count as ``seqused_k`` (vLLM's index conversion compacts them). The only place its call shape
is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..inputs import CaseInputs
from ..methods import Prepared, Unsupported

Call = Callable[[], torch.Tensor]


def compact_slots(indices: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slots int32 [T, K], counts int32 [T])``: each row's valid slots (``0 <= s < num_slots``) first, in their
    order, then zeros; ``counts`` is how many are valid."""
    valid = (indices >= 0) & (indices < num_slots)
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
    slots = torch.where(valid, indices, torch.zeros_like(indices)).gather(1, order).to(torch.int32).contiguous()
    return slots, valid.sum(dim=1, dtype=torch.int32)


def fa3_page1_call(fa3: Any, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                   scale: float) -> tuple[Call, str]:
    """``fa3.prepare`` over the cache's rows ``[S, 576]`` with the compacted slots (made once, outside the call);
    the loader refuses the module on GPUs other than SM90."""
    if kv.dtype not in (torch.bfloat16, torch.float16):
        raise Unsupported(f"FLASH_ATTN_MLA_SPARSE reads bf16/fp16 caches, got {kv.dtype}")
    rows = kv.reshape(-1, kv.shape[-1])
    slots, counts = compact_slots(indices, rows.shape[0])
    return fa3.prepare(q, rows, slots, scale, seqused=counts), "FA3 page_size=1 (FLASH_ATTN_MLA_SPARSE)"


def build_fa3_page1(fa3: Any, inp: CaseInputs) -> Prepared:
    """The ``fa3_page1`` method."""
    call, desc = fa3_page1_call(fa3, inp.q, inp.kv_cache, inp.indices, inp.softmax_scale)
    return Prepared(fn=call, config=desc)

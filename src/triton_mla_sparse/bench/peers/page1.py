"""vLLM's dense Triton MLA decode kernel (``triton_decode_attention.decode_attention_fwd``) fed the slot list as a
page_size=1 block table: the only place its call shape is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...formats import D_QK, D_V
from ..inputs import CaseInputs
from ..methods import Prepared

NUM_KV_SPLITS = 4

Call = Callable[[], torch.Tensor]


def page1_call(tda: Any, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
               scale: float) -> tuple[Call, Call, str]:
    """``decode_attention_fwd`` with ``req_to_token`` = the slots (invalid -> slot 0), every row's sequence length
    = top-k, 4 KV splits; buffers made once. Returns ``(call, call_default_scales, description)``: ``call`` passes
    1.0 k/v scale tensors made once, as vLLM's Triton MLA backend passes the layer's scale tensors;
    ``call_default_scales`` passes none, so the kernel makes two 1.0 tensors per call (two synchronous
    host-to-device copies that cannot be captured in a CUDA graph). Both write the same output buffer."""
    T, H, _ = q.shape
    dev = q.device
    flat = kv.view(-1, 1, D_QK)
    topk = indices.shape[1]
    req_to_token = torch.where(indices >= 0, indices, 0).contiguous()
    seq = torch.full((T,), topk, dtype=torch.int32, device=dev)
    o = torch.empty(T, H, D_V, dtype=q.dtype, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    ns = NUM_KV_SPLITS
    logits = torch.empty(T, H, ns, D_V + 1, dtype=torch.float32, device=dev)
    one_k = torch.ones((), dtype=torch.float32, device=dev)
    one_v = torch.ones((), dtype=torch.float32, device=dev)

    def call() -> torch.Tensor:
        tda.decode_attention_fwd(q, flat, flat[..., :D_V], o, lse, req_to_token, seq, logits, ns, scale,
                                 page_size=1, is_mla=True, k_scale=one_k, v_scale=one_v)
        return o

    def call_default_scales() -> torch.Tensor:
        tda.decode_attention_fwd(q, flat, flat[..., :D_V], o, lse, req_to_token, seq, logits, ns, scale,
                                 page_size=1, is_mla=True)
        return o

    return call, call_default_scales, f"decode_attention_fwd page_size=1 splits{ns}"


def build_page1_triton(tda: Any, inp: CaseInputs) -> Prepared:
    """The ``page1_triton`` method; the variant ``default_scales`` (recorded as ``ms_default_scales``) is the call
    without scale tensors, as the anchors in ../shared/reference/anchors-h200.md were measured."""
    call, default, desc = page1_call(tda, inp.q, inp.kv_cache, inp.indices, inp.softmax_scale)
    return Prepared(fn=call, config=desc, variants={"default_scales": default})

"""DeepGEMM adapters (the indexer peer, vLLM 0.33's API): the only place its call shapes are written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...formats import D_INDEX, INDEXER_ROW_BYTES, unpack_indexer_cache
from ..inputs import IndexerInputs
from ..methods import Prepared, Unsupported, invalid_columns, topk_positions
from ..timing import warm_up

# The functions a DeepGEMM must have (the API of the DeepGEMM in vLLM 0.33.0).
DEEPGEMM_FUNCTIONS = ("get_paged_mqa_logits_metadata", "fp8_fp4_paged_mqa_logits", "fp8_fp4_mqa_logits", "get_num_sms")


def deepgemm_logits_call(dg: Any, inp: IndexerInputs) -> tuple[Callable[[], torch.Tensor], str]:
    """The DeepGEMM logits call for an indexer case, as vLLM 0.33 makes it, and its description.

    decode: ``fp8_fp4_paged_mqa_logits((q [B,1,Hi,128], None), cache [nb,bs,1,132], weights, context_lens [B,1],
    block_table, schedule_meta, max_len)`` with ``context_lens = position + 1`` and the schedule metadata computed
    once outside the timed call (vLLM computes it once per step, shared by all layers). prefill:
    ``fp8_fp4_mqa_logits((q [T,Hi,128], None), (k [N,128] e4m3, k_scale [N] f32), weights, ks, ke, max_len)`` on the
    request's K gathered into contiguous tensors once, outside the timed call (vLLM gathers it per chunk with its
    own kernel), ``ks = 0``, ``ke = position + 1``. DeepGEMM does not clean the columns past a row's length."""
    c = inp.case
    T, Hi = inp.q.shape[:2]
    bs, L = c.block_size, inp.max_len
    w = inp.weights.contiguous()
    if c.phase == "decode":
        ctx_lens = (inp.positions + 1).to(torch.int32).view(T, 1).contiguous()
        bt = inp.block_table[inp.req_id_per_token.long()].contiguous()  # one table row per query row
        kv4 = inp.k_cache.view(inp.k_cache.shape[0], bs, 1, INDEXER_ROW_BYTES)
        q4 = inp.q.view(T, 1, Hi, D_INDEX)
        meta = dg.get_paged_mqa_logits_metadata(ctx_lens, bs, dg.get_num_sms())

        def call():
            return dg.fp8_fp4_paged_mqa_logits((q4, None), kv4, w, ctx_lens, bt, meta, L)[:, :L]

        return call, "fp8_fp4_paged_mqa_logits"
    if not bool((inp.req_id_per_token == 0).all()):
        raise Unsupported("DeepGEMM prefill here: every row of request 0")
    vals, scales = unpack_indexer_cache(inp.k_cache[inp.block_table[0].long()])  # the request's blocks in order
    k_fp8, k_sf = vals.view(-1, D_INDEX), scales.view(-1)  # e4m3 [N, 128], float32 [N]
    ks = torch.zeros(T, dtype=torch.int32, device=inp.device)
    ke = (inp.positions + 1).to(torch.int32).contiguous()
    q = inp.q.contiguous()

    def call():
        return dg.fp8_fp4_mqa_logits((q, None), (k_fp8, k_sf), w, ks, ke, L)[:, :L]

    return call, "fp8_fp4_mqa_logits (K gathered once)"


def build_deepgemm(dg: Any, inp: IndexerInputs) -> Prepared:
    """DeepGEMM's fp8 MQA-logits kernel alone (:func:`deepgemm_logits_call`); warmed up (JIT-compiled) here."""
    call, desc = deepgemm_logits_call(dg, inp)
    return Prepared(fn=call, config=f"{desc} h{inp.case.heads}", warmup_s=warm_up(call, inp.device))


def build_deepgemm_topk(dg: Any, inp: IndexerInputs) -> Prepared:
    """DeepGEMM's logits, then ``torch.topk(topk)``; where some rows end before max_len (prefill) the uncleaned
    columns past each row's length are first set to -inf in place (one masked_fill_ with a mask made once)."""
    call, desc = deepgemm_logits_call(dg, inp)
    invalid = invalid_columns(inp)
    topk = inp.case.topk

    def fn():
        lg = call()
        if invalid is not None:
            lg.masked_fill_(invalid, float("-inf"))
        return topk_positions(lg, topk)

    cfg = f"{desc} h{inp.case.heads}" + (" + -inf fill" if invalid is not None else "") + " + torch.topk"
    return Prepared(fn=fn, config=cfg, warmup_s=warm_up(fn, inp.device))

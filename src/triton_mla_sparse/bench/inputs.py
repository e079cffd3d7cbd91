"""The tensors of a case, made by the shared fixtures of :mod:`triton_mla_sparse.testing`: a paged cache whose
blocks are handed to requests from a random permutation of the pool and per-row top-k slot lists of distinct
request-local positions (attention), or vLLM's indexer layout (indexer); plus what the bench derives from them."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..formats import INDEXER_ROW_BYTES
from .. import testing
from ..testing import indexer_inputs, sparse_mla_inputs, sparse_mla_unique_bytes, v4_decode_inputs
from .cases import V4_KV_FORMAT, Case


class _Inputs:
    """What every input set derives from its case and its q."""

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def kv_format(self) -> str:
        return self.case.kv_format


@dataclass
class CaseInputs(_Inputs):
    """The arguments of one sparse MLA attention problem."""

    case: Case
    q: torch.Tensor  # [rows, heads, 576]
    kv_cache: torch.Tensor  # [num_blocks, block_size, row] in the case's format
    indices: torch.Tensor  # int32 [rows, topk] global slots
    block_table: torch.Tensor  # int32 [requests, blocks_per_request]
    unique_rows: int  # distinct cache rows referenced by all lists together
    # DeepSeek-V4 cases: each row's list lengths, the per-head sink and the second (compressed) cache with its list
    topk_length: torch.Tensor | None = None  # int32 [rows]
    attn_sink: torch.Tensor | None = None  # float32 [heads]
    extra_kv_cache: torch.Tensor | None = None
    extra_indices: torch.Tensor | None = None  # int32 [rows, extra_topk]
    extra_topk_length: torch.Tensor | None = None  # int32 [rows]

    @property
    def softmax_scale(self) -> float:
        return self.case.softmax_scale

    def extras(self, rows: torch.Tensor | None = None) -> dict:
        """The keyword arguments of the attention call beyond (q, kv_cache, indices, softmax_scale, kv_format) that
        this case has, per-row ones restricted to ``rows`` (None: all)."""
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])
        kw = dict(topk_length=self.topk_length, extra_indices=self.extra_indices,
                  extra_topk_length=self.extra_topk_length)
        kw = {k: pick(v) for k, v in kw.items() if v is not None}
        if self.attn_sink is not None:
            kw["attn_sink"] = self.attn_sink
        if self.extra_kv_cache is not None:
            kw["extra_kv_cache"] = self.extra_kv_cache
        return kw

    @property
    def unique_bytes(self) -> int:
        """Bytes a perfect kernel moves (:func:`triton_mla_sparse.testing.sparse_mla_unique_bytes`)."""
        return sparse_mla_unique_bytes(self.case.kv_format, self.unique_rows, self.q)


@dataclass
class IndexerInputs(_Inputs, testing.IndexerInputs):
    """The arguments of one DSA-indexer problem (:class:`triton_mla_sparse.testing.IndexerInputs`: the layout vLLM
    hands to its indexer, and to ours) and its case."""

    case: Case

    @property
    def max_len(self) -> int:
        """Logits width: the block table's capacity (= ctx)."""
        return self.block_table.shape[1] * self.case.block_size

    @property
    def unique_rows(self) -> int:
        """Cache tokens read by all rows together: every token of every request."""
        return self.case.requests * self.case.ctx

    @property
    def unique_bytes(self) -> int:
        """Bytes a perfect logits kernel reads: each cache token once (132 B), q and the weights once. The logits
        (rows × ctx × 4 B, written by logits-only methods; a workspace in a fused top-k) are left out."""
        return (self.unique_rows * INDEXER_ROW_BYTES + self.q.numel() * self.q.element_size()
                + self.weights.numel() * self.weights.element_size())


def indexer_args(inp: IndexerInputs) -> tuple[torch.Tensor, ...]:
    """``(q, weights, k_cache, block_table, req_id_per_token, positions)``: the leading arguments of the indexer
    calls."""
    return (inp.q, inp.weights, inp.k_cache, inp.block_table, inp.req_id_per_token, inp.positions)


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def build_inputs(case: Case, device: torch.device | str, seed: int = 0) -> CaseInputs | IndexerInputs:
    """Random inputs for ``case`` on ``device`` (seeds torch's generator): paged cache, block table, slot lists, q
    (:func:`triton_mla_sparse.testing.sparse_mla_inputs`, a :class:`CaseInputs`); for an indexer case an
    :class:`IndexerInputs` (:func:`build_indexer_inputs`)."""
    if case.kind == "indexer":
        return build_indexer_inputs(case, device, seed)
    if case.kv_format == V4_KV_FORMAT:
        v = v4_decode_inputs(rows=case.rows, heads=case.heads, ctx=case.ctx, window=case.topk,
                             extra_topk=case.extra_topk, block_size=case.block_size, q_dtype=_DTYPES[case.q_dtype],
                             device=device, seed=seed)
        return CaseInputs(case=case, **{f.name: getattr(v, f.name) for f in fields(v)})
    t = sparse_mla_inputs(case.kind, rows=case.rows, heads=case.heads, ctx=case.ctx, topk=case.topk,
                          requests=case.requests, block_size=case.block_size, kv_format=case.kv_format,
                          q_dtype=_DTYPES[case.q_dtype], scale_format=case.scale_format, device=device, seed=seed)
    return CaseInputs(case=case, q=t.q, kv_cache=t.kv_cache, indices=t.indices, block_table=t.block_table,
                      unique_rows=t.unique_rows)


def build_indexer_inputs(case: Case, device: torch.device | str, seed: int = 0) -> IndexerInputs:
    """Random indexer inputs for ``case`` (:func:`triton_mla_sparse.testing.indexer_inputs`: vLLM's fp8 cache of
    tokens of varied magnitude, e4m3 q with its scales folded into the weights). Decode: request r's only row sits
    at position ctx - 1; prefill: rows at positions ctx - rows .. ctx - 1 of request 0."""
    if case.kind != "indexer":
        raise ValueError(f"case {case.name!r}: not an indexer case")
    t = indexer_inputs(case.phase, rows=case.rows, heads=case.heads, ctx=case.ctx, requests=case.requests,
                       block_size=case.block_size, device=device, seed=seed)
    return IndexerInputs(case=case, **{f.name: getattr(t, f.name) for f in fields(t)})

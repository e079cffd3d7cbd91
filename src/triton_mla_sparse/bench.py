"""Benchmark harness: realistic paged caches, every method on the same inputs, accuracy first, then timings against
ceilings measured in the same run.

Structure
  * :class:`Case` describes one problem (decode: one query row per request; prefill: many causal rows over one
    sequence). :func:`bench_cases` is the standard list, :func:`build_inputs` turns a case into tensors: a paged cache
    whose blocks are handed to requests from a random permutation of the pool, and per-row top-k slot lists made of
    distinct request-local positions mapped through the block table (:func:`triton_mla_sparse.topk_to_slots`).
  * A *method* computes the attention for a case. The keys are :data:`METHOD_KEYS`: ``ours`` (this package),
    ``torch`` (gather + matmul + softmax), and the third-party peers ``page1_triton`` (vLLM's dense Triton MLA decode
    kernel fed the slot list as a page_size=1 block table), ``flashmla_bf16`` (FlashMLA ``flash_mla_sparse_fwd``)
    and ``flashmla_fp8`` (FlashMLA ``flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...)``). Which peers
    apply to a case: :func:`method_applies`. A method factory ``factory(inputs) -> Prepared`` builds the call;
    ``Prepared.fn()`` runs it and returns ``out [rows, heads, 512]``.
  * Peers are imported at run time (never vendored) by :func:`load_peers`: from a folder (``--peers DIR``, else
    ``$TMS_PEERS_DIR``, else ``./.peers`` when it exists; ``../shared/tools/get-peers.sh`` makes one), else from an
    installed vLLM. A peer that cannot load is reported (``peers`` in the JSON, and an ``error`` on every case it
    applies to), never silently dropped.
  * :func:`run_case` checks every method against the float32 reference on the same inputs first (a subset of rows
    for large cases) and refuses to time a method whose relative error exceeds the case's tolerance; it then times
    it with ``triton.testing.do_bench`` (the lowest median of three windows taken in turn with the case's other
    methods, :class:`DoBenchTimer`; CUDA events, median of 3, for calls over 20 ms) and, for decode, under
    CUDA-graph replay.
  * Reports that need no GPU: :func:`plot_results` (PNG), :func:`compare_text` (old vs new, per case and method),
    :func:`ratios_text` (ours ÷ each peer), :func:`targets_text` (the issue's ours/peer targets, PASS/FAIL).

Nothing here imports triton at module import time (``triton.testing`` is imported inside the GPU timers), so the
CLI can still choose ``TRITON_INTERPRET`` before the kernels load.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from .formats import D_QK, D_V, FP8_DS_MLA_BYTES, dequantize_fp8_ds_mla, quantize_fp8_ds_mla
from .indexer import D_INDEX
from .indexer import FP8_ROW_BYTES as INDEX_ROW_BYTES
from .slots import topk_to_slots

__all__ = [
    "Case", "CaseInputs", "Prepared", "Unsupported", "PeerUnavailable", "Peers", "METHODS", "METHOD_KEYS",
    "PEER_KEYS", "register_method", "bench_cases", "smoke_cases", "build_inputs", "random_block_table",
    "random_topk_positions", "encode_cache", "reference_output", "rel_err", "tolerance", "measure_ceilings",
    "method_applies", "load_peers", "resolve_peers_dir", "method_factories", "run_case", "run_bench", "format_table",
    "config_str", "gpu_slug", "results_path", "resolve_commit", "plot_results", "compare_text", "compare_rows",
    "ratios_text", "ratio_rows", "targets_text", "target_rows", "TARGETS", "load_results",
]

GLM5_SCALE = 256 ** -0.5
DSV32_SCALE = 192 ** -0.5
ROW_BYTES = {"bf16": 2 * D_QK, "fp16": 2 * D_QK, "fp8_e4m3": D_QK, "fp8_ds_mla": FP8_DS_MLA_BYTES}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


# ----------------------------------------------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    """One benchmark problem. ``rows`` query rows; decode cases have one row per request (``requests == rows``),
    prefill cases ``rows`` causal rows at the last positions of one ``ctx``-token request."""

    name: str
    kind: str  # "decode" | "prefill" (attention) | "indexer"
    rows: int
    heads: int  # attention heads; index heads (Hi) for indexer cases
    topk: int
    ctx: int  # tokens per request
    kv_format: str  # "bf16" | "fp16" | "fp8_ds_mla"; indexer cases: "fp8_indexer" (INDEXER_KV_FORMAT)
    requests: int
    block_size: int = 64
    q_dtype: str = "bfloat16"
    softmax_scale: float = GLM5_SCALE
    scale_format: str = "pow2"  # fp8_ds_mla writer convention
    check_rows: int = 256  # accuracy is checked on at most this many rows (a random subset)
    phase: str | None = None  # indexer cases: "decode" (one row per request) | "prefill" (causal rows, one request)

    @property
    def pairs(self) -> int:
        """(row, token) pairs an indexer case scores: every row sees the tokens up to its position (decode rows sit
        at the last position, ``ctx`` tokens each; prefill rows are the last ``rows`` positions of the request)."""
        if self.phase == "prefill":
            return self.rows * (self.ctx - self.rows) + self.rows * (self.rows + 1) // 2
        return self.rows * self.ctx

    @property
    def flops(self) -> int:
        if self.kind == "indexer":
            return 2 * self.heads * D_INDEX * self.pairs
        return 2 * self.heads * self.topk * (D_QK + D_V) * self.rows


def _ctx_label(ctx: int) -> str:
    return f"{ctx // 1024}K" if ctx % 1024 == 0 else str(ctx)


def decode_case(heads, batch, kv_format, *, ctx=8192, topk=2048, block_size=64, q_dtype="bfloat16") -> Case:
    scale = DSV32_SCALE if heads == 128 else GLM5_SCALE
    return Case(name=f"decode h{heads} B={batch} ctx{_ctx_label(ctx)} {kv_format}", kind="decode", rows=batch,
                heads=heads, topk=topk, ctx=ctx, kv_format=kv_format, requests=batch, block_size=block_size,
                q_dtype=q_dtype, softmax_scale=scale)


def prefill_case(heads, kv_format, *, rows=4096, ctx=32768, topk=2048, block_size=64, q_dtype="bfloat16") -> Case:
    scale = DSV32_SCALE if heads == 128 else GLM5_SCALE
    return Case(name=f"prefill h{heads} T={rows} ctx{_ctx_label(ctx)} {kv_format}", kind="prefill", rows=rows,
                heads=heads, topk=topk, ctx=ctx, kv_format=kv_format, requests=1, block_size=block_size,
                q_dtype=q_dtype, softmax_scale=scale)


INDEXER_KV_FORMAT = "fp8_indexer"  # vLLM's fp8 indexer cache: per block bs·128 e4m3 values, then bs float32 scales
KINDS = ("attention", "indexer")  # case groups: attention = kind "decode" / "prefill"; indexer = kind "indexer"


def case_group(case_or_kind) -> str:
    """``"indexer"`` for indexer cases (a :class:`Case`, a case record or a kind string), else ``"attention"``."""
    kind = case_or_kind if isinstance(case_or_kind, str) else (
        case_or_kind.get("kind") if isinstance(case_or_kind, dict) else case_or_kind.kind)
    return "indexer" if kind == "indexer" else "attention"


def indexer_case(heads, phase, *, rows=None, ctx=None, topk=2048, block_size=64, check_rows=128) -> Case:
    """A DSA-indexer case: fp8 e4m3 q ``[rows, heads, 128]``, float32 weights, vLLM's fp8 indexer cache (132 bytes
    per token), top-``topk`` selection. ``phase`` "decode": ``rows`` requests (default 64) of ``ctx`` tokens (default
    32K), one row each at the last position; "prefill": ``rows`` (default 4096) causal rows at the last positions of
    one ``ctx``-token (default 32K) request."""
    if phase == "decode":
        rows = 64 if rows is None else rows
        ctx = 32768 if ctx is None else ctx
        name, requests = f"indexer decode h{heads} B={rows} ctx{_ctx_label(ctx)}", rows
    elif phase == "prefill":
        rows = 4096 if rows is None else rows
        ctx = 32768 if ctx is None else ctx
        name, requests = f"indexer prefill h{heads} T={rows} ctx{_ctx_label(ctx)}", 1
    else:
        raise ValueError(f"phase: expected 'decode' or 'prefill', got {phase!r}")
    return Case(name=name, kind="indexer", rows=rows, heads=heads, topk=topk, ctx=ctx, kv_format=INDEXER_KV_FORMAT,
                requests=requests, block_size=block_size, q_dtype="float8_e4m3fn", softmax_scale=1.0,
                check_rows=check_rows, phase=phase)


def _parse_kinds(kinds) -> tuple[str, ...]:
    if kinds is None:
        return KINDS
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds: expected a comma-separated subset of {', '.join(KINDS)}, got {bad or 'nothing'}")
    return kinds


def bench_cases(quick: bool = False, kinds=None) -> list[Case]:
    """The standard case list (see benchmarks/NOTES.md); ``quick`` keeps a subset that runs in about a minute.
    ``kinds``: which case groups (:data:`KINDS`, default both): the attention cases, then the indexer cases."""
    kinds = _parse_kinds(kinds)
    fmts = ("bf16", "fp8_ds_mla")
    cases: list[Case] = []
    if "attention" in kinds:
        if quick:
            cases += [decode_case(h, 64, f) for h in (16, 128) for f in fmts]
            cases += [prefill_case(64, f) for f in fmts]
        else:
            cases += [decode_case(h, 64, f) for h in (8, 16, 32, 64, 128) for f in fmts]
            cases += [decode_case(16, 256, f) for f in fmts]
            cases += [decode_case(128, 1, f, ctx=65536) for f in fmts]
            cases += [prefill_case(h, f) for h in (8, 16, 64, 128) for f in fmts]
    if "indexer" in kinds:
        if quick:
            cases += [indexer_case(64, "decode", ctx=131072), indexer_case(64, "prefill")]
        else:
            cases += [indexer_case(h, "decode", ctx=c) for h in (64, 32) for c in (32768, 131072)]
            cases += [indexer_case(h, "prefill") for h in (64, 32)]
    return cases


def smoke_cases(kinds=None) -> list[Case]:
    """Tiny cases that exercise every code path of the harness (fp16 q: the interpreter's bf16 dots are garbage)."""
    kinds = _parse_kinds(kinds)
    kw = dict(topk=64, q_dtype="float16")
    cases: list[Case] = []
    if "attention" in kinds:
        cases += [
            decode_case(8, 2, "fp16", ctx=256, **kw),
            decode_case(32, 2, "fp8_ds_mla", ctx=256, **kw),
            decode_case(128, 1, "fp16", ctx=512, **kw),
            replace(prefill_case(16, "fp8_ds_mla", rows=6, ctx=512, **kw), check_rows=4),
            prefill_case(8, "fp16", rows=4, ctx=256, **kw),
        ]
    if "indexer" in kinds:
        cases += [
            indexer_case(4, "decode", rows=3, ctx=96, topk=40, block_size=16),
            indexer_case(8, "prefill", rows=5, ctx=80, topk=32, block_size=16, check_rows=3),
        ]
    return cases


# ----------------------------------------------------------------------------------------------------- inputs

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
    case: Case
    q: torch.Tensor  # [rows, heads, 576]
    kv_cache: torch.Tensor  # [num_blocks, block_size, row] in the case's format
    indices: torch.Tensor  # int32 [rows, topk] global slots
    block_table: torch.Tensor  # int32 [requests, blocks_per_request]
    unique_rows: int  # distinct cache rows referenced by all lists together

    @property
    def softmax_scale(self) -> float:
        return self.case.softmax_scale

    @property
    def unique_bytes(self) -> int:
        """Bytes a perfect kernel moves: each referenced cache row once, q read once, out written once."""
        c = self.case
        return (self.unique_rows * ROW_BYTES[c.kv_format] + self.q.numel() * self.q.element_size()
                + c.rows * c.heads * D_V * self.q.element_size())


def random_block_table(num_requests: int, blocks_per_request: int, device, *, pool_blocks: int | None = None):
    """int32 ``[num_requests, blocks_per_request]``: each request's blocks taken in turn from a random permutation of
    a pool of ``pool_blocks`` (default: exactly enough) blocks, so a request's pages are scattered over the pool."""
    need = num_requests * blocks_per_request
    pool = need if pool_blocks is None else pool_blocks
    if pool < need:
        raise ValueError(f"pool_blocks: expected at least {need}, got {pool}")
    perm = torch.randperm(pool, device=device)[:need]
    return perm.view(num_requests, blocks_per_request).to(torch.int32)


def random_topk_positions(rows: int, ctx: int, topk: int, device, *, row_positions: torch.Tensor | None = None,
                          chunk: int = 1024):
    """int32 ``[rows, topk]`` distinct request-local positions per row, in random order. With ``row_positions``
    (the position of each query row) a row only picks positions ``<= row_positions[t]`` (causal; a row must see at
    least ``topk`` tokens)."""
    if topk > ctx:
        raise ValueError(f"topk: expected at most ctx = {ctx}, got {topk}")
    out = torch.empty(rows, topk, dtype=torch.int32, device=device)
    cols = torch.arange(ctx, device=device)
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        key = torch.rand(r1 - r0, ctx, device=device)
        if row_positions is not None:
            key = key.masked_fill(cols[None, :] > row_positions[r0:r1, None], -1.0)
        out[r0:r1] = key.topk(topk, dim=1).indices.to(torch.int32)
    return out


def encode_cache(values: torch.Tensor, kv_format: str, *, scale_format: str = "pow2") -> torch.Tensor:
    """Store float ``values [..., 576]`` in ``kv_format`` ("bf16", "fp16" or "fp8_ds_mla")."""
    if kv_format == "bf16":
        return values.to(torch.bfloat16)
    if kv_format == "fp16":
        return values.to(torch.float16)
    if kv_format == "fp8_ds_mla":
        return quantize_fp8_ds_mla(values, scale_format=scale_format)
    raise ValueError(f"kv_format: expected 'bf16', 'fp16' or 'fp8_ds_mla', got {kv_format!r}")


def _paged_layout(case: Case, device, seed: int):
    """Seed torch's generator, then the case's paged layout: (device, block_size, blocks in the pool, a random block
    table [requests, ctx / block_size] handing every request its own blocks)."""
    device = torch.device(device)
    torch.manual_seed(seed)
    bs = case.block_size
    if case.ctx % bs:
        raise ValueError(f"ctx {case.ctx} must be a multiple of block_size {bs}")
    bpr = case.ctx // bs
    return device, bs, case.requests * bpr, random_block_table(case.requests, bpr, device)


def build_inputs(case: Case, device, seed: int = 0):
    """Random inputs for ``case`` on ``device`` (seeded): paged cache, block table, slot lists, q (a
    :class:`CaseInputs`); for an indexer case an :class:`IndexerInputs` (:func:`build_indexer_inputs`)."""
    if case.kind == "indexer":
        return build_indexer_inputs(case, device, seed)
    device, bs, num_blocks, block_table = _paged_layout(case, device, seed)
    # Cache values: standard normal latents and rope, stored in the case's format.
    values = torch.randn(num_blocks, bs, D_QK, dtype=torch.bfloat16, device=device)
    kv_cache = encode_cache(values, case.kv_format, scale_format=case.scale_format)
    del values
    if case.kind == "decode":
        if case.rows != case.requests:
            raise ValueError("decode cases have one row per request")
        req = torch.arange(case.rows, dtype=torch.int32, device=device)
        positions = random_topk_positions(case.rows, case.ctx, case.topk, device)
    elif case.kind == "prefill":
        if case.requests != 1 or case.rows > case.ctx or case.ctx - case.rows + 1 < case.topk:
            raise ValueError("prefill cases: one request; rows at its last positions must each see >= topk tokens")
        req = torch.zeros(case.rows, dtype=torch.int32, device=device)
        row_pos = torch.arange(case.ctx - case.rows, case.ctx, device=device)
        positions = random_topk_positions(case.rows, case.ctx, case.topk, device, row_positions=row_pos)
    else:
        raise ValueError(f"kind: expected 'decode' or 'prefill', got {case.kind!r}")
    indices = topk_to_slots(positions, req, block_table, bs)
    del positions
    unique_rows = int(torch.unique(indices[indices >= 0]).numel())
    q = torch.randn(case.rows, case.heads, D_QK, dtype=_DTYPES[case.q_dtype], device=device)
    return CaseInputs(case=case, q=q, kv_cache=kv_cache, indices=indices, block_table=block_table,
                      unique_rows=unique_rows)


@dataclass
class IndexerInputs(_Inputs):
    """The arguments of one DSA-indexer problem, in the layout vLLM hands to its indexer (and to ours)."""

    case: Case
    q: torch.Tensor  # float8_e4m3fn [rows, Hi, 128] (per-(row, head) scales folded into weights, as vLLM does)
    weights: torch.Tensor  # float32 [rows, Hi]
    k_cache: torch.Tensor  # uint8 [num_blocks, block_size · 132]: vLLM's fp8 indexer layout
    block_table: torch.Tensor  # int32 [requests, ctx / block_size]
    req_id_per_token: torch.Tensor  # int32 [rows]
    positions: torch.Tensor  # int32 [rows]: row t scores request-local tokens 0 .. positions[t]

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
        return (self.unique_rows * INDEX_ROW_BYTES + self.q.numel() * self.q.element_size()
                + self.weights.numel() * self.weights.element_size())


def encode_indexer_cache(values: torch.Tensor) -> torch.Tensor:
    """float ``values [num_blocks, block_size, 128]`` -> vLLM's fp8 indexer cache, uint8 ``[num_blocks,
    block_size · 132]``: per block the block_size · 128 e4m3 values (token-major), then block_size float32 scales
    (scale = amax / 448 per token, as vLLM's indexer cache writer and DeepGEMM's tests make them)."""
    nb, bs, d = values.shape
    if d != D_INDEX:
        raise ValueError(f"values: expected last dim {D_INDEX}, got {d}")
    scale = (values.abs().amax(-1).float() / 448.0).clamp_min(1e-8)  # [nb, bs]
    q8 = (values.float() / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    buf = torch.empty(nb, bs * INDEX_ROW_BYTES, dtype=torch.uint8, device=values.device)
    buf[:, :bs * D_INDEX] = q8.view(torch.uint8).reshape(nb, bs * D_INDEX)
    buf[:, bs * D_INDEX:] = scale.contiguous().view(torch.uint8).reshape(nb, bs * 4)
    return buf


def build_indexer_inputs(case: Case, device, seed: int = 0) -> IndexerInputs:
    """Random indexer inputs for ``case`` (seeded): cache tokens of varied magnitude in blocks handed to the
    requests from a random permutation of the pool; q quantised to e4m3 per (row, head) with the scale folded into
    the weights (vLLM's convention); weights ~ N(0, 1/Hi). Decode: request r's only row sits at position ctx - 1;
    prefill: rows at positions ctx - rows .. ctx - 1 of request 0."""
    device, bs, nb, block_table = _paged_layout(case, device, seed)
    k_cache = torch.empty(nb, bs * INDEX_ROW_BYTES, dtype=torch.uint8, device=device)
    step = max(1, (1 << 25) // (bs * D_INDEX))  # encode in pieces: a float32 copy of a 1 GB cache is 4 GB
    for b0 in range(0, nb, step):
        b1 = min(nb, b0 + step)
        vals = torch.randn(b1 - b0, bs, D_INDEX, device=device)
        vals *= torch.empty(b1 - b0, bs, 1, device=device).uniform_(0.25, 2.0)
        k_cache[b0:b1] = encode_indexer_cache(vals)
    T, Hi = case.rows, case.heads
    if case.phase == "decode":
        if case.rows != case.requests:
            raise ValueError("indexer decode cases have one row per request")
        req = torch.arange(T, dtype=torch.int32, device=device)
        positions = torch.full((T,), case.ctx - 1, dtype=torch.int32, device=device)
    elif case.phase == "prefill":
        if case.requests != 1 or case.rows > case.ctx:
            raise ValueError("indexer prefill cases: one request, rows <= ctx")
        req = torch.zeros(T, dtype=torch.int32, device=device)
        positions = torch.arange(case.ctx - T, case.ctx, dtype=torch.int32, device=device)
    else:
        raise ValueError(f"phase: expected 'decode' or 'prefill', got {case.phase!r}")
    qf = torch.randn(T, Hi, D_INDEX, device=device)
    q_scale = (qf.abs().amax(-1) / 448.0).clamp_min(1e-8)  # [T, Hi]
    q = (qf / q_scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    del qf
    weights = (torch.randn(T, Hi, device=device) * Hi ** -0.5 * q_scale).float().contiguous()
    return IndexerInputs(case=case, q=q, weights=weights, k_cache=k_cache, block_table=block_table,
                         req_id_per_token=req, positions=positions)


# ----------------------------------------------------------------------------------------------------- methods

METHOD_KEYS = ("ours", "torch", "page1_triton", "flashmla_bf16", "flashmla_fp8", "ours_logits", "deepgemm",
               "deepgemm_topk")
PEER_KEYS = tuple(m for m in METHOD_KEYS if not m.startswith("ours"))
EXTERNAL_PEERS = ("page1_triton", "flashmla_bf16", "flashmla_fp8", "deepgemm", "deepgemm_topk")
DEEPGEMM_KEYS = ("deepgemm", "deepgemm_topk")
# Indexer cases: ours = indexer_topk (logits + select), ours_logits = indexer_logits alone, deepgemm = DeepGEMM's
# logits alone, deepgemm_topk = DeepGEMM's logits + torch.topk, torch = plain torch logits + torch.topk. Run order:
INDEXER_METHOD_KEYS = ("ours", "ours_logits", "deepgemm", "deepgemm_topk", "torch")
INDEXER_ONLY = ("ours_logits", "deepgemm", "deepgemm_topk")


class Unsupported(Exception):
    """Raised by a method factory for a case the method cannot run (recorded as an ``error``, not timed)."""


class PeerUnavailable(Exception):
    """Raised by the factory of a peer that could not be loaded (recorded as ``error: not available: ...``)."""


@dataclass
class Prepared:
    fn: Callable[[], torch.Tensor]  # one call; returns out [rows, heads, 512]
    config: str | None = None
    graphable: bool = True  # can be captured in a CUDA graph
    # Other eager call patterns of the same method, each checked and timed like fn and recorded as ms_<key>
    # (e.g. page1_triton called exactly as benchmarks/sweep.py did, for comparison with the anchors).
    variants: dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict)
    warmup_s: float | None = None  # seconds of a first (compiling) call made while building, when there was one


MethodFactory = Callable[["CaseInputs"], Prepared]
METHODS: dict[str, MethodFactory] = {}


def register_method(name: str):
    """Decorator: ``@register_method("peer") def build(inputs) -> Prepared``."""
    def deco(factory: MethodFactory) -> MethodFactory:
        METHODS[name] = factory
        return factory
    return deco


def method_applies(name: str, case: Case) -> bool:
    """Whether method ``name`` is run on ``case`` at all (a peer that does not apply is absent from the case).

    ``ours`` and ``torch``: every case. ``page1_triton``: bf16 (and fp16, the CPU smoke format) caches, decode and
    prefill. ``flashmla_bf16``: bf16 caches, decode and prefill. ``flashmla_fp8``: fp8_ds_mla caches, decode and
    prefill (prefill through the decode kernel with each row as its own batch entry, as vLLM's fp8 path does).
    ``ours_logits``, ``deepgemm``, ``deepgemm_topk``: indexer cases only (and no attention peer applies to them)."""
    if name in ("ours", "torch"):
        return True
    if name in INDEXER_ONLY:
        return case.kind == "indexer"
    if case.kind not in ("decode", "prefill"):
        return False
    if name == "page1_triton":
        return case.kv_format in ("bf16", "fp16")
    if name == "flashmla_bf16":
        return case.kv_format == "bf16"
    if name == "flashmla_fp8":
        return case.kv_format == "fp8_ds_mla"
    return name in METHODS  # a registered extra method: every case


def config_str(cfg) -> str:
    """Short text of an ``AttentionConfig``: kernel, head block, gather block, splits, warps/stages, and any
    boolean option that is switched on."""
    if cfg.kernel == "prefill":
        text = f"prefill bh{cfg.block_h} bn{cfg.block_n} w{cfg.num_warps} st{cfg.num_stages}"
    else:
        text = (f"decode bh{cfg.block_h} bn{cfg.block_n} split{cfg.num_splits}x{cfg.split_len} w{cfg.num_warps} "
                f"st{cfg.num_stages}")
    flags = [k for k, v in getattr(cfg, "__dict__", {}).items() if v is True]
    return text + "".join(f" +{k}" for k in flags)


@register_method("ours")
def _build_ours(inp: CaseInputs) -> Prepared:
    if inp.case.kind == "indexer":
        return _build_ours_indexer(inp)
    from .api import sparse_mla_attention, sparse_mla_attention_with_config

    q, kv, idx, scale, fmt = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, inp.kv_format
    out = torch.empty(q.shape[0], q.shape[1], D_V, dtype=q.dtype, device=q.device)
    # One call to learn the configuration the API picks for this shape (also compiles the kernel).
    _, cfg = sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt, out=out, return_config=True)

    def fn():
        return sparse_mla_attention(q, kv, idx, scale, kv_format=fmt, out=out)

    return Prepared(fn=fn, config=config_str(cfg))


@register_method("torch")
def _build_torch(inp: CaseInputs) -> Prepared:
    """Plain PyTorch: gather the rows, (dequantise fp8_ds_mla to bf16), matmul, softmax, matmul in q's dtype.
    Indexer cases: :func:`_build_torch_indexer`."""
    if inp.case.kind == "indexer":
        return _build_torch_indexer(inp)
    q, kv, idx, scale, fmt = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, inp.kv_format
    if not kv.is_contiguous():
        raise Unsupported("torch method needs a contiguous cache")
    flat = kv.reshape(-1, kv.shape[-1])
    num_slots = flat.shape[0]

    def fn():
        i = idx.long()
        valid = (i >= 0) & (i < num_slots)
        rows = flat[torch.where(valid, i, torch.zeros_like(i))]  # [T, k, row]
        if fmt == "fp8_ds_mla":
            k = dequantize_fp8_ds_mla(rows).to(q.dtype)
        else:
            k = rows.to(q.dtype)
        s = torch.matmul(q, k.transpose(1, 2)) * scale  # [T, H, k]
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, k[..., :D_V])

    return Prepared(fn=fn, config="gather+matmul+softmax")


# ----- the DSA indexer methods

def _indexer_args(inp: IndexerInputs) -> tuple:
    return (inp.q, inp.weights, inp.k_cache, inp.block_table, inp.req_id_per_token, inp.positions)


def _indexer_config_str(inp: IndexerInputs, what: str) -> str:
    try:
        from .indexer import check_indexer_inputs, choose_indexer_config

        cfg = choose_indexer_config(check_indexer_inputs(*_indexer_args(inp)))
    except Exception as e:  # noqa: BLE001 - the call itself reports real problems
        return f"{what} (config: {_short_exc(e, 60)})"
    g = lambda k: getattr(cfg, k, "?")  # noqa: E731 - the config's fields move with the kernel's tuning
    chunk = f"x{cfg.chunk_tiles}" if hasattr(cfg, "chunk_tiles") else ""
    return (f"{what} bh{g('block_h')} bk{g('block_k')}{chunk} w{g('num_warps')} st{g('num_stages')}"
            + (" fp8dot" if getattr(cfg, "use_fp8_dot", False) else "")
            + f" sel-{g('select')}")


def _build_ours_indexer(inp: IndexerInputs) -> Prepared:
    """``indexer_topk``: the logits kernel into a float32 workspace, then the radix select, into a preallocated
    int32 ``[rows, topk]`` (the call vLLM would make per layer)."""
    from .indexer import indexer_topk

    args, topk, L = _indexer_args(inp), inp.case.topk, inp.max_len
    out = torch.empty(inp.case.rows, topk, dtype=torch.int32, device=inp.device)

    def fn():
        return indexer_topk(*args, topk, max_len=L, out=out)

    return Prepared(fn=fn, config=_indexer_config_str(inp, "indexer_topk"))


@register_method("ours_logits")
def _build_ours_logits(inp: IndexerInputs) -> Prepared:
    """``indexer_logits`` alone: float32 ``[rows, ctx]`` (allocated per call, as DeepGEMM allocates its output)."""
    from .indexer import indexer_logits

    if inp.case.kind != "indexer":
        raise Unsupported("ours_logits is the indexer logits kernel (indexer cases only)")
    args, L = _indexer_args(inp), inp.max_len

    def fn():
        return indexer_logits(*args, L)

    return Prepared(fn=fn, config=_indexer_config_str(inp, "indexer_logits"))


def _invalid_columns(inp: IndexerInputs) -> torch.Tensor | None:
    """bool ``[rows, max_len]``: columns past each row's position (None when every column is a candidate)."""
    cols = torch.arange(inp.max_len, device=inp.device)
    mask = cols[None, :] > inp.positions.long()[:, None]
    return mask if bool(mask.any()) else None


def _topk_positions(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """torch.topk of each row, -1 where the value is -inf (not a candidate) or past the row's width. Unsorted: the
    contract leaves the order free, and sorted=False measured 12-20 % faster on the H200 (the strictest peer)."""
    k = min(topk, logits.shape[1])
    vals, idx = torch.topk(logits, k, dim=1, sorted=False)
    idx = idx.masked_fill(torch.isneginf(vals), -1)
    if k < topk:
        idx = torch.cat([idx, idx.new_full((idx.shape[0], topk - k), -1)], 1)
    return idx


def _build_torch_indexer(inp: IndexerInputs) -> Prepared:
    """Plain PyTorch indexer: gather the requests' cache blocks through the block table, e4m3 -> bf16 (exact), bf16
    ``q · kᵀ`` (fp32 accumulation) in row chunks of <= 1 GB of scores, × the token scales, relu, the weighted head
    sum as a bf16 matmul, -inf past each row's position, then ``torch.topk``. The variant ``logits`` (recorded as
    ``ms_logits``) stops before the top-k. Rows must either all belong to request 0 (prefill: one K shared by every
    row) or be one row per request in order (decode)."""
    c = inp.case
    T, Hi = inp.q.shape[:2]
    bs, L, topk = c.block_size, inp.max_len, c.topk
    R, bpr = inp.block_table.shape
    req = inp.req_id_per_token.tolist()
    if R == 1 and all(r == 0 for r in req):
        shared = True
    elif R == T and req == list(range(T)):
        shared = False
    else:
        raise Unsupported("the torch indexer handles one request shared by all rows, or one row per request")
    nb = inp.k_cache.shape[0]
    vals_u8 = inp.k_cache[:, :bs * D_INDEX].reshape(nb, bs, D_INDEX)  # views of the cache bytes
    scale_u8 = inp.k_cache[:, bs * D_INDEX:bs * INDEX_ROW_BYTES]
    bt = inp.block_table.long()
    invalid = _invalid_columns(inp)
    chunk = max(1, (1 << 30) // (Hi * L * 2))
    q, w = inp.q, inp.weights

    def logits():
        kv = vals_u8[bt].reshape(R, L, D_INDEX).view(torch.float8_e4m3fn).to(torch.bfloat16)
        ks = scale_u8[bt].reshape(R, bpr, bs * 4).view(torch.float32).reshape(R, L).to(torch.bfloat16)
        qb, wb = q.to(torch.bfloat16), w.to(torch.bfloat16)
        out = torch.empty(T, L, dtype=torch.float32, device=q.device)
        for t0 in range(0, T, chunk):
            t1 = min(T, t0 + chunk)
            if shared:
                s = torch.matmul(qb[t0:t1], kv[0].t())  # [t, Hi, L]
                s.mul_(ks[0])
            else:
                s = torch.matmul(qb[t0:t1], kv[t0:t1].transpose(1, 2))
                s.mul_(ks[t0:t1, None, :])
            s.relu_()
            out[t0:t1] = torch.matmul(wb[t0:t1, None, :], s)[:, 0]
            del s
        if invalid is not None:
            out.masked_fill_(invalid, float("-inf"))
        return out

    def fn():
        return _topk_positions(logits(), topk)

    return Prepared(fn=fn, config="gather+bf16 matmul+relu+w-sum+torch.topk", variants={"logits": logits})


def _deepgemm_logits_call(dg, inp: IndexerInputs) -> tuple[Callable[[], torch.Tensor], str]:
    """The DeepGEMM logits call for the case, as vLLM 0.33 makes it, and its description.

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
        kv4 = inp.k_cache.view(inp.k_cache.shape[0], bs, 1, INDEX_ROW_BYTES)
        q4 = inp.q.view(T, 1, Hi, D_INDEX)
        meta = dg.get_paged_mqa_logits_metadata(ctx_lens, bs, dg.get_num_sms())

        def call():
            return dg.fp8_fp4_paged_mqa_logits((q4, None), kv4, w, ctx_lens, bt, meta, L)[:, :L]

        return call, "fp8_fp4_paged_mqa_logits"
    if not bool((inp.req_id_per_token == 0).all()):
        raise Unsupported("DeepGEMM prefill here: every row of request 0")
    blocks = inp.k_cache[inp.block_table[0].long()]  # [blocks, bs * 132], the request's blocks in order
    k_fp8 = blocks[:, :bs * D_INDEX].contiguous().view(torch.float8_e4m3fn).view(-1, D_INDEX)
    k_sf = blocks[:, bs * D_INDEX:].contiguous().view(torch.float32).view(-1)
    ks = torch.zeros(T, dtype=torch.int32, device=inp.device)
    ke = (inp.positions + 1).to(torch.int32).contiguous()
    q = inp.q.contiguous()

    def call():
        return dg.fp8_fp4_mqa_logits((q, None), (k_fp8, k_sf), w, ks, ke, L)[:, :L]

    return call, "fp8_fp4_mqa_logits (K gathered once)"


def _warm_up(fn, device) -> float:
    """One call (DeepGEMM JIT-compiles its kernels on first use), synchronised; returns its seconds."""
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _build_deepgemm(dg, inp: IndexerInputs) -> Prepared:
    """DeepGEMM's fp8 MQA-logits kernel alone (see :func:`_deepgemm_logits_call`); warmed up (compiled) here."""
    call, desc = _deepgemm_logits_call(dg, inp)
    return Prepared(fn=call, config=f"{desc} h{inp.case.heads}", warmup_s=_warm_up(call, inp.device))


def _build_deepgemm_topk(dg, inp: IndexerInputs) -> Prepared:
    """DeepGEMM's logits, then ``torch.topk(topk)``; where some rows end before max_len (prefill) the uncleaned
    columns past each row's length are first set to -inf in place (one masked_fill_ with a mask made once)."""
    call, desc = _deepgemm_logits_call(dg, inp)
    invalid = _invalid_columns(inp)
    topk = inp.case.topk

    def fn():
        lg = call()
        if invalid is not None:
            lg.masked_fill_(invalid, float("-inf"))
        return _topk_positions(lg, topk)

    cfg = f"{desc} h{inp.case.heads}" + (" + -inf fill" if invalid is not None else "") + " + torch.topk"
    return Prepared(fn=fn, config=cfg, warmup_s=_warm_up(fn, inp.device))


# The peer calls below are the ones benchmarks/sweep.py ran on the H200 (same argument shapes, padding and slicing);
# padding q and building the page1 block table happen once here, outside the timed call.

def _build_flashmla_bf16(fmi, inp: CaseInputs) -> Prepared:
    """FlashMLA ``flash_mla_sparse_fwd`` on the bf16 cache viewed as [slots, 1, 576]; heads padded to a multiple of
    64 unless 8/16/32 (SM90), output sliced back to the case's heads."""
    q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale
    T, H, _ = q.shape
    flat = kv.view(-1, 1, D_QK)
    hp = H if H in (8, 16, 32) or H % 64 == 0 else 64 * math.ceil(H / 64)
    qp = q if hp == H else torch.cat([q, q.new_zeros(T, hp - H, D_QK)], 1)
    idx3 = idx.view(T, 1, -1)

    def fn():
        return fmi.flash_mla_sparse_fwd(qp, flat, idx3, scale)[0][:, :H]

    return Prepared(fn=fn, config="flash_mla_sparse_fwd" + (f" heads {H}->{hp}" if hp != H else ""))


def _build_flashmla_fp8(fmi, inp: CaseInputs) -> Prepared:
    """FlashMLA ``flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...)`` on the 656-byte cache viewed as
    [blocks, block_size, 1, 656]; heads padded to 64 (<= 64) or 128 as vLLM does, output sliced back. Prefill runs
    every row as its own batch entry of the decode kernel."""
    q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale
    T, H, _ = q.shape
    hp = 64 if H <= 64 else 128
    qp = torch.cat([q, q.new_zeros(T, hp - H, D_QK)], 1) if hp != H else q
    meta = fmi.get_mla_metadata()[0] if hasattr(fmi, "get_mla_metadata") else None
    k4 = kv.view(kv.shape[0], kv.shape[1], 1, FP8_DS_MLA_BYTES)
    q4 = qp.view(T, 1, hp, D_QK)
    idx3 = idx.view(T, 1, -1)

    def fn():
        o = fmi.flash_mla_with_kvcache(q4, k4, None, None, D_V, meta, softmax_scale=scale, is_fp8_kvcache=True,
                                       indices=idx3)[0]
        return o.view(T, hp, D_V)[:, :H]

    cfg = "flash_mla_with_kvcache fp8" + (f" heads {H}->{hp}" if hp != H else "")
    if inp.case.kind == "prefill":
        cfg += ", rows as batch"  # the decode kernel, each query row its own batch entry
    return Prepared(fn=fn, config=cfg)


def _build_page1_triton(tda, inp: CaseInputs) -> Prepared:
    """vLLM's dense Triton MLA decode kernel with the slot list as a page_size=1 block table: ``req_to_token`` =
    the slots (invalid -> slot 0), every row's sequence length = top-k, 4 KV splits."""
    q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale
    T, H, _ = q.shape
    dev = q.device
    flat = kv.view(-1, 1, D_QK)
    topk = idx.shape[1]
    valid = idx >= 0
    req_to_token = torch.where(valid, idx, 0).contiguous()
    seq = torch.full((T,), topk, dtype=torch.int32, device=dev)
    o = torch.empty(T, H, D_V, dtype=q.dtype, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    ns = 4
    logits = torch.empty(T, H, ns, D_V + 1, dtype=torch.float32, device=dev)
    # k/v scales: vLLM's Triton MLA backend passes the layer's scale tensors (k_scale=layer._k_scale, ...); without
    # them decode_attention_fwd makes two 1.0 tensors on every call, i.e. two synchronous host-to-device copies,
    # which cost ~0.1 ms of idle GPU per call and cannot be captured in a CUDA graph. So `ms` and `graph_ms` use
    # 1.0 tensors made once (same values); `ms_default_scales` is the call exactly as benchmarks/sweep.py made it
    # (the anchors in ../shared/reference/anchors-h200.md were measured that way).
    one_k = torch.ones((), dtype=torch.float32, device=dev)
    one_v = torch.ones((), dtype=torch.float32, device=dev)

    def fn():
        tda.decode_attention_fwd(q, flat, flat[..., :D_V], o, lse, req_to_token, seq, logits, ns, scale,
                                 page_size=1, is_mla=True, k_scale=one_k, v_scale=one_v)
        return o

    def fn_default_scales():
        tda.decode_attention_fwd(q, flat, flat[..., :D_V], o, lse, req_to_token, seq, logits, ns, scale,
                                 page_size=1, is_mla=True)
        return o

    return Prepared(fn=fn, config=f"decode_attention_fwd page_size=1 splits{ns}",
                    variants={"default_scales": fn_default_scales})


_PEER_BUILDERS = {"page1_triton": ("page1", _build_page1_triton), "flashmla_bf16": ("flashmla", _build_flashmla_bf16),
                  "flashmla_fp8": ("flashmla", _build_flashmla_fp8), "deepgemm": ("deepgemm", _build_deepgemm),
                  "deepgemm_topk": ("deepgemm", _build_deepgemm_topk)}


# ----------------------------------------------------------------------------------------------------- peers

# peer module -> (module file in a peers folder, module in an installed vLLM, method keys it provides)
PEER_MODULES = {
    "flashmla": ("flash_mla_interface", "vllm.third_party.flashmla.flash_mla_interface",
                 ("flashmla_bf16", "flashmla_fp8")),
    "page1": ("triton_decode_attention", "vllm.v1.attention.ops.triton_decode_attention", ("page1_triton",)),
}


# DeepGEMM (the indexer peer): a package folder (get-peers.sh --deepgemm makes <peers>-deepgemm/deep_gemm), else the
# copy inside an installed vLLM. These functions must be there (the API of the DeepGEMM in vLLM 0.33.0).
DEEPGEMM_VLLM_MODULE = "vllm.third_party.deep_gemm"
DEEPGEMM_FUNCTIONS = ("get_paged_mqa_logits_metadata", "fp8_fp4_paged_mqa_logits", "fp8_fp4_mqa_logits", "get_num_sms")


@dataclass
class Peers:
    """Loaded peer modules and a one-line status per method key ("loaded from ..." / "not available: ...")."""

    modules: dict[str, Any] = field(default_factory=dict)  # "flashmla" / "page1" / "deepgemm" -> module
    status: dict[str, str] = field(default_factory=dict)  # method key -> status line
    folder: str | None = None

    def available(self, method: str) -> bool:
        return self.status.get(method, "").startswith(("loaded", "built in"))


def resolve_peers_dir(option: str | None = None, env=None, cwd: str | None = None) -> tuple[str | None, str]:
    """The peers folder and how it was chosen: ``--peers DIR``, else ``$TMS_PEERS_DIR``, else ``./.peers`` when
    it exists, else ``(None, "none")``."""
    env = os.environ if env is None else env
    if option:
        return option, "--peers"
    if env.get("TMS_PEERS_DIR"):
        return env["TMS_PEERS_DIR"], "TMS_PEERS_DIR"
    cwd = os.getcwd() if cwd is None else cwd
    if os.path.isdir(os.path.join(cwd, ".peers")):
        return os.path.join(cwd, ".peers"), "./.peers"
    return None, "none"


def resolve_deepgemm_dir(option: str | None = None, env=None, cwd: str | None = None,
                         peers_dir: str | None = None) -> tuple[str | None, str]:
    """The folder holding the ``deep_gemm`` package and how it was chosen: ``--deepgemm-dir DIR``, else
    ``$TMS_DEEPGEMM_DIR``, else ``<peers folder>-deepgemm`` beside the peers folder in use (what
    ``get-peers.sh --deepgemm`` makes), else ``./.peers-deepgemm`` when it exists, else ``(None, "none")``."""
    env = os.environ if env is None else env
    if option:
        return option, "--deepgemm-dir"
    if env.get("TMS_DEEPGEMM_DIR"):
        return env["TMS_DEEPGEMM_DIR"], "TMS_DEEPGEMM_DIR"
    if peers_dir:
        return os.path.normpath(peers_dir) + "-deepgemm", "beside the peers folder"
    cwd = os.getcwd() if cwd is None else cwd
    if os.path.isdir(os.path.join(cwd, ".peers-deepgemm")):
        return os.path.join(cwd, ".peers-deepgemm"), "./.peers-deepgemm"
    return None, "none"


def deepgemm_jit_cache_dir(env=None) -> str:
    """Where DeepGEMM's JIT writes its kernels: ``$DG_JIT_CACHE_DIR`` when set, else (set by :func:`load_peers`
    before the import) a folder in the system temp dir, reused by later runs on the same machine."""
    env = os.environ if env is None else env
    import tempfile

    return env.get("DG_JIT_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "triton-mla-sparse-deepgemm-jit")


def _import_package_from_folder(name: str, folder: str):
    """Import the package ``folder/name/`` as ``name`` (what ``sys.path.insert(0, folder); import name`` does, but
    always this folder). On failure nothing of it stays in ``sys.modules`` (an earlier module is put back)."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"folder {folder} does not exist")
    pkg = os.path.join(folder, name)
    init = os.path.join(pkg, "__init__.py")
    if not os.path.isfile(init):
        raise FileNotFoundError(f"{init} does not exist")

    def ours(k):
        return k == name or k.startswith(name + ".")

    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    for k in saved:
        del sys.modules[k]
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        for k in [k for k in sys.modules if ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)
        raise
    return mod


def _deepgemm_device_problem() -> str | None:
    """DeepGEMM's MQA-logits kernels are built for SM90 / SM100 (and SM120 in this build)."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10, 12):
        return f"DeepGEMM's MQA-logits kernels need SM90 or SM100 (SM120); this device is sm_{major}{minor}"
    return None


def _load_deepgemm(peers: Peers, wanted, *, option, env, cwd, peers_dir, use_vllm) -> None:
    """Load DeepGEMM for the method keys of :data:`DEEPGEMM_KEYS` in ``wanted`` (see :func:`load_peers`)."""
    keys = [m for m in DEEPGEMM_KEYS if m in wanted]
    if not keys:
        return
    folder, how = resolve_deepgemm_dir(option, env, cwd, peers_dir)
    reasons = []
    mod = source = None

    def set_jit_dir():  # before DeepGEMM is imported: its runtime reads the variable
        if not os.environ.get("DG_JIT_CACHE_DIR"):
            os.environ["DG_JIT_CACHE_DIR"] = deepgemm_jit_cache_dir()

    if folder:
        here = os.path.join(os.getcwd() if cwd is None else cwd, ".peers-deepgemm")
        shown = ".peers-deepgemm" if os.path.abspath(folder) == os.path.abspath(here) else f"{folder} ({how})"
        try:
            if os.path.isdir(folder):
                set_jit_dir()
            mod = _import_package_from_folder("deep_gemm", folder)
            source = f"loaded from {shown}"
        except Exception as e:  # noqa: BLE001 - e.g. OSError from the CUDA extension on a CPU-only torch
            reasons.append(f"{shown}: {_short_exc(e)}")
    else:
        reasons.append("no DeepGEMM folder (--deepgemm-dir DIR, $TMS_DEEPGEMM_DIR or ./.peers-deepgemm, made by "
                       "get-peers.sh --deepgemm)")
    if mod is None and use_vllm:
        if not _vllm_installed():
            reasons.append("vLLM: not installed")
        else:
            try:
                set_jit_dir()
                mod = importlib.import_module(DEEPGEMM_VLLM_MODULE)
                import vllm

                source = f"loaded from installed vLLM {getattr(vllm, '__version__', '?')} ({DEEPGEMM_VLLM_MODULE})"
            except Exception as e:  # noqa: BLE001
                reasons.append(f"vLLM {DEEPGEMM_VLLM_MODULE}: {_short_exc(e)}")
    if mod is not None:
        missing = [f for f in DEEPGEMM_FUNCTIONS if not callable(getattr(mod, f, None))]
        if missing:
            reasons.append(f"{source[len('loaded from '):]}: no {', '.join(missing)} (another DeepGEMM API)")
            mod = None
    if mod is not None:
        problem = _deepgemm_device_problem()
        if problem:
            reasons.append(problem)
            mod = None
    if mod is not None:
        peers.modules["deepgemm"] = mod
        version = getattr(mod, "__version__", None)
        source += (f", DeepGEMM {version}" if version else "") + f"; JIT cache {deepgemm_jit_cache_dir()}"
    for m in keys:
        peers.status[m] = source if mod is not None else "not available: " + "; ".join(reasons)


def _short_exc(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _import_from_folder(modname: str, folder: str):
    """Import ``folder/modname.py`` as module ``modname`` (what ``sys.path.insert(0, folder); import modname``
    does, but always this file)."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"folder {folder} does not exist")
    path = os.path.join(folder, modname + ".py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist")
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    old = sys.modules.get(modname)
    sys.modules[modname] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        if old is None:
            sys.modules.pop(modname, None)
        else:
            sys.modules[modname] = old
        raise
    return mod


def _vllm_installed() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def _flashmla_device_problem() -> str | None:
    """FlashMLA's sparse kernels are built for SM90 / SM100 only."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return f"FlashMLA's sparse kernels need SM90 or SM100; this device is sm_{major}{minor}"
    return None


def load_peers(option: str | None = None, *, env=None, use_vllm: bool = True, wanted=EXTERNAL_PEERS,
               cwd: str | None = None, deepgemm_dir: str | None = None) -> Peers:
    """Load the peer modules needed by the method keys in ``wanted``: each from the peers folder
    (:func:`resolve_peers_dir`), else from an installed vLLM; DeepGEMM (``deepgemm``, ``deepgemm_topk``) from its own
    folder (:func:`resolve_deepgemm_dir`), else the copy in an installed vLLM, with ``$DG_JIT_CACHE_DIR`` set to a
    writable folder when unset. Never raises: a peer that cannot load gets the status
    ``not available: <every source tried and why it failed>``."""
    folder, how = resolve_peers_dir(option, env, cwd)
    peers = Peers(folder=folder)
    shown = (".peers" if how == "./.peers" else f"{folder} ({how})") if folder else None
    for key, (file_mod, vllm_mod, provides) in PEER_MODULES.items():
        if not any(m in wanted for m in provides):
            continue
        reasons = []
        mod = source = None
        if folder:
            try:
                mod = _import_from_folder(file_mod, folder)
                source = f"loaded from {shown}"
            except Exception as e:  # noqa: BLE001 - e.g. OSError from the CUDA extension on a CPU-only torch
                reasons.append(f"{shown}: {_short_exc(e)}")
        else:
            reasons.append("no peers folder (--peers DIR, $TMS_PEERS_DIR or ./.peers)")
        if mod is None and use_vllm:
            if not _vllm_installed():
                reasons.append("vLLM: not installed")
            else:
                try:
                    mod = importlib.import_module(vllm_mod)
                    import vllm

                    source = f"loaded from installed vLLM {getattr(vllm, '__version__', '?')} ({vllm_mod})"
                except Exception as e:  # noqa: BLE001
                    reasons.append(f"vLLM {vllm_mod}: {_short_exc(e)}")
        if mod is not None and key == "flashmla":
            problem = _flashmla_device_problem()
            if problem:
                reasons.append(problem)
                mod = None
        if mod is not None:
            peers.modules[key] = mod
        for m in provides:
            if m in wanted:
                peers.status[m] = source if mod is not None else "not available: " + "; ".join(reasons)
    _load_deepgemm(peers, wanted, option=deepgemm_dir, env=env, cwd=cwd, peers_dir=folder, use_vllm=use_vllm)
    return peers


def method_factories(peers: Peers | None) -> dict[str, MethodFactory]:
    """Factories for every method key: the registered ones (``ours``, ``torch``, extras) and the peers; a peer that
    is not loaded gets a factory that raises :class:`PeerUnavailable` with its status."""
    facs: dict[str, MethodFactory] = dict(METHODS)
    peers = peers or Peers()
    for name, (key, builder) in _PEER_BUILDERS.items():
        mod = peers.modules.get(key)
        if mod is not None:
            facs[name] = (lambda inp, _b=builder, _m=mod: _b(_m, inp))
        else:
            reason = peers.status.get(name, "not available: not loaded")

            def unavailable(inp, _r=reason):
                raise PeerUnavailable(_r)

            unavailable.unavailable = True
            facs[name] = unavailable
    return facs


# ----------------------------------------------------------------------------------------------------- accuracy

def tolerance(kv_format: str) -> float:
    """Relative-error limit vs the float32 reference (fp8: vs the reference on the same fp8 cache)."""
    return 2e-2 if kv_format.startswith("fp8") else 1e-2


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float32 (inf when a holds a non-finite value)."""
    a = a.float()
    b = b.float()
    if not torch.isfinite(a).all():
        return math.inf
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


INDEXER_TOL = 1e-2  # indexer logits: relative error over the candidates; top-k: over the sorted selected logits


def case_tolerance(case: Case) -> float:
    """The accuracy limit of a case's methods (:func:`tolerance` for attention, :data:`INDEXER_TOL` for indexer)."""
    return INDEXER_TOL if case.kind == "indexer" else tolerance(case.kv_format)


def _check_rows(c: Case, device, seed: int):
    if c.rows <= c.check_rows:
        return None
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randperm(c.rows, generator=g)[: c.check_rows].sort().values.to(device)


def indexer_reference(inp: IndexerInputs, seed: int = 1234):
    """float32 reference logits ``[checked rows, max_len]`` (-inf where not a candidate) of a random subset of at
    most ``case.check_rows`` rows: ``(ref, row_ids)`` (``row_ids`` None when all rows are checked)."""
    from . import reference

    sel = _check_rows(inp.case, inp.device, seed)
    q, w, kc, bt, req, pos = _indexer_args(inp)
    if sel is not None:  # (q's rows picked through a uint8 view: fp8 indexing kernels are not everywhere)
        q = q.view(torch.uint8)[sel].view(q.dtype) if q.dtype == torch.float8_e4m3fn else q[sel]
        w, req, pos = w[sel], req[sel], pos[sel]
    ref = reference.indexer_logits(q, w, kc, bt, req, pos, inp.max_len, compute_dtype=torch.float32)
    return ref, sel


def indexer_error(out: torch.Tensor, ref: torch.Tensor, topk: int) -> tuple[float, str | None]:
    """Error of an indexer method's output on the checked rows against the reference logits ``ref`` (-inf = not a
    candidate): ``(error, problem)``, ``problem`` None unless the output is structurally wrong (error inf then).

    * logits (a float tensor ``[rows, max_len]``): relative error over the candidate positions; what a method writes
      elsewhere is not checked (DeepGEMM leaves those columns uncleaned).
    * top-k positions (an integer tensor ``[rows, topk]``): each row must hold exactly min(topk, candidates)
      distinct candidate positions, -1 elsewhere; the error is the relative error of their reference logits, sorted,
      against the reference's own top values (a set comparison that any choice among ties passes)."""
    T, L = ref.shape
    ref = ref.float()
    if out.dtype.is_floating_point:
        if tuple(out.shape) != (T, L):
            return math.inf, f"logits of shape {tuple(out.shape)}, expected {(T, L)}"
        cand = ~torch.isneginf(ref)
        got = out[cand].float()
        if not bool(torch.isfinite(got).all()):
            return math.inf, "non-finite logits at candidate positions"
        return rel_err(got, ref[cand]), None
    if out.dim() != 2 or tuple(out.shape) != (T, topk):
        return math.inf, f"top-k of shape {tuple(out.shape)}, expected {(T, topk)}"
    pos = out.long()
    sel = pos >= 0
    n = (~torch.isneginf(ref)).sum(1)
    want_k = n.clamp(max=topk)
    if not torch.equal(sel.sum(1), want_k):
        return math.inf, "a row does not hold min(topk, candidates) positions"
    if bool((pos >= L).any()) or bool(((pos < 0) & (pos != -1)).any()):
        return math.inf, "a position out of range (padding must be -1)"
    key = torch.where(sel, pos, -1 - torch.arange(topk, device=pos.device)[None, :])  # padding: distinct negatives
    key = key.sort(dim=1).values
    if bool((key[:, 1:] == key[:, :-1]).any()):
        return math.inf, "a position selected twice"
    vals = torch.gather(ref, 1, torch.where(sel, pos, torch.zeros_like(pos)))
    if bool(torch.isneginf(vals[sel]).any()):
        return math.inf, "a selected position is not a candidate"
    got = torch.where(sel, vals, torch.full_like(vals, -math.inf)).sort(dim=1, descending=True).values
    k = min(topk, L)
    want = torch.topk(ref, k, dim=1).values
    if k < topk:
        want = torch.cat([want, want.new_full((T, topk - k), -math.inf)], 1)
    cols = torch.arange(topk, device=ref.device)[None, :] < want_k[:, None]
    if not bool(cols.any()):
        return 0.0, None
    return rel_err(got[cols], want[cols]), None


def check_output(case: Case, out: torch.Tensor, ref: torch.Tensor, sel) -> tuple[float, str | None]:
    """``(error, problem)`` of a method's output on the checked rows (``sel``) against the case's reference."""
    got = out if sel is None else out[sel]
    if case.kind == "indexer":
        return indexer_error(got, ref, case.topk)
    return rel_err(got, ref), None


def reference_output(inp: CaseInputs, seed: int = 1234):
    """float32 reference on a random subset of at most ``case.check_rows`` rows: returns ``(ref, row_ids)``
    (``row_ids`` None when all rows are checked). Indexer cases: :func:`indexer_reference`."""
    from . import reference

    if isinstance(inp, IndexerInputs):
        return indexer_reference(inp, seed)
    c = inp.case
    q, idx = inp.q, inp.indices
    sel = None
    if c.rows > c.check_rows:
        g = torch.Generator(device="cpu").manual_seed(seed)
        sel = torch.randperm(c.rows, generator=g)[: c.check_rows].sort().values.to(inp.device)
        q, idx = q[sel], idx[sel]
    ref = reference.sparse_mla_attention(q, inp.kv_cache, idx, inp.softmax_scale, kv_format=inp.kv_format,
                                         compute_dtype=torch.float32, out_dtype=torch.float32)
    return ref, sel


# ----------------------------------------------------------------------------------------------------- timing

SLOW_CALL_MS = 20.0  # calls slower than this are timed by CUDA events over 3 calls instead of do_bench


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


DO_BENCH_WINDOWS = 3  # eager timing: do_bench windows per method, round-robin over a case's methods; lowest median


class DoBenchTimer:
    """``timer(fn)``: the lowest of ``windows`` ``triton.testing.do_bench`` medians of ``fn`` (each window ~``rep``
    ms of calls, the L2 flushed before every call); the window medians of the last call are kept in
    ``last_windows``. The bench calls it with one window per method in turn (:func:`run_case`, ``windows``).

    Why windows: on the lent GPU machines a window now and then runs host-bound — a transient host slowdown. In
    eight interleaved windows per method (benchmarks/eager_windows.py, H200, 2026-11-30) the DeepGEMM + torch.topk
    peer read 0.179 ms in seven and 0.256 in one, while every other method stayed within 2 %; a single median
    reports such a window as the method's figure (it decided PASS/FAIL of single indexer rows in earlier runs, for
    ours and the peers alike). Slowdowns also last longer than one method's back-to-back windows (a run where
    three consecutive windows of one call read 0.228–0.244 ms against 0.152 under graphs), hence round-robin. The
    lowest window is the steady-state figure, taken the same way for every method."""

    def __init__(self, windows: int = 1, rep: int = 60):
        self.windows, self.rep = windows, rep
        self.last_windows: list[float] = []

    def __call__(self, fn) -> float:
        from triton.testing import do_bench

        self.last_windows = [float(do_bench(fn, warmup=25 if i == 0 else 5, rep=self.rep, return_mode="median"))
                             for i in range(self.windows)]
        return min(self.last_windows)


def time_do_bench(fn) -> float:
    """Lowest of :data:`DO_BENCH_WINDOWS` back-to-back ``triton.testing.do_bench`` medians of ``fn``
    (:class:`DoBenchTimer`)."""
    return DoBenchTimer(DO_BENCH_WINDOWS)(fn)


def time_events(fn, n: int = 3) -> float:
    """Median milliseconds of ``n`` calls of ``fn``, each between two CUDA events (for calls of tens of ms, where
    do_bench's fixed 5-call estimate plus warmup would cost seconds and memory churn)."""
    times = []
    for _ in range(n):
        st = torch.cuda.Event(enable_timing=True)
        en = torch.cuda.Event(enable_timing=True)
        st.record()
        fn()
        en.record()
        en.synchronize()
        times.append(st.elapsed_time(en))
    return float(statistics.median(times))


def graph_replays(call_ms: float | None, target_ms: float = 50.0) -> int:
    """Replays per timed batch of :func:`time_graph`: about ``target_ms`` of work, between 3 and 50."""
    if not call_ms or call_ms <= 0:
        return 50
    return int(max(3, min(50, round(target_ms / call_ms))))


def time_graph(fn, replays: int = 50, repeats: int = 5) -> float:
    """Milliseconds per call of ``fn`` captured once in a CUDA graph and replayed ``replays`` times back to back
    (median over ``repeats`` batches, timed with CUDA events). No L2 flush between replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    try:
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            st = torch.cuda.Event(enable_timing=True)
            en = torch.cuda.Event(enable_timing=True)
            st.record()
            for _ in range(replays):
                g.replay()
            en.record()
            en.synchronize()
            times.append(st.elapsed_time(en) / replays)
        return float(statistics.median(times))
    finally:
        del g
        torch.cuda.synchronize()


def time_wall(fn, device=None) -> float:
    """Wall-clock milliseconds of one call (synchronised; CPU / interpreter smoke runs, timer choice)."""
    _sync(device or "cpu")
    t0 = time.perf_counter()
    fn()
    _sync(device or "cpu")
    return (time.perf_counter() - t0) * 1e3


def measure_ceilings(device) -> dict:
    """Device copy bandwidth (bytes read + written), read-only bandwidth (the best of a few configurations of a
    streaming read of 2 GiB, :data:`READ_CONFIGS`) and the bf16 8192³ matmul rate, by do_bench medians. A read
    configuration that fails is skipped (``read_errors``); the copy and matmul ceilings never depend on it."""
    from triton.testing import do_bench

    src = torch.ones(1 << 30, dtype=torch.bfloat16, device=device)  # 2 GiB
    dst = torch.empty_like(src)
    ms = float(do_bench(lambda: dst.copy_(src), return_mode="median"))
    copy_gbps = 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9
    del dst
    out = {"copy_gbps": copy_gbps, "copy_ms_2GiB": ms}
    out.update(_measure_read(src, do_bench))
    del src
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    ms_mm = float(do_bench(lambda: torch.matmul(a, b), return_mode="median"))
    tflops = 2 * n ** 3 / (ms_mm * 1e-3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    out.update(bf16_tflops=tflops, matmul_ms_8192=ms_mm)
    return out


READ_CONFIGS = ((4096, 16, 8), (8192, 8, 16), (2048, 32, 4), (16384, 4, 16))  # (block, iters, warps) of read_sum


def _measure_read(src, do_bench) -> dict:
    """Read-only bandwidth of ``src``: the fastest of :data:`READ_CONFIGS` (a lower bound on what the device can
    read: a kernel that only gathers cannot beat the device's true read bandwidth). A configuration that fails is
    skipped (``read_errors``); ``read_gbps`` is None only when all fail."""
    from .kernels.readbw import read_sum

    best, errors = None, []
    for block, iters, warps in READ_CONFIGS:
        label = f"block {block} x {iters}, {warps} warps"
        try:
            ms = float(do_bench(lambda: read_sum(src, block, iters, warps), return_mode="median"))
        except Exception as e:  # noqa: BLE001 - the other configurations and ceilings stay usable
            errors.append(f"{label}: {_short_exc(e)}")
            continue
        if best is None or ms < best[0]:
            best = (ms, label)
    out = {"read_errors": errors} if errors else {}
    if best is None:
        return dict(out, read_gbps=None)
    gbps = src.numel() * src.element_size() / (best[0] * 1e-3) / 1e9
    return dict(out, read_gbps=gbps, read_ms_2GiB=best[0], read_config=best[1])


# ----------------------------------------------------------------------------------------------------- running

def _fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def _floors(case: Case, unique_bytes: int, ceilings: dict | None) -> dict:
    if not ceilings or not ceilings.get("copy_gbps") or not ceilings.get("bf16_tflops"):
        return {"memory_ms": None, "compute_ms": None}
    # The indexer's dots are fp8 e4m3 (twice the bf16 tensor-core rate on sm89+ / Hopper).
    rate = ceilings["bf16_tflops"] * (2 if case.kind == "indexer" else 1)
    return {"memory_ms": unique_bytes / (ceilings["copy_gbps"] * 1e9) * 1e3,
            "compute_ms": case.flops / (rate * 1e12) * 1e3}


def _case_record(case: Case) -> dict:
    rec = {"name": case.name, "kind": case.kind, "rows": case.rows, "heads": case.heads, "topk": case.topk,
           "ctx": case.ctx, "kv_format": case.kv_format, "block_size": case.block_size, "q_dtype": case.q_dtype,
           "softmax_scale": case.softmax_scale, "flops": case.flops, "methods": {}}
    if case.kind == "indexer":
        rec.update(phase=case.phase, requests=case.requests, pairs=case.pairs)
        del rec["softmax_scale"]
    return rec


def _graph_timed(case) -> bool:
    """Decode-like cases (attention decode, indexer decode; a Case or a case record) are also CUDA-graph timed."""
    kind = case.get("kind") if isinstance(case, dict) else case.kind
    phase = case.get("phase") if isinstance(case, dict) else case.phase
    return kind == "decode" or (kind == "indexer" and phase == "decode")


def _free(device):
    if torch.device(device).type == "cuda":
        try:
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001 - a broken context shows up in the next method's error
            pass
        torch.cuda.empty_cache()


def _rates(case: Case, inp, ms: float, ceilings) -> dict:
    rec = {"ms": ms, "tflops": case.flops / (ms * 1e-3) / 1e12, "gbps": inp.unique_bytes / (ms * 1e-3) / 1e9}
    if ceilings and ceilings.get("copy_gbps"):
        rec["pct_copy"] = 100.0 * rec["gbps"] / ceilings["copy_gbps"]
    return rec


def _run_method(name: str, factory, inp: CaseInputs, ref, sel, *, device, ceilings, timer, graph_timer, log,
                keep=None) -> dict:
    """Accuracy check, then timing, of one method on one case's inputs. Returns its JSON record: ``ms``, ``tflops``,
    ``gbps``, ``rel_err`` (+ ``graph_ms`` for decode, ``pct_copy``, ``config``, ``timer``), or ``error``. ``keep``
    (a list): a method timed by ``timer`` is appended as (name, prepared call) for more windows (:func:`run_case`)."""
    case = inp.case
    tol = case_tolerance(case)
    m: dict = {}
    prep = None
    tag = f"  {name:<13}"
    try:
        if factory is None:
            raise PeerUnavailable(f"not available: unknown method {name!r}")
        if name in DEEPGEMM_KEYS and not getattr(factory, "unavailable", False):
            log(f"{tag} building (DeepGEMM JIT-compiles its kernels on first use: may take a minute) ...")
        prep = factory(inp)
        m["config"] = prep.config
        if prep.warmup_s is not None:
            m["warmup_s"] = prep.warmup_s
            if prep.warmup_s > 1.0:
                log(f"{tag} first call (compile / JIT warm-up) took {prep.warmup_s:.1f} s")
        out = prep.fn()
        _sync(device)
        err, problem = check_output(case, out, ref, sel)
        m["rel_err"] = err
        del out
        if not err <= tol:
            m["error"] = (f"accuracy: {problem}; not timed" if problem else
                          f"accuracy: rel err {err:.3g} > {tol:g}; not timed")
            log(f"{tag} {(prep.config or '')[:44]:<44} ERROR {m['error']}")
            return m
        # On the GPU a second call (the first may have compiled) picks the timer and the graph replay count.
        call_ms = time_wall(prep.fn, device) if device.type == "cuda" else None
        if call_ms is not None and call_ms > SLOW_CALL_MS:
            ms = time_events(prep.fn, 3)
            m["timer"] = f"cuda events, median of 3 (one call > {SLOW_CALL_MS:g} ms)"
        else:
            ms = timer(prep.fn)
            m["timer"] = "do_bench median" if device.type == "cuda" else "wall clock, 1 call (smoke)"
            if keep is not None:
                keep.append((name, prep))
                m["ms_windows"] = [ms]
        rec = {**_rates(case, inp, ms, ceilings), "rel_err": err}
        if _graph_timed(case) and graph_timer is not None:
            if not prep.graphable:
                rec["graph_error"] = "not graphable"
            else:
                try:
                    rec["graph_ms"] = graph_timer(prep.fn, call_ms)
                except Exception as e:  # noqa: BLE001 - the eager timing stands
                    rec["graph_error"] = _short_exc(e)
                    log(f"{tag} graph timing failed: {rec['graph_error']}")
        m = {**rec, **m}
        log(f"{tag} {(prep.config or '')[:44]:<44} {ms:9.4f} ms  graph {_fmt(m.get('graph_ms'), '.4f')} ms  "
            f"{m['tflops']:7.1f} TFLOP/s  {m['gbps']:7.0f} GB/s  err {err:.2e}")
        for key, vfn in prep.variants.items():  # same checks, same timer; recorded beside the main numbers
            try:
                vout = vfn()
                _sync(device)
                verr, vproblem = check_output(case, vout, ref, sel)
                del vout
                if not verr <= tol:
                    m[f"ms_{key}_error"] = (f"accuracy: {vproblem}; not timed" if vproblem else
                                            f"accuracy: rel err {verr:.3g} > {tol:g}; not timed")
                    log(f"{tag} variant {key}: ERROR {m[f'ms_{key}_error']}")
                    continue
                v_ms = time_wall(vfn, device) if device.type == "cuda" else None
                m[f"ms_{key}"] = time_events(vfn, 3) if v_ms is not None and v_ms > SLOW_CALL_MS else timer(vfn)
                log(f"{tag} {'  variant ' + key:<44} {m[f'ms_{key}']:9.4f} ms")
            except Exception as e:  # noqa: BLE001 - the main numbers stand
                m[f"ms_{key}_error"] = _short_exc(e)
                log(f"{tag} variant {key}: ERROR {m[f'ms_{key}_error']}")
    except PeerUnavailable as e:
        m = {"error": str(e)}
        log(f"{tag} ERROR {e}")
    except Unsupported as e:
        m["error"] = f"unsupported: {e}"
        log(f"{tag} ERROR {m['error']}")
    except Exception as e:  # noqa: BLE001 - one method's failure must not stop the run
        m["error"] = _short_exc(e, 500)
        log(f"{tag} ERROR {m['error']}")
        traceback.print_exc(file=sys.stderr)
    finally:
        del prep
        _free(device)
    return m


def run_case(case: Case, method_names, device, *, factories=None, ceilings=None, seed=0, timer=None,
             graph_timer=None, log=print, windows: int = 1) -> dict:
    """Build ``case`` once, then for every method in ``method_names`` that applies to it (:func:`method_applies`):
    accuracy against the float32 reference, then timing. ``windows`` > 1: after every method's first timing, each
    method timed by ``timer`` gets ``windows - 1`` more, in turn (round-robin), and its figure is the lowest
    (``ms_windows`` holds them all; the prepared calls of the case's methods stay alive until then). Returns the
    JSON record of the case."""
    device = torch.device(device)
    factories = method_factories(None) if factories is None else factories
    timer = timer or (DoBenchTimer(1) if windows > 1 else time_do_bench)
    rec = _case_record(case)
    try:
        inp = build_inputs(case, device, seed)
        rec["unique_rows"] = inp.unique_rows
        rec["unique_bytes"] = inp.unique_bytes
        rec["floors"] = _floors(case, inp.unique_bytes, ceilings)
        ref, sel = reference_output(inp)
        rec["checked_rows"] = case.rows if sel is None else int(sel.numel())
    except Exception as e:  # noqa: BLE001 - a broken case must not stop the run
        rec["error"] = _short_exc(e, 500)
        log(f"  ERROR building case: {rec['error']}")
        traceback.print_exc(file=sys.stderr)
        _free(device)
        return rec
    names = list(method_names)
    if case.kind == "indexer":  # ours, ours_logits, deepgemm, deepgemm_topk, torch, then any extra
        names = [m for m in INDEXER_METHOD_KEYS if m in names] + [m for m in names if m not in INDEXER_METHOD_KEYS]
    keep = [] if windows > 1 else None
    for name in names:
        if not method_applies(name, case):
            continue
        rec["methods"][name] = _run_method(name, factories.get(name), inp, ref, sel, device=device,
                                           ceilings=ceilings, timer=timer, graph_timer=graph_timer, log=log,
                                           keep=keep)
    for _ in range(windows - 1):
        for name, prep in keep or []:
            try:
                rec["methods"][name]["ms_windows"].append(timer(prep.fn))
            except Exception as e:  # noqa: BLE001 - the first window stands
                rec["methods"][name]["windows_error"] = _short_exc(e)
    for name, _ in keep or []:
        m = rec["methods"][name]
        ms = min(m["ms_windows"])
        m.update(_rates(case, inp, ms, ceilings))
        m["timer"] = (f"lowest of {len(m['ms_windows'])} do_bench medians, taken in turn with the case's other methods"
                      if device.type == "cuda" else f"wall clock, lowest of {len(m['ms_windows'])} calls (smoke)")
        log(f"  {name:<13} windows " + " ".join(f"{w:.4f}" for w in m["ms_windows"]) + f" -> {ms:.4f} ms")
    del keep, inp, ref
    _free(device)
    return rec


def format_table(results: list[dict], ceilings: dict | None = None) -> str:
    hdr = (f"{'case':<37} {'method':<13} {'kernel+config':<44} {'ms':>9} {'graph ms':>9} {'TFLOP/s':>8} "
           f"{'GB/s':>7} {'%copy':>6} {'rel err':>8} {'floor ms':>9}")
    lines = [hdr, "-" * len(hdr)]
    for r in results:
        fl = r.get("floors") or {}
        floor = None
        if fl.get("memory_ms") is not None:
            floor = max(fl["memory_ms"], fl["compute_ms"])
        if r.get("error"):
            lines.append(f"{r['name']:<37} ERROR {r['error']}")
            continue
        for name, m in r["methods"].items():
            cfg = (m.get("config") or "")[:44]
            if m.get("error"):
                lines.append(f"{r['name']:<37} {name:<13} {cfg:<44} ERROR {m['error']}")
                continue
            lines.append(f"{r['name']:<37} {name:<13} {cfg:<44} {_fmt(m.get('ms'), '9.4f'):>9} "
                         f"{_fmt(m.get('graph_ms'), '9.4f'):>9} {_fmt(m.get('tflops'), '8.1f'):>8} "
                         f"{_fmt(m.get('gbps'), '7.0f'):>7} {_fmt(m.get('pct_copy'), '6.1f'):>6} "
                         f"{_fmt(m.get('rel_err'), '8.1e'):>8} {_fmt(floor, '9.4f'):>9}")
            for k, v in m.items():  # timed variants of the call (ms_<variant>), e.g. page1_triton's default scales
                if k.startswith("ms_") and isinstance(v, (int, float)):
                    lines.append(f"{'':<37} {'':<13} {'  variant ' + k[3:]:<44} {v:9.4f}")
    if ceilings:
        lines.append(f"ceilings: copy {_fmt(ceilings.get('copy_gbps'), '.0f')} GB/s (read + write), "
                     f"read {_fmt(ceilings.get('read_gbps'), '.0f')} GB/s, "
                     f"bf16 matmul {_fmt(ceilings.get('bf16_tflops'), '.0f')} TFLOP/s; floor = max(unique bytes / "
                     f"copy bandwidth, FLOPs / matmul rate)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- run metadata

_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "instinct", "radeon", "intel", "r", "tm", "data",
                 "center", "gpu", "graphics", "accelerator"}
_NOISE_TOKEN = re.compile(r"^(\d+gb|\d+g|sxm\d*|pcie|hbm\d*e?|nvl|nvlink|oam|mig|\d+c)$")


def gpu_slug(device_name: str | None) -> str:
    """Short lowercase name of a device for file names: "NVIDIA H200" -> "h200", "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA GeForce RTX 4090" -> "rtx4090", "AMD Instinct MI300X" -> "mi300x",
    "CPU (...)" -> "cpu". Vendor words and memory / form-factor tokens are dropped; the name runs up to the first
    token with a digit."""
    if not device_name or not device_name.strip():
        return "unknown"
    low = device_name.strip().lower()
    if low.startswith("cpu"):
        return "cpu"
    toks = [t for t in re.split(r"[^a-z0-9]+", low) if t and t not in _VENDOR_WORDS]
    picked = []
    for t in toks:
        if _NOISE_TOKEN.match(t):
            continue
        picked.append(t)
        if any(ch.isdigit() for ch in t):
            break
    slug = "".join(picked)[:24]
    return slug or (re.sub(r"[^a-z0-9]+", "-", low).strip("-")[:24] or "unknown")


def utc_date() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def results_path(device_name: str, date: str | None = None, out_dir: str | None = None) -> str:
    """``<out_dir>/<gpu slug>-<YYYY-MM-DD>.json`` (UTC date by default)."""
    name = f"{gpu_slug(device_name)}-{date or utc_date()}.json"
    return os.path.join(out_dir or os.path.join("benchmarks", "results"), name)


def _git(*args) -> str | None:
    try:
        r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
        return r.stdout.strip() if r.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def resolve_commit(env=None) -> tuple[str | None, str | None, bool | None]:
    """``(commit, source, dirty)``: ``$TMS_COMMIT`` when set (a copy without .git, e.g. the GPU machine), else
    ``git rev-parse HEAD`` of the package's checkout (``dirty``: tracked files modified), else ``(None, None,
    None)``."""
    env = os.environ if env is None else env
    c = (env.get("TMS_COMMIT") or "").strip()
    if c:
        return c, "TMS_COMMIT", None
    sha = _git("rev-parse", "HEAD")
    if not sha:
        return None, None, None
    st = _git("status", "--porcelain", "--untracked-files=no")
    return sha, "git", (bool(st) if st is not None else None)


def git_commit() -> str | None:
    """The commit of the package's checkout with ``-dirty`` appended when tracked files are modified (or None)."""
    sha, _, dirty = resolve_commit({})
    return None if sha is None else sha + ("-dirty" if dirty else "")


def _versions() -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        v["triton"] = f"unavailable ({type(e).__name__})"
    return v


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return str(x)


def _clean(x):
    """JSON-safe copy: non-finite floats become None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(doc: dict, path: str) -> None:
    """Write ``doc`` to ``path`` atomically (a half-written file never replaces a good one)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(doc), f, indent=1, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)


def load_results(path: str) -> dict:
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise ValueError(f"{path}: not a triton-mla-sparse bench results file (no 'cases' list)")
    return doc


# ----------------------------------------------------------------------------------------------------- the run

DEFAULT_OUT_DIR = os.path.join("benchmarks", "results")


def run_bench(*, quick=False, out=None, out_dir=DEFAULT_OUT_DIR, methods=METHOD_KEYS,
              case_filter=None, seed=0, cpu_smoke=False, peers_dir=None, peers: Peers | None = None, use_vllm=True,
              budget_s=None, plot=True, compare=None, log=None, kinds=None, deepgemm_dir=None) -> int:
    """Run the benchmark, print the tables, write the JSON (and PNG). Returns the exit status: 0 ok, 1 a case of
    'ours' (or 'ours_logits') failed (or the time budget cut the run short), 2 no GPU / bad arguments.

    ``out``: JSON path; default ``<out_dir>/<gpu>-<date>.json`` on a GPU, none for ``cpu_smoke``. The JSON is
    rewritten after every case (``complete`` false until the end), so a run cut short still leaves its results.
    ``peers``: preloaded :class:`Peers` (tests); else :func:`load_peers` with ``peers_dir`` (and ``deepgemm_dir``).
    ``budget_s``: no case starts after this many seconds (the rest are recorded with an error). ``compare``: an older
    results JSON to compare with at the end. ``kinds``: the case groups to run (:data:`KINDS`: "attention",
    "indexer"; a list or a comma-separated string; default both). Peers are loaded only for the groups that run."""
    log = log or (lambda s: print(s, flush=True))
    t_start = time.perf_counter()
    cuda = torch.cuda.is_available()
    if not cuda and not cpu_smoke:
        print("triton-mla-sparse bench: needs a CUDA GPU (torch.cuda.is_available() is False); timings through the "
              "Triton interpreter on a CPU mean nothing. Try `triton-mla-sparse demo` instead, or the reports that "
              "need no GPU: --plot / --targets / --compare OLD.json --against NEW.json.", file=sys.stderr)
        return 2
    methods = tuple(methods)
    known = set(METHOD_KEYS) | set(METHODS)
    unknown = [m for m in methods if m not in known]
    if unknown or not methods:
        print(f"triton-mla-sparse bench: unknown method(s) {unknown}; known: {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    old_doc = None
    if compare:
        try:
            old_doc = load_results(compare)
        except Exception as e:  # noqa: BLE001 - fail before the long run, not after it
            print(f"triton-mla-sparse bench: --compare {compare}: {_short_exc(e)}", file=sys.stderr)
            return 2
    try:
        kinds = _parse_kinds(kinds)
    except ValueError as e:
        print(f"triton-mla-sparse bench: {e}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    cases = smoke_cases(kinds) if cpu_smoke else bench_cases(quick, kinds)
    if case_filter:
        rx = re.compile(case_filter)
        cases = [c for c in cases if rx.search(c.name)]
    dev_name = torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.processor() or platform.machine()})"
    now = datetime.datetime.now(datetime.timezone.utc)
    date = now.strftime("%Y-%m-%d")
    if out is None and not cpu_smoke:
        out = results_path(dev_name, date, out_dir)
    versions = _versions()
    commit, commit_source, dirty = resolve_commit()
    log(f"triton-mla-sparse bench on {dev_name}: torch {versions['torch']}, triton {versions['triton']}, commit "
        f"{commit or 'unknown'}{' (dirty)' if dirty else ''}, {len(cases)} cases ({', '.join(kinds)}), methods "
        f"{', '.join(methods)}" + (" [cpu smoke]" if cpu_smoke else "")
        + (f", budget {budget_s:g} s" if budget_s else ""))

    # Peers: load what the requested methods need for the case groups that run, and say where each came from (or
    # why it is missing).
    groups = {case_group(c) for c in cases}
    wanted = [m for m in methods if m in EXTERNAL_PEERS
              and ("indexer" if m in DEEPGEMM_KEYS else "attention") in groups]
    if peers is None:
        peers = load_peers(peers_dir, use_vllm=use_vllm, wanted=wanted, deepgemm_dir=deepgemm_dir) if wanted \
            else Peers()
    peer_status = {}
    if "torch" in methods and groups:
        parts = (["gather + matmul + softmax in q's dtype"] if "attention" in groups else []) + (
            ["indexer: paged gather, bf16 matmul, relu, weighted head sum, torch.topk"] if "indexer" in groups else [])
        peer_status["torch"] = f"built in ({'; '.join(parts)})"
    for m in wanted:
        peer_status[m] = peers.status.get(m, "not available: not loaded")
    if peer_status:
        log("peers:")
        for m, s in peer_status.items():
            log(f"  {m:<13} {s}")
    factories = method_factories(peers)

    if cuda:
        log("measuring ceilings (2 GiB device copy and read, bf16 8192^3 matmul) ...")
        try:
            ceilings = measure_ceilings(device)
            log(f"  copy {ceilings['copy_gbps']:.0f} GB/s, read {_fmt(ceilings.get('read_gbps'), '.0f')} GB/s, "
                f"bf16 matmul {ceilings['bf16_tflops']:.0f} TFLOP/s")
        except Exception as e:  # noqa: BLE001
            ceilings = {"copy_gbps": None, "bf16_tflops": None, "error": _short_exc(e)}
            log(f"  ceilings failed: {ceilings['error']}")
        timer = DoBenchTimer()
        windows = DO_BENCH_WINDOWS

        def graph_timer(fn, call_ms=None):
            return time_graph(fn, replays=graph_replays(call_ms))
    else:
        ceilings = {"copy_gbps": None, "bf16_tflops": None}
        timer, graph_timer = (lambda fn: time_wall(fn, device)), None
        windows = 1

    results: list[dict] = []
    doc = {
        "device": dev_name, "date": date, "time": now.isoformat(timespec="seconds"),
        "torch": versions["torch"], "triton": versions["triton"], "python": versions["python"],
        "commit": commit, "commit_source": commit_source, "commit_dirty": dirty,
        "quick": bool(quick), "cpu_smoke": bool(cpu_smoke), "kinds": list(kinds),
        "multiprocessors": torch.cuda.get_device_properties(device).multi_processor_count if cuda else None,
        "ceilings": ceilings, "peers": peer_status, "methods": list(methods), "cases": results, "failed": [],
        "complete": False, "elapsed_s": None,
    }
    cut_short = False
    for i, case in enumerate(cases, 1):
        elapsed = time.perf_counter() - t_start
        if budget_s and elapsed > budget_s:
            rec = _case_record(case)
            rec["error"] = f"not run: the time budget of {budget_s:g} s was used up"
            results.append(rec)
            if not cut_short:
                log(f"[{i}/{len(cases)}] time budget of {budget_s:g} s used up ({elapsed:.0f} s): the remaining "
                    f"{len(cases) - i + 1} cases are recorded as not run")
            cut_short = True
            continue
        eta = "" if i == 1 else f", ~{elapsed / (i - 1) * (len(cases) - i + 1):.0f} s left"
        log(f"[{i}/{len(cases)}] {case.name} ({elapsed:.0f} s{eta})")
        results.append(run_case(case, methods, device, factories=factories, ceilings=ceilings, seed=seed,
                                timer=timer, graph_timer=graph_timer, log=log, windows=windows))
        if out:
            doc["elapsed_s"] = time.perf_counter() - t_start
            try:
                write_json(doc, out)
            except OSError as e:
                log(f"  could not write {out}: {e}")
    failed = [r["name"] for r in results
              if r.get("error") or any(m in r["methods"] and r["methods"][m].get("error")
                                       for m in ("ours", "ours_logits"))]
    doc.update(failed=failed, complete=not cut_short, elapsed_s=time.perf_counter() - t_start)
    log("")
    log(format_table(results, ceilings))
    log("")
    log(ratios_text(doc))
    if not cpu_smoke:
        log("")
        log(targets_text(doc))
    if out:
        write_json(doc, out)
        log(f"wrote {out}")
        if plot:
            png = plot_results(doc, os.path.splitext(out)[0] + ".png", log=log)
            if png:
                log(f"wrote {png}")
    if old_doc is not None:
        log("")
        log(compare_text(old_doc, doc, old_label=compare, new_label=out or "this run"))
    if failed:
        log(f"FAILED cases (ours): {', '.join(failed)}")
        return 1
    log(f"done in {time.perf_counter() - t_start:.0f} s")
    return 0


# ----------------------------------------------------------------------------------------------------- reports
# Everything below works on a results JSON (a dict as written by run_bench) and needs no GPU.

def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 else None


def _method_ms(case_rec: dict | None, method: str, key: str = "ms") -> float | None:
    """A method's timing in a case record (None when absent, errored or not a positive number)."""
    if not case_rec:
        return None
    m = (case_rec.get("methods") or {}).get(method)
    if not isinstance(m, dict) or m.get("error"):
        return None
    return _num(m.get(key))


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b is not None else None


def _case_key(c: dict) -> tuple:
    return (c.get("kind"), c.get("phase"), c.get("heads"), c.get("rows"), c.get("kv_format"), c.get("ctx"),
            c.get("topk"))


def _find_case(doc: dict, **sel) -> dict | None:
    """The first case of ``doc`` whose fields equal every ``sel`` item (kind, heads, rows, kv_format, ...)."""
    for c in doc.get("cases") or []:
        if all(c.get(k) == v for k, v in sel.items()):
            return c
    return None


def _methods_in(doc: dict) -> list[str]:
    seen = []
    for c in doc.get("cases") or []:
        for m in c.get("methods") or {}:
            if m not in seen:
                seen.append(m)
    return [m for m in METHOD_KEYS if m in seen] + [m for m in seen if m not in METHOD_KEYS]


def _commit_of(doc: dict) -> str:
    return str(doc.get("commit") or doc.get("git_commit") or "unknown")


def _doc_label(doc: dict) -> str:
    return f"{doc.get('device', '?')}, {doc.get('date', '?')}, commit {_commit_of(doc)[:12]}"


def ours_for(case_rec: dict | None, peer: str) -> str:
    """The method of ours a peer is compared with: in indexer cases DeepGEMM's logits-only ``deepgemm`` against
    ``ours_logits``; everything else against ``ours`` (for indexer cases: logits + top-k)."""
    if (case_rec or {}).get("kind") == "indexer" and peer == "deepgemm":
        return "ours_logits"
    return "ours"


def _is_ours(m: str) -> bool:
    return m == "ours" or m == "ours_logits"


def ratio_rows(doc: dict) -> list[dict]:
    """Per case: ours ms and ``ours ÷ peer`` for every peer present (do_bench ms; ``graph`` for decode cases where
    both have a CUDA-graph time). A peer present with an error has ratio None and its error text. In indexer cases
    ``deepgemm`` (logits only) is divided into ``ours_logits``, the others into ``ours`` (:func:`ours_for`)."""
    rows = []
    for c in doc.get("cases") or []:
        methods = c.get("methods") or {}
        ours = _method_ms(c, "ours")
        r = {"case": c.get("name"), "kind": c.get("kind"), "ours_ms": ours, "ratios": {}, "graph_ratios": {},
             "errors": {}}
        for p in methods:
            if _is_ours(p):
                continue
            m = methods[p] or {}
            if m.get("error"):
                r["errors"][p] = m["error"]
            mine = ours_for(c, p)
            r["ratios"][p] = _ratio(_method_ms(c, mine), _method_ms(c, p))
            r["graph_ratios"][p] = _ratio(_method_ms(c, mine, "graph_ms"), _method_ms(c, p, "graph_ms"))
        rows.append(r)
    return rows


def _cell(r, g=None, width=14) -> str:
    if r is None:
        return "-"
    return f"{r:.2f}" + (f" (g {g:.2f})" if g is not None else "")


def ratios_text(doc: dict) -> str:
    """Table: per case, ours ms and ours ÷ each peer (< 1: ours is faster); ``g``: the same under CUDA graphs."""
    peers = [m for m in _methods_in(doc) if not _is_ours(m)]
    lines = [f"ours / peer (do_bench ms; < 1 means ours is faster; g = CUDA-graph times) -- {_doc_label(doc)}"]
    if any(c.get("kind") == "indexer" for c in doc.get("cases") or []):
        lines.append("  indexer cases: ours = logits + top-k; /deepgemm is ours_logits / deepgemm (logits only)")
    hdr = f"{'case':<37} {'ours ms':>9} " + " ".join(f"{'/' + p:>18}" for p in peers)
    lines += [hdr, "-" * len(hdr)]
    for r in ratio_rows(doc):
        cells = []
        for p in peers:
            if p not in r["ratios"]:
                cells.append(f"{'':>18}")
            elif p in r["errors"]:
                cells.append(f"{'error':>18}")
            else:
                cells.append(f"{_cell(r['ratios'][p], r['graph_ratios'].get(p)):>18}")
        lines.append(f"{r['case']!s:<37} {_fmt(r['ours_ms'], '9.4f'):>9} " + " ".join(cells))
    return "\n".join(lines)


def compare_rows(old: dict, new: dict) -> list[dict]:
    """Per case of ``new`` (matched in ``old`` by name, else by kind/heads/rows/format/ctx/topk) and per method in
    either: old ms, new ms, new ÷ old (and the graph-time ratio where both have one)."""
    by_name = {c.get("name"): c for c in old.get("cases") or []}
    by_key = {}
    for c in old.get("cases") or []:
        by_key.setdefault(_case_key(c), c)
    rows = []
    for c in new.get("cases") or []:
        o = by_name.get(c.get("name")) or by_key.get(_case_key(c))
        names = list(c.get("methods") or {})
        for m in (o or {}).get("methods") or {}:
            if m not in names:
                names.append(m)
        names = [m for m in METHOD_KEYS if m in names] + [m for m in names if m not in METHOD_KEYS]
        for m in names:
            om, nm = _method_ms(o, m), _method_ms(c, m)
            og, ng = _method_ms(o, m, "graph_ms"), _method_ms(c, m, "graph_ms")
            rows.append({"case": c.get("name"), "method": m, "old_ms": om, "new_ms": nm, "ratio": _ratio(nm, om),
                         "old_graph_ms": og, "new_graph_ms": ng, "graph_ratio": _ratio(ng, og),
                         "in_old": o is not None})
    return rows


def compare_text(old: dict, new: dict, old_label: str = "old", new_label: str = "new") -> str:
    lines = ["compare: new / old (< 1 means faster now)",
             f"  old: {old_label} -- {_doc_label(old)}",
             f"  new: {new_label} -- {_doc_label(new)}"]
    hdr = f"{'case':<37} {'method':<13} {'old ms':>9} {'new ms':>9} {'new/old':>8} {'graph new/old':>14}"
    lines += [hdr, "-" * len(hdr)]
    prev = None
    for r in compare_rows(old, new):
        name = r["case"] if r["case"] != prev else ""
        prev = r["case"]
        note = "" if r["in_old"] else "  (case not in old)"
        lines.append(f"{name!s:<37} {r['method']:<13} {_fmt(r['old_ms'], '9.4f'):>9} "
                     f"{_fmt(r['new_ms'], '9.4f'):>9} {_fmt(r['ratio'], '8.2f'):>8} "
                     f"{_fmt(r['graph_ratio'], '14.2f'):>14}{note}")
    lines += ["", ratios_text(new), "", targets_text(new)]
    return "\n".join(lines)


# The issue's targets, as ours / peer ratios of do_bench ms: (label, [(numerator case, method), (denominator case,
# method | "best peer")] rows, limit, goal). PASS: ratio <= limit. "every case" rows cover each case with the peer.
def _dec(heads, fmt, rows=64):
    return {"kind": "decode", "heads": heads, "rows": rows, "kv_format": fmt}


def _pre(heads, fmt="bf16"):
    return {"kind": "prefill", "heads": heads, "kv_format": fmt}


def _idx(phase, heads, ctx=32768, rows=None):
    return {"kind": "indexer", "phase": phase, "heads": heads, "ctx": ctx,
            "rows": rows if rows is not None else (64 if phase == "decode" else 4096)}


_IDX_DEC = [(h, c) for h in (64, 32) for c in (32768, 131072)]


BEST_PEER = "best peer"
TARGETS = [
    ("decode h8 & h16 B=64 bf16: ours / best peer",
     [(_dec(h, "bf16"), "ours", _dec(h, "bf16"), BEST_PEER) for h in (8, 16)], 0.40, 0.25),
    ("decode h8 & h16 B=64 fp8: ours / flashmla_fp8",
     [(_dec(h, "fp8_ds_mla"), "ours", _dec(h, "fp8_ds_mla"), "flashmla_fp8") for h in (8, 16)], 0.60, 0.45),
    ("decode h16 B=256 bf16: ours / flashmla_bf16",
     [(_dec(16, "bf16", 256), "ours", _dec(16, "bf16", 256), "flashmla_bf16")], 0.90, 0.70),
    ("decode h128 B=64 bf16: ours / flashmla_bf16",
     [(_dec(128, "bf16"), "ours", _dec(128, "bf16"), "flashmla_bf16")], 1.50, 1.00),
    ("decode h128 B=64 fp8: ours / flashmla_fp8",
     [(_dec(128, "fp8_ds_mla"), "ours", _dec(128, "fp8_ds_mla"), "flashmla_fp8")], 1.20, 0.85),
    ("prefill h128 & h64 bf16: ours / flashmla_bf16",
     [(_pre(h), "ours", _pre(h), "flashmla_bf16") for h in (128, 64)], 1.60, 1.20),
    ("prefill h16 & h8 bf16: ours / flashmla_bf16",
     [(_pre(h), "ours", _pre(h), "flashmla_bf16") for h in (16, 8)], 0.80, 0.50),
    ("every case: ours / page1_triton", "every case:page1_triton", 0.33, 0.15),
    ("decode h16 B=64: ours fp8 / ours bf16",
     [(_dec(16, "fp8_ds_mla"), "ours", _dec(16, "bf16"), "ours")], 0.70, 0.60),
    # DSA indexer (issue #6): decode B=64 at Hi 64/32 and 32K/128K contexts; prefill 4096 rows over 32K at Hi 64/32.
    ("indexer decode logits: ours_logits / deepgemm",
     [(_idx("decode", h, c), "ours_logits", _idx("decode", h, c), "deepgemm") for h, c in _IDX_DEC], 1.30, 1.00),
    ("indexer decode +top-k: ours / deepgemm_topk",
     [(_idx("decode", h, c), "ours", _idx("decode", h, c), "deepgemm_topk") for h, c in _IDX_DEC], 1.00, 0.70),
    ("indexer prefill logits: ours_logits / deepgemm",
     [(_idx("prefill", h), "ours_logits", _idx("prefill", h), "deepgemm") for h in (64, 32)], 2.50, 1.30),
    ("indexer prefill +top-k: ours / deepgemm_topk",
     [(_idx("prefill", h), "ours", _idx("prefill", h), "deepgemm_topk") for h in (64, 32)], 1.30, 0.90),
]


def target_group(spec) -> str:
    """``"indexer"`` for a target over indexer cases, else ``"attention"``."""
    if isinstance(spec, str):
        return "attention"
    return "indexer" if any(nsel.get("kind") == "indexer" for nsel, _, _, _ in spec) else "attention"


def _groups_in(doc: dict) -> set[str]:
    return {case_group(c) for c in doc.get("cases") or [] if isinstance(c, dict)}


def _best_peer(c: dict, key: str = "ms") -> tuple[str | None, float | None]:
    best = (None, None)
    for p in (c.get("methods") or {}):
        if p == "ours":
            continue
        v = _method_ms(c, p, key)
        if v is not None and (best[1] is None or v < best[1]):
            best = (p, v)
    return best


def _sel_text(sel: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sel.items())


def _why_missing(c: dict | None, m: str) -> str:
    if c is None:
        return "case not in results"
    if m == BEST_PEER:
        return "no peer timed"
    rec = (c.get("methods") or {}).get(m)
    if rec is None:
        return f"{m} not in results"
    if rec.get("error"):
        return f"{m}: {rec['error']}"
    return f"{m}: no time"


def _needs_gbps(c: dict | None, den_ms: float | None, limit: float) -> float | None:
    """Bandwidth (GB/s of the case's unique bytes) that a time of ``limit`` × ``den_ms`` would need. The timed calls
    start with a flushed L2, so every unique byte moves through HBM at least once: a limit that needs more than the
    read ceiling measured in the run asks for more than any kernel was seen to read on that device (and where it
    needs more than the device's nominal bandwidth, more than it can)."""
    ub = (c or {}).get("unique_bytes")
    if not ub or not den_ms:
        return None
    return ub / (limit * den_ms * 1e-3) / 1e9


def target_rows(doc: dict) -> list[dict]:
    """One row per (target, case): ``ratio`` (do_bench ms), ``graph_ratio`` (decode, both graph-timed), ``limit``,
    ``goal``, ``status`` PASS / FAIL / n/a, ``goal_met``, ``note`` (which peer, or why n/a). The targets of a case
    group (attention / indexer, :func:`target_group`) are left out when the results have cases but none of that
    group (e.g. a ``--kinds indexer`` run)."""
    out = []
    groups = _groups_in(doc)
    for label, spec, limit, goal in TARGETS:
        if groups and target_group(spec) not in groups:
            continue
        pairs = []
        if isinstance(spec, str):  # every case that has the peer
            peer = spec.split(":", 1)[1]
            for c in doc.get("cases") or []:
                if peer in (c.get("methods") or {}):
                    pairs.append((c, "ours", c, peer, c.get("name")))
            if not pairs:
                pairs.append((None, "ours", None, peer, f"(no case has {peer})"))
        else:
            for nsel, nm, dsel, dm in spec:
                nc, dc = _find_case(doc, **nsel), _find_case(doc, **dsel)
                name = nc.get("name") if nc else f"({_sel_text(nsel)})"
                if nc and dc and nc is not dc:  # two cases, e.g. ours fp8 / ours bf16
                    fmt = str(nc.get("kv_format"))
                    name = str(nc.get("name")).replace(fmt, f"{fmt} / {dc.get('kv_format')}")
                pairs.append((nc, nm, dc, dm, name))
        for nc, nm, dc, dm, name in pairs:
            num, num_g = _method_ms(nc, nm), _method_ms(nc, nm, "graph_ms")
            note = ""
            if dm == BEST_PEER:
                bp, den = _best_peer(dc) if dc else (None, None)
                _, den_g = _best_peer(dc, "graph_ms") if dc else (None, None)
                if bp:
                    note = f"best peer: {bp} {den:.4f} ms"
            else:
                den, den_g = _method_ms(dc, dm), _method_ms(dc, dm, "graph_ms")
            why = [_why_missing(cc, mm) for cc, mm, v in ((nc, nm, num), (dc, dm, den)) if v is None]
            if why:
                note = "; ".join(dict.fromkeys(why))
            ratio = _ratio(num, den)
            alt = _method_ms(dc, dm, "ms_default_scales") if dm == "page1_triton" else None
            if alt is not None and num is not None:
                extra = f"vs page1 as sweep.py called it (default scales): {num / alt:.2f}"
                note = f"{note}; {extra}" if note else extra
            g = _ratio(num_g, den_g) if nc and _graph_timed(nc) else None
            eps = 1e-9  # a ratio equal to the limit passes, whatever the float rounding
            status = "n/a" if ratio is None else ("PASS" if ratio <= limit + eps else "FAIL")
            needs = _needs_gbps(nc, den, limit) if nm.startswith("ours") else None  # our methods read all
            read = (doc.get("ceilings") or {}).get("read_gbps")
            over = needs is not None and bool(read) and needs > read
            if over:
                extra = (f"limit over the read ceiling: {limit:.2f} x {den:.4f} ms means moving the case's unique "
                         f"bytes at {needs:.0f} GB/s > {read:.0f} GB/s, the best read measured in the run")
                note = f"{note}; {extra}" if note else extra
            out.append({"target": label, "case": name, "ratio": ratio, "graph_ratio": g, "limit": limit, "goal": goal,
                        "status": status, "goal_met": ratio is not None and ratio <= goal + eps, "note": note,
                        "needs_gbps": needs, "over_read_ceiling": over})
    return out


def targets_text(doc: dict) -> str:
    rows = target_rows(doc)
    lines = [f"targets (ours / peer, do_bench ms; PASS = ratio <= limit; goal: where the issue wants it; graph = the "
             f"same with CUDA-graph times) -- {_doc_label(doc)}"]
    groups = _groups_in(doc)
    skipped = sorted({target_group(spec) for _, spec, _, _ in TARGETS} - groups) if groups else []
    if skipped:
        lines.append(f"  ({' and '.join(skipped)} targets left out: no such cases in these results)")
    hdr = (f"{'target':<46} {'case':<40} {'ratio':>6} {'graph':>6} {'limit':>6} {'goal':>5} {'status':<6} "
           f"{'goal?':<5} note")
    lines += [hdr, "-" * len(hdr)]
    prev = None
    for r in rows:
        tgt = r["target"] if r["target"] != prev else ""
        prev = r["target"]
        lines.append(f"{tgt:<46} {str(r['case'])[:40]:<40} {_fmt(r['ratio'], '6.2f'):>6} "
                     f"{_fmt(r['graph_ratio'], '6.2f'):>6} {r['limit']:6.2f} {r['goal']:5.2f} {r['status']:<6} "
                     f"{'met' if r['goal_met'] else '-':<5} {r['note']}")
    n = {s: sum(r["status"] == s for r in rows) for s in ("PASS", "FAIL", "n/a")}
    lines.append(f"{n['PASS']} PASS, {n['FAIL']} FAIL, {n['n/a']} n/a; goal met on {sum(r['goal_met'] for r in rows)} "
                 f"of {len(rows)} rows")
    over = [r for r in rows if r.get("over_read_ceiling")]
    if over:
        lines.append(f"{len(over)} row(s) whose limit needs more bandwidth than the read ceiling of the run: "
                     + "; ".join(f"{r['target'].split(':')[0]} / {r['case']}" for r in over))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- plot

METHOD_COLORS = {"ours": "#d62728", "torch": "#7f7f7f", "page1_triton": "#2ca02c", "flashmla_bf16": "#1f77b4",
                 "flashmla_fp8": "#9467bd", "ours_logits": "#ff9896", "deepgemm": "#ff7f0e",
                 "deepgemm_topk": "#8c564b"}


def plot_results(doc_or_path, png: str | None = None, *, log=print) -> str | None:
    """Grouped bar chart of a results JSON (dict or path): one group per case, one bar per method with a time,
    log-scale ms; an × at the bottom marks a method that applies but has an error (e.g. a peer not available).
    Saved to ``png`` (default: the JSON's path with .png). Returns the PNG path, or None when matplotlib is not
    importable (printed as skipped)."""
    if isinstance(doc_or_path, (str, os.PathLike)):
        path = os.fspath(doc_or_path)
        doc = load_results(path)
        png = png or os.path.splitext(path)[0] + ".png"
    else:
        doc = doc_or_path
    if not png:
        raise ValueError("plot_results: png path required when given a dict")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:
        log(f"plot skipped: matplotlib is not importable ({e}); pip install 'triton-mla-sparse[bench]'")
        return None
    cases = [c for c in doc.get("cases") or [] if c.get("methods")]
    methods = _methods_in(doc)
    n_m = max(1, len(methods))
    width = 0.8 / n_m
    fig = Figure(figsize=(max(8.0, 0.62 * len(cases) + 2.5), 6.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    all_ms = [v for c in cases for m in methods if (v := _method_ms(c, m)) is not None]
    lo = min(all_ms) if all_ms else 1e-3
    err_y = lo / 2.2
    handles = []
    for j, m in enumerate(methods):
        xs, ys, ex = [], [], []
        for i, c in enumerate(cases):
            x = i - 0.4 + width * (j + 0.5)
            v = _method_ms(c, m)
            if v is not None:
                xs.append(x)
                ys.append(v)
            elif m in (c.get("methods") or {}):
                ex.append(x)
        color = METHOD_COLORS.get(m) or f"C{j}"
        ax.bar(xs, ys, width=width * 0.95, color=color, zorder=3)
        handles.append(Patch(color=color, label=m))
        if ex:
            ax.scatter(ex, [err_y] * len(ex), marker="x", s=18, color=color, zorder=4)
    ax.set_yscale("log")
    if all_ms:
        ax.set_ylim(bottom=lo / 3.5, top=max(all_ms) * 2.0)
    for i in range(1, len(cases)):  # a dashed line between the attention and the indexer cases
        if case_group(cases[i]) != case_group(cases[i - 1]):
            ax.axvline(i - 0.5, color="#555555", linestyle="--", linewidth=0.8, zorder=2)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([c.get("name", "?") for c in cases], rotation=55, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.set_ylabel("ms per call (do_bench median, log scale)")
    ax.grid(axis="y", which="both", alpha=0.3, zorder=0)
    ax.set_title(f"triton-mla-sparse bench: {doc.get('device', '?')}, {doc.get('date', '?')}, "
                 f"commit {_commit_of(doc)[:12]}", fontsize=10)
    if methods:
        ax.legend(handles=handles, fontsize=8, ncol=min(5, n_m), loc="upper left")
    if not all_ms:
        ax.text(0.5, 0.5, "no timings", transform=ax.transAxes, ha="center")
    fig.text(0.01, 0.01, "× = applies but errored / not available (see JSON); indexer cases: ours = logits + top-k, "
             "ours_logits / deepgemm = logits only", fontsize=7, color="#555555")
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(png))
    os.makedirs(d, exist_ok=True)
    fig.savefig(png)
    return png


def report_main(*, plot=None, png=None, targets=None, compare=None, against=None, log=None) -> int:
    """The GPU-free modes of ``triton-mla-sparse bench``: ``--plot``, ``--targets``, ``--compare OLD --against NEW``.
    Returns 0, or 2 when a file cannot be read."""
    log = log or (lambda s: print(s, flush=True))
    try:
        if compare and against:
            log(compare_text(load_results(compare), load_results(against), old_label=compare, new_label=against))
        if targets:
            doc = load_results(targets)
            log(ratios_text(doc))
            log("")
            log(targets_text(doc))
        if plot:
            p = plot_results(plot, png, log=log)
            if p:
                log(f"wrote {p}")
    except (OSError, ValueError) as e:
        print(f"triton-mla-sparse bench: {_short_exc(e)}", file=sys.stderr)
        return 2
    return 0


__all__ += ["indexer_case", "IndexerInputs", "build_indexer_inputs", "encode_indexer_cache", "indexer_reference",
            "indexer_error", "check_output", "case_tolerance", "case_group", "target_group", "ours_for", "KINDS",
            "INDEXER_KV_FORMAT", "INDEXER_METHOD_KEYS", "INDEXER_TOL", "DEEPGEMM_KEYS", "resolve_deepgemm_dir",
            "deepgemm_jit_cache_dir"]
__all__ += ["decode_case", "prefill_case", "git_commit", "DoBenchTimer", "time_do_bench", "time_graph", "time_wall",
            "time_events", "graph_replays", "report_main", "write_json", "utc_date", "BEST_PEER", "METHOD_COLORS"]

"""Benchmark cases: :class:`Case` and the standard lists (:func:`bench_cases`, :func:`smoke_cases`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..formats import D_INDEX, D_QK, D_V, D_V4, FP8_DS_MLA_V4
from ..testing import DSV32_SOFTMAX_SCALE as DSV32_SCALE
from ..testing import DSV4_SOFTMAX_SCALE as DSV4_SCALE
from ..testing import GLM5_SOFTMAX_SCALE as GLM5_SCALE
V4_KV_FORMAT = FP8_DS_MLA_V4  # DeepSeek-V4's fp8 pages: its cases also read a second (compressed) cache
INDEXER_KV_FORMAT = "fp8_indexer"  # vLLM's fp8 indexer cache: per block bs·128 e4m3 values, then bs float32 scales
KINDS = ("attention", "indexer")  # case groups: attention = kind "decode" / "prefill"; indexer = kind "indexer"


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
    extra_topk: int = 0  # DeepSeek-V4 cases: entries of the compressed cache's list (``topk``: the window's)

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
        if self.kv_format == V4_KV_FORMAT:
            return 2 * self.heads * (self.topk + self.extra_topk) * (D_V4 + D_V4) * self.rows
        return 2 * self.heads * self.topk * (D_QK + D_V) * self.rows


def _ctx_label(ctx: int) -> str:
    return f"{ctx // 1024}K" if ctx % 1024 == 0 else str(ctx)


def decode_case(heads: int, batch: int, kv_format: str, *, ctx: int = 8192, topk: int = 2048, block_size: int = 64,
                q_dtype: str = "bfloat16") -> Case:
    """An attention decode case: ``batch`` requests of ``ctx`` tokens, one query row each."""
    scale = DSV32_SCALE if heads == 128 else GLM5_SCALE
    return Case(name=f"decode h{heads} B={batch} ctx{_ctx_label(ctx)} {kv_format}", kind="decode", rows=batch,
                heads=heads, topk=topk, ctx=ctx, kv_format=kv_format, requests=batch, block_size=block_size,
                q_dtype=q_dtype, softmax_scale=scale)


def v4_decode_case(heads: int, batch: int, *, window: int = 128, extra_topk: int = 512, ctx: int = 8192,
                   block_size: int = 64, q_dtype: str = "bfloat16") -> Case:
    """A DeepSeek-V4 decode case, a compressed-attention layer as vLLM's FlashMLA path runs it: ``batch`` requests
    of ``ctx`` tokens, one query row each (512 wide) over two ``fp8_ds_mla_v4`` caches with one softmax and a
    per-head sink — the sliding-window cache (the last ``window`` tokens: the main list) and the compressed cache
    (``ctx // 4`` entries, ``extra_topk`` of them chosen by the indexer: the extra list)."""
    return Case(name=f"decode v4 h{heads} B={batch} swa{window}+c{extra_topk} ctx{_ctx_label(ctx)} {V4_KV_FORMAT}",
                kind="decode", rows=batch, heads=heads, topk=window, ctx=ctx, kv_format=V4_KV_FORMAT,
                requests=batch, block_size=block_size, q_dtype=q_dtype, softmax_scale=DSV4_SCALE,
                extra_topk=extra_topk)


def prefill_case(heads: int, kv_format: str, *, rows: int = 4096, ctx: int = 32768, topk: int = 2048,
                 block_size: int = 64, q_dtype: str = "bfloat16") -> Case:
    """An attention prefill case: ``rows`` causal rows at the last positions of one ``ctx``-token request."""
    scale = DSV32_SCALE if heads == 128 else GLM5_SCALE
    return Case(name=f"prefill h{heads} T={rows} ctx{_ctx_label(ctx)} {kv_format}", kind="prefill", rows=rows,
                heads=heads, topk=topk, ctx=ctx, kv_format=kv_format, requests=1, block_size=block_size,
                q_dtype=q_dtype, softmax_scale=scale)


def indexer_case(heads: int, phase: str, *, rows: int | None = None, ctx: int | None = None, topk: int = 2048,
                 block_size: int = 64, check_rows: int = 128) -> Case:
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


def case_group(case_or_kind: Case | dict | str) -> str:
    """``"indexer"`` for indexer cases (a :class:`Case`, a case record or a kind string), else ``"attention"``."""
    kind = case_or_kind if isinstance(case_or_kind, str) else (
        case_or_kind.get("kind") if isinstance(case_or_kind, dict) else case_or_kind.kind)
    return "indexer" if kind == "indexer" else "attention"


def graph_timed(case: Case | dict) -> bool:
    """Decode-like cases (attention decode, indexer decode; a Case or a case record) are also CUDA-graph timed."""
    kind = case.get("kind") if isinstance(case, dict) else case.kind
    phase = case.get("phase") if isinstance(case, dict) else case.phase
    return kind == "decode" or (kind == "indexer" and phase == "decode")


def parse_kinds(kinds: str | Iterable[str] | None) -> tuple[str, ...]:
    """The case groups named by ``kinds`` (a comma-separated string or a sequence; None: all of :data:`KINDS`)."""
    if kinds is None:
        return KINDS
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds: expected a comma-separated subset of {', '.join(KINDS)}, got {bad or 'nothing'}")
    return kinds


def bench_cases(quick: bool = False, kinds: str | Iterable[str] | None = None) -> list[Case]:
    """The standard case list (see benchmarks/README.md); ``quick`` keeps a subset that runs in about a minute.
    ``kinds``: which case groups (:data:`KINDS`, default both): the attention cases, then the indexer cases."""
    kinds = parse_kinds(kinds)
    fmts = ("bf16", "fp8_ds_mla")
    cases: list[Case] = []
    if "attention" in kinds:
        if quick:
            cases += [decode_case(h, 64, f) for h in (16, 128) for f in fmts]
            cases += [prefill_case(64, f) for f in fmts]
            cases += [v4_decode_case(8, 64)]
        else:
            cases += [decode_case(h, 64, f) for h in (8, 16, 32, 64, 128) for f in fmts]
            cases += [decode_case(16, 256, f) for f in fmts]
            cases += [decode_case(128, 1, f, ctx=65536) for f in fmts]
            cases += [prefill_case(h, f) for h in (8, 16, 64, 128) for f in fmts]
            cases += [v4_decode_case(h, b) for h in (8, 64) for b in (64, 256)]
    if "indexer" in kinds:
        if quick:
            cases += [indexer_case(64, "decode", ctx=131072), indexer_case(64, "prefill")]
        else:
            cases += [indexer_case(h, "decode", ctx=c) for h in (64, 32) for c in (32768, 131072)]
            cases += [indexer_case(h, "prefill") for h in (64, 32)]
    return cases


def smoke_cases(kinds: str | Iterable[str] | None = None) -> list[Case]:
    """Tiny cases that exercise every code path of the harness (fp16 q: the interpreter's bf16 dots are garbage)."""
    kinds = parse_kinds(kinds)
    kw = dict(topk=64, q_dtype="float16")
    cases: list[Case] = []
    if "attention" in kinds:
        cases += [
            decode_case(8, 2, "fp16", ctx=256, **kw),
            decode_case(32, 2, "fp8_ds_mla", ctx=256, **kw),
            decode_case(128, 1, "fp16", ctx=512, **kw),
            replace(prefill_case(16, "fp8_ds_mla", rows=6, ctx=512, **kw), check_rows=4),
            prefill_case(8, "fp16", rows=4, ctx=256, **kw),
            v4_decode_case(4, 2, window=32, extra_topk=48, ctx=512, block_size=16, q_dtype="float16"),
        ]
    if "indexer" in kinds:
        cases += [
            indexer_case(4, "decode", rows=3, ctx=96, topk=40, block_size=16),
            indexer_case(8, "prefill", rows=5, ctx=80, topk=32, block_size=16, check_rows=3),
        ]
    return cases

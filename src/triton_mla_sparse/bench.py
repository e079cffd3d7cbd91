"""Benchmark harness: realistic paged caches, accuracy first, then timings against ceilings measured in the same run.

Structure
  * :class:`Case` describes one problem (decode: one query row per request; prefill: many causal rows over one
    sequence). :func:`bench_cases` is the standard list, :func:`build_inputs` turns a case into tensors: a paged cache
    whose blocks are handed to requests from a random permutation of the pool, and per-row top-k slot lists made of
    distinct request-local positions mapped through the block table (:func:`triton_mla_sparse.topk_to_slots`).
  * A *method* is something that computes the attention for a case. :data:`METHODS` maps a name to a factory
    ``factory(inputs) -> Prepared`` (or raises :class:`Unsupported`); ``Prepared.fn()`` runs one call and returns
    ``out [rows, heads, 512]``. Peers are added with :func:`register_method`.
  * :func:`run_case` checks every method against the float32 reference on the same inputs first (a subset of rows
    for large cases) and refuses to time a method whose relative error exceeds the case's tolerance; it then times
    it with ``triton.testing.do_bench`` (median) and, for decode, under CUDA-graph replay.

Nothing here imports triton at module import time (``triton.testing`` is imported inside the GPU timers), so the
CLI can still choose ``TRITON_INTERPRET`` before the kernels load.
"""

from __future__ import annotations

import datetime
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
from dataclasses import dataclass, replace
from typing import Callable

import torch

from .formats import D_QK, D_V, FP8_DS_MLA_BYTES, dequantize_fp8_ds_mla, quantize_fp8_ds_mla
from .slots import topk_to_slots

__all__ = [
    "Case", "CaseInputs", "Prepared", "Unsupported", "METHODS", "register_method", "bench_cases", "smoke_cases",
    "build_inputs", "random_block_table", "random_topk_positions", "encode_cache", "reference_output", "rel_err",
    "tolerance", "measure_ceilings", "run_case", "run_bench", "format_table", "config_str",
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
    kind: str  # "decode" | "prefill"
    rows: int
    heads: int
    topk: int
    ctx: int  # tokens per request
    kv_format: str  # "bf16" | "fp16" | "fp8_ds_mla"
    requests: int
    block_size: int = 64
    q_dtype: str = "bfloat16"
    softmax_scale: float = GLM5_SCALE
    scale_format: str = "pow2"  # fp8_ds_mla writer convention
    check_rows: int = 256  # accuracy is checked on at most this many rows (a random subset)

    @property
    def flops(self) -> int:
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


def bench_cases(quick: bool = False) -> list[Case]:
    """The standard case list (see benchmarks/NOTES.md); ``quick`` keeps a subset that runs in about a minute."""
    fmts = ("bf16", "fp8_ds_mla")
    if quick:
        cases = [decode_case(h, 64, f) for h in (16, 128) for f in fmts]
        cases += [prefill_case(64, f) for f in fmts]
        return cases
    cases = [decode_case(h, 64, f) for h in (8, 16, 32, 64, 128) for f in fmts]
    cases += [decode_case(16, 256, f) for f in fmts]
    cases += [decode_case(128, 1, f, ctx=65536) for f in fmts]
    cases += [prefill_case(h, f) for h in (8, 16, 64, 128) for f in fmts]
    return cases


def smoke_cases() -> list[Case]:
    """Tiny cases that exercise every code path of the harness (fp16 q: the interpreter's bf16 dots are garbage)."""
    kw = dict(topk=64, q_dtype="float16")
    return [
        decode_case(8, 2, "fp16", ctx=256, **kw),
        decode_case(32, 2, "fp8_ds_mla", ctx=256, **kw),
        decode_case(128, 1, "fp16", ctx=512, **kw),
        replace(prefill_case(16, "fp8_ds_mla", rows=6, ctx=512, **kw), check_rows=4),
        prefill_case(8, "fp16", rows=4, ctx=256, **kw),
    ]


# ----------------------------------------------------------------------------------------------------- inputs

@dataclass
class CaseInputs:
    case: Case
    q: torch.Tensor  # [rows, heads, 576]
    kv_cache: torch.Tensor  # [num_blocks, block_size, row] in the case's format
    indices: torch.Tensor  # int32 [rows, topk] global slots
    block_table: torch.Tensor  # int32 [requests, blocks_per_request]
    unique_rows: int  # distinct cache rows referenced by all lists together

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def kv_format(self) -> str:
        return self.case.kv_format

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


def build_inputs(case: Case, device, seed: int = 0) -> CaseInputs:
    """Random inputs for ``case`` on ``device`` (seeded): paged cache, block table, slot lists, q."""
    device = torch.device(device)
    torch.manual_seed(seed)
    bs = case.block_size
    if case.ctx % bs:
        raise ValueError(f"ctx {case.ctx} must be a multiple of block_size {bs}")
    bpr = case.ctx // bs
    num_blocks = case.requests * bpr
    block_table = random_block_table(case.requests, bpr, device)
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


# ----------------------------------------------------------------------------------------------------- methods

class Unsupported(Exception):
    """Raised by a method factory for a case the method cannot run (recorded as skipped, not as an error)."""


@dataclass
class Prepared:
    fn: Callable[[], torch.Tensor]  # one call; returns out [rows, heads, 512]
    config: str | None = None
    graphable: bool = True  # can be captured in a CUDA graph


MethodFactory = Callable[[CaseInputs], Prepared]
METHODS: dict[str, MethodFactory] = {}


def register_method(name: str):
    """Decorator: ``@register_method("peer") def build(inputs) -> Prepared``."""
    def deco(factory: MethodFactory) -> MethodFactory:
        METHODS[name] = factory
        return factory
    return deco


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
    """Plain PyTorch: gather the rows, (dequantise fp8_ds_mla to bf16), matmul, softmax, matmul in q's dtype."""
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


def reference_output(inp: CaseInputs, seed: int = 1234):
    """float32 reference on a random subset of at most ``case.check_rows`` rows: returns ``(ref, row_ids)``
    (``row_ids`` None when all rows are checked)."""
    from . import reference

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

def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_do_bench(fn) -> float:
    """Median milliseconds of ``fn`` by ``triton.testing.do_bench`` (L2 flushed before each call)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


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
    """Wall-clock milliseconds of one call (CPU / interpreter smoke runs)."""
    t0 = time.perf_counter()
    fn()
    _sync(device or "cpu")
    return (time.perf_counter() - t0) * 1e3


def measure_ceilings(device) -> dict:
    """Device copy bandwidth (bytes read + written) and bf16 8192³ matmul rate, by do_bench medians."""
    from triton.testing import do_bench

    src = torch.ones(1 << 30, dtype=torch.bfloat16, device=device)  # 2 GiB
    dst = torch.empty_like(src)
    ms = float(do_bench(lambda: dst.copy_(src), return_mode="median"))
    copy_gbps = 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9
    del src, dst
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    ms_mm = float(do_bench(lambda: torch.matmul(a, b), return_mode="median"))
    tflops = 2 * n ** 3 / (ms_mm * 1e-3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return {"copy_gbps": copy_gbps, "copy_ms_2GiB": ms, "bf16_tflops": tflops, "matmul_ms_8192": ms_mm}


# ----------------------------------------------------------------------------------------------------- running

def _fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def _floors(case: Case, unique_bytes: int, ceilings: dict | None) -> dict:
    if not ceilings or not ceilings.get("copy_gbps") or not ceilings.get("bf16_tflops"):
        return {"memory_ms": None, "compute_ms": None}
    return {"memory_ms": unique_bytes / (ceilings["copy_gbps"] * 1e9) * 1e3,
            "compute_ms": case.flops / (ceilings["bf16_tflops"] * 1e12) * 1e3}


def run_case(case: Case, method_names, device, *, ceilings=None, seed=0, timer=None, graph_timer=None,
             log=print) -> dict:
    """Build ``case``, check every method against the reference, then time it. Returns the JSON record."""
    device = torch.device(device)
    rec = {"name": case.name, "kind": case.kind, "rows": case.rows, "heads": case.heads, "topk": case.topk,
           "ctx": case.ctx, "kv_format": case.kv_format, "block_size": case.block_size, "q_dtype": case.q_dtype,
           "softmax_scale": case.softmax_scale, "flops": case.flops, "methods": {}}
    try:
        inp = build_inputs(case, device, seed)
        rec["unique_rows"] = inp.unique_rows
        rec["unique_bytes"] = inp.unique_bytes
        rec["floors"] = _floors(case, inp.unique_bytes, ceilings)
        ref, sel = reference_output(inp)
        rec["checked_rows"] = case.rows if sel is None else int(sel.numel())
    except Exception as e:  # noqa: BLE001 - a broken case must not stop the run
        rec["error"] = f"{type(e).__name__}: {e}"
        log(f"  ERROR building case: {rec['error']}")
        traceback.print_exc(file=sys.stderr)
        return rec
    tol = tolerance(case.kv_format)
    for name in method_names:
        m = {"ms": None, "graph_ms": None, "tflops": None, "gbps": None, "pct_copy": None, "rel_err": None,
             "config": None}
        rec["methods"][name] = m
        prep = None
        try:
            prep = METHODS[name](inp)
            m["config"] = prep.config
            out = prep.fn()
            _sync(device)
            got = out if sel is None else out[sel]
            err = rel_err(got, ref)
            m["rel_err"] = err
            del out, got
            if not err <= tol:
                m["error"] = f"accuracy: rel err {err:.3g} > {tol:g}; timing refused"
                log(f"  {name:<8} {prep.config or '':<40} ERROR {m['error']}")
                continue
            ms = (timer or time_do_bench)(prep.fn)
            m["ms"] = ms
            if case.kind == "decode" and prep.graphable and graph_timer is not None:
                m["graph_ms"] = graph_timer(prep.fn)
            m["tflops"] = case.flops / (ms * 1e-3) / 1e12
            m["gbps"] = inp.unique_bytes / (ms * 1e-3) / 1e9
            if ceilings and ceilings.get("copy_gbps"):
                m["pct_copy"] = 100.0 * m["gbps"] / ceilings["copy_gbps"]
            log(f"  {name:<8} {prep.config or '':<40} {ms:8.4f} ms  graph {_fmt(m['graph_ms'], '.4f')} ms  "
                f"{m['tflops']:7.1f} TFLOP/s  {m['gbps']:7.0f} GB/s  err {err:.2e}")
        except Unsupported as e:
            m["skipped"] = str(e)
            log(f"  {name:<8} skipped: {e}")
        except Exception as e:  # noqa: BLE001
            m["error"] = f"{type(e).__name__}: {e}"
            log(f"  {name:<8} ERROR {m['error']}")
            traceback.print_exc(file=sys.stderr)
        finally:
            del prep
            if device.type == "cuda":
                torch.cuda.empty_cache()
    del inp, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rec


def format_table(results: list[dict], ceilings: dict | None = None) -> str:
    hdr = (f"{'case':<36} {'method':<7} {'kernel+config':<40} {'ms':>8} {'graph ms':>9} {'TFLOP/s':>8} "
           f"{'GB/s':>7} {'%copy':>6} {'rel err':>8} {'floor ms':>9}")
    lines = [hdr, "-" * len(hdr)]
    for r in results:
        fl = r.get("floors") or {}
        floor = None
        if fl.get("memory_ms") is not None:
            floor = max(fl["memory_ms"], fl["compute_ms"])
        if r.get("error"):
            lines.append(f"{r['name']:<36} ERROR {r['error']}")
            continue
        for name, m in r["methods"].items():
            if m.get("skipped"):
                lines.append(f"{r['name']:<36} {name:<7} skipped: {m['skipped']}")
                continue
            if m.get("error"):
                lines.append(f"{r['name']:<36} {name:<7} {(m.get('config') or ''):<40} ERROR {m['error']}")
                continue
            lines.append(f"{r['name']:<36} {name:<7} {(m.get('config') or ''):<40} {_fmt(m['ms'], '8.4f'):>8} "
                         f"{_fmt(m['graph_ms'], '9.4f'):>9} {_fmt(m['tflops'], '8.1f'):>8} {_fmt(m['gbps'], '7.0f'):>7} "
                         f"{_fmt(m['pct_copy'], '6.1f'):>6} {_fmt(m['rel_err'], '8.1e'):>8} {_fmt(floor, '9.4f'):>9}")
    if ceilings:
        lines.append(f"ceilings: copy {_fmt(ceilings.get('copy_gbps'), '.0f')} GB/s (read + write), "
                     f"bf16 matmul {_fmt(ceilings.get('bf16_tflops'), '.0f')} TFLOP/s; floor = max(unique bytes / "
                     f"copy bandwidth, FLOPs / matmul rate)")
    return "\n".join(lines)


def git_commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            return None
        sha = r.stdout.strip()
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           timeout=10)
        return sha + ("-dirty" if d.returncode == 0 and d.stdout.strip() else "")
    except Exception:  # noqa: BLE001
        return None


def _versions() -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        v["triton"] = f"unavailable ({type(e).__name__})"
    return v


def run_bench(*, quick=False, out=None, methods=("ours", "torch"), case_filter=None, seed=0, cpu_smoke=False,
              log=None) -> int:
    """Run the benchmark and print the table; returns the exit status (0 ok, 1 a case of 'ours' failed, 2 no GPU)."""
    log = log or (lambda s: print(s, flush=True))
    cuda = torch.cuda.is_available()
    if not cuda and not cpu_smoke:
        print("triton-mla-sparse bench: needs a CUDA GPU (torch.cuda.is_available() is False); timings through the "
              "Triton interpreter on a CPU mean nothing. Try `triton-mla-sparse demo` instead.", file=sys.stderr)
        return 2
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        print(f"triton-mla-sparse bench: unknown method(s) {unknown}; known: {sorted(METHODS)}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    cases = smoke_cases() if cpu_smoke else bench_cases(quick)
    if case_filter:
        rx = re.compile(case_filter)
        cases = [c for c in cases if rx.search(c.name)]
    dev_name = torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.processor() or platform.machine()})"
    versions = _versions()
    log(f"triton-mla-sparse bench on {dev_name}: torch {versions['torch']}, triton {versions['triton']}, "
        f"{len(cases)} cases, methods {', '.join(methods)}" + (" [cpu smoke]" if cpu_smoke else ""))
    if cuda:
        log("measuring ceilings (2 GiB device copy, bf16 8192^3 matmul) ...")
        try:
            ceilings = measure_ceilings(device)
            log(f"  copy {ceilings['copy_gbps']:.0f} GB/s, bf16 matmul {ceilings['bf16_tflops']:.0f} TFLOP/s")
        except Exception as e:  # noqa: BLE001
            ceilings = {"copy_gbps": None, "bf16_tflops": None, "error": f"{type(e).__name__}: {e}"}
            log(f"  ceilings failed: {ceilings['error']}")
        timer, graph_timer = time_do_bench, time_graph
    else:
        ceilings = {"copy_gbps": None, "bf16_tflops": None}
        timer, graph_timer = (lambda fn: time_wall(fn, device)), None
    results = []
    t_start = time.perf_counter()
    for i, case in enumerate(cases, 1):
        log(f"[{i}/{len(cases)}] {case.name} ({time.perf_counter() - t_start:.0f} s)")
        results.append(run_case(case, methods, device, ceilings=ceilings, seed=seed, timer=timer,
                                graph_timer=graph_timer, log=log))
    log("")
    log(format_table(results, ceilings))
    failed = [r["name"] for r in results
              if r.get("error") or ("ours" in r["methods"] and r["methods"]["ours"].get("error"))]
    doc = {
        "device": dev_name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": versions["torch"], "triton": versions["triton"], "python": versions["python"],
        "git_commit": git_commit(), "quick": bool(quick), "cpu_smoke": bool(cpu_smoke),
        "multiprocessors": torch.cuda.get_device_properties(device).multi_processor_count if cuda else None,
        "ceilings": ceilings, "methods": list(methods), "cases": results, "failed": failed,
        "elapsed_s": time.perf_counter() - t_start,
    }
    if out:
        d = os.path.dirname(os.path.abspath(out))
        os.makedirs(d, exist_ok=True)
        with open(out, "w") as f:
            json.dump(_clean(doc), f, indent=1, default=_json_default)
        log(f"wrote {out}")
    if failed:
        log(f"FAILED cases (ours): {', '.join(failed)}")
        return 1
    log(f"done in {time.perf_counter() - t_start:.0f} s")
    return 0


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


__all__ += ["decode_case", "prefill_case", "git_commit", "time_do_bench", "time_graph", "time_wall"]

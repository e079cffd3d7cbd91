"""The DSA "lightning indexer" on the Triton kernels: validation, launch configuration and the public functions.

``indexer_logits`` computes, for every query row t and request-local position p,
``logits[t, p] = Σ_h weights[t, h] · relu(<q[t, h], k[p]> · kscale[p])`` over the row's request (causal:
p <= positions[t]); ``indexer_topk`` returns the positions of each row's ``topk`` largest logits. The contract is
the docstring of :func:`triton_mla_sparse.reference.indexer_logits` / :func:`~triton_mla_sparse.reference.indexer_topk`
(plain torch); the validation here is shared with them. Importing this module touches neither CUDA nor triton.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._checks import _desc, _fail, check_kernel_device, check_paged_strides, device_guard

__all__ = ["IndexerProblem", "check_indexer_inputs", "indexer_logits", "indexer_topk"]

D_INDEX = 128  # index head dim (DeepSeek-V3.2, GLM-5)
MAX_INDEX_HEADS = 64  # DeepSeek-V3.2: 64, GLM-5: 32
FP8_ROW_BYTES = D_INDEX + 4  # 128 e4m3 values + one float32 scale per token
Q_DTYPES = (torch.float8_e4m3fn, torch.float16, torch.bfloat16)
MAX_GRID = 2**31 - 1
MAX_LEN = 2**31 - 2**16  # positions (and a chunk past the last) stay in int32 inside the kernels


@dataclass
class IndexerProblem:
    """Normalised inputs of one indexer call (no copies)."""

    q: torch.Tensor  # [T, Hi, 128], unit last stride
    weights: torch.Tensor  # float32 [T, Hi]
    k: torch.Tensor  # the cache tensor as given (the kernels use its base pointer and the strides below)
    k_fp8: bool  # vLLM's fp8 indexer layout (uint8) vs bf16/fp16 rows
    k_block_stride: int  # elements (bytes for fp8) between blocks
    k_row_stride: int  # elements between rows of a block (128 for fp8: values are packed)
    block_table: torch.Tensor  # int32 [R, max_blocks]
    req_id_per_token: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T]
    T: int
    Hi: int
    block_size: int
    num_blocks: int

    @property
    def q_fp8(self) -> bool:
        return self.q.dtype == torch.float8_e4m3fn

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def capacity(self) -> int:
        """Positions the block table can address: max_blocks · block_size."""
        return self.block_table.shape[1] * self.block_size


def _check_k_cache(k_cache, q_dtype, device):
    """(k, k_fp8, block_stride, row_stride, num_blocks, block_size) of an indexer K cache."""
    if not isinstance(k_cache, torch.Tensor):
        _fail("k_cache", f"a uint8 tensor [num_blocks, block_size·{FP8_ROW_BYTES}] (vLLM's fp8 indexer layout) or a "
              f"float16/bfloat16 tensor [num_blocks, block_size, {D_INDEX}]", k_cache)
    if k_cache.device != device:
        _fail("k_cache", f"device {device} (the device of q)", k_cache)
    if k_cache.dtype == torch.uint8:
        if k_cache.dim() == 4 and k_cache.shape[2] == 1 and k_cache.shape[3] == FP8_ROW_BYTES:
            nb, bs = k_cache.shape[:2]
            if k_cache.stride(3) != 1 or (bs > 1 and k_cache.stride(1) != FP8_ROW_BYTES):
                _fail("k_cache", f"the bytes of each block contiguous (strides (*, {FP8_ROW_BYTES}, *, 1))",
                      f"strides {tuple(k_cache.stride())}")
        elif k_cache.dim() == 2 and k_cache.shape[1] > 0 and k_cache.shape[1] % FP8_ROW_BYTES == 0:
            nb, bs = k_cache.shape[0], k_cache.shape[1] // FP8_ROW_BYTES
            if k_cache.stride(1) != 1:
                _fail("k_cache", "a unit stride in the last dimension", f"strides {tuple(k_cache.stride())}")
        else:
            _fail("k_cache", f"shape [num_blocks, block_size·{FP8_ROW_BYTES}] or [num_blocks, block_size, 1, "
                  f"{FP8_ROW_BYTES}] for the uint8 fp8 indexer layout ({D_INDEX} e4m3 bytes + a float32 scale per "
                  f"token)", k_cache)
        block_stride = k_cache.stride(0)
        if nb > 1 and block_stride < bs * FP8_ROW_BYTES:
            _fail("k_cache", f"a block stride of at least block_size·{FP8_ROW_BYTES} = {bs * FP8_ROW_BYTES} bytes",
                  f"strides {tuple(k_cache.stride())}")
        if (nb > 1 and block_stride % 4) or k_cache.data_ptr() % 4:
            _fail("k_cache", "blocks aligned to 4 bytes (the float32 scales): block stride and start divisible by 4",
                  f"strides {tuple(k_cache.stride())}, start offset {k_cache.data_ptr() % 16} mod 16")
        return k_cache, True, block_stride, D_INDEX, nb, bs
    if k_cache.dtype in (torch.float16, torch.bfloat16):
        if q_dtype != torch.float8_e4m3fn and k_cache.dtype != q_dtype:
            _fail("k_cache", f"dtype {q_dtype} (the dtype of q) or the uint8 fp8 indexer layout", k_cache)
        k = k_cache[:, :, 0] if (k_cache.dim() == 4 and k_cache.shape[2] == 1) else k_cache
        if k.dim() != 3 or k.shape[2] != D_INDEX:
            _fail("k_cache", f"shape [num_blocks, block_size, {D_INDEX}] (or [num_blocks, block_size, 1, {D_INDEX}])",
                  k_cache)
        nb, bs = k.shape[:2]
        check_paged_strides("k_cache", k, k_cache, D_INDEX)
        return k, False, k.stride(0), k.stride(1), nb, bs
    _fail("k_cache", "dtype uint8 (vLLM's fp8 indexer layout), float16 or bfloat16", k_cache)


def _check_int32(arg, x, shape_desc, dims, device, first=None):
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.dim() != dims:
        _fail(arg, f"an int32 tensor {shape_desc}", x)
    if first is not None and x.shape[0] != first:
        _fail(arg, f"shape {shape_desc}", x)
    if x.device != device:
        _fail(arg, f"device {device} (the device of q)", x)


def _check_int(arg, x, lo, hi=MAX_GRID):
    if isinstance(x, bool) or not isinstance(x, int):
        _fail(arg, f"a Python int >= {lo}", _desc(x))
    if x < lo or x > hi:
        _fail(arg, f"an int in [{lo}, {hi}]", f"{x!r}")


def check_indexer_inputs(q, weights, k_cache, block_table, req_id_per_token, positions) -> IndexerProblem:
    """Validate the common arguments of the indexer functions; each failure is one ``ValueError`` naming the
    argument and the expectation, raised before anything is launched or written."""
    if not isinstance(q, torch.Tensor) or q.dtype not in Q_DTYPES:
        _fail("q", f"a float8_e4m3fn, float16 or bfloat16 tensor [T, Hi, {D_INDEX}]", q)
    if q.dim() != 3 or q.shape[2] != D_INDEX:
        _fail("q", f"shape [T, Hi, {D_INDEX}] (index head dim {D_INDEX})", q)
    T, Hi = q.shape[:2]
    if not 1 <= Hi <= MAX_INDEX_HEADS:
        _fail("q", f"1 to {MAX_INDEX_HEADS} index heads (DeepSeek-V3.2 has 64, GLM-5 32)", q)
    if q.stride(2) != 1:
        _fail("q", "a unit stride in the last dimension", f"strides {q.stride()}")
    device = q.device
    if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
        _fail("weights", f"a float32 tensor [{T}, {Hi}]", weights)
    if weights.shape != (T, Hi):
        _fail("weights", f"shape [{T}, {Hi}] (rows and heads of q)", weights)
    if weights.device != device:
        _fail("weights", f"device {device} (the device of q)", weights)
    k, k_fp8, block_stride, row_stride, nb, bs = _check_k_cache(k_cache, q.dtype, device)
    _check_int32("block_table", block_table, "[num_requests, max_blocks]", 2, device)
    _check_int32("req_id_per_token", req_id_per_token, f"[{T}]", 1, device, first=T)
    _check_int32("positions", positions, f"[{T}]", 1, device, first=T)
    return IndexerProblem(q=q, weights=weights, k=k, k_fp8=k_fp8, k_block_stride=block_stride,
                          k_row_stride=row_stride, block_table=block_table, req_id_per_token=req_id_per_token,
                          positions=positions, T=T, Hi=Hi, block_size=bs, num_blocks=nb)


def _check_out(out, dtype, shape, device):
    if out is None:
        return
    dname = str(dtype).replace("torch.", "")
    if not isinstance(out, torch.Tensor) or out.dtype != dtype:
        _fail("out", f"a {dname} tensor [{shape[0]}, {shape[1]}]", out)
    if tuple(out.shape) != tuple(shape):
        _fail("out", f"shape [{shape[0]}, {shape[1]}]", out)
    if out.device != device:
        _fail("out", f"device {device} (the device of q)", out)


@dataclass(frozen=True)
class IndexerConfig:
    block_h: int  # heads padded to a power of two >= 16 (one dot per tile)
    block_k: int  # positions per tile (one dot)
    chunk_tiles: int  # tiles per logits program (q and weights loaded once per chunk)
    rows_per_program: int  # query rows sharing each K tile (prefill: rows of one request)
    num_warps: int
    num_stages: int
    use_fp8_dot: bool  # fp8 q and fp8 cache on a GPU with fp8 tensor cores: dot on e4m3 operands
    dot_bf16: bool  # dot operand type when not fp8: bf16 (q bf16) or fp16
    sw_fp8: bool  # integer e4m3 decode (no fp8 conversion instructions)
    select: str  # "split" (this package's multi-program select) or "torch" (torch.topk)
    split_chunk: int = 8192  # positions per program of the split select
    split_block: int = 1024  # positions per step of the split select (8 warps; H200, 64 rows x 128K: select 0.091
    # ms at 1024 vs 0.103 at 2048, benchmarks/select_profile.py)
    maxnreg: int | None = None  # register cap per thread for the logits kernel (None: ptxas decides)
    bound: bool = True  # split select: a bound pass first, so that the histogram counts only the candidates above it
    bound_min_chunks: int = 8  # ... on rows of at least this many split chunks (shorter: one launch fewer, measured
    # neutral on the GPU at 32K, where eager calls are bound by the host's launches)


SELECTS = ("split", "torch")


@functools.lru_cache(maxsize=1024)
def indexer_config_for(arch, *, hi: int, q_fp8: bool, k_fp8: bool, dot_bf16: bool,
                       shared_rows: bool = False) -> IndexerConfig:
    """The launch parameters on ``arch`` (a :class:`~triton_mla_sparse.capabilities.Arch`; None: Triton's
    interpreter) for ``hi`` index heads: a pure function, shared by the launch and the AOT compile matrix.
    ``shared_rows``: rows outnumber requests (prefill), so groups of rows share each K tile (N = rows · heads =
    128 of the dot)."""
    block_h = max(16, 1 << max(0, (hi - 1).bit_length()))
    rows = max(1, 128 // block_h) if shared_rows else 1  # N = rows · heads of the dot: 128 (sm90, interpreter)
    if arch is None:  # interpreter: small tiles and chunks so tests cover several of each
        return IndexerConfig(block_h=block_h, block_k=32, chunk_tiles=2, rows_per_program=rows, num_warps=4,
                             num_stages=1, use_fp8_dot=False, dot_bf16=dot_bf16, sw_fp8=False, select="split",
                             split_chunk=256, split_block=64, bound_min_chunks=2)
    fp8_dot = q_fp8 and k_fp8 and arch.fp8_hw and (arch.backend != "cuda" or int(arch.target) >= 89)
    if arch.name == "sm90":
        # one warpgroup (wgmma), 128-position tiles, 2 stages, 16 tiles per program: the fastest of the sweep on
        # the H200 (benchmarks/indexer_sweep.py; NOTES.md) for decode and prefill, 32 and 64 heads
        block_k, chunk_tiles, warps, stages = 128, 16, 4, 2
    else:
        # unmeasured: 64-position tiles, 8 warps, one row per program (the compile matrix: 128-position tiles
        # spill with row groups on sm80/sm100, 4 warps on sm120, row groups on sm80/sm89)
        block_k, chunk_tiles, warps, stages = 64, 32, 8, 3
        rows = 1
    # Selection, measured on the H200 (benchmarks/NOTES.md): for decode rows (one per request) the split select beat
    # torch.topk (64 rows x 32K: 0.059 vs 0.092-0.105 ms; x 128K with the bound pass and bins up to the row
    # maximum: 0.091 vs 0.147, benchmarks/select_profile.py); for prefill rows torch.topk won (4096 x 32K: 1.68 vs
    # 1.80 ms, before the bound pass). Unmeasured architectures keep torch.topk.
    select = "split" if arch.name == "sm90" and rows == 1 else "torch"
    return IndexerConfig(block_h=block_h, block_k=block_k, chunk_tiles=chunk_tiles, rows_per_program=rows,
                         num_warps=warps, num_stages=stages, use_fp8_dot=fp8_dot, dot_bf16=dot_bf16,
                         sw_fp8=(q_fp8 or k_fp8) and not arch.fp8_hw, select=select)


_CONFIGS: dict = {}  # choose_indexer_config's memo (a few entries: device x heads x formats x row kind)


def choose_indexer_config(p: IndexerProblem, **overrides) -> IndexerConfig:
    """Launch parameters for the indexer kernels (a pure function of the device and the problem's shape; memoised:
    it runs on every eager call)."""
    from .kernels.configs import interpreting

    shared_rows = p.T > p.block_table.shape[0]
    interpreter = interpreting()
    key = (p.device, p.Hi, p.q.dtype, p.k.dtype, p.k_fp8, shared_rows, interpreter)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        cfg = _CONFIGS[key] = _indexer_config(p, shared_rows, interpreter)
    if overrides:
        from dataclasses import replace

        cfg = replace(cfg, **overrides)
    return cfg


def _indexer_config(p: IndexerProblem, shared_rows: bool, interpreter: bool) -> IndexerConfig:
    dev = p.device
    dot_bf16 = p.q.dtype == torch.bfloat16 or (p.q_fp8 and not p.k_fp8 and p.k.dtype == torch.bfloat16)
    arch = None
    if dev.type == "cuda" and not interpreter:
        from .capabilities import arch_for_device, describe_device

        arch = arch_for_device(dev)
        if arch is None:
            raise ValueError(f"q: {describe_device(dev)} is not a declared architecture of triton_mla_sparse")
    return indexer_config_for(arch, hi=p.Hi, q_fp8=p.q_fp8, k_fp8=p.k_fp8, dot_bf16=dot_bf16,
                              shared_rows=shared_rows)


def _launch_logits(p: IndexerProblem, out: torch.Tensor, cfg: IndexerConfig, ws=None) -> None:
    from .kernels.indexer import launch_indexer_logits

    chunk = cfg.block_k * cfg.chunk_tiles
    if p.T * -(-out.shape[1] // chunk) > MAX_GRID:
        _fail("max_len", f"rows · ceil(max_len / {chunk}) <= {MAX_GRID} programs (split the rows)",
              f"{p.T} rows and max_len {out.shape[1]}")
    launch_indexer_logits(p, out, cfg, ws)


def indexer_logits(q, weights, k_cache, block_table, req_id_per_token, positions, max_len, *, out=None):
    """Indexer logits float32 ``[T, max_len]`` with the Triton kernel.

    Same arguments and result as :func:`triton_mla_sparse.reference.indexer_logits` (the contract): row t, column p
    holds ``Σ_h weights[t, h] · relu(<q[t, h], k[p]> · kscale[p])`` for request-local positions
    ``p <= positions[t]`` of request ``req_id_per_token[t]`` whose block is addressable, and -inf elsewhere.
    ``out=`` (float32 ``[T, max_len]``, any strides) receives the result when given. No host synchronisation.
    """
    p = check_indexer_inputs(q, weights, k_cache, block_table, req_id_per_token, positions)
    _check_int("max_len", max_len, 0, MAX_LEN)
    _check_out(out, torch.float32, (p.T, max_len), p.device)
    check_kernel_device(p.device)
    result = out if out is not None else torch.empty(p.T, max_len, dtype=torch.float32, device=p.device)
    if p.T and max_len:
        cfg = choose_indexer_config(p)
        with device_guard(p.device):
            _launch_logits(p, result, cfg)
    return result


def check_indexer_topk_inputs(q, weights, k_cache, block_table, req_id_per_token, positions, topk, max_len, out):
    """Validate the arguments of ``indexer_topk`` (shared with the reference); returns (problem, max_len)."""
    p = check_indexer_inputs(q, weights, k_cache, block_table, req_id_per_token, positions)
    _check_int("topk", topk, 1, MAX_LEN)
    if max_len is None:
        max_len = p.capacity
    _check_int("max_len", max_len, 0, MAX_LEN)
    _check_out(out, torch.int32, (p.T, topk), p.device)
    return p, max_len


def indexer_topk(q, weights, k_cache, block_table, req_id_per_token, positions, topk, *, max_len=None, out=None,
                 select=None):
    """Request-local positions int32 ``[T, topk]`` of each row's ``topk`` largest indexer logits (any order; -1
    padded when the row has fewer than ``topk`` candidates), with the Triton kernels.

    Same contract as :func:`triton_mla_sparse.reference.indexer_topk`. ``max_len`` bounds the positions considered
    (default: the block table's capacity, max_blocks · block_size); the logits kernel writes a float32
    ``[T, max_len]`` workspace, then a selection picks the positions without sorting: ``select="split"`` (this
    package's multi-program select: on long rows a counting bound and the row maximum, a histogram of the
    candidates at or above the bound (2048 bins up to the maximum; the top 11 key bits on short rows), then every
    program writes its positions above the threshold bin and the row's last program resolves the boundary bin by
    radix select; the default for decode rows on sm90, where it measured fastest, and under the interpreter),
    ``"torch"`` (``torch.topk``, a radix select; the default for prefill rows and other GPUs), or ``None`` = the
    configuration's choice. Shapes decide every allocation: no host synchronisation, CUDA-graph capturable. The
    result plugs into :func:`triton_mla_sparse.topk_to_slots`.
    """
    p, max_len = check_indexer_topk_inputs(q, weights, k_cache, block_table, req_id_per_token, positions, topk,
                                           max_len, out)
    if select is not None and select not in SELECTS:
        _fail("select", f"one of {SELECTS} or None", repr(select))
    check_kernel_device(p.device)
    result = out if out is not None else torch.empty(p.T, topk, dtype=torch.int32, device=p.device)
    if p.T:
        cfg = choose_indexer_config(p, **({"select": select} if select else {}))
        logits = torch.empty(p.T, max_len, dtype=torch.float32, device=p.device)
        from .kernels.indexer import WS_WIDTH, launch_split_select

        # the split select's workspace is zeroed by the logits launch (one launch fewer than a memset)
        ws = torch.empty(p.T, WS_WIDTH, dtype=torch.int32, device=p.device) if cfg.select == "split" and max_len \
            else None
        with device_guard(p.device):
            if max_len:
                _launch_logits(p, logits, cfg, ws)
            if cfg.select == "split":
                launch_split_select(logits, result, topk, cfg, ws)
            else:
                _torch_select(logits, result, topk)
    return result


def _torch_select(logits: torch.Tensor, out: torch.Tensor, topk: int) -> None:
    """``torch.topk`` over the logits with the contract's padding: -inf (not a candidate) and columns past
    ``max_len`` become -1."""
    k = min(topk, logits.shape[1])
    if k:
        vals, idx = torch.topk(logits, k, dim=1, sorted=False)
        out[:, :k] = idx.masked_fill_(vals == float("-inf"), -1)  # (three small launches after the top-k)
    if k < topk:
        out[:, k:] = -1

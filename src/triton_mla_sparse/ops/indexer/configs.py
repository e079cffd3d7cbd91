"""Launch parameters of the indexer's kernels: a pure function of the architecture and the problem's shape.

Shared by the launch (:func:`choose_indexer_config`, memoised per device and shape class) and the ahead-of-time
compile matrix (:func:`indexer_config_for`). The top-k select's parameters are the top-k operator's
(:class:`~triton_mla_sparse.ops.topk.SelectConfig`, which :class:`IndexerConfig` extends).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

from ..._common.runtime import interpreting
from ..topk import SELECTS, SelectConfig, select_config_for

if TYPE_CHECKING:
    from ...capabilities import Arch
    from .api import IndexerProblem

__all__ = ["SELECTS", "IndexerConfig", "choose_indexer_config", "indexer_config_for"]


@dataclass(frozen=True, kw_only=True)
class IndexerConfig(SelectConfig):
    """The logits kernel's launch parameters, and (inherited) the top-k select's that ``indexer_topk`` uses."""

    block_h: int  # heads padded to a power of two >= 16 (one dot per tile)
    block_k: int  # positions per tile (one dot)
    chunk_tiles: int  # tiles per logits program (q and weights loaded once per chunk)
    rows_per_program: int  # query rows sharing each K tile (prefill: rows of one request)
    num_warps: int
    num_stages: int
    use_fp8_dot: bool  # fp8 q and fp8 cache on a GPU with fp8 tensor cores: dot on e4m3 operands
    dot_bf16: bool  # dot operand type when not fp8: bf16 (q bf16) or fp16
    sw_fp8: bool  # integer e4m3 decode (no fp8 conversion instructions)
    maxnreg: int | None = None  # register cap per thread for the logits kernel (None: ptxas decides)


@functools.lru_cache(maxsize=1024)
def indexer_config_for(arch: Arch | None, *, hi: int, q_fp8: bool, k_fp8: bool, dot_bf16: bool,
                       shared_rows: bool = False) -> IndexerConfig:
    """The launch parameters on ``arch`` (a :class:`~triton_mla_sparse.capabilities.Arch`; None: Triton's
    interpreter) for ``hi`` index heads: a pure function, shared by the launch and the AOT compile matrix.
    ``shared_rows``: rows outnumber requests (prefill), so groups of rows share each K tile (N = rows · heads =
    128 of the dot)."""
    block_h = max(16, 1 << max(0, (hi - 1).bit_length()))
    rows = max(1, 128 // block_h) if shared_rows else 1  # N = rows · heads of the dot: 128 (sm90, interpreter)
    if arch is None:  # interpreter: small tiles and chunks so tests cover several of each
        return IndexerConfig(block_h=block_h, block_k=32, chunk_tiles=2, rows_per_program=rows, num_warps=4,
                             num_stages=1, use_fp8_dot=False, dot_bf16=dot_bf16, sw_fp8=False,
                             **asdict(select_config_for(None)))
    fp8_dot = q_fp8 and k_fp8 and arch.fp8_hw and (arch.backend != "cuda" or int(arch.target) >= 89)
    if arch.name == "sm90":
        # one warpgroup (wgmma), 128-position tiles, 2 stages, 16 tiles per program: the fastest of the sweep on
        # the H200 (benchmarks/scripts/indexer_sweep.py; NOTES.md) for decode and prefill, 32 and 64 heads
        block_k, chunk_tiles, warps, stages = 128, 16, 4, 2
    else:
        # unmeasured: 64-position tiles, 8 warps, one row per program (the compile matrix: 128-position tiles
        # spill with row groups on sm80/sm100, 4 warps on sm120, row groups on sm80/sm89)
        block_k, chunk_tiles, warps, stages = 64, 32, 8, 3
        rows = 1
    return IndexerConfig(block_h=block_h, block_k=block_k, chunk_tiles=chunk_tiles, rows_per_program=rows,
                         num_warps=warps, num_stages=stages, use_fp8_dot=fp8_dot, dot_bf16=dot_bf16,
                         sw_fp8=(q_fp8 or k_fp8) and not arch.fp8_hw,
                         **asdict(select_config_for(arch, shared_rows=rows > 1)))


_CONFIGS: dict = {}  # choose_indexer_config's memo (a few entries: device x heads x formats x row kind)


def choose_indexer_config(p: IndexerProblem, **overrides: object) -> IndexerConfig:
    """Launch parameters for the indexer kernels (a pure function of the device and the problem's shape; memoised:
    it runs on every eager call)."""
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
        from ...capabilities import arch_for_device, describe_device

        arch = arch_for_device(dev)
        if arch is None:
            raise ValueError(f"q: {describe_device(dev)} is not a declared architecture of triton_mla_sparse")
    return indexer_config_for(arch, hi=p.Hi, q_fp8=p.q_fp8, k_fp8=p.k_fp8, dot_bf16=dot_bf16,
                              shared_rows=shared_rows)

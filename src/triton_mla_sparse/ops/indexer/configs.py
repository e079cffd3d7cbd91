"""Launch parameters of the indexer's kernels: a pure function of the architecture and the problem's shape.

Shared by the launch (:func:`choose_indexer_config`, memoised per device and shape class) and the ahead-of-time
compile matrix (:func:`indexer_config_for`). The top-k select's parameters are the top-k operator's
(:class:`~triton_mla_sparse.ops.topk.SelectConfig`, which :class:`IndexerConfig` extends). Two logits kernels:
``family="tl"`` (kernels.py, every target) and ``"wgmma"`` (kernels_wgmma.py, Gluon: decode rows of e4m3 q over
vLLM's fp8 cache on sm90); :func:`wgmma_refusal` is the one rule saying whether the latter can take a problem.
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

__all__ = ["FAMILIES", "SELECTS", "IndexerConfig", "choose_indexer_config", "indexer_config_for",
           "wgmma_config_problem", "wgmma_refusal"]

FAMILIES = ("tl", "wgmma")
# The wgmma kernel's ring depth and chunk: 4 stages (3 blocks in flight per program, 5 programs per SM) of 16
# tiles (1024 positions per program), the fastest at 64 heads x 128K on the H200 (0.285 ms; 8 tiles 0.293, 32 tiles
# 0.291, 6 stages 0.323; at 32K 8 tiles measured 4 % faster: benchmarks/NOTES.md, session 7)
WGMMA_STAGES = 4
WGMMA_CHUNK_TILES = 16
WGMMA_BLOCK = 64  # the wgmma kernel's tile: one block of vLLM's indexer cache


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
    family: str = "tl"  # "tl": kernels.py; "wgmma": kernels_wgmma.py (block_k = the cache block, num_stages = its
    # ring of shared buffers, one row per program)


@functools.lru_cache(maxsize=1024)
def indexer_config_for(arch: Arch | None, *, hi: int, q_fp8: bool, k_fp8: bool, dot_bf16: bool,
                       shared_rows: bool = False, family: str | None = None) -> IndexerConfig:
    """The launch parameters on ``arch`` (a :class:`~triton_mla_sparse.capabilities.Arch`; None: Triton's
    interpreter) for ``hi`` index heads: a pure function, shared by the launch and the AOT compile matrix.
    ``shared_rows``: rows outnumber requests (prefill), so groups of rows share each K tile (N = rows · heads =
    128 of the dot). ``family``: None for the table's choice (the wgmma kernel for decode rows of fp8 q over the
    fp8 cache on sm90, the tl kernel everywhere else), or the kernel to configure (``"wgmma"`` raises
    ``ValueError`` where it cannot run: not sm90, not fp8 q and cache)."""
    if family not in (None, *FAMILIES):
        raise ValueError(f"family: expected one of {FAMILIES} or None, got {family!r}")
    block_h = max(16, 1 << max(0, (hi - 1).bit_length()))
    wgmma = arch is not None and arch.name == "sm90" and q_fp8 and k_fp8
    if family == "wgmma" and not wgmma:
        raise ValueError(f"family: the wgmma logits kernel needs sm90, e4m3 q and vLLM's fp8 indexer cache; got "
                         f"{arch.name if arch else 'the interpreter'}, q {'fp8' if q_fp8 else '16-bit'}, cache "
                         f"{'fp8' if k_fp8 else '16-bit'}")
    if family == "wgmma" or (family is None and wgmma and not shared_rows):
        # a forced wgmma kernel takes prefill rows one per program (no K tile shared between rows)
        return IndexerConfig(family="wgmma", block_h=block_h, block_k=WGMMA_BLOCK, chunk_tiles=WGMMA_CHUNK_TILES,
                             rows_per_program=1, num_warps=4, num_stages=WGMMA_STAGES, use_fp8_dot=True,
                             dot_bf16=dot_bf16, sw_fp8=False,
                             **asdict(select_config_for(arch, shared_rows=shared_rows)))
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


def wgmma_refusal(p: IndexerProblem, arch: Arch | None) -> str | None:
    """Why the wgmma logits kernel cannot take the problem ``p`` on ``arch`` (None: it can): it runs on sm90, not
    under the interpreter, and copies vLLM's fp8 cache one 64-token block at a time in 16-byte vectors (e4m3 q,
    128-byte rows, a 16-byte aligned start and block stride). The one rule behind the table's fallback, the
    ``family`` override and the launch."""
    if arch is None or arch.name != "sm90" or interpreting():
        where = "the interpreter" if interpreting() else arch.name if arch else "no GPU"
        return f"the wgmma logits kernel runs on sm90, got {where}"
    return _layout_refusal(p)


def _layout_refusal(p: IndexerProblem) -> str | None:
    """The problem-only part of :func:`wgmma_refusal` (the part the memo of :func:`choose_indexer_config` keys on)."""
    if not (p.q_fp8 and p.k_fp8):
        return "the wgmma logits kernel reads e4m3 q over vLLM's fp8 indexer cache"
    if p.block_size != WGMMA_BLOCK:
        return f"the wgmma logits kernel reads blocks of {WGMMA_BLOCK} tokens, got {p.block_size}"
    if p.k_row_stride != 128:
        return f"the wgmma logits kernel reads 128-byte rows, got a row stride of {p.k_row_stride}"
    if p.k.data_ptr() % 16 or p.k_block_stride % 16:
        return (f"the wgmma logits kernel copies 16-byte vectors: cache start {p.k.data_ptr() % 16} mod 16, block "
                f"stride {p.k_block_stride} bytes")
    return None


def wgmma_config_problem(cfg: IndexerConfig) -> str | None:
    """Why a wgmma configuration cannot be built as given (None when it can, and for the tl kernel): 64-position
    tiles, one row per program on 4 warps, 16 to 64 padded heads, 2 to 32 stages, at least one tile per chunk."""
    if cfg.family != "wgmma":
        return None
    if cfg.block_k != WGMMA_BLOCK or cfg.rows_per_program != 1 or cfg.num_warps != 4:
        return (f"block_k / rows_per_program / num_warps: the wgmma logits kernel runs {WGMMA_BLOCK} / 1 / 4, got "
                f"{cfg.block_k} / {cfg.rows_per_program} / {cfg.num_warps}")
    if cfg.block_h not in (16, 32, 64):
        return f"block_h: the wgmma logits kernel takes 16, 32 or 64, got {cfg.block_h}"
    if not 2 <= cfg.num_stages <= 32:
        return f"num_stages: the wgmma logits kernel takes 2 to 32, got {cfg.num_stages}"
    if cfg.chunk_tiles < 1:
        return f"chunk_tiles: at least 1, got {cfg.chunk_tiles}"
    return None


_CONFIGS: dict = {}  # choose_indexer_config's memo (a few entries: device x heads x formats x row kind x layout)


def choose_indexer_config(p: IndexerProblem, **overrides: object) -> IndexerConfig:
    """Launch parameters for the indexer kernels (a pure function of the device and the problem's shape; memoised:
    it runs on every eager call). The table's wgmma kernel gives way to the tl kernel's own entry where
    :func:`wgmma_refusal` refuses the problem. ``overrides`` replace fields; ``family="tl"`` / ``"wgmma"`` picks
    the kernel first (``"wgmma"`` on a problem it refuses, or with overrides it cannot take, raises ``ValueError``);
    without ``family``, overrides the table's wgmma kernel cannot take (:func:`wgmma_config_problem`) apply to the
    tl kernel's entry."""
    shared_rows = p.T > p.block_table.shape[0]
    interpreter = interpreting()
    layout_ok = _layout_refusal(p) is None
    key = (p.device, p.Hi, p.q.dtype, p.k.dtype, p.k_fp8, shared_rows, interpreter, layout_ok)
    hit = _CONFIGS.get(key)
    if hit is None:
        hit = _CONFIGS[key] = _indexer_config(p, shared_rows, interpreter, layout_ok)
    cfg, arch, dot_bf16 = hit
    if not overrides:
        return cfg
    from dataclasses import replace

    over = dict(overrides)
    family = over.pop("family", None)

    def table(fam: str | None) -> IndexerConfig:
        return indexer_config_for(arch, hi=p.Hi, q_fp8=p.q_fp8, k_fp8=p.k_fp8, dot_bf16=dot_bf16,
                                  shared_rows=shared_rows, family=fam)

    if family is not None and family != cfg.family:
        if family == "wgmma":
            reason = wgmma_refusal(p, arch)
            if reason is not None:
                raise ValueError(f"family: {reason}")
        cfg = table(family)
    out = replace(cfg, **over)
    problem = wgmma_config_problem(out)
    if problem is not None:
        if family is not None:
            raise ValueError(problem)
        # overrides meant for the tl kernel on a problem the table gives the wgmma kernel
        out = replace(table("tl"), **over)
    return out


def _indexer_config(p: IndexerProblem, shared_rows: bool, interpreter: bool,
                    layout_ok: bool) -> tuple[IndexerConfig, Arch | None, bool]:
    """(the table's configuration, the architecture, dot_bf16) of a memo key of :func:`choose_indexer_config`."""
    dot_bf16 = p.q.dtype == torch.bfloat16 or (p.q_fp8 and not p.k_fp8 and p.k.dtype == torch.bfloat16)
    arch = _device_arch(p.device, interpreter)
    cfg = indexer_config_for(arch, hi=p.Hi, q_fp8=p.q_fp8, k_fp8=p.k_fp8, dot_bf16=dot_bf16,
                             shared_rows=shared_rows)
    if cfg.family == "wgmma" and not layout_ok:  # a cache the wgmma kernel cannot copy: the tl kernel's entry
        cfg = indexer_config_for(arch, hi=p.Hi, q_fp8=p.q_fp8, k_fp8=p.k_fp8, dot_bf16=dot_bf16,
                                 shared_rows=shared_rows, family="tl")
    return cfg, arch, dot_bf16


def _device_arch(dev: torch.device, interpreter: bool) -> Arch | None:
    """The declared architecture of a CUDA device (None: the interpreter; ``ValueError`` for an undeclared GPU)."""
    if dev.type != "cuda" or interpreter:
        return None
    from ...capabilities import arch_for_device, describe_device

    arch = arch_for_device(dev)
    if arch is None:
        raise ValueError(f"q: {describe_device(dev)} is not a declared architecture of triton_mla_sparse")
    return arch

"""Ahead-of-time builds of the indexer's logits kernels for any target, on any machine (no GPU needed).

The operator's part of the compile matrix (:mod:`triton_mla_sparse.aot`): the logits kernel for each build the
matrix checks (:data:`INDEXER_BUILDS`), for decode and prefill rows, with the configuration the launch picks
(:func:`~.configs.indexer_config_for`: the Gluon wgmma kernel for sm90's fp8 decode rows, the tl kernel elsewhere),
and where the table picks the wgmma kernel also the tl kernel's configuration it falls back to. The top-k select's
kernels are the top-k operator's (:mod:`triton_mla_sparse.ops.topk.aot`). Importing this module imports triton.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._common.compile import compile_kernel, matrix_row
from .configs import IndexerConfig, indexer_config_for

if TYPE_CHECKING:
    from triton.compiler import CompiledKernel

    from ...capabilities import Arch

__all__ = ["INDEXER_BUILDS", "INDEXER_LOGITS_KERNELS", "compile_indexer_logits", "compile_rows", "matrix_entries"]

# The indexer builds the matrix checks: (heads, q format, k format). DeepSeek-V3.2 64 heads, GLM-5 32; fp8 is
# vLLM's layout, bf16 the 16-bit alternative; each for decode rows (one per request) and prefill rows (groups of
# rows of one request share each K tile).
INDEXER_BUILDS = ((64, "fp8", "fp8"), (32, "fp8", "fp8"), (64, "bf16", "bf16"))
INDEXER_LOGITS_KERNELS = ("indexer_logits_decode", "indexer_logits_prefill")
FALLBACK_KERNEL = "indexer_logits_decode_tl"  # the tl decode build where the table picks the wgmma kernel


def compile_indexer_logits(arch: Arch, cfg: IndexerConfig, *, q_fp8: bool, k_fp8: bool) -> CompiledKernel:
    """Compile the indexer logits kernel of ``cfg`` (an ``IndexerConfig``; ``cfg.family`` picks it) for ``arch``."""
    from . import kernels as K

    q_t = "*u8" if q_fp8 else ("*bf16" if cfg.dot_bf16 else "*fp16")
    k_t = "*u8" if k_fp8 else ("*bf16" if cfg.dot_bf16 else "*fp16")
    sig = {"q_ptr": q_t, "w_ptr": "*fp32", "k_ptr": k_t, "bt_ptr": "*i32", "req_ptr": "*i32", "pos_ptr": "*i32",
           "out_ptr": "*fp32", "ws_ptr": "*i32"}
    ints = ["stride_q_t", "stride_q_h", "stride_w_t", "stride_w_h", "stride_k_blk", "stride_k_row", "stride_bt_r",
            "stride_bt_c", "stride_req", "stride_pos", "stride_o_t", "stride_o_p", "stride_ws_t", "T", "Hi",
            "max_len", "block_size", "num_blocks", "R", "max_blocks", "n_chunks", "chunk", "ws_width"]
    sig.update({n: "i32" for n in ints})
    # worst case: the variant that also zeroes the split select's workspace (indexer_topk's)
    const = dict(Q_FP8=q_fp8, K_FP8=k_fp8, USE_FP8_DOT=cfg.use_fp8_dot, DOT_BF16=cfg.dot_bf16, SW_FP8=cfg.sw_fp8,
                 BLOCK_H=cfg.block_h, BLOCK_K=cfg.block_k, ROWS=cfg.rows_per_program, ZERO_WS=True)
    # as launched on contiguous tensors with 32 or 64 heads: unit strides of weights' heads, the block table's
    # columns, the row vectors and the logits' columns; the rest of the strides, Hi and block_size divisible by 16
    # (not the workspace's row stride: WS_WIDTH = 16408 is 8 mod 16)
    div = list(sig)[:8] + ["stride_q_t", "stride_q_h", "stride_w_t", "stride_k_blk", "stride_k_row", "stride_bt_r",
                           "stride_o_t", "Hi", "block_size"]
    ones = ("stride_w_h", "stride_bt_c", "stride_req", "stride_pos", "stride_o_p")
    if cfg.family == "wgmma":
        from . import kernels_wgmma as KW

        const = dict(BLOCK_H=cfg.block_h, STAGES=cfg.num_stages, ZERO_WS=True)
        return compile_kernel(KW._indexer_logits_wgmma, sig, const, div, arch, cfg.num_warps, 1, ones,
                              max_registers=cfg.maxnreg)
    return compile_kernel(K._indexer_logits_kernel, sig, const, div, arch, cfg.num_warps, cfg.num_stages, ones,
                          max_registers=cfg.maxnreg)


def _config(arch: Arch | None, hi: int, qf: str, kf: str, kernel: str) -> IndexerConfig:
    """The configuration the launch picks for a matrix entry (the fallback entry: the tl kernel's)."""
    return indexer_config_for(arch, hi=hi, q_fp8=qf == "fp8", k_fp8=kf == "fp8", dot_bf16=qf == "bf16",
                              shared_rows=kernel.endswith("prefill"),
                              family="tl" if kernel == FALLBACK_KERNEL else None)


def matrix_entries(arch: Arch | None = None) -> list[tuple[int, str, str, str]]:
    """Every (index heads, q format, k format, kernel) the compile matrix builds for the indexer on ``arch`` (None:
    the entries of every target, without the fallback builds)."""
    entries = [(hi, qf, kf, kernel) for hi, qf, kf in INDEXER_BUILDS for kernel in INDEXER_LOGITS_KERNELS]
    if arch is not None:
        entries += [(hi, qf, kf, FALLBACK_KERNEL) for hi, qf, kf in INDEXER_BUILDS
                    if _config(arch, hi, qf, kf, "indexer_logits_decode").family != "tl"]
    return entries


def compile_rows(arch: Arch) -> list[dict]:
    """The operator's rows of the compile matrix on ``arch``, in :func:`matrix_entries`' order."""
    rows = []
    for hi, qf, kf, kernel in matrix_entries(arch):
        cfg = _config(arch, hi, qf, kf, kernel)
        rows.append(matrix_row(arch, (hi, qf, kf, kernel), cfg,
                               lambda: compile_indexer_logits(arch, cfg, q_fp8=qf == "fp8", k_fp8=kf == "fp8")))
    return rows

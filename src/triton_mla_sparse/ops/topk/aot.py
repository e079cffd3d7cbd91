"""Ahead-of-time builds of the split select's kernels for any target, on any machine (no GPU needed).

The operator's part of the compile matrix (:mod:`triton_mla_sparse.aot`): the bound, histogram and select kernels
with the decode-row parameters of the target (:func:`~.configs.select_config_for`; the split select's chunking
where the target picks ``torch.topk``). Importing this module imports triton.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._common.compile import compile_kernel, matrix_row
from .configs import SelectConfig, select_config_for

if TYPE_CHECKING:
    from triton.compiler import CompiledKernel

    from ...capabilities import Arch

__all__ = ["SPLIT_SELECT_KERNELS", "compile_rows", "compile_split_select", "matrix_entries"]

SPLIT_SELECT_KERNELS = ("topk_split_bound", "topk_split_hist", "topk_split_select")  # compile_split_select's order


def compile_split_select(arch: Arch, cfg: SelectConfig) -> list[CompiledKernel]:
    """Compile the three kernels of the split top-k select (bound, histogram, then select) for ``arch``."""
    from . import split_select as S

    bound_sig = {"x_ptr": "*fp32", "ws_ptr": "*i32"}
    bound_sig.update({n: "i32" for n in ["stride_x_t", "stride_x_p", "stride_w_t", "L", "n_chunks"]})
    hist_sig = dict(bound_sig, topk="i32")
    sel_sig = {"x_ptr": "*fp32", "out_ptr": "*i32", "ws_ptr": "*i32", "buf_ptr": "*i32"}
    sel_sig.update({n: "i32" for n in ["stride_x_t", "stride_x_p", "stride_o_t", "stride_o_k", "stride_w_t",
                                       "stride_b_t", "L", "topk", "n_chunks"]})
    const = dict(CHUNK=cfg.split_chunk, BLOCK=cfg.split_block)
    warps = S.SPLIT_WARPS
    return [
        compile_kernel(S._topk_bound_kernel, bound_sig, dict(CHUNK=cfg.split_chunk, NB=S.NBINS, NREP=S.NREP),
                       ["x_ptr", "ws_ptr", "stride_x_t"], arch, warps, 1, ("stride_x_p",)),
        compile_kernel(S._topk_hist_kernel, hist_sig, dict(const, NB=S.NBINS, NREP=S.NREP),
                       ["x_ptr", "ws_ptr", "stride_x_t"], arch, warps, 1, ("stride_x_p",)),
        compile_kernel(S._topk_split_select_kernel, sel_sig, dict(const, TAIL=cfg.split_tail,
                                                                   ATOMIC=cfg.split_atomic, NB=S.NBINS,
                                                                   NREP=S.NREP),
                       ["x_ptr", "out_ptr", "ws_ptr", "buf_ptr", "stride_x_t", "stride_o_t", "stride_b_t"], arch,
                       warps, 1, ("stride_x_p", "stride_o_k")),
    ]


def matrix_entries() -> list[tuple[int, str, str, str]]:
    """The compile matrix's keys of the select's kernels: (0, "", "", kernel) (no heads, no formats)."""
    return [(0, "", "", kernel) for kernel in SPLIT_SELECT_KERNELS]


def compile_rows(arch: Arch) -> list[dict]:
    """The operator's rows of the compile matrix on ``arch`` (the three kernels, built once)."""
    cfg = select_config_for(arch)
    builds: list = []  # compile_split_select's kernels, built on the first row's call

    def build(i: int) -> CompiledKernel:
        if not builds:
            builds.extend(compile_split_select(arch, cfg))
        return builds[i]

    return [matrix_row(arch, key, cfg, lambda i=i: build(i)) for i, key in enumerate(matrix_entries())]

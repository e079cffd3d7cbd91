"""Ahead-of-time builds of the attention kernels for any target, on any machine (no GPU needed).

The operator's part of the compile matrix (:mod:`triton_mla_sparse.aot`): every (head class, cache class, kv format,
kernel) the launch table can pick (:func:`matrix_entries`), built with the configuration ``choose_config`` picks
(:func:`table_config`), and the split-merge kernel. Importing this module imports triton.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ..._common.compile import compile_kernel, matrix_row
from ...capabilities import ARCHS
from . import kernels as K
from .configs import GLUON_TABLE, TABLE, AttentionConfig, choose_config, extra_cache_supported, pdl_supported

if TYPE_CHECKING:
    from triton.compiler import CompiledKernel

    from ...capabilities import Arch

__all__ = ["MATRIX_FORMATS", "compile_attention", "compile_combine", "compile_rows", "matrix_entries",
           "table_config"]

_PTR_TYPES = {
    "q_nope_ptr": "q", "q_pe_ptr": "q", "kv_ptr": "kv", "idx_ptr": "*i32", "topk_len_ptr": "*i32",
    "sink_ptr": "*fp32", "k_scale_ptr": "*fp32", "out_ptr": "*fp32", "lse_ptr": "*fp32",
}
_INTS = ["stride_qn_t", "stride_qn_h", "stride_qp_t", "stride_qp_h", "stride_kv_blk", "stride_kv_row",
         "stride_idx_t", "stride_idx_k", "stride_tl", "stride_sink", "stride_o_t", "stride_o_s", "stride_o_h",
         "stride_l_t", "stride_l_s", "stride_l_h", "T", "H", "topk", "num_slots", "block_size", "num_splits",
         "split_len"]
# What a launch with real vLLM-shaped tensors specialises as divisible by 16 (pointers are 16-byte aligned).
_DIV16 = {"stride_qn_t", "stride_qn_h", "stride_qp_t", "stride_qp_h", "stride_kv_blk", "stride_kv_row",
          "stride_idx_t", "stride_o_t", "stride_o_s", "stride_o_h", "stride_l_t", "stride_l_s", "block_size"}

# The extra cache's arguments (DeepSeek-V4's second list; the tl kernel's).
_EXTRA_INTS = ["stride_kv2_blk", "stride_kv2_row", "stride_idx2_t", "stride_idx2_k", "stride_tl2", "topk2",
               "num_slots2", "block_size2"]
# (block_size2 is left out: vLLM's DeepSeek-V4 C128A compressed cache has 2 rows per page)
_DIV16_EXTRA = {"stride_kv2_blk", "stride_kv2_row", "stride_idx2_t"}

MATRIX_FORMATS = {"16bit": ("bf16",), "fp8_e4m3": ("fp8_e4m3",), "fp8_ds_mla": ("fp8_ds_mla",),
                  "fp8_ds_mla_v4": ("fp8_ds_mla_v4",)}


def compile_attention(arch: Arch, cfg: AttentionConfig, *, kv_format: str, split: bool, q_dtype: str = "bf16",
                      has_rope: bool = True, extra: bool = False) -> CompiledKernel:
    """Compile the attention kernel of ``cfg`` for ``arch`` (worst-case flags: topk_length and sink on; ``extra``:
    with an extra cache and its lengths; ``fp8_ds_mla_v4`` is built without a RoPE part, as it runs)."""
    fmt = K._FMT_CODES[kv_format]
    has_rope = has_rope and fmt != K.FMT_FP8_V4
    kv_type = "*u8" if fmt != K.FMT_NATIVE else f"*{'fp16' if kv_format == 'fp16' else 'bf16'}"
    sig = {n: (f"*{q_dtype}" if t == "q" else kv_type if t == "kv" else t) for n, t in _PTR_TYPES.items()}
    sig.update({n: "i32" for n in _INTS})
    sig.update(sm_scale_log2="fp32", k_scale="fp32")
    sig.update(kv2_ptr=kv_type, idx2_ptr="*i32", topk_len2_ptr="*i32", **{n: "i32" for n in _EXTRA_INTS})
    divisible = list(_PTR_TYPES) + ["kv2_ptr", "idx2_ptr", "topk_len2_ptr"] + sorted(_DIV16 | _DIV16_EXTRA)
    if cfg.family != "tl":
        if cfg.family == "wgmma":
            from .kernels_wgmma import _sparse_mla_fwd_wgmma as fn
        elif cfg.family == "wgmma_t":
            from .kernels_wgmma_t import _sparse_mla_fwd_wgmma_t as fn
        elif cfg.family == "wgmma_ws":
            from .kernels_wgmma_ws import _sparse_mla_fwd_wgmma_ws as fn
        elif cfg.dsplit and not extra:
            from .kernels_mma2d import _sparse_mla_fwd_mma2d as fn
        else:
            from .kernels_mma2 import _sparse_mla_fwd_mma2 as fn

        const = dict(FMT=fmt, HAS_ROPE=has_rope, HAS_TOPK_LEN=True, HAS_SINK=True, SPLIT=split, BLOCK_H=cfg.block_h,
                     BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, SW_FP8=cfg.sw_fp8,
                     F16_DOT=cfg.f16_dot and fmt == K.FMT_FP8_DS_MLA, PDL=cfg.pdl and split and not cfg.merge,
                     HAS_EXTRA=extra, HAS_TOPK_LEN2=extra)
        warps, regs = cfg.num_warps, cfg.max_registers
        if cfg.family == "wgmma_t":
            const["OVERLAP"] = cfg.overlap and fmt in (K.FMT_FP8_DS_MLA, K.FMT_FP8_V4)
            const["MERGE"] = cfg.merge and split
            sig.update(fin_out_ptr=f"*{q_dtype}", fin_lse_ptr="*fp32", cnt_ptr="*i32",
                       **{n: "i32" for n in ("stride_fo_t", "stride_fo_h", "stride_fl_t", "stride_fl_h")})
            divisible += ["fin_out_ptr", "fin_lse_ptr", "cnt_ptr", "stride_fo_t", "stride_fo_h"]
        if cfg.family == "wgmma_ws":
            ws_const, warps, regs = K.ws_build(cfg)
            const.update(ws_const)
        return compile_kernel(fn, sig, const, divisible, arch, warps, 1,
                              ones=("stride_idx_k", "stride_idx2_k"), max_registers=regs)
    const = dict(FMT=fmt, CONVERT=fmt == K.FMT_NATIVE and kv_type != f"*{q_dtype}", HAS_ROPE=has_rope,
                 HAS_TOPK_LEN=True, HAS_SINK=True, K_SCALE_PTR=False, SPLIT=split, BLOCK_H=cfg.block_h,
                 BLOCK_N=cfg.block_n, SW_FP8=cfg.sw_fp8, F16_DOT=cfg.f16_dot and fmt == K.FMT_FP8_DS_MLA,
                 LOW_REG=cfg.low_reg, PDL=cfg.pdl and split, HAS_EXTRA=extra, HAS_TOPK_LEN2=extra)
    return compile_kernel(K._sparse_mla_fwd_kernel, sig, const, divisible, arch, cfg.num_warps, cfg.num_stages,
                          ones=("stride_idx_k", "stride_idx2_k"),
                          max_registers=cfg.max_registers)


def compile_combine(arch: Arch, cfg: AttentionConfig, q_dtype: str = "bf16") -> CompiledKernel:
    """Compile the split-merge kernel of ``cfg`` for ``arch``."""
    sig = {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": f"*{q_dtype}",
           "lse_ptr": "*fp32"}
    ints = ["stride_po_t", "stride_po_s", "stride_po_h", "stride_pl_t", "stride_pl_s", "stride_pl_h",
            "stride_o_t", "stride_o_h", "stride_l_t", "stride_l_h", "stride_sink", "H", "num_splits"]
    sig.update({n: "i32" for n in ints})
    const = dict(HAS_SINK=True, BLOCK_H=cfg.combine_block_h, PDL=cfg.pdl)
    return compile_kernel(K._combine_kernel, sig, const, list(sig)[:5], arch, cfg.combine_warps, 1)


def matrix_entries(arch_name: str) -> list[tuple[int, str, str, str]]:
    """Every (head class, cache class, kv format, kernel) the launch table can pick on ``arch_name``; kernels
    ``"decode-extra"`` / ``"prefill-extra"``: built with an extra cache, where the API takes one; ``"-extra-tl"``:
    the tl kernel with one where the table's choice is a Gluon kernel (what runs when a cache is not one the Gluon
    kernels read: rows off 16 bytes, converted rows, fp16 q with fp8 pages)."""
    arch = ARCHS[arch_name]
    extra = extra_cache_supported(arch)
    out = []
    for (hc, cc) in TABLE[arch_name]:
        kernels = ["decode", "prefill"]
        if extra:
            kernels += ["decode-extra", "prefill-extra"]
            if (hc, cc) in GLUON_TABLE.get(arch_name, {}):  # (the table itself: the interpreter picks tl always)
                kernels += ["decode-extra-tl", "prefill-extra-tl"]
        out += [(hc, cc, fmt, kernel) for fmt in MATRIX_FORMATS[cc] for kernel in kernels]
    return out


def table_config(arch: Arch, hc: int, cc: str, kernel: str) -> AttentionConfig:
    """The config ``choose_config`` picks on ``arch`` for a head class and cache class (``hc`` heads; split sizes
    are irrelevant to compilation); an ``-extra`` kernel is the same kernel, built with an extra cache; an
    ``-extra-tl`` kernel the tl kernel's configuration for the classes."""
    base = kernel.partition("-")[0]
    return choose_config(1, hc, 2048, torch.device("cpu"), base, kv_format=MATRIX_FORMATS[cc][0], arch=arch,
                         **({"family": "tl"} if kernel.endswith("-tl") else {}))


def compile_rows(arch: Arch) -> list[dict]:
    """The operator's rows of the compile matrix on ``arch``: every table entry, then the combine kernel (key
    ``(0, "", "", "combine")``)."""
    rows = []
    for hc, cc, fmt, kernel in matrix_entries(arch.name):
        cfg = table_config(arch, hc, cc, kernel)
        rows.append(matrix_row(arch, (hc, cc, fmt, kernel), cfg,
                               lambda: compile_attention(arch, cfg, kv_format=fmt, split=kernel.startswith("decode"),
                                                         extra="-extra" in kernel)))
    # the combine kernel as a programmatic dependent launch where the target has it (a table entry may ask for it)
    cfg = replace(table_config(arch, 16, "16bit", "decode"), pdl=pdl_supported(arch))
    rows.append(matrix_row(arch, (0, "", "", "combine"), cfg, lambda: compile_combine(arch, cfg)))
    return rows

"""Ahead-of-time compilation of the kernels for any target, on any machine (no GPU needed).

The one cross-operator tool: it builds every operator's kernels. Used by the compile-matrix test and by
``triton-mla-sparse info``: compiles a kernel configuration for a
``GPUTarget`` with the same specialisation a real launch gets (16-byte aligned pointers, strides divisible by 16,
unit index stride) and reports shared memory, registers and spills read from the binary.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ..ops.sparse_mla import kernels as A
from ..ops.sparse_mla.configs import AttentionConfig

if TYPE_CHECKING:
    from triton.compiler import CompiledKernel

    from ..capabilities import Arch
    from ..ops.indexer.configs import IndexerConfig
    from ..ops.topk.split_select import SplitSelectConfig

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


@dataclass(frozen=True)
class CompileReport:
    target: str
    shared_bytes: int
    registers: int | None  # NVIDIA only
    stack_bytes: int | None  # NVIDIA: stack frame (register spills land here)
    local_bytes: int | None
    traps: int = 0  # trap instructions in the assembly: a build the compiler gave up on compiles to a trap

    @property
    def spills(self) -> bool:
        return bool(self.stack_bytes) or bool(self.local_bytes)


def target_for(arch: Arch) -> GPUTarget:
    """The ``GPUTarget`` of a :class:`~triton_mla_sparse.capabilities.Arch`."""
    return GPUTarget(arch.backend, arch.target, arch.warp_size)


def _compile(fn, sig: dict, const: dict, divisible, arch, num_warps: int, num_stages: int, ones=()):
    """``triton.compile`` of ``fn`` with ``sig`` (name -> type), constexprs ``const``, and what a real launch
    specialises: the names in ``divisible`` as divisible by 16, those in ``ones`` as the constant 1 (Triton turns an
    int argument equal to 1 into a constexpr)."""
    names = list(sig) + list(const)
    full = dict(sig, **{k: "constexpr" for k in const}, **{k: "constexpr" for k in ones})
    consts = {(names.index(k),): v for k, v in const.items()}
    consts.update({(names.index(k),): 1 for k in ones})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(fn=fn, signature=full, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=target_for(arch), options=dict(num_warps=num_warps, num_stages=num_stages))


def compile_attention(arch: Arch, cfg: AttentionConfig, *, kv_format: str, split: bool, q_dtype: str = "bf16",
                      has_rope: bool = True) -> CompiledKernel:
    """Compile the attention kernel of ``cfg`` for ``arch`` (worst-case flags: topk_length and sink on)."""
    fmt = A._FMT_CODES[kv_format]
    kv_type = "*u8" if fmt != A.FMT_NATIVE else f"*{'fp16' if kv_format == 'fp16' else 'bf16'}"
    sig = {n: (f"*{q_dtype}" if t == "q" else kv_type if t == "kv" else t) for n, t in _PTR_TYPES.items()}
    sig.update({n: "i32" for n in _INTS})
    sig.update(sm_scale_log2="fp32", k_scale="fp32")
    const = dict(FMT=fmt, CONVERT=fmt == A.FMT_NATIVE and kv_type != f"*{q_dtype}", HAS_ROPE=has_rope,
                 HAS_TOPK_LEN=True, HAS_SINK=True, K_SCALE_PTR=False, SPLIT=split, BLOCK_H=cfg.block_h,
                 BLOCK_N=cfg.block_n, SW_FP8=cfg.sw_fp8)
    return _compile(A._sparse_mla_fwd_kernel, sig, const, list(_PTR_TYPES) + sorted(_DIV16), arch, cfg.num_warps,
                    cfg.num_stages, ones=("stride_idx_k",))


def compile_combine(arch: Arch, cfg: AttentionConfig, q_dtype: str = "bf16") -> CompiledKernel:
    """Compile the split-merge kernel of ``cfg`` for ``arch``."""
    sig = {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": f"*{q_dtype}",
           "lse_ptr": "*fp32"}
    ints = ["stride_po_t", "stride_po_s", "stride_po_h", "stride_pl_t", "stride_pl_s", "stride_pl_h",
            "stride_o_t", "stride_o_h", "stride_l_t", "stride_l_h", "stride_sink", "H", "num_splits"]
    sig.update({n: "i32" for n in ints})
    const = dict(HAS_SINK=True, BLOCK_H=cfg.combine_block_h)
    return _compile(A._combine_kernel, sig, const, list(sig)[:5], arch, cfg.combine_warps, 1)


def compile_indexer_logits(arch: Arch, cfg: IndexerConfig, *, q_fp8: bool, k_fp8: bool) -> CompiledKernel:
    """Compile the indexer logits kernel of ``cfg`` (an ``IndexerConfig``) for ``arch``."""
    from ..ops.indexer import kernels as I

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
    return _compile(I._indexer_logits_kernel, sig, const, div, arch, cfg.num_warps, cfg.num_stages, ones)


def compile_split_select(arch: Arch, cfg: SplitSelectConfig) -> list[CompiledKernel]:
    """Compile the three kernels of the split top-k select (bound, histogram, then select) for ``arch``."""
    from ..ops.topk import split_select as S

    bound_sig = {"x_ptr": "*fp32", "ws_ptr": "*i32"}
    bound_sig.update({n: "i32" for n in ["stride_x_t", "stride_x_p", "stride_w_t", "L", "n_chunks"]})
    hist_sig = dict(bound_sig, topk="i32")
    sel_sig = {"x_ptr": "*fp32", "out_ptr": "*i32", "ws_ptr": "*i32", "buf_ptr": "*i32"}
    sel_sig.update({n: "i32" for n in ["stride_x_t", "stride_x_p", "stride_o_t", "stride_o_k", "stride_w_t",
                                       "stride_b_t", "L", "topk", "n_chunks"]})
    const = dict(CHUNK=cfg.split_chunk, BLOCK=cfg.split_block)
    return [
        _compile(S._topk_bound_kernel, bound_sig, dict(CHUNK=cfg.split_chunk, NB=S.NBINS, NREP=S.NREP),
                 ["x_ptr", "ws_ptr", "stride_x_t"], arch, 8, 1, ("stride_x_p",)),
        _compile(S._topk_hist_kernel, hist_sig, dict(const, NB=S.NBINS, NREP=S.NREP), ["x_ptr", "ws_ptr", "stride_x_t"],
                 arch, 8, 1, ("stride_x_p",)),
        _compile(S._topk_split_select_kernel, sel_sig, dict(const, NB=S.NBINS, NREP=S.NREP),
                 ["x_ptr", "out_ptr", "ws_ptr", "buf_ptr", "stride_x_t", "stride_o_t", "stride_b_t"], arch,
                 8, 1, ("stride_x_p", "stride_o_k")),
    ]


# The indexer builds the matrix checks: (heads, q format, k format). DeepSeek-V3.2 64 heads, GLM-5 32; fp8 is
# vLLM's layout, bf16 the 16-bit alternative; each for decode rows (one per request) and prefill rows (groups of
# rows of one request share each K tile).
INDEXER_BUILDS = ((64, "fp8", "fp8"), (32, "fp8", "fp8"), (64, "bf16", "bf16"))
INDEXER_LOGITS_KERNELS = ("indexer_logits_decode", "indexer_logits_prefill")


SPLIT_SELECT_KERNELS = ("topk_split_bound", "topk_split_hist", "topk_split_select")  # compile_split_select's order


def indexer_matrix_entries() -> list[tuple[int, str, str, str]]:
    """Every (index heads, q format, k format, kernel) the compile matrix builds for the indexer and the split
    select (heads 0 and no formats for the select's kernels)."""
    return [(hi, qf, kf, kernel) for hi, qf, kf in INDEXER_BUILDS for kernel in INDEXER_LOGITS_KERNELS] + \
        [(0, "", "", kernel) for kernel in SPLIT_SELECT_KERNELS]


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def report(arch: Arch, compiled: CompiledKernel) -> CompileReport:
    """Shared memory from Triton's metadata; registers, stack frame and local memory from the cubin."""
    shared = int(compiled.metadata.shared)
    traps = count_traps(arch, compiled)
    if arch.backend != "cuda":
        return CompileReport(arch.name, shared, None, None, None, traps)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
        path = f.name
    try:
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", path], capture_output=True, text=True,
                             check=True).stdout
    finally:
        os.unlink(path)
    fields = {}  # the largest value over the cubin's functions (one per kernel today)
    for key, val in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", out):
        fields[key] = max(int(val), fields.get(key, 0))
    return CompileReport(arch.name, shared, int(fields["REG"]), int(fields["STACK"]), int(fields["LOCAL"]), traps)


def count_traps(arch: Arch, compiled: CompiledKernel) -> int:
    """Trap instructions in the build's assembly (PTX ``trap;``, AMDGCN ``s_trap``). None of our kernels asks for
    one; Triton emits a bare trap as the whole kernel body when it cannot lay a kernel out on the target (seen: the
    64-head attention block on sm100 with triton 3.9, whose accumulators need more than the 512 tensor-memory
    columns) — such a build compiles, fits and does not spill, and would stop the GPU at its first launch."""
    if arch.backend == "cuda":
        return len(re.findall(r"^\s*(?:@!?%p\d+\s+)?trap;", compiled.asm["ptx"], flags=re.M))
    return len(re.findall(r"^\s*s_trap\b", compiled.asm.get("amdgcn", ""), flags=re.M))


MATRIX_FORMATS = {"16bit": ("bf16",), "fp8_e4m3": ("fp8_e4m3",), "fp8_ds_mla": ("fp8_ds_mla",)}


def matrix_entries(arch_name: str) -> list[tuple[int, str, str, str]]:
    """Every (head class, cache class, kv format, kernel) the launch table can pick on ``arch_name``."""
    from ..ops.sparse_mla.configs import TABLE

    return [(hc, cc, fmt, kernel) for (hc, cc) in TABLE[arch_name] for fmt in MATRIX_FORMATS[cc]
            for kernel in ("decode", "prefill")]


def table_config(arch: Arch, hc: int, cc: str, kernel: str) -> AttentionConfig:
    """The config ``choose_config`` picks on ``arch`` for a head class and cache class (``hc`` heads; split sizes
    are irrelevant to compilation)."""
    import torch

    from ..ops.sparse_mla.configs import choose_config

    return choose_config(1, hc, 2048, torch.device("cpu"), kernel, kv_format=MATRIX_FORMATS[cc][0], arch=arch)


def compile_matrix(arch_name: str) -> list[dict]:
    """Compile every table entry (and the combine kernel) for one target; one dict per build."""
    from ..capabilities import ARCHS

    arch = ARCHS[arch_name]
    out = []
    for hc, cc, fmt, kernel in matrix_entries(arch_name):
        cfg = table_config(arch, hc, cc, kernel)
        item = dict(arch=arch_name, hc=hc, cc=cc, fmt=fmt, kernel=kernel, config=repr(cfg))
        try:
            item.update(vars(report(arch, compile_attention(arch, cfg, kv_format=fmt, split=kernel == "decode"))))
        except Exception as e:  # noqa: BLE001 - a failed build is a result of the matrix
            item["error"] = f"{type(e).__name__}: {e}"
        out.append(item)
    cfg = table_config(arch, 16, "16bit", "decode")
    item = dict(arch=arch_name, hc=0, cc="", fmt="", kernel="combine", config=repr(cfg))
    try:
        item.update(vars(report(arch, compile_combine(arch, cfg))))
    except Exception as e:  # noqa: BLE001
        item["error"] = f"{type(e).__name__}: {e}"
    out.append(item)
    from ..ops.indexer.configs import indexer_config_for

    split_builds = None  # the split select's kernels, compiled once for their three entries
    for hi, qf, kf, kernel in indexer_matrix_entries():
        icfg = indexer_config_for(arch, hi=hi or 64, q_fp8=qf == "fp8", k_fp8=kf == "fp8", dot_bf16=qf == "bf16",
                                  shared_rows=kernel.endswith("prefill"))
        item = dict(arch=arch_name, hc=hi, cc=qf, fmt=kf, kernel=kernel, config=repr(icfg))
        try:
            if kernel in SPLIT_SELECT_KERNELS:
                split_builds = split_builds or compile_split_select(arch, icfg)
                built = split_builds[SPLIT_SELECT_KERNELS.index(kernel)]
            else:
                built = compile_indexer_logits(arch, icfg, q_fp8=qf == "fp8", k_fp8=kf == "fp8")
            item.update(vars(report(arch, built)))
        except Exception as e:  # noqa: BLE001
            item["error"] = f"{type(e).__name__}: {e}"
        out.append(item)
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m triton_mla_sparse._common.aot ARCH``: the compile matrix of one target as JSON lines."""
    import json
    import sys

    for row in compile_matrix((sys.argv[1:] if argv is None else argv)[0]):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""Launch configurations: block sizes, warps, stages and split counts, fixed per architecture and problem shape.

No autotuning at call time (it would re-benchmark inside a CUDA-graph capture): every choice is a pure function
of the architecture family, the problem's shape and the device's multiprocessor count. :data:`TABLE` holds one
entry per (architecture, head class, cache class) for the tl kernel (kernels.py), :data:`GLUON_TABLE` the entries
where a Gluon kernel (kernels_mma2.py, kernels_wgmma.py, kernels_wgmma_t.py, kernels_wgmma_ws.py) runs instead (an
entry may name another entry for the prefill kernel: :attr:`Launch.prefill`); the compile-matrix test builds every entry
choose_config can pick for its target and checks shared memory against the architecture's budget and (NVIDIA) that
ptxas reports no spills.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from ..._common.runtime import interpreting, multiprocessor_count

if TYPE_CHECKING:
    from ...capabilities import Arch

KERNELS = ("auto", "decode", "prefill")


@dataclass(frozen=True)
class Launch:
    """One table entry: what a program of this class is built with."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int  # resident programs per multiprocessor (sizes the decode split count)
    prefill_stages: int | None = None  # num_stages of the prefill kernel when it differs from the decode kernel's
    prefill_block_n: int | None = None  # block_n of the prefill kernel when it differs from the decode kernel's
    # fp8_ds_mla: float16 dots with the tile scales outside the dots (tl: kernels.py's module docstring; Gluon: values
    # over each chunk's tile scale, kernels_mma2.py); off, Gluon kernels dot bf16 tiles of exact values
    f16_dot: bool = False
    low_reg: bool = False  # q and the cache chunks loaded where each dot needs them, not held across the step
    family: str = "tl"  # "tl": kernels.py; "mma2" / "wgmma" / "wgmma_t" / "wgmma_ws": kernels_mma2.py /
    # kernels_wgmma.py / kernels_wgmma_t.py / kernels_wgmma_ws.py (num_stages = their STAGES: tiles in flight + 1;
    # wgmma_ws: its bf16 tile buffers)
    max_registers: int | None = None  # NVIDIA: ptxas's per-thread register cap (maxnreg), to fit more programs per SM
    overlap: bool = False  # wgmma_t with fp8_ds_mla / V4 pages: dequantise the next tile during this one's output MMAs
    max_waves: int = 2  # decode splits fill at most this many waves of resident programs (1: each SM's one program
    # streams its split without a second wave behind it)
    min_split_len: int = 1  # the table's decode split count is at most list length // this (splits of about this
    # many entries or more; a num_splits override is taken as given)
    prefill: Launch | None = None  # the prefill kernel's entry where another kernel family is faster there
    pdl: bool = False  # decode: the combine kernel as a programmatic dependent launch (where the target has it)
    merge: bool = False  # wgmma_t decode of 2..MERGE_SPLITS splits: the row's last split merges, no combine kernel
    dsplit: bool = False  # mma2 on bf16/fp16 caches: the scores' dims split over the warps (kernels_mma2d.py)


HEAD_CLASSES = (16, 32, 64)  # the head block a problem asks for: H <= 16, H <= 32, H > 32
CACHE_CLASSES = ("16bit", "fp8_e4m3", "fp8_ds_mla", "fp8_ds_mla_v4")  # bf16/fp16 rows; the two fp8 row formats;
# DeepSeek-V4's fp8 pages (where v4_supported holds)

# Measured on the H200 (benchmarks/NOTES.md) for sm90; elsewhere the fastest-by-construction entry that the
# compile matrix shows to fit the architecture's shared memory without spills (no hardware to time it on).
_L = Launch
TABLE: dict[str, dict[tuple[int, str], Launch]] = {
    "sm90": {
        (16, "fp8_e4m3"): _L(16, 32, 8, 2, 1),
        (32, "fp8_e4m3"): _L(32, 32, 8, 2, 1),
        (64, "fp8_e4m3"): _L(32, 32, 8, 2, 1),
        # prefill at 16 heads, bf16: 3 stages, 2.17 ms vs 2.35 with 2 (4096 rows x 32K, benchmarks/NOTES.md)
        (16, "16bit"): _L(16, 64, 4, 2, 2, prefill_stages=3),
        (32, "16bit"): _L(32, 64, 8, 2, 1),
        # More than 32 heads: two or more 32-head blocks per row. A 64-head block (bh64 bn64 w8) is faster but
        # spills on sm90 (255 registers + 360 B of stack bf16, 440 B fp8_ds_mla), which the compile matrix forbids.
        # The spill-free entries cost some speed against it (measured on the H200, benchmarks/NOTES.md).
        # The 64-head block stays reachable on sm90 with the overrides block_h=64, block_n=64.
        (64, "16bit"): _L(32, 128, 8, 2, 1),
        (16, "fp8_ds_mla"): _L(16, 32, 4, 2, 2),
        (32, "fp8_ds_mla"): _L(32, 64, 8, 2, 1),
        (64, "fp8_ds_mla"): _L(32, 64, 8, 2, 1),
    },
    "sm100": {
        # 32-head blocks for more than 32 heads, as on sm90: a 64-head block's five accumulators need 576 of the
        # 512 tensor-memory columns, and Triton then compiles the kernel to a bare trap (the compile matrix checks)
        (16, "fp8_e4m3"): _L(16, 32, 8, 2, 1),
        (32, "fp8_e4m3"): _L(32, 32, 8, 2, 1),
        (64, "fp8_e4m3"): _L(32, 32, 8, 2, 1),
        (16, "16bit"): _L(16, 64, 4, 2, 2),
        (32, "16bit"): _L(32, 64, 8, 2, 1),
        (64, "16bit"): _L(32, 128, 8, 2, 1),
        (16, "fp8_ds_mla"): _L(16, 32, 4, 2, 2),
        (32, "fp8_ds_mla"): _L(32, 64, 8, 2, 1),
        (64, "fp8_ds_mla"): _L(32, 64, 8, 2, 1),
    },
    "sm80": {
        (16, "fp8_e4m3"): _L(16, 32, 4, 2, 2),
        (32, "fp8_e4m3"): _L(32, 32, 8, 2, 1),
        (64, "fp8_e4m3"): _L(32, 32, 8, 2, 1),
        (16, "16bit"): _L(16, 64, 4, 2, 1),
        (32, "16bit"): _L(32, 64, 8, 2, 1),
        (64, "16bit"): _L(64, 32, 8, 2, 1),
        (16, "fp8_ds_mla"): _L(16, 32, 4, 2, 2),
        (32, "fp8_ds_mla"): _L(32, 32, 8, 2, 1),
        (64, "fp8_ds_mla"): _L(32, 32, 8, 2, 1),
    },
    # ~99 KB of shared memory: one program per SM at these tile sizes.
    "sm86": {
        (16, "fp8_e4m3"): _L(16, 32, 8, 2, 1),
        (32, "fp8_e4m3"): _L(32, 32, 8, 2, 1),
        (64, "fp8_e4m3"): _L(32, 32, 8, 2, 1),
        (16, "16bit"): _L(16, 64, 4, 2, 1),
        (32, "16bit"): _L(32, 32, 8, 2, 1),
        (64, "16bit"): _L(64, 16, 8, 2, 1),
        (16, "fp8_ds_mla"): _L(16, 32, 4, 2, 1),
        (32, "fp8_ds_mla"): _L(32, 32, 8, 2, 1),
        (64, "fp8_ds_mla"): _L(32, 32, 8, 2, 1),
    },
    # CDNA (wave64, 512 VGPRs with the accumulation registers): 16-head blocks; every larger block or tile the compile
    # matrix tried spills registers. Unmeasured (no AMD GPU).
    "gfx942": {
        (16, "fp8_e4m3"): _L(16, 16, 4, 2, 1),
        (32, "fp8_e4m3"): _L(16, 16, 4, 2, 1),
        (64, "fp8_e4m3"): _L(16, 16, 4, 2, 1),
        (16, "16bit"): _L(16, 32, 4, 2, 1),
        (32, "16bit"): _L(16, 32, 4, 2, 1),
        (64, "16bit"): _L(16, 32, 4, 2, 1),
        (16, "fp8_ds_mla"): _L(16, 16, 4, 1, 1),
        (32, "fp8_ds_mla"): _L(16, 16, 4, 1, 1),
        (64, "fp8_ds_mla"): _L(16, 16, 4, 1, 1),
    },
    "gfx950": {  # native e4m3 conversions: fewer registers for the fp8 decode
        (16, "fp8_e4m3"): _L(16, 32, 4, 1, 1),
        (32, "fp8_e4m3"): _L(16, 32, 4, 1, 1),
        (64, "fp8_e4m3"): _L(16, 32, 4, 1, 1),
        (16, "16bit"): _L(16, 32, 4, 1, 1),
        (32, "16bit"): _L(16, 32, 4, 1, 1),
        (64, "16bit"): _L(16, 32, 4, 1, 1),
        (16, "fp8_ds_mla"): _L(16, 32, 4, 1, 1),
        (32, "fp8_ds_mla"): _L(16, 32, 4, 1, 1),
        (64, "fp8_ds_mla"): _L(16, 32, 4, 1, 1),
    },
    # RDNA (wave32, 64 KB of LDS, 256 VGPRs, no accumulation registers): the low-register variant (q and each cache
    # chunk loaded where its dot needs it, scores in 64-column parts) with 16-head blocks of 16-row tiles is the first
    # configuration the compile matrix found without spills (gfx1100 bf16 204 VGPRs, fp8_e4m3 244; fp8_ds_mla only
    # with float16 dots and 16 warps, 252; gfx12 138 / 139 / 228). Unmeasured (no RDNA GPU).
    "gfx1100": {(hc, cc): _L(16, 16, 16 if cc == "fp8_ds_mla" else 8, 1, 1, low_reg=True,
                             f16_dot=cc == "fp8_ds_mla")
                for hc in (16, 32, 64) for cc in ("16bit", "fp8_e4m3", "fp8_ds_mla")},
}
# The Gluon kernels where they were measured faster than the tl kernel on the H200 (benchmarks/NOTES.md, sessions 5-7;
# decode by graph replay, prefill by do_bench): wgmma_t (kernels_wgmma_t.py: tile rows along M, heads along N, one
# warpgroup) decodes at <= 32 heads (bf16 h16 B=64 0.048 ms vs mma2's 0.052, h32 0.053 vs wgmma's 0.064; fp8_ds_mla
# h16 0.059 vs 0.066, h32 0.067 vs 0.084) and prefills fp8_ds_mla at <= 16 heads (3.15 vs 3.30); mma2 (kernels_mma2.py:
# cp.async gathers, mma.sync) keeps bf16 prefill at <= 16 heads (one buffer of 64-row tiles: 1.86 vs wgmma_t's 2.06);
# wgmma (kernels_wgmma.py: 64-head blocks, two warpgroups) runs more than 32 heads and (unmeasured against wgmma_t)
# 32-head prefill (h128 bf16 decode 0.131
# vs 0.254, prefill 6.5 vs 13.5). fp8_ds_mla runs bf16 tiles of exact values (f16_dot off): faster than the float16
# tiles in chunk units at every measured shape and free of their range limit. Elsewhere (sm80, sm86/89/120: no such
# GPU; timed only through the sm120 entries on the H200, `bench --emulate sm120`) the entries fit the shared memory:
# 16-head blocks of 32-row tiles up to 16 heads, 32-head blocks of 16-row tiles above. Everything else, and every
# problem under the interpreter, runs the tl kernel of TABLE.
_M = functools.partial(Launch, family="mma2")
_W = functools.partial(Launch, family="wgmma")
_T = functools.partial(Launch, family="wgmma_t")
_WS = functools.partial(Launch, family="wgmma_ws")
GLUON_CACHE_CLASSES = ("16bit", "fp8_ds_mla", "fp8_ds_mla_v4")
FP8_TILE_CLASSES = ("fp8_ds_mla", "fp8_ds_mla_v4")  # dequantised once per tile into bf16 by the Gluon kernels
GLUON_FAMILIES = ("mma2", "wgmma", "wgmma_t", "wgmma_ws")
HOPPER_FAMILIES = ("wgmma", "wgmma_t", "wgmma_ws")  # warpgroup MMAs: sm90 only
WS_CACHE_CLASSES = ("fp8_ds_mla",)  # what the warp-specialised kernel reads (kernels_wgmma_ws.py)
# AttentionConfig switches of a Gluon kernel (the tl kernel refuses them)
GLUON_ONLY_SWITCHES = ("overlap", "merge", "dsplit")
COMPILED_ONLY_SWITCHES = ("pdl", "merge")  # switches of a compiled NVIDIA launch (refused under the interpreter)
MERGE_SPLITS = 2  # a merging decode loads every split's partial at once: up to this many (more, or one: combine kernel)


def _mma2_entries(stages: int, dsplit_stages: int) -> dict[tuple[int, str], Launch]:
    """mma2 entries of the Ampere-class targets: up to 16 heads (and DeepSeek-V4 pages, unmeasured otherwise)
    16-head blocks of 32-row tiles with ``stages`` stages; more than 16 heads 32-head blocks of 16-row tiles (75 KB;
    half the rows gathered per head), measured with the sm120 entries on the H200 (benchmarks/NOTES.md, graph us,
    B=64): bf16 h32 / h64 / h128 77 / 140 / 264 vs 81 / 150 / 305 with 16-head blocks, fp8_ds_mla h64 / h128 187 / 355
    vs 238 / 433; splits of 128 entries or more (one 64K request, h128 bf16: 25 us with 16 splits, 49 with the 64 that
    fill two waves, 29 with 16-head blocks). The H200 ran two programs per SM where a 99 KB SM holds one of 75 KB: the
    emulation's limit. bf16/fp16 caches there: the scores' dims split over the warps (``dsplit``, kernels_mma2d.py)
    with ``dsplit_stages`` stages: two (80 KB) gave h32 / h64 / h128 75 / 136 / 250 vs 77 / 139 / 266, prefill h64
    7.2 vs 7.9 ms; three (100352 B, the software-pipelined loop) 72.6 / 125.5 / 228.5 vs 74.4 / 135.4 / 250.0 and
    6.94 vs 7.22 ms."""
    narrow, wide = _M(16, 32, 4, stages, 1), _M(32, 16, 4, 2, 1, min_split_len=128)
    wide_16bit = replace(wide, dsplit=True, num_stages=dsplit_stages)
    return {(hc, cc): narrow if hc == 16 or cc == "fp8_ds_mla_v4" else wide_16bit if cc == "16bit" else wide
            for hc in HEAD_CLASSES for cc in GLUON_CACHE_CLASSES}


GLUON_TABLE: dict[str, dict[tuple[int, str], Launch]] = {
    "sm90": {
        # decode: wgmma_t (tile rows along M, one warpgroup, one program per SM, one wave of splits); bf16 prefill at
        # <= 16 heads: mma2 with one buffer of 64-row tiles (two resident programs hide each other's latency)
        (16, "16bit"): _T(16, 64, 4, 2, 1, max_waves=1, merge=True,
                           prefill=_M(16, 32, 4, 2, 1, prefill_stages=1, prefill_block_n=64)),
        # (bf16 decode of two splits at <= 16 heads: the last split merges in-kernel, h16 B=64 48.5-48.9 vs 49.7-50.1 us
        # with the combine kernel; fp8_ds_mla h16 0.5 us slower merged than with its dependent-launch combine, so not
        # there: benchmarks/NOTES.md)
        # fp8_ds_mla decode at <= 16 heads: the combine kernel as a programmatic dependent launch (h16 B=64 0.0582
        # vs 0.0595 ms; bf16 and 32 heads measured 1-3 % slower with it, so without: benchmarks/NOTES.md); prefill:
        # the warp-specialised kernel with 8 producer warps (h16 4096 rows x 32K: 2.42 ms vs wgmma_t's 3.14, FlashMLA
        # 3.32; decode at B=64 it is slower than wgmma_t, 0.065 vs 0.058 ms)
        (16, "fp8_ds_mla"): _T(16, 64, 4, 2, 1, max_waves=1, overlap=True, pdl=True, prefill=_WS(16, 64, 12, 2, 1)),
        (32, "16bit"): _T(32, 64, 4, 2, 1, max_waves=1, prefill=_W(64, 64, 8, 2, 1)),
        (32, "fp8_ds_mla"): _T(32, 64, 4, 2, 1, max_waves=1, overlap=True, prefill=_W(64, 64, 8, 2, 1)),
        (64, "16bit"): _W(64, 64, 8, 2, 1),
        (64, "fp8_ds_mla"): _W(64, 64, 8, 2, 1),
        # DeepSeek-V4 pages: the same dequantised bf16 tile, from V4's rows and footers (window 128 + 512 compressed
        # entries, graph ms vs FlashMLA's V4 kernel: h8 B=64 0.024 vs 0.045, B=256 0.079 vs 0.088); 64 heads decode
        # as two 32-head wgmma_t blocks (B=64 0.049 vs wgmma's 0.053) and prefill (B=256) with wgmma (0.114 vs 0.166)
        (16, "fp8_ds_mla_v4"): _T(16, 64, 4, 2, 1, max_waves=1, overlap=True, prefill_stages=3, pdl=True),
        (32, "fp8_ds_mla_v4"): _T(32, 64, 4, 2, 1, max_waves=1, overlap=True, prefill=_W(64, 64, 8, 2, 1)),
        (64, "fp8_ds_mla_v4"): _T(32, 64, 4, 2, 1, max_waves=1, overlap=True, prefill=_W(64, 64, 8, 2, 1)),
    },
    # sm80 (163 KB of shared memory): three stages of 32-row tiles (130 KB) up to 16 heads; above, two programs per
    # SM as measured on the H200: 75 KB (mma2), 80 KB (the dims split's two stages; its three, 100 KB, would leave
    # one program per SM there: unmeasured)
    "sm80": _mma2_entries(3, 2),
    # ~99 KB (sm86, sm89, sm120): two stages (93 KB) up to 16 heads; one program per SM whatever the dims split's
    # stages, so its three (100352 B, pipelined)
    "sm86": _mma2_entries(2, 3),
}
GLUON_TABLE["sm89"] = GLUON_TABLE["sm86"]
GLUON_TABLE["sm120"] = GLUON_TABLE["sm86"]
# what a forced family runs where the table has no entry of it
_GLUON_DEFAULT = {"mma2": _M(16, 32, 4, 2, 1), "wgmma": _W(64, 64, 8, 2, 1),
                  "wgmma_t": _T(16, 64, 4, 2, 1, max_waves=1, overlap=True),
                  "wgmma_ws": _WS(16, 64, 12, 2, 1)}

# Head blocks a target cannot build: on sm100/sm110 a 64-head block's accumulators need 576 of the 512 tensor-memory
# columns (triton 3.9 compiles it to a bare trap, 3.6 asks 451 KB of shared memory); on RDNA it spills registers.
MAX_BLOCK_H = {"sm100": 32, "sm110": 32, **{a: 32 for a in ("gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201")}}
TABLE["sm89"] = TABLE["sm86"]
TABLE["sm110"] = TABLE["sm100"]  # Thor: Blackwell with sm100's shared memory and tensor memory
TABLE["sm120"] = TABLE["sm86"]
for _rdna in ("gfx1101", "gfx1151"):
    TABLE[_rdna] = TABLE["gfx1100"]
TABLE["gfx1200"] = dict(TABLE["gfx1100"])  # RDNA4: RDNA3's entries, and DeepSeek-V4 pages (below)
TABLE["gfx1201"] = TABLE["gfx1200"]
# DeepSeek-V4 pages (fp8_ds_mla_v4) for the tl kernel: the fp8_ds_mla entries' tiles with exact-value dots (no
# f16_dot) and the full kernel (no low_reg: the V4 path has no low-register variant). On the ~99 KB targets (sm86,
# sm89, sm120) one stage: two need 104 KB (16-head blocks) / 120 KB (32) of shared memory there. RDNA4's entry is
# RDNA's 16-head, 16-row, 16-warp tile (248 VGPRs, no spills); RDNA3 (gfx1100, gfx1101, gfx1151) has none: that build
# spills (~460 B of scratch) with triton 3.9, so v4_supported refuses the format there. Unmeasured (compile matrix
# only): no V4 timings yet.
for _name, _change in {"sm80": {}, "sm86": {"num_stages": 1}, "sm90": {}, "sm100": {}, "gfx942": {}, "gfx950": {},
                       "gfx1200": {}}.items():
    for _hc in HEAD_CLASSES:
        TABLE[_name][(_hc, "fp8_ds_mla_v4")] = replace(TABLE[_name][(_hc, "fp8_ds_mla")], f16_dot=False,
                                                       low_reg=False, **_change)
# Interpreter (CPU): small tiles so tests cover several steps and splits quickly.
_INTERPRETER = Launch(16, 16, 4, 1, 1)


def cache_class(kv_format: str) -> str:
    """The cache class of a format in :data:`TABLE`: ``"16bit"`` for bf16/fp16 rows."""
    return kv_format if kv_format in ("fp8_e4m3", "fp8_ds_mla", "fp8_ds_mla_v4") else "16bit"


def use_sw_fp8(arch: Arch, kv_format: str) -> bool:
    """Decode e4m3 with integer operations: only for fp8 caches on targets without native fp8 conversions."""
    return cache_class(kv_format) != "16bit" and not arch.fp8_hw


def head_class(H: int) -> int:
    """The head class of :data:`TABLE` that ``H`` heads ask for."""
    return 16 if H <= 16 else 32 if H <= 32 else 64


@dataclass(frozen=True)
class AttentionConfig:
    kernel: str  # "decode" (split top-k + combine) or "prefill" (one program per row and head block)
    block_h: int
    block_n: int
    num_splits: int
    split_len: int
    num_warps: int
    num_stages: int
    sw_fp8: bool = False  # decode e4m3 with integer operations (no fp8 conversion instructions on the target)
    f16_dot: bool = False  # fp8_ds_mla: float16 dots on unscaled e4m3 values, scales on scores and probabilities
    low_reg: bool = False  # registers: q and each cache chunk loaded where its dot needs it (V gathered twice)
    programs_per_sm: int = 1  # resident programs per multiprocessor (registers/shared memory bound)
    combine_block_h: int = 8
    combine_warps: int = 4
    family: str = "tl"  # which kernel: "tl" (kernels.py), "mma2" / "wgmma" / "wgmma_t" / "wgmma_ws" (kernels_mma2.py
    # / kernels_wgmma.py / kernels_wgmma_t.py / kernels_wgmma_ws.py; wgmma_ws: num_warps counts its producer warps)
    max_registers: int | None = None  # NVIDIA: registers per thread the build may use (ptxas maxnreg); None: its own
    overlap: bool = False  # wgmma_t with fp8_ds_mla / V4 pages: the next tile dequantised during this one's output MMAs
    pdl: bool = False  # decode: the combine kernel is a programmatic dependent launch (NVIDIA sm90 on), started
    # while the split kernel runs so that its launch and start-up overlap the splits' tail (_common/pdl.py)
    merge: bool = False  # wgmma_t decode: the last of a row's splits to finish merges them (arrival counters,
    # _common/counters.py) instead of a combine kernel; at launch only where there are 2..MERGE_SPLITS splits
    dsplit: bool = False  # mma2 on bf16/fp16 caches: kernels_mma2d.py, the scores' 576 dims split over the 4 warps
    # and the output's columns too, so that q and each tile are read from shared memory once a tile (a call with an
    # extra cache runs the mma2 kernel)

    def describe(self) -> str:
        """Short text: kernel, head block, gather block, splits, warps/stages, and every option switched on."""
        if self.kernel == "prefill":
            text = f"prefill bh{self.block_h} bn{self.block_n} w{self.num_warps} st{self.num_stages}"
        else:
            text = (f"decode bh{self.block_h} bn{self.block_n} split{self.num_splits}x{self.split_len} "
                    f"w{self.num_warps} st{self.num_stages}")
        text = ("" if self.family == "tl" else f"{self.family} ") + text
        if self.max_registers is not None:
            text += f" reg{self.max_registers}"
        return text + "".join(f" +{k}" for k, v in vars(self).items() if v is True)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _split_count(rows_x_heads: int, n_blocks: int, slots: int, max_waves: int = 2) -> int:
    """Splits of each row's list so the grid fills whole waves of ``slots`` resident programs.

    Measured on the H200 (benchmarks/NOTES.md): a grid of 1.2 waves ran 50% slower than one of 0.97 waves, so the
    choice maximises the filled fraction of the last wave, over at most ``max_waves`` waves, preferring more splits
    on ties (more memory parallelism)."""
    best, best_score = 1, -1.0
    if rows_x_heads <= 0:
        return 1
    for ns in range(1, n_blocks + 1):
        progs = rows_x_heads * ns
        waves = -(-progs // slots)
        if waves > max_waves and ns > 1:
            break
        score = progs / (waves * slots)
        if score >= best_score - 1e-9:
            best, best_score = ns, score
    return best


def gluon_supported(family: str, arch: Arch | None, kv_format: str, q_dtype: torch.dtype | None = None) -> bool:
    """The Gluon kernel ``family`` can run this problem: not the interpreter, an NVIDIA target with cp.async and
    mma.sync (``"mma2"``: sm80 on) or Hopper's wgmma (``"wgmma"``, ``"wgmma_t"``, ``"wgmma_ws"``: sm90), a bf16/fp16
    cache read as stored (``q_dtype`` None or the cache's dtype), fp8_ds_mla or DeepSeek-V4 pages (bf16 q);
    ``"wgmma_ws"`` reads fp8_ds_mla only."""
    if arch is None or interpreting() or arch.backend != "cuda" or family not in GLUON_FAMILIES:
        return False
    if int(arch.target) < 80 or (family in HOPPER_FAMILIES and arch.name != "sm90"):
        return False
    if family == "wgmma_ws" and cache_class(kv_format) not in WS_CACHE_CLASSES:
        return False
    if kv_format in FP8_TILE_CLASSES:  # the rows' bf16 RoPE part is copied as stored and dotted with q's
        return q_dtype is None or q_dtype == torch.bfloat16
    native = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(kv_format)
    return native is not None and (q_dtype is None or q_dtype == native)


def pdl_supported(arch: Arch | None) -> bool:
    """``griddepcontrol`` (programmatic dependent launch) exists on the target: NVIDIA from sm90 on, compiled."""
    return arch is not None and not interpreting() and arch.backend == "cuda" and int(arch.target) >= 90


def v4_supported(arch: Arch | None) -> bool:
    """The tl kernel reads DeepSeek-V4 pages (kv_format ``fp8_ds_mla_v4``) on ``arch``: where :data:`TABLE` has
    entries for them (and None: the interpreter). RDNA3 has none: its build spills registers (the compile matrix),
    so the API refuses the format there."""
    return arch is None or (16, "fp8_ds_mla_v4") in TABLE.get(arch.name, {})


def extra_cache_supported(arch: Arch | None) -> bool:
    """The tl kernel takes an extra cache on ``arch``: NVIDIA targets (and None: the interpreter). On the AMD
    targets its build with one spills registers (the compile matrix), so the API refuses it there."""
    return arch is None or arch.backend == "cuda"


def wgmma_ws_shared_bytes(cfg: AttentionConfig) -> int:
    """Shared memory of a wgmma_ws build (kernels_wgmma_ws.py's buffers, and 1 KB for the compiler's scratch): the
    bf16 tile buffers (576 values a row), q, the transposed probabilities and the buffers' mbarriers."""
    return cfg.num_stages * cfg.block_n * 576 * 2 + cfg.block_h * 576 * 2 + cfg.block_n * cfg.block_h * 2 + 1024


def wgmma_t_shared_bytes(cfg: AttentionConfig, fp8: bool) -> int:
    """Shared memory of a wgmma_t build (kernels_wgmma_t.py's buffers, and 1 KB for the compiler's reduction
    scratch): the stages' rows (fp8_ds_mla: latent bytes, scales, bf16 RoPE; else 576 16-bit values), fp8_ds_mla's
    dequantised tile, q and the transposed probabilities."""
    row = 512 + 16 + 128 if fp8 else 576 * 2
    deq = cfg.block_n * 512 * 2 if fp8 else 0
    return cfg.num_stages * cfg.block_n * row + deq + cfg.block_h * 576 * 2 + cfg.block_n * cfg.block_h * 2 + 1024


def gluon_config_problem(cfg: AttentionConfig, kv_format: str | None = None, arch: Arch | None = None) -> str | None:
    """Why a Gluon config cannot be built as given (``None`` when it can): wgmma runs 64-head blocks on 8 warps with
    32- or 64-row tiles and at least two stages; wgmma_t runs 8-, 16- or 32-head blocks of 64-row tiles on one
    warpgroup (or two, each with half the heads) with at least two stages, within ``arch``'s shared memory for
    ``kv_format`` (when both are given); mma2 runs 16-, 32- or 64-head blocks of 16-, 32- or 64-row tiles on 4 or 8
    warps (what the GPU tier covers), its dims split (``dsplit``) 16- or 32-head blocks of 16- or 32-row tiles on 4
    warps with at least two stages, bf16/fp16 caches only; none takes the tl kernel's low-register variant."""
    if cfg.family == "wgmma_ws":
        if cfg.block_h not in (8, 16, 32) or cfg.num_warps not in (8, 12):
            return (f"block_h / num_warps: the wgmma_ws kernel runs block_h 8, 16 or 32 on 8 or 12 warps (4 consumer "
                    f"warps, the rest producers), got {cfg.block_h} / {cfg.num_warps}")
        if cfg.block_n != 64:
            return f"block_n: the wgmma_ws kernel takes 64 (the rows of a warpgroup MMA), got {cfg.block_n}"
        if cfg.num_stages < 2:
            return f"num_stages: the wgmma_ws kernel needs at least 2 tile buffers, got {cfg.num_stages}"
        if cfg.f16_dot:
            return "f16_dot: the wgmma_ws kernel dots bf16 tiles of exact values only"
        if kv_format is not None and cache_class(kv_format) not in WS_CACHE_CLASSES:
            return f"kv_format: the wgmma_ws kernel reads {' or '.join(WS_CACHE_CLASSES)}, got {kv_format!r}"
        if arch is not None:
            need = wgmma_ws_shared_bytes(cfg)
            if need > arch.shared_bytes:
                return (f"num_stages / block_h: the wgmma_ws kernel with {cfg.num_stages} tile buffers and "
                        f"{cfg.block_h}-head blocks needs {need} bytes of shared memory, {arch.name} has "
                        f"{arch.shared_bytes}")
    elif cfg.family == "wgmma_t":
        if cfg.block_h not in (8, 16, 32) or cfg.num_warps not in (4, 8) or cfg.block_h // (cfg.num_warps // 4) < 8:
            return (f"block_h / num_warps: the wgmma_t kernel runs block_h 8, 16 or 32 on 4 warps (16 or 32 on 8), got "
                    f"{cfg.block_h} / {cfg.num_warps}")
        if cfg.block_n != 64:
            return f"block_n: the wgmma_t kernel takes 64 (the rows of a warpgroup MMA), got {cfg.block_n}"
        if cfg.num_stages < 2:
            return f"num_stages: the wgmma_t kernel needs at least 2, got {cfg.num_stages}"
        if cfg.f16_dot:
            return "f16_dot: the wgmma_t kernel dots bf16 tiles of exact values only"
        if kv_format is not None and arch is not None:
            need = wgmma_t_shared_bytes(cfg, cache_class(kv_format) in FP8_TILE_CLASSES)
            if need > arch.shared_bytes:
                return (f"num_stages / block_h: the wgmma_t kernel with {cfg.num_stages} stages of {cfg.block_n} "
                        f"{kv_format} rows and {cfg.block_h}-head blocks needs {need} bytes of shared memory, "
                        f"{arch.name} has {arch.shared_bytes}")
    elif cfg.family == "wgmma":
        if cfg.block_h != 64 or cfg.num_warps != 8:
            return (f"block_h / num_warps: the wgmma kernel runs block_h 64 on 8 warps, got {cfg.block_h} / "
                    f"{cfg.num_warps}")
        if cfg.block_n not in (32, 64):
            return f"block_n: the wgmma kernel takes 32 or 64, got {cfg.block_n}"
        if cfg.num_stages < 2:
            return f"num_stages: the wgmma kernel needs at least 2, got {cfg.num_stages}"
    elif cfg.family == "mma2":
        if cfg.block_h not in (16, 32, 64) or cfg.num_warps not in (4, 8):
            return (f"block_h / num_warps: the mma2 kernel takes block_h 16, 32 or 64 on 4 or 8 warps, got "
                    f"{cfg.block_h} / {cfg.num_warps}")
        if cfg.block_n not in (16, 32, 64):
            return f"block_n: the mma2 kernel takes 16, 32 or 64, got {cfg.block_n}"
        if cfg.num_stages < 1:
            return f"num_stages: at least 1, got {cfg.num_stages}"
    if cfg.family != "tl" and cfg.low_reg:
        return f"low_reg: a variant of the tl kernel, not of {cfg.family}"
    if cfg.family != "wgmma_t" and cfg.overlap:
        return f"overlap: a variant of the wgmma_t kernel, not of {cfg.family}"
    if cfg.family != "wgmma_t" and cfg.merge:
        return f"merge: a variant of the wgmma_t kernel's decode, not of {cfg.family}"
    if cfg.dsplit:
        if cfg.family != "mma2":
            return f"dsplit: a variant of the mma2 kernel, not of {cfg.family}"
        if cfg.num_warps != 4 or cfg.block_h not in (16, 32) or cfg.block_n not in (16, 32) or cfg.num_stages < 2:
            return (f"dsplit: the mma2 kernel's dims split runs 4 warps, block_h 16 or 32, block_n 16 or 32 and at "
                    f"least 2 stages, got {cfg.num_warps} / {cfg.block_h} / {cfg.block_n} / {cfg.num_stages}")
        if kv_format is not None and cache_class(kv_format) != "16bit":
            return f"dsplit: the mma2 kernel's dims split reads bf16/fp16 caches, got {kv_format!r}"
    return None


def choose_config(T: int, H: int, topk: int, device: torch.device, kernel: str = "auto", *,
                  kv_format: str = "bf16", arch: Arch | None = None, q_dtype: torch.dtype | None = None,
                  **overrides: object) -> AttentionConfig:
    """Pick the kernel and its launch parameters for ``T`` rows, ``H`` heads and lists of ``topk`` slots.

    The table entry of the device's architecture (``arch``, else the device's) sets the head block (every cache
    row gathered for a row is shared by up to ``block_h`` heads), the tile and the warps. The prefill kernel is
    chosen when rows × head blocks alone fill two waves of resident programs; otherwise the decode kernel splits
    each row's list so that the grid fills whole waves. ``overrides`` replace any field (tests and benchmarks use
    them to reach a specific configuration; ``family`` ``"tl"``, ``"mma2"``, ``"wgmma"`` or ``"wgmma_t"`` picks the
    kernel, whose table entry then applies — the class's entry or its prefill entry, whichever is of that family;
    ``programs_per_sm`` also sizes the split count). A Gluon kernel (``GLUON_TABLE``) runs where it has an entry for
    the problem's classes and :func:`gluon_supported` holds (``q_dtype``: q's dtype, when known), the prefill kernel
    the entry's :attr:`Launch.prefill` where it has one; the tl kernel everywhere else. Overrides that the table's
    mma2 dims split cannot take (``dsplit`` not given) give the mma2 kernel itself; overrides that a table-chosen
    Gluon kernel cannot take (:func:`gluon_config_problem`) give the tl kernel with them; with ``family`` given they
    raise ``ValueError``.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    if arch is None and device.type == "cuda":
        from ...capabilities import arch_for_device

        arch = arch_for_device(device)
    given = dict(overrides)
    family = overrides.pop("family", None)
    if family not in (None, "tl", *GLUON_FAMILIES):
        raise ValueError(f"family: expected 'tl', 'mma2', 'wgmma', 'wgmma_t' or 'wgmma_ws', got {family!r}")
    key = (head_class(H), cache_class(kv_format))
    if family in GLUON_FAMILIES and not gluon_supported(family, arch, kv_format, q_dtype):
        where = "sm90" if family in HOPPER_FAMILIES else "an NVIDIA GPU from sm80 on"
        reads = ("fp8_ds_mla with bf16 q" if family == "wgmma_ws" else
                 "a bf16/fp16 cache read as stored, fp8_ds_mla or fp8_ds_mla_v4 with bf16 q")
        raise ValueError(f"family: the {family} kernel needs {where} and {reads}; got "
                         f"{arch.name if arch else 'no GPU'}, {kv_format}, q {q_dtype}")
    if key[1] == "fp8_ds_mla_v4" and not interpreting() and not v4_supported(arch):
        raise ValueError(f"kv_format: 'fp8_ds_mla_v4' is not built for {arch.name} (its build spills registers there: "
                         f"the compile matrix), got {kv_format!r}")
    if arch is None or interpreting():
        launch = replace(_INTERPRETER, block_h=min(64, max(16, _next_pow2(H))))
        sw_fp8 = False
    else:
        launch = TABLE[arch.name][key]
        sw_fp8 = use_sw_fp8(arch, kv_format)
    # the kernel is chosen with the tl entry's sizes, then a Gluon entry (if any) takes over
    block_h = overrides.get("block_h", launch.block_h)
    n_hb = -(-H // block_h)
    n_blocks = -(-topk // overrides.get("block_n", launch.block_n))
    slots = multiprocessor_count(device) * overrides.get("programs_per_sm", launch.programs_per_sm)
    if kernel == "auto":
        kernel = "prefill" if T * n_hb >= 2 * slots or n_blocks == 1 else "decode"
    entry = GLUON_TABLE.get(arch.name, {}).get(key) if arch is not None else None
    if family is None and entry is not None and gluon_supported(entry.family, arch, kv_format, q_dtype):
        if kernel == "prefill" and entry.prefill is not None and gluon_supported(entry.prefill.family, arch,
                                                                                  kv_format, q_dtype):
            entry = entry.prefill
        family, launch = entry.family, entry
    elif family in GLUON_FAMILIES:
        if entry is not None and entry.family != family and entry.prefill is not None:
            entry = entry.prefill
        launch = entry if entry is not None and entry.family == family else _GLUON_DEFAULT[family]
    else:
        family = "tl"
    launch = replace(launch, programs_per_sm=overrides.pop("programs_per_sm", launch.programs_per_sm))
    block_h = overrides.pop("block_h", launch.block_h)
    block_n = overrides.pop("block_n", launch.prefill_block_n if kernel == "prefill" and launch.prefill_block_n
                            else launch.block_n)
    if arch is not None and not interpreting() and block_h > MAX_BLOCK_H.get(arch.name, 64):
        raise ValueError(f"block_h: at most {MAX_BLOCK_H[arch.name]} on {arch.name}, got {block_h} (a larger head block "
                         f"does not fit the architecture: tensor memory on sm100/sm110, registers on RDNA)")
    n_hb = -(-H // block_h)
    slots = multiprocessor_count(device) * launch.programs_per_sm
    n_blocks = -(-topk // block_n)
    num_stages = launch.num_stages
    if kernel == "prefill":
        num_splits = 1
        num_stages = launch.prefill_stages or num_stages
    else:
        max_splits = min(n_blocks, max(1, topk // launch.min_split_len))
        num_splits = overrides.pop("num_splits", _split_count(T * n_hb, max_splits, slots, launch.max_waves))
    split_len = -(-(-(-topk // num_splits)) // block_n) * block_n
    num_splits = -(-topk // split_len)
    cfg = AttentionConfig(kernel=kernel, block_h=block_h, block_n=block_n, num_splits=num_splits,
                          split_len=split_len, num_warps=launch.num_warps, num_stages=num_stages,
                          sw_fp8=sw_fp8, programs_per_sm=launch.programs_per_sm,
                          f16_dot=launch.f16_dot and cache_class(kv_format) == "fp8_ds_mla", low_reg=launch.low_reg,
                          family=family, max_registers=launch.max_registers,
                          overlap=launch.overlap and cache_class(kv_format) in FP8_TILE_CLASSES,
                          pdl=launch.pdl and kernel == "decode" and pdl_supported(arch),
                          merge=launch.merge and kernel == "decode",
                          dsplit=launch.dsplit and cache_class(kv_format) == "16bit")
    cfg = replace(cfg, **overrides) if overrides else cfg
    if type(cfg.split_len) is not int or cfg.split_len < 1 or cfg.split_len % cfg.block_n:
        # a program's range starts on a tile boundary: tiles never straddle two programs (or the two lists of an
        # extra cache)
        raise ValueError(f"split_len: expected a positive multiple of block_n ({cfg.block_n}), got {cfg.split_len!r}")
    if cfg.low_reg and key[1] == "fp8_ds_mla_v4":
        raise ValueError("low_reg: the tl kernel reads fp8_ds_mla_v4 pages with its full variant only, got True")
    if cfg.merge and (interpreting() or arch is None or arch.backend != "cuda"):
        raise ValueError(f"merge: the splits' in-kernel merge runs compiled on NVIDIA GPUs (not the interpreter), got "
                         f"{arch.name if arch else 'no GPU'}")
    if cfg.merge and cfg.kernel != "decode":
        raise ValueError(f"merge: merges a decode's splits; the {cfg.kernel} kernel has none, got True")
    if cfg.pdl and not pdl_supported(arch):
        raise ValueError(f"pdl: programmatic dependent launch needs an NVIDIA GPU from sm90 on (not the interpreter), "
                         f"got {arch.name if arch else 'no GPU'}")
    reg = cfg.max_registers
    if reg is not None and (type(reg) is not int or not 32 <= reg <= 255):
        raise ValueError(f"max_registers: expected None or an int in [32, 255], got {reg!r}")
    if reg is not None and arch is not None and arch.backend != "cuda" and not interpreting():
        raise ValueError(f"max_registers: a cap of ptxas (NVIDIA) with no equivalent on {arch.name}, got {reg}")
    problem = gluon_config_problem(cfg, kv_format, arch)
    if problem is not None and cfg.dsplit and "dsplit" not in given:
        # overrides the table's dims split cannot take (tile, warps, stages): the mma2 kernel itself
        cfg = replace(cfg, dsplit=False)
        problem = gluon_config_problem(cfg, kv_format, arch)
    if problem is not None:
        if "family" in given:
            raise ValueError(problem)
        # overrides meant for the tl kernel (or its variants) on a class the table gives a Gluon kernel
        return choose_config(T, H, topk, device, kernel, kv_format=kv_format, arch=arch, q_dtype=q_dtype,
                             **dict(given, family="tl"))
    return cfg

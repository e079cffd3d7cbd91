"""mma2 head blocks and tiles for the portable rows of issue 16 (ours_portable, sm120 table, against ours on sm90):
each variant as ``--emulate sm120`` runs it (the sm120 entries' family, Triton's MMA v3 off), ours on sm90 beside.

    DISABLE_MMA_V3=1 PYTHONPATH=src python benchmarks/scripts/ab_mma2_heads.py [quick | b1 | bf16 | portable]

Every variant's output is checked against the float32 reference first (the bench's check); decode by graph
replay (median of 5), prefill by do_bench. Session 18's runs: benchmarks/results/ab-h200-2026-12-03-mma2-heads.txt
(these variants, the "sm120 table" line the 16-head entry before 32-head blocks took the table), and
ab-h200-2026-12-03-mma2-qreg.txt (q in registers: benchmarks/scripts/ab_mma2_qreg.patch, dropped); session 19's:
ab-h200-2026-12-03-mma2d.txt (the dims split, kept) and ab-h200-2026-12-03-mma2d-w8.txt (on 8 warps, dropped);
session 20's: ab-h200-2026-12-04-mma2d-pipe.txt (the dims split's software-pipelined three stages, kept) and
ab-h200-2026-12-04-mma2d-lazy.txt (a lazy running max: benchmarks/scripts/ab_mma2d_lazy.patch, dropped); session 21's:
ab-h200-2026-12-04-mma2d-gather.txt (RoPE gathers without replicated copies, kept) and
ab-h200-2026-12-04-mma2d-qreg8.txt (8 warps, q in registers: benchmarks/scripts/ab_mma2d_qreg8.patch, dropped)."""
import statistics
import sys

import torch

from triton_mla_sparse.bench import DoBenchTimer, build_inputs, check_output, decode_case, prefill_case, reference_output
from triton_mla_sparse.bench.portable import emulated_overrides
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config

MODE = sys.argv[1] if len(sys.argv) > 1 else ""  # "quick": the first two cases; "b1": one long request
ONLY = sys.argv[2].split(",") if len(sys.argv) > 2 else None  # variant names to run (default: all)
VARIANTS = {
    "sm120 table": {},
    "bh32 bn16 w4 st2": dict(block_h=32, block_n=16, num_warps=4, num_stages=2),
    "bh32 bn16 w4 st3": dict(block_h=32, block_n=16, num_warps=4, num_stages=3),
    "bh32 bn16 w4 st3 sp+1": dict(block_h=32, block_n=16, num_warps=4, num_stages=3, _more_splits=True),
    "bh64 bn16 w8 st1": dict(block_h=64, block_n=16, num_warps=8, num_stages=1),
    "bh32 bn32 w8 st1": dict(block_h=32, block_n=32, num_warps=8, num_stages=1),
    "bh32 bn16 w8 st2": dict(block_h=32, block_n=16, num_warps=8, num_stages=2),
    "bh16 bn32 w4 st2": dict(block_h=16, block_n=32, num_warps=4, num_stages=2),
    # session 19: the scores' dims split over the warps (kernels_mma2d.py)
    "dsplit bh32 bn16 st2": dict(block_h=32, block_n=16, num_warps=4, num_stages=2, dsplit=True),
    "dsplit bh32 bn16 st3": dict(block_h=32, block_n=16, num_warps=4, num_stages=3, dsplit=True),
    "dsplit bh32 bn16 st4": dict(block_h=32, block_n=16, num_warps=4, num_stages=4, dsplit=True),
    "dsplit bh16 bn16 st2": dict(block_h=16, block_n=16, num_warps=4, num_stages=2, dsplit=True),
    "dsplit bh16 bn32 st2": dict(block_h=16, block_n=32, num_warps=4, num_stages=2, dsplit=True),
    # (8 warps: benchmarks/scripts/ab_mma2d_w8.patch applied; the kernel takes 4 otherwise)
    "dsplit bh32 bn16 w8 st2": dict(block_h=32, block_n=16, num_warps=8, num_stages=2, dsplit=True),
    "dsplit bh32 bn16 w8 st3": dict(block_h=32, block_n=16, num_warps=8, num_stages=3, dsplit=True),
    "dsplit bh32 bn32 w8 st2": dict(block_h=32, block_n=32, num_warps=8, num_stages=2, dsplit=True),
}
CASES = [("decode", 64, "bf16"), ("decode", 128, "bf16"), ("decode", 32, "bf16"), ("decode", 64, "fp8_ds_mla"),
         ("decode", 128, "fp8_ds_mla"), ("prefill", 64, "bf16")]
B1_VARIANTS = {  # one 64K request: the split count decides the grid
    "sm120 table": {},
    **{f"bh32 bn16 w4 st2 sp{n}": dict(block_h=32, block_n=16, num_warps=4, num_stages=2, num_splits=n)
       for n in (8, 16, 32)},
    "bh16 bn32 w4 st2": dict(block_h=16, block_n=32, num_warps=4, num_stages=2, num_splits=32),  # (as measured)
}
B1_CASES = [("decode", 128, "bf16"), ("decode", 128, "fp8_ds_mla"), ("decode", 64, "bf16")]
if MODE == "b1":
    VARIANTS, CASES = B1_VARIANTS, B1_CASES
if MODE == "bf16":  # the 16-bit cases only
    CASES = [c for c in CASES if c[2] == "bf16"]
if MODE == "portable":  # the portable rows only
    CASES = [("decode", 64, "bf16"), ("decode", 128, "bf16")]
timer = DoBenchTimer(1, rep=40)
for kind, h, fmt in CASES[:2] if MODE == "quick" else CASES:
    if MODE == "b1":
        c = decode_case(h, 1, fmt, ctx=65536)
    else:
        c = decode_case(h, 64, fmt) if kind == "decode" else prefill_case(h, fmt)
    inp = build_inputs(c, "cuda")
    ref, sel = reference_output(inp)
    q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale

    def timed(over, label, kernel="auto"):
        def fn():
            return sparse_mla_attention_with_config(q, kv, idx, scale, kernel=kernel, kv_format=fmt, **over)
        _, used = sparse_mla_attention_with_config(q, kv, idx, scale, kernel=kernel, kv_format=fmt,
                                                   return_config=True, **over)
        err, problem = check_output(c, fn(), ref, sel)
        if problem:
            print(f"{kind} h{h} {fmt:10s} {label:24s} WRONG {problem}", flush=True)
            return
        ms = (statistics.median(time_graph(fn) for _ in range(5)) if kind == "decode" else timer(fn))
        print(f"{kind} h{h} B={c.rows} {fmt:10s} {label:24s} {ms * 1000:8.1f} us err {err:.1e}  {used.describe()}",
              flush=True)

    timed({}, "ours sm90", "prefill" if kind == "prefill" else "auto")
    for label, var in VARIANTS.items():
        if ONLY is not None and label not in ONLY:
            continue
        var = dict(var)
        more = var.pop("_more_splits", False)
        try:
            kern, over = emulated_overrides("sm120", c, q, family="mma2", **var)
            if more and kern == "decode":
                over["num_splits"] += 1
            timed(over, label, kern)
        except Exception as e:  # noqa: BLE001
            print(f"{kind} h{h} {fmt:10s} {label:24s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    del inp, ref, q, kv, idx
    torch.cuda.empty_cache()

"""A/B timing behind benchmarks/results/ab-h200-2026-12-02-lazy.txt (session 9, benchmarks/NOTES.md): graph-replay
medians (do_bench for prefill) of attention cases for whichever source tree is on PYTHONPATH, with the sm90 table and
with the sm120 table's mma2 entries (the ``ours_portable`` configuration; the Gluon mma2 kernel issues mma.sync on
any GPU). There: src before and after the lazy softmax (a head's reference max moves only when a tile passes it by
more than 2^8, and the accumulators are rescaled only when one moved), run alternately:

    PYTHONPATH=<tree>/src python benchmarks/scripts/ab_lazy.py <tag>"""
import dataclasses
import sys

import torch
from triton_mla_sparse.bench import build_inputs, decode_case
from triton_mla_sparse.bench.cases import prefill_case
from triton_mla_sparse.bench.timing import time_do_bench, time_graph
from triton_mla_sparse.capabilities import ARCHS
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config
from triton_mla_sparse.ops.sparse_mla.configs import choose_config
from triton_mla_sparse.reference import sparse_mla_attention as reference

tag = sys.argv[1]
dev = torch.device("cuda")


def med(fn, n=5):
    return sorted(time_graph(fn) for _ in range(n))[n // 2]


def run(case, table):
    inp = build_inputs(case, dev)
    q, kv, idx, scale, fmt = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, case.kv_format
    over = {}
    if table != "sm90":
        cfg = choose_config(case.rows, case.heads, case.topk, dev, "auto", kv_format=fmt, arch=ARCHS[table],
                            q_dtype=q.dtype)
        over = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("kernel", "split_len")}
        over["kernel"] = cfg.kernel
    fn = lambda: sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt, **over)
    t = med(fn) * 1000 if case.kind == "decode" else time_do_bench(fn)
    unit = "us" if case.kind == "decode" else "ms"
    out = fn().float()
    n = min(64, case.rows)
    ref = reference(q[-n:], kv, idx[-n:], scale, kv_format=fmt).float()
    err = (out[-n:] - ref).abs().max().item()
    print(f"{tag} {table:5s} {case.name:40s} {t:9.3f} {unit}  max err {err:.2e}", flush=True)


for h in (8, 16, 32, 64, 128):
    run(decode_case(h, 64, "bf16"), "sm90")
for h in (8, 16, 32, 128):
    run(decode_case(h, 64, "fp8_ds_mla"), "sm90")
run(decode_case(16, 256, "fp8_ds_mla"), "sm90")
run(decode_case(16, 256, "bf16"), "sm90")
for h in (16, 64, 128):
    run(decode_case(h, 64, "bf16"), "sm120")
run(prefill_case(16, "bf16"), "sm90")
run(prefill_case(16, "fp8_ds_mla"), "sm90")

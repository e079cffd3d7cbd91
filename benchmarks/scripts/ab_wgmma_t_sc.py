"""A/B timing behind benchmarks/results/ab-h200-2026-12-04-wgmma_t-scales.txt (session 22, benchmarks/NOTES.md):
graph-replay µs of decode at B = 64 (fp8_ds_mla and bf16, 8 and 16 heads) for whichever source tree is on
PYTHONPATH, and with a second argument the largest error of fp8_ds_mla h16 against the reference (pow2 and float32
scales). Trees, one process each, in turn: eb8de95 (``base``); ``sc1``, the tile's chunk scales read once (a draft
of 45c15a7 whose 16-head build has 45c15a7's PTX); ``ids``, ``pre``, ``scl``: ``ab_wgmma_t_{ids,pre,scl}.patch``:

    PYTHONPATH=<tree>/src python benchmarks/scripts/ab_wgmma_t_sc.py <tag> [err]"""
import statistics
import sys
from dataclasses import replace

import torch
from triton_mla_sparse.bench import build_inputs, decode_case
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config
from triton_mla_sparse.reference import sparse_mla_attention as reference
tag = sys.argv[1]
dev = torch.device("cuda")
for h, fmt, b in [(16, "fp8_ds_mla", 64), (8, "fp8_ds_mla", 64), (16, "bf16", 64), (8, "bf16", 64)]:
    c = decode_case(h, b, fmt)
    inp = build_inputs(c, dev)
    fn = lambda: sparse_mla_attention_with_config(inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, kv_format=fmt)
    ts = [time_graph(fn) * 1000 for _ in range(7)]
    print(f"{tag:5s} h{h} B={b} {fmt:10s} median {statistics.median(ts):7.2f} us  min {min(ts):7.2f}", flush=True)
    del inp
if len(sys.argv) > 2:
    for sf in ("pow2", "fp32"):
        c = replace(decode_case(16, 64, "fp8_ds_mla"), scale_format=sf)
        inp = build_inputs(c, dev, seed=1)
        out = sparse_mla_attention_with_config(inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, kv_format="fp8_ds_mla")
        ref = reference(inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, kv_format="fp8_ds_mla")
        err = (out.float() - ref.float()).abs()
        print(f"{tag} error fp8 h16 {sf}: max {err.max().item():.3e} mean {err.mean().item():.3e} nan {out.isnan().any().item()}", flush=True)

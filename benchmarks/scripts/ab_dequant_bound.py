"""A/B timing behind benchmarks/results/ab-h200-2026-12-04-dequant-bound.txt (session 22, benchmarks/NOTES.md): how
fast the sm90 fp8_ds_mla decode kernel (wgmma_t) could be with a cheaper dequantisation, or none. Three copies of
src at eb8de95: as committed there (``base``), with ``ab_dequant_bound_cvt.patch`` (``cvt``: one
``cvt.rn.f16x2.e4m3x2`` per two values, no scale: the arithmetic floor of any float16-tile variant) and with
``ab_dequant_bound_nodq.patch`` (``nodq``: no dequantisation pass at all). Both variants compute wrong outputs on purpose; only their times count:

    for t in base cvt nodq; do PYTHONPATH=<copies>/$t/src python benchmarks/scripts/ab_dequant_bound.py $t; done"""
import statistics
import sys

import torch

from triton_mla_sparse.bench import build_inputs, decode_case
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config

tag = sys.argv[1]
dev = torch.device("cuda")
for h, fmt, b in [(16, "fp8_ds_mla", 64), (8, "fp8_ds_mla", 64), (16, "bf16", 64)]:
    c = decode_case(h, b, fmt)
    inp = build_inputs(c, dev)
    fn = lambda: sparse_mla_attention_with_config(inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, kv_format=fmt)
    ts = [time_graph(fn) * 1000 for _ in range(7)]
    print(f"{tag:6s} h{h} B={b} {fmt:10s} median {statistics.median(ts):7.2f} us  min {min(ts):7.2f}", flush=True)
    del inp

"""A/B timing of ``indexer_topk`` (logits + top-k; graph-replay medians) for whichever source tree is on PYTHONPATH,
run alternately per tree. Behind benchmarks/results/ab-h200-2026-12-02-indexer-scale.txt (session 9) and
ab-h200-2026-12-02-records.txt (session 12, ab_records.patch; benchmarks/NOTES.md). Session 9: src as
committed ("ia": ReLU of the scaled score) and a copy whose wgmma logits kernel applies the position's scale after
the head sum ("ib": ``b_v = gl.sum(gl.maximum(b_s, 0.0) * b_w[None, :], 1) * b_sc``, equal for scales >= 0), run
alternately twice:

    PYTHONPATH=<tree>/src python benchmarks/scripts/ab_indexer_scale.py <tag>"""
import sys

import torch
from triton_mla_sparse.bench import build_inputs
from triton_mla_sparse.bench.cases import indexer_case
from triton_mla_sparse.bench.inputs import indexer_args
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.indexer import indexer_topk

tag = sys.argv[1]
dev = torch.device("cuda")


def med(fn, n=5):
    return sorted(time_graph(fn) for _ in range(n))[n // 2]


for h, ctx in [(64, 131072), (64, 32768), (32, 131072)]:
    c = indexer_case(h, "decode", ctx=ctx)
    inp = build_inputs(c, dev)
    args = indexer_args(inp)
    out = torch.empty(c.rows, c.topk, dtype=torch.int32, device=dev)
    fn = lambda: indexer_topk(*args, c.topk, max_len=inp.max_len, out=out)
    fn()
    torch.cuda.synchronize()
    print(f"{tag} indexer_topk h{h} {ctx//1024}K {med(fn)*1000:8.2f} us", flush=True)
    del inp

"""A/B timing behind benchmarks/results/ab-h200-2026-12-02-pdl-late.txt (session 8, benchmarks/NOTES.md): graph-replay
medians of a few attention decode cases and of ``indexer_topk``, for whichever source tree is on PYTHONPATH (there:
the select loop unrolled, the PDL signal at the split kernel's start, and after its main loop):

    PYTHONPATH=<tree>/src python benchmarks/scripts/ab_pdl_late.py <tag>"""
import sys, torch
from triton_mla_sparse.bench import build_inputs, decode_case
from triton_mla_sparse.bench.cases import indexer_case
from triton_mla_sparse.bench.inputs import indexer_args
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config
from triton_mla_sparse.ops.indexer import indexer_topk
tag = sys.argv[1]
dev = torch.device("cuda")
def med(fn, n=5):
    return sorted(time_graph(fn) for _ in range(n))[n // 2]
for h, fmt in [(8, "fp8_ds_mla"), (16, "fp8_ds_mla"), (16, "bf16")]:
    c = decode_case(h, 64, fmt)
    inp = build_inputs(c, dev)
    q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale
    fn = lambda: sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt)
    print(f"{tag} decode h{h} {fmt:10s} {med(fn)*1000:8.2f} us", flush=True)
    del inp
for h, ctx in [(64, 32768), (64, 131072), (32, 131072)]:
    c = indexer_case(h, "decode", ctx=ctx)
    inp = build_inputs(c, dev)
    args = indexer_args(inp)
    out = torch.empty(c.rows, c.topk, dtype=torch.int32, device=dev)
    fn = lambda: indexer_topk(*args, c.topk, max_len=inp.max_len, out=out)
    fn()
    torch.cuda.synchronize()
    print(f"{tag} indexer h{h} {ctx//1024}K {med(fn)*1000:8.2f} us", flush=True)
    del inp

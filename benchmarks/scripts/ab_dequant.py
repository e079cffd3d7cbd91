"""A/B timing behind benchmarks/results/ab-h200-2026-12-02-dequant.txt (session 9, benchmarks/NOTES.md): graph-replay
medians of fp8_ds_mla decode (and do_bench of a prefill) for whichever source tree is on PYTHONPATH, with the largest
error against the float32 reference for pow2 (DeepSeek) and float32 (GLM) scales. There: three copies of src with
``ab_dequant.patch`` applied (the wgmma_t kernel's fp8_ds_mla dequantisation in float32 as committed, mode 0; in
packed bf16 with inline PTX, modes 1 and 2), ``DEQ_MODE`` set by sed in each:

    PYTHONPATH=<tree>/src python benchmarks/scripts/ab_dequant.py <tag>"""
import sys
from dataclasses import replace

import torch
from triton_mla_sparse.bench import build_inputs, decode_case
from triton_mla_sparse.bench.cases import prefill_case
from triton_mla_sparse.bench.timing import time_do_bench, time_graph
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config
from triton_mla_sparse.reference import sparse_mla_attention as reference

tag = sys.argv[1]
dev = torch.device("cuda")


def med(fn, n=5):
    return sorted(time_graph(fn) for _ in range(n))[n // 2]


for h, b, fmt in [(8, 64, "fp8_ds_mla"), (16, 64, "fp8_ds_mla"), (16, 256, "fp8_ds_mla"), (32, 64, "fp8_ds_mla"),
                  (16, 64, "bf16")]:
    c = decode_case(h, b, fmt)
    inp = build_inputs(c, dev)
    q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale
    fn = lambda: sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt)
    print(f"{tag} decode h{h} B={b} {fmt:10s} {med(fn)*1000:8.2f} us", flush=True)
    del inp
c = prefill_case(16, "fp8_ds_mla")
inp = build_inputs(c, dev)
fn = lambda: sparse_mla_attention_with_config(inp.q, inp.kv_cache, inp.indices, inp.softmax_scale,
                                              kv_format="fp8_ds_mla")
print(f"{tag} prefill h16 fp8_ds_mla {time_do_bench(fn):8.3f} ms", flush=True)
del inp
for sf in ("pow2", "fp32"):
    for h in (16, 32):
        c = replace(decode_case(h, 64, "fp8_ds_mla"), scale_format=sf)
        inp = build_inputs(c, dev, seed=1)
        out = sparse_mla_attention_with_config(inp.q, inp.kv_cache, inp.indices, inp.softmax_scale,
                                              kv_format="fp8_ds_mla")
        ref = reference(inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, kv_format="fp8_ds_mla")
        err = (out.float() - ref.float()).abs()
        print(f"{tag} error h{h} {sf}: max {err.max().item():.3e} mean {err.mean().item():.3e} "
              f"(|ref| max {ref.abs().max().item():.3e}) nan {out.isnan().any().item()}", flush=True)
        del inp

"""A/B timing behind benchmarks/results/ab-h200-2026-12-02-pdl-grid.txt (session 8, benchmarks/NOTES.md): graph-replay
medians of attention decode (the sm90 table and the sm120 table's mma2 entry, each with the combine kernel as a
programmatic dependent launch and without) and of the indexer's logits + split select (PDL chain on and off), for
whichever source tree is on PYTHONPATH (a tree without ``AttentionConfig.pdl`` runs the plain variants only):

    PYTHONPATH=src python benchmarks/scripts/ab_pdl_grid.py new
    PYTHONPATH=<checkout of 416f0da>/src python benchmarks/scripts/ab_pdl_grid.py old

The indexer part needs a tree whose ``SelectConfig`` has ``pdl`` (e2ba1a4) for its second variant."""
import dataclasses, sys, torch
from triton_mla_sparse.bench import build_inputs, decode_case
from triton_mla_sparse.bench.cases import indexer_case
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config
from triton_mla_sparse.ops.sparse_mla.configs import AttentionConfig, choose_config
from triton_mla_sparse.capabilities import ARCHS
tag = sys.argv[1]
has_pdl = "pdl" in {f.name for f in dataclasses.fields(AttentionConfig)}
dev = torch.device("cuda")
def med(fn, n=3):
    return sorted(time_graph(fn) for _ in range(n))[n // 2]
for h, fmt in [(8, "bf16"), (16, "fp8_ds_mla"), (16, "bf16"), (64, "bf16"), (128, "bf16")]:
    c = decode_case(h, 64, fmt)
    inp = build_inputs(c, dev)
    q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale
    port = choose_config(c.rows, h, c.topk, dev, "auto", kv_format=fmt, arch=ARCHS["sm120"], q_dtype=q.dtype)
    pover = {k: v for k, v in dataclasses.asdict(port).items() if k not in ("kernel", "split_len")}
    variants = [("table", "auto", {}), ("sm120", port.kernel, pover)]
    if has_pdl:
        variants += [("table-nopdl", "auto", {"pdl": False}), ("sm120-nopdl", port.kernel, dict(pover, pdl=False))]
    for name, kernel, over in variants:
        if not has_pdl:
            over = {k: v for k, v in over.items() if k != "pdl"}
        fn = lambda: sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt, kernel=kernel, **over)
        print(f"{tag} decode h{h} {fmt:10s} {name:12s} {med(fn)*1000:8.2f} us", flush=True)
    del inp
from triton_mla_sparse.ops.indexer.api import check_indexer_inputs, _launch_logits
from triton_mla_sparse.ops.indexer.configs import choose_indexer_config
from triton_mla_sparse.ops.topk.api import launch_select, select_workspace
from triton_mla_sparse.bench.inputs import indexer_args
for ctx in (32768, 131072):
    c = indexer_case(64, "decode", ctx=ctx)
    inp = build_inputs(c, dev)
    p = check_indexer_inputs(*indexer_args(inp))
    cfg0 = choose_indexer_config(p)
    L = inp.max_len
    logits = torch.empty(p.T, L, dtype=torch.float32, device=dev)
    out = torch.empty(p.T, c.topk, dtype=torch.int32, device=dev)
    ws = select_workspace(cfg0, p.T, dev)
    variants = [("pdl", cfg0)] + ([("nopdl", dataclasses.replace(cfg0, pdl=False))] if has_pdl else [])
    for name, cfg in variants:
        def fn(cfg=cfg):
            _launch_logits(p, logits, cfg, ws)
            launch_select(logits, out, c.topk, cfg, ws)
        print(f"{tag} indexer {ctx//1024}K {name:8s} {med(fn)*1000:8.2f} us", flush=True)
        def fl(cfg=cfg):
            _launch_logits(p, logits, cfg, ws)
        print(f"{tag} logits  {ctx//1024}K {name:8s} {med(fl)*1000:8.2f} us", flush=True)

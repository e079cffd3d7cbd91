"""A/B timing of the split select's chunk / step / tail sizes and per-position claims inside ``indexer_topk`` on decode rows (graph-replay
medians, µs) for whichever source tree is on PYTHONPATH; trees that lack a field skip the variants that set it.
Behind benchmarks/results/ab-h200-2026-12-03-select.txt (session 16), ab-h200-2026-12-03-fused.txt (session 19,
the fused variants) and ab-h200-2026-12-04-atomic.txt (session 21, per-position claims; benchmarks/NOTES.md):

    PYTHONPATH=<tree>/src python benchmarks/scripts/ab_select.py <tag> [VARIANT,VARIANT,...]

Per case (the bench's inputs: 64 requests, one row each at the end of the context): the public call, then the
logits launch + select under each variant (the table's logits configuration), then the select alone on fixed
logits; every variant's selection is checked against ``torch.topk``'s values first, and the rows' boundary-bin
sizes (the keys each row's last program resolves) are printed."""
import dataclasses
import statistics
import sys

import torch

from triton_mla_sparse.bench import build_inputs
from triton_mla_sparse.bench.cases import indexer_case
from triton_mla_sparse.bench.inputs import indexer_args
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.indexer import api as I
from triton_mla_sparse.ops.indexer import indexer_topk
from triton_mla_sparse.ops.topk import launch_select, select_workspace
from triton_mla_sparse.ops.topk import split_select as K

tag = sys.argv[1]
dev = torch.device("cuda")
TOPK = 2048
VARIANTS = {  # SelectConfig fields: split_chunk, split_block, split_tail, split_atomic (and fused: a patch's)
    "c8192 b1024": dict(split_chunk=8192, split_block=1024),
    "c8192 b1024 t1024": dict(split_chunk=8192, split_block=1024, split_tail=1024),
    "c8192 b1024 t512": dict(split_chunk=8192, split_block=1024, split_tail=512),
    "c8192 b1024 t256": dict(split_chunk=8192, split_block=1024, split_tail=256),
    "c8192 b2048 t512": dict(split_chunk=8192, split_block=2048, split_tail=512),
    "c8192 b4096 t512": dict(split_chunk=8192, split_block=4096, split_tail=512),
    "c8192 b8192 t512": dict(split_chunk=8192, split_block=8192, split_tail=512),
    "c4096 b1024 t512": dict(split_chunk=4096, split_block=1024, split_tail=512),
    "c16384 b2048 t512": dict(split_chunk=16384, split_block=2048, split_tail=512),
    # session 19: the steps as one launch (SelectConfig.fused: benchmarks/scripts/ab_select_fused.patch applied)
    "fused c8192 b4096 t512": dict(split_chunk=8192, split_block=4096, split_tail=512, fused=True),
    "fused c8192 b2048 t512": dict(split_chunk=8192, split_block=2048, split_tail=512, fused=True),
    "fused c8192 b1024 t512": dict(split_chunk=8192, split_block=1024, split_tail=512, fused=True),
    "fused c16384 b2048 t512": dict(split_chunk=16384, split_block=2048, split_tail=512, fused=True),
    # session 21: slots claimed per position where the boundary bin holds fewer than split_atomic keys
    "c8192 b4096 t512 a4096": dict(split_chunk=8192, split_block=4096, split_tail=512, split_atomic=4096),
    "c8192 b2048 t512 a4096": dict(split_chunk=8192, split_block=2048, split_tail=512, split_atomic=4096),
    "c8192 b1024 t512 a4096": dict(split_chunk=8192, split_block=1024, split_tail=512, split_atomic=4096),
    "c16384 b4096 t512 a4096": dict(split_chunk=16384, split_block=4096, split_tail=512, split_atomic=4096),
    "c4096 b4096 t512 a4096": dict(split_chunk=4096, split_block=4096, split_tail=512, split_atomic=4096),
    "c8192 b512 t512 a4096": dict(split_chunk=8192, split_block=512, split_tail=512, split_atomic=4096),
    "c8192 b1024 t256 a4096": dict(split_chunk=8192, split_block=1024, split_tail=256, split_atomic=4096),
    "c16384 b1024 t512 a4096": dict(split_chunk=16384, split_block=1024, split_tail=512, split_atomic=4096),
    "c4096 b1024 t512 a4096": dict(split_chunk=4096, split_block=1024, split_tail=512, split_atomic=4096),
    "c8192 b1024 t512": dict(split_chunk=8192, split_block=1024, split_tail=512),
}


if len(sys.argv) > 2:
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in sys.argv[2].split(",")}


def med(fn, n=5):
    return statistics.median(time_graph(fn) for _ in range(n)) * 1000


def values_match(logits, out, ref):
    got = logits.gather(1, out.long().clamp_min(0)).sort(1).values
    return torch.equal(got, ref)


for h, ctx in [(64, 131072), (64, 32768), (32, 131072)]:
    c = indexer_case(h, "decode", ctx=ctx)
    inp = build_inputs(c, dev)
    args = indexer_args(inp)
    p = I.check_indexer_inputs(*args)
    T, L = p.T, inp.max_len
    out = torch.empty(T, TOPK, dtype=torch.int32, device=dev)
    fn = lambda: indexer_topk(*args, TOPK, max_len=L, out=out)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    print(f"{tag} h{h} {ctx // 1024}K indexer_topk (table)       {med(fn):8.2f} us", flush=True)
    cfg0 = I.choose_indexer_config(p)
    logits = torch.empty(T, L, dtype=torch.float32, device=dev)
    I._launch_logits(p, logits, cfg0)
    ref = torch.topk(logits, TOPK, dim=1, sorted=False).values.sort(1).values
    for name, over in VARIANTS.items():
        if any(not hasattr(cfg0, k) for k in over):
            continue
        try:
            cfg = dataclasses.replace(cfg0, **over)
            ws = select_workspace(cfg, T, dev)

            def call(cfg=cfg, ws=ws):
                I._launch_logits(p, logits, cfg, ws)
                launch_select(logits, out, TOPK, cfg, ws)

            def select(cfg=cfg):
                K.launch_split_select(logits, out, TOPK, cfg)

            select()
            torch.cuda.synchronize()
            ok = values_match(logits, out, ref)
            sel_ws, _ = K.launch_split_select(logits, out, TOPK, cfg)
            n_bound = sel_ws[:, K.NREP * K.NBINS + 9].float()
            call()
            torch.cuda.synchronize()
            ok = ok and values_match(logits, out, ref)
            print(f"{tag} h{h} {ctx // 1024}K {name:22s} logits+select {med(call):8.2f} us  select {med(select):7.2f}"
                  f" us  match {ok}  n_bound mean {n_bound.mean():.0f} max {n_bound.max():.0f}", flush=True)
        except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the others still run
            print(f"{tag} h{h} {ctx // 1024}K {name:22s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    del inp, logits

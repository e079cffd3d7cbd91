"""Sweep the indexer kernels' launch parameters on the GPU (offline tuning aid; prints a table, writes nothing).

    python benchmarks/scripts/indexer_sweep.py [--quick]

Cases (the bench's indexer inputs): decode (64 requests, one row each at the end of a 32K / 128K context) and
prefill (4096 causal rows over 32K), 64 and 32 fp8 index heads, paged block 64. Times (do_bench median, ms) the logits kernel for each
(block_k, chunk_tiles, num_warps, num_stages) and the selection (the split select vs torch.topk) on the same logits.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

from triton_mla_sparse import bench
from triton_mla_sparse.ops.indexer import api as I
from triton_mla_sparse.ops.topk.split_select import launch_split_select

D, TOPK = 128, 2048


def make(kind: str, Hi: int, ctx: int) -> tuple[tuple, int]:
    """The bench's inputs of an indexer case (64 decode rows, or 4096 prefill rows) and the logits width."""
    inp = bench.build_indexer_inputs(bench.indexer_case(Hi, kind, ctx=ctx), "cuda")
    return bench.indexer_args(inp), inp.max_len


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--wide", action="store_true", help="larger tiles and chunks around the chosen config")
    ap.add_argument("--no-select", action="store_true", help="time the logits kernel only")
    ap.add_argument("--only", default="", help="decode or prefill: run only those cases")
    ap.add_argument("--maxnreg", default="0", help="comma list of register caps to try (0 = none)")
    ap.add_argument("--nrep", default="", help="comma list of histogram copies to try in the split select")
    a = ap.parse_args()
    cases = [("decode", 64, 32768), ("decode", 64, 131072), ("decode", 32, 131072), ("prefill", 64, 32768),
             ("prefill", 32, 32768)]
    grid = list(itertools.product((64, 128), (16, 64), (4, 8), (2, 3)))
    if a.wide:
        grid = list(itertools.product((128, 256), (8, 16, 32), (4, 8), (2, 3)))
    if a.quick:
        grid = [(128, 16, 4, 2), (128, 32, 4, 2), (128, 16, 4, 3), (64, 16, 4, 2)]
    caps = [int(x) or None for x in a.maxnreg.split(",")]
    grid = [g + (cap,) for g in grid for cap in caps]
    for kind, Hi, ctx in cases:
        if a.only and kind != a.only:
            continue
        args, L = make(kind, Hi, ctx)
        p = I.check_indexer_inputs(*args)
        out = torch.empty(p.T, L, dtype=torch.float32, device="cuda")
        res = []
        for bk, ct, w, st, cap in grid:
            cfg = I.choose_indexer_config(p, block_k=bk, chunk_tiles=ct, num_warps=w, num_stages=st, maxnreg=cap)
            try:
                I._launch_logits(p, out, cfg)
                ms = triton.testing.do_bench(lambda: I._launch_logits(p, out, cfg), warmup=5, rep=40)
            except Exception as e:  # noqa: BLE001
                print(f"{kind} h{Hi} {ctx}: bk{bk} ct{ct} w{w} s{st} r{cap} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            gbps = p.T * (ctx if kind == "decode" else ctx - 2048) * (D + 4) / ms / 1e6
            res.append((ms, bk, ct, w, st, cap or 0, gbps))
        res.sort()
        for ms, bk, ct, w, st, cap, gbps in res[:6]:
            print(f"{kind} h{Hi} ctx{ctx}: logits {ms:.4f} ms  bk{bk} ct{ct} w{w} s{st} r{cap}  ({gbps:.0f} GB/s of K)")
        if a.no_select:
            continue
        sel = torch.empty(p.T, TOPK, dtype=torch.int32, device="cuda")
        cfg = I.choose_indexer_config(p)
        from triton_mla_sparse.ops.topk import split_select as K

        nreps, nrep0 = [int(x) for x in a.nrep.split(",") if x] or [K.NREP], K.NREP
        for chunk, blk, nrep in [(c, b, r) for c, b in ((8192, 2048), (4096, 2048), (16384, 2048)) for r in nreps]:
            K.NREP = nrep
            c3 = I.choose_indexer_config(p, split_chunk=chunk, split_block=blk)
            ms = triton.testing.do_bench(lambda: launch_split_select(out, sel, TOPK, c3), warmup=5, rep=40)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                launch_split_select(out, sel, TOPK, c3)
            gms = triton.testing.do_bench(g.replay, warmup=5, rep=40)
            print(f"{kind} h{Hi} ctx{ctx}: select split {ms:.4f} ms (graph {gms:.4f}; chunk {chunk}, block {blk}, "
                  f"copies {nrep})")
        K.NREP = nrep0
        ms = triton.testing.do_bench(lambda: torch.topk(out, TOPK, dim=-1, sorted=False), warmup=5, rep=40)
        print(f"{kind} h{Hi} ctx{ctx}: torch.topk {ms:.4f} ms; default cfg {cfg}", flush=True)


if __name__ == "__main__":
    main()

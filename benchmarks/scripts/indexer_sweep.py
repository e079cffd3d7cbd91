"""Sweep the indexer kernels' launch parameters on the GPU (offline tuning aid; prints a table, writes nothing).

    python benchmarks/scripts/indexer_sweep.py [--quick] [--family tl|wgmma|both]

Cases (the bench's indexer inputs): decode (64 requests, one row each at the end of a 32K / 128K context) and
prefill (4096 causal rows over 32K), 64 and 32 fp8 index heads, paged block 64. Times (do_bench median, ms) the
logits kernel for each tl configuration (block_k, chunk_tiles, num_warps, num_stages) and, on decode cases, each
configuration of the Gluon wgmma kernel (chunk_tiles x num_stages: --wgmma-chunks, --wgmma-stages; sm90), then the
selection (the split select vs torch.topk) on the same logits.
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
    ap.add_argument("--family", default="both", choices=("tl", "wgmma", "both"), help="logits kernels to sweep")
    ap.add_argument("--wgmma-chunks", default="4,8,16,32,64", help="comma list of wgmma chunk_tiles (64 positions)")
    ap.add_argument("--wgmma-stages", default="2,3,4,5,6,8", help="comma list of wgmma ring depths")
    a = ap.parse_args()
    cases = [("decode", 64, 32768), ("decode", 64, 131072), ("decode", 32, 131072), ("prefill", 64, 32768),
             ("prefill", 32, 32768)]
    grid = list(itertools.product((64, 128), (16, 64), (4, 8), (2, 3)))
    if a.wide:
        grid = list(itertools.product((128, 256), (8, 16, 32), (4, 8), (2, 3)))
    if a.quick:
        grid = [(128, 16, 4, 2), (128, 32, 4, 2), (128, 16, 4, 3), (64, 16, 4, 2)]
    caps = [int(x) or None for x in a.maxnreg.split(",")]
    # (family, overrides) of every logits configuration; the tl grid names its family (sm90's decode table entry
    # is the wgmma kernel)
    grid = [("tl", dict(block_k=bk, chunk_tiles=ct, num_warps=w, num_stages=st, maxnreg=cap))
            for bk, ct, w, st in grid for cap in caps] if a.family != "wgmma" else []
    wg = list(itertools.product([int(x) for x in a.wgmma_chunks.split(",")],
                                [int(x) for x in a.wgmma_stages.split(",")]))
    if a.quick:
        wg = [(16, 4), (32, 4), (16, 3), (8, 4), (16, 6)]
    wgmma_grid = [("wgmma", dict(chunk_tiles=ct, num_stages=st, maxnreg=cap))
                  for ct, st in wg for cap in caps] if a.family != "tl" else []
    for kind, Hi, ctx in cases:
        if a.only and kind != a.only:
            continue
        args, L = make(kind, Hi, ctx)
        p = I.check_indexer_inputs(*args)
        out = torch.empty(p.T, L, dtype=torch.float32, device="cuda")
        res = []
        for family, over in grid + (wgmma_grid if kind == "decode" else []):
            label = f"{family} " + " ".join(f"{k}={v}" for k, v in over.items() if v is not None)
            try:
                cfg = I.choose_indexer_config(p, family=family, **over)
                I._launch_logits(p, out, cfg)
                ms = triton.testing.do_bench(lambda: I._launch_logits(p, out, cfg), warmup=5, rep=40)
            except Exception as e:  # noqa: BLE001
                print(f"{kind} h{Hi} {ctx}: {label} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            gbps = p.T * (ctx if kind == "decode" else ctx - 2048) * (D + 4) / ms / 1e6
            res.append((ms, label, gbps))
        res.sort()
        best = res[:6] + [r for f in ("tl", "wgmma") for r in [x for x in res if x[1].startswith(f)][:1]
                          if r not in res[:6]]
        for ms, label, gbps in best:
            print(f"{kind} h{Hi} ctx{ctx}: logits {ms:.4f} ms  {label}  ({gbps:.0f} GB/s of K)")
        cfg = I.choose_indexer_config(p)
        ms = triton.testing.do_bench(lambda: I._launch_logits(p, out, cfg), warmup=5, rep=40)
        print(f"{kind} h{Hi} ctx{ctx}: logits {ms:.4f} ms  default ({cfg.family} chunk_tiles={cfg.chunk_tiles} "
              f"num_stages={cfg.num_stages})", flush=True)
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

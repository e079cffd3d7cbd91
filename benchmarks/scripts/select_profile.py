"""Where the time of ``indexer_topk`` goes on decode rows (offline aid for the split select; prints, writes nothing).

    python benchmarks/scripts/select_profile.py [--cases h64-128K,h32-128K,...] [--nrep 8,32]

For each decode case (the bench's inputs: 64 requests, one row each at the end of the context, 64 or 32 fp8 index
heads) it times under CUDA-graph replay (median ms): the whole call, the logits kernel, the split select on the
same logits (with and without its bound pass, and over a few chunk/block sizes), ``torch.topk`` (unsorted), and a
plain read of the logits (``amax``) as the bandwidth yardstick; then the candidates the histogram counted, the
boundary-bin sizes (``n_bound``: candidates the row's last program resolves alone) and a per-kernel breakdown from
the torch profiler.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch
from triton.testing import do_bench_cudagraph

from triton_mla_sparse import bench as B
from triton_mla_sparse.ops.indexer import api as I
from triton_mla_sparse.ops.topk import split_select as K

TOPK = 2048
CASES = {"h64-32K": (64, 32768), "h64-128K": (64, 131072), "h32-32K": (32, 32768), "h32-128K": (32, 131072)}


def graph_ms(fn, rep=60):
    return do_bench_cudagraph(fn, rep=rep, return_mode="median")


def run_case(label, heads, ctx, nreps):
    case = B.indexer_case(heads, "decode", ctx=ctx)
    inp = B.build_indexer_inputs(case, "cuda")
    args = B.indexer_args(inp)
    p = I.check_indexer_inputs(*args)
    L = inp.max_len
    T = p.T
    cfg = I.choose_indexer_config(p)
    logits = torch.empty(T, L, dtype=torch.float32, device="cuda")
    out = torch.empty(T, TOPK, dtype=torch.int32, device="cuda")
    I._launch_logits(p, logits, cfg)
    ref = torch.topk(logits, TOPK, dim=1, sorted=False)
    print(f"\n== {label}: {T} rows x {L}, config {cfg}")
    res = {}

    for nrep in nreps:
        K.NREP = nrep
        tag = f"nrep{nrep}"

        def full():
            I.indexer_topk(*args, TOPK, max_len=L, out=out)

        def logits_only():
            I._launch_logits(p, logits, cfg)

        def select(c):
            return lambda: K.launch_split_select(logits, out, TOPK, c)

        timings = [("full", full), ("logits", logits_only), ("select", select(cfg)),
                   ("select, no bound", select(dataclasses.replace(cfg, bound=False)))]
        for chunk, block in ((8192, 2048), (4096, 2048), (4096, 1024), (16384, 2048), (8192, 1024)):
            timings.append((f"select c{chunk} b{block}",
                            select(dataclasses.replace(cfg, split_chunk=chunk, split_block=block))))
        for name, fn in timings:
            fn()
            torch.cuda.synchronize()
            res[f"{tag} {name}"] = graph_ms(fn)
        full()
        got = logits.gather(1, out.long().clamp_min(0)).sort(1).values
        want = ref.values.sort(1).values
        print(f"  {tag}: top-k values match torch.topk: {torch.equal(got, want)}")
        ws, _ = K.launch_split_select(logits, out, TOPK, cfg)
        torch.cuda.synchronize()
        sl = ws[:, nrep * K.NBINS:].long()
        counted = ws[:, :nrep * K.NBINS].sum(1).float()
        print(f"  {tag}: counted per row mean {counted.mean():.0f} (of {L}); "
              f"n_above mean {sl[:, 7].float().mean():.0f}; "
              f"n_bound mean {sl[:, 9].float().mean():.0f} max {sl[:, 9].max()}")
    K.NREP = nreps[0]
    res["torch.topk"] = graph_ms(lambda: torch.topk(logits, TOPK, dim=1, sorted=False))
    res["amax (read)"] = graph_ms(lambda: logits.amax(1))
    for k, v in res.items():
        print(f"  {k:36s} {v:.4f} ms")

    try:
        profile_breakdown(args, L, out)
    except Exception as e:  # noqa: BLE001 - a profiler problem is reported, not fatal
        print(f"  profiler: {type(e).__name__}: {str(e)[:120]}")


def profile_breakdown(args, L, out):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            I.indexer_topk(*args, TOPK, max_len=L, out=out)
        torch.cuda.synchronize()
    agg = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            agg.setdefault(e.name[:60], []).append(e.device_time_total if hasattr(e, "device_time_total")
                                                  else e.cuda_time_total)
    for name, ts in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
        print(f"  profiler: {name:60s} x{len(ts):3d}  median {statistics.median(ts) / 1000:.4f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="h64-128K,h32-128K,h64-32K")
    ap.add_argument("--nrep", default="8")
    a = ap.parse_args()
    nreps = [int(x) for x in a.nrep.split(",")]
    for label in a.cases.split(","):
        heads, ctx = CASES[label]
        run_case(label, heads, ctx, nreps)


if __name__ == "__main__":
    main()

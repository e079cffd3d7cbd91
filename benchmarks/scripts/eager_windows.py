"""How stable are eager (do_bench) figures of sub-0.5 ms calls on the lent GPU machine? For the bench's decode
indexer cases, times ours / ours_logits / deepgemm / deepgemm_topk in interleaved rounds (one do_bench window per
method per round, the bench's eager timer) and prints every round, so a transient slowdown of one window shows as
one outlier rather than as a method's figure.

    python benchmarks/scripts/eager_windows.py [rounds]
"""

from __future__ import annotations

import sys

import torch

from triton_mla_sparse import bench

METHODS = ("ours", "ours_logits", "deepgemm", "deepgemm_topk")


def main(rounds: int = 6) -> None:
    peers = bench.load_peers(None, wanted=("deepgemm", "deepgemm_topk"))
    facs = bench.method_factories(peers)
    timer = bench.DoBenchTimer(1, rep=50)
    for heads, ctx in ((64, 32768), (32, 32768), (64, 131072)):
        case = bench.indexer_case(heads, "decode", ctx=ctx)
        inp = bench.build_inputs(case, "cuda")
        fns = {}
        for m in METHODS:
            try:
                prep = facs[m](inp)
                prep.fn()
                fns[m] = prep.fn
            except Exception as e:  # noqa: BLE001 - a missing peer is reported, the rest runs
                print(f"{case.name}: {m} unavailable: {type(e).__name__}: {e}")
        torch.cuda.synchronize()
        rows = {m: [] for m in fns}
        for _ in range(rounds):
            for m, fn in fns.items():
                rows[m].append(timer(fn))
        print(case.name)
        for m, v in rows.items():
            print(f"  {m:14s} " + " ".join(f"{x:.4f}" for x in v) + f"   min {min(v):.4f} max {max(v):.4f}")
        del inp, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)

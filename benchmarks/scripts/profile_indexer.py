"""Run one indexer decode case (the bench's inputs) a few times so `ncu` can capture its kernels:

    ncu --clock-control none --launch-skip 8 --launch-count 4 -k regex:"indexer_logits|topk_" \
        python benchmarks/scripts/profile_indexer.py [heads] [ctx]

(defaults 64 heads, 131072 positions; each call launches the logits kernel, then the split select's bound,
histogram and select kernels)."""

from __future__ import annotations

import sys

import torch

from triton_mla_sparse.bench import build_inputs
from triton_mla_sparse.bench.cases import indexer_case
from triton_mla_sparse.bench.inputs import indexer_args
from triton_mla_sparse.ops.indexer import indexer_topk


def main() -> None:
    heads = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 131072
    inp = build_inputs(indexer_case(heads, "decode", ctx=ctx), torch.device("cuda"))
    args = indexer_args(inp)
    out = torch.empty(inp.q.shape[0], 2048, dtype=torch.int32, device="cuda")
    for _ in range(4):
        indexer_topk(*args, 2048, max_len=inp.max_len, out=out)
    torch.cuda.synchronize()
    print("indexer", heads, ctx, "done")


if __name__ == "__main__":
    main()

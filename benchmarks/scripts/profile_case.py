"""Run one sweep case a few times so `ncu` can capture a launch of our kernel.

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:_sparse_mla_fwd \
        python benchmarks/scripts/profile_case.py decode_h16 bf16 [key=value config overrides...]

(integer values as ints, True / False as bools, others as strings: ``family=mma2 block_h=32 dsplit=True``)
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import case_for  # noqa: E402

from triton_mla_sparse.bench import build_inputs  # noqa: E402
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config  # noqa: E402


def main() -> None:
    name, fmt = sys.argv[1], sys.argv[2]
    over = {}
    for kv in sys.argv[3:]:
        k, v = kv.split("=")
        over[k] = {"True": True, "False": False}.get(v, int(v) if v.lstrip("-").isdigit() else v)  # family=mma2
    case = case_for(name, fmt)
    inp = build_inputs(case, "cuda")
    kernel = "prefill" if case.kind == "prefill" else "auto"
    for _ in range(4):
        _, cfg = sparse_mla_attention_with_config(inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, kernel=kernel,
                                                  return_config=True, **over)
    torch.cuda.synchronize()
    print(name, fmt, cfg)


if __name__ == "__main__":
    main()

"""Run one sweep case a few times so `ncu` can capture a launch of our kernel.

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:_sparse_mla_fwd \
        python benchmarks/profile_case.py decode_h16 bf16 [key=value config overrides...]
"""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from sweep import CASES, make_case  # noqa: E402

from triton_mla_sparse.api import sparse_mla_attention_with_config  # noqa: E402


def main():
    name, fmt = sys.argv[1], sys.argv[2]
    over = {}
    for kv in sys.argv[3:]:
        k, v = kv.split("=")
        over[k] = int(v)
    case = dict(CASES[name])
    prefill = case.pop("prefill", False)
    q, kv, idx = make_case(**case, fmt=fmt, prefill=prefill)
    for _ in range(4):
        _, cfg = sparse_mla_attention_with_config(q, kv, idx, 192 ** -0.5, kernel="prefill" if prefill else "auto",
                                                  return_config=True, **over)
    torch.cuda.synchronize()
    print(name, fmt, cfg)


if __name__ == "__main__":
    main()

"""Where the host time of one eager call goes (GPU machine): per-call wall time of the public call and of its
parts on a tiny decode problem, whose GPU work is shorter than its launch, so the loop runs at host speed.

    python benchmarks/host_overhead.py
"""

from __future__ import annotations

import time

import torch

import triton_mla_sparse as tms
from triton_mla_sparse import api
from triton_mla_sparse._checks import check_attention_inputs
from triton_mla_sparse.kernels.attention import launch_sparse_mla


def per_call_us(fn, n=400):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    dev = torch.device("cuda")
    for H, fmt in ((16, "bf16"), (128, "bf16"), (16, "fp8_ds_mla")):
        q = torch.randn(1, H, 576, dtype=torch.bfloat16, device=dev)
        kv = torch.randn(64, 64, 576, dtype=torch.bfloat16, device=dev)
        if fmt == "fp8_ds_mla":
            kv = tms.formats.quantize_fp8_ds_mla(kv)
        idx = torch.randint(0, 4096, (1, 64), dtype=torch.int32, device=dev)
        p = check_attention_inputs(q, kv, idx, 0.1)
        cfg = api._choose_config(p.T, p.H, p.topk, dev, "auto", p.kv_format, api.arch_for_device(dev))
        out = torch.empty(1, H, 512, dtype=torch.bfloat16, device=dev)
        rows = {
            "sparse_mla_attention": lambda: tms.sparse_mla_attention(q, kv, idx, 0.1),
            "  check_attention_inputs": lambda: check_attention_inputs(q, kv, idx, 0.1),
            "  config (memoised)": lambda: api._choose_config(p.T, p.H, p.topk, dev, "auto", p.kv_format,
                                                              api.arch_for_device(dev)),
            "  torch.empty x1": lambda: torch.empty(1, H, 512, dtype=torch.bfloat16, device=dev),
            "  launch_sparse_mla (kernels only)": lambda: launch_sparse_mla(p, cfg, out),
            "torch.add (one tiny torch op)": lambda: torch.add(q, 1.0),
        }
        print(f"H={H} {fmt} cfg={cfg.kernel} splits={cfg.num_splits}")
        for name, fn in rows.items():
            print(f"  {name:40s} {per_call_us(fn):7.1f} us/call", flush=True)


if __name__ == "__main__":
    main()

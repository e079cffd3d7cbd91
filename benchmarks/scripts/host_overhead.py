"""Where the host time of one eager call goes (GPU machine): per-call wall time of the public call and of its
parts on a tiny decode problem, whose GPU work is shorter than its launch, so the loop runs at host speed.

    python benchmarks/scripts/host_overhead.py [--indexer]   (--indexer: only the indexer rows)
"""

from __future__ import annotations

import time

import torch

import triton_mla_sparse as tms
from triton_mla_sparse import bench
from triton_mla_sparse.capabilities import arch_for_device
from triton_mla_sparse.ops.sparse_mla.api import _choose_config, check_attention_inputs
from triton_mla_sparse.ops.sparse_mla.kernels import launch_sparse_mla


def _timed_loop(fn, n, warmup):
    """(host µs per call when the loop's last call returns, wall µs per call after the GPU drained), after
    ``warmup`` calls and a synchronisation."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t) / n * 1e6


def per_call_us(fn, n=400):
    """Wall time per call of ``fn`` over a long loop (host-bound for small problems)."""
    return _timed_loop(fn, n, warmup=20)[1]


def indexer_rows():
    """The indexer's eager path on 4 decode rows x 512 positions (fp8 q and cache, 64 heads): the public
    ``indexer_topk`` and each of its parts, plus the pieces of one Triton launch through a compiled kernel."""
    import triton

    from triton_mla_sparse.ops.indexer import api as ix
    from triton_mla_sparse.ops.indexer.configs import choose_indexer_config
    from triton_mla_sparse.ops.indexer.kernels import launch_indexer_logits
    from triton_mla_sparse.ops.topk import split_select as kix

    dev = torch.device("cuda")
    T, H, bs, ctx = 4, 64, 64, 512
    inp = bench.build_indexer_inputs(bench.indexer_case(H, "decode", rows=T, ctx=ctx, block_size=bs), dev)
    q, w, kc, bt, req, pos = bench.indexer_args(inp)
    p = ix.check_indexer_inputs(q, w, kc, bt, req, pos)
    cfg = choose_indexer_config(p)
    logits = torch.empty(T, ctx, dtype=torch.float32, device=dev)
    out = torch.empty(T, 2048, dtype=torch.int32, device=dev)
    ws, buf = kix.split_select_workspace(T, ctx, dev)
    n_chunks = max(1, triton.cdiv(ctx, cfg.split_chunk))
    hist_args = (logits, ws, logits.stride(0), logits.stride(1), ws.stride(0), ctx, n_chunks, 2048)
    const = dict(CHUNK=cfg.split_chunk, BLOCK=cfg.split_block, NB=kix.NBINS, NREP=kix.NREP)
    grid = (T * n_chunks, 1, 1)
    kix._launch_hist(grid, hist_args, const, num_warps=8)
    compiled = next(iter(kix._launch_hist.cache.values()))
    full = (*hist_args, *const.values())
    from triton.runtime import driver

    def raw_run():  # the compiled kernel's launcher, device/stream/hooks looked up here instead of per call
        compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, None, None, None, *full)

    stream = driver.active.get_current_stream(driver.active.get_current_device())
    rows = {
        "indexer_topk (public, split select)": lambda: ix.indexer_topk(q, w, kc, bt, req, pos, 2048),
        "indexer_topk (public, torch.topk)": lambda: ix.indexer_topk(q, w, kc, bt, req, pos, 2048, select="torch"),
        "indexer_logits (public)": lambda: ix.indexer_logits(q, w, kc, bt, req, pos, ctx),
        "  check_indexer_topk_inputs": lambda: ix.check_indexer_topk_inputs(q, w, kc, bt, req, pos, 2048, None,
                                                                            None),
        "  choose_indexer_config": lambda: ix.choose_indexer_config(p),
        "  torch.empty x1": lambda: torch.empty(T, ctx, dtype=torch.float32, device=dev),
        "  split_select_workspace (zeros + empty)": lambda: kix.split_select_workspace(T, ctx, dev),
        "  launch_indexer_logits": lambda: launch_indexer_logits(p, logits, cfg),
        "  launch_split_select": lambda: kix.launch_split_select(logits, out, 2048, cfg),
        "  hist launch (CachedLauncher)": lambda: kix._launch_hist(grid, hist_args, const, num_warps=8),
        "  hist launch (compiled[grid](*args))": lambda: compiled[grid](*full),
        "  hist launch (compiled.run, stream given)": raw_run,
        "  driver get_current_device + stream": lambda: driver.active.get_current_stream(
            driver.active.get_current_device()),
        "torch.topk 4 x 512 (k 256)": lambda: torch.topk(logits, 256, dim=1, sorted=False),
        "torch.add (one tiny torch op)": lambda: torch.add(w, 1.0),
    }
    print(f"indexer T={T} H={H} ctx={ctx} select={cfg.select} chunk={cfg.split_chunk}")
    for name, fn in rows.items():
        try:
            print(f"  {name:44s} {per_call_us(fn):7.1f} us/call", flush=True)
        except Exception as e:  # internal Triton APIs (compiled.run) differ between versions
            print(f"  {name:44s} failed: {type(e).__name__}: {e}", flush=True)


def enqueue_us(fn, n=12):
    """Host time per call of ``fn`` while the GPU is still busy with earlier calls (the queue never drains, so
    this is the host's enqueue time, not the GPU's)."""
    return _timed_loop(fn, n, warmup=3)


def indexer_real_sizes():
    """Host enqueue time against wall time per call at the bench's decode indexer sizes (64 rows x 32K / 128K)."""
    for heads, ctx in ((64, 32768), (32, 32768), (64, 131072)):
        inp = bench.build_indexer_inputs(bench.indexer_case(heads, "decode", ctx=ctx), "cuda")
        a = bench.indexer_args(inp)
        logits = tms.indexer_logits(*a, ctx)
        for name, fn in (("indexer_topk", lambda: tms.indexer_topk(*a, 2048)),
                         ("indexer_logits", lambda: tms.indexer_logits(*a, ctx)),
                         ("torch.topk unsorted", lambda: torch.topk(logits, 2048, dim=1, sorted=False))):
            host, wall = enqueue_us(fn)
            print(f"  h{heads} 64 x {ctx // 1024}K {name:22s} host {host:7.1f} us/call   wall {wall:7.1f} us/call",
                  flush=True)


def main():
    import sys

    if "--indexer" in sys.argv[1:]:
        indexer_rows()
        indexer_real_sizes()
        return
    dev = torch.device("cuda")
    for H, fmt in ((16, "bf16"), (128, "bf16"), (16, "fp8_ds_mla")):
        inp = bench.build_inputs(bench.decode_case(H, 1, fmt, ctx=4096, topk=64), dev)
        q, kv, idx = inp.q, inp.kv_cache, inp.indices
        p = check_attention_inputs(q, kv, idx, 0.1)
        cfg = _choose_config(p.T, p.H, p.topk, dev, "auto", p.kv_format, arch_for_device(dev), p.dtype)
        out = torch.empty(1, H, 512, dtype=torch.bfloat16, device=dev)
        rows = {
            "sparse_mla_attention": lambda: tms.sparse_mla_attention(q, kv, idx, 0.1),
            "  check_attention_inputs": lambda: check_attention_inputs(q, kv, idx, 0.1),
            "  config (memoised)": lambda: _choose_config(p.T, p.H, p.topk, dev, "auto", p.kv_format,
                                                              arch_for_device(dev), p.dtype),
            "  torch.empty x1": lambda: torch.empty(1, H, 512, dtype=torch.bfloat16, device=dev),
            "  launch_sparse_mla (kernels only)": lambda: launch_sparse_mla(p, cfg, out),
            "torch.add (one tiny torch op)": lambda: torch.add(q, 1.0),
        }
        print(f"H={H} {fmt} cfg={cfg.kernel} splits={cfg.num_splits}")
        for name, fn in rows.items():
            print(f"  {name:40s} {per_call_us(fn):7.1f} us/call", flush=True)


if __name__ == "__main__":
    main()

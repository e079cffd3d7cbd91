"""Where a decode call's graph time goes: the public call, the split kernel alone (the combine launch skipped), and
the kernels' own durations from the torch profiler over graph replays. Behind session 17's notes on the
fp8_ds_mla h16 row (benchmarks/NOTES.md):

    PYTHONPATH=<tree>/src python benchmarks/scripts/ab_decode_parts.py <tag> [quick]

With a tree that has ``AttentionConfig.merge``, each case runs with the combine kernel and with the in-kernel
merge, and says whether the two outputs agree bitwise."""
import statistics
import sys
from collections import defaultdict

import torch

from triton_mla_sparse.bench import build_inputs, decode_case
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.sparse_mla import kernels as K
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config

tag = sys.argv[1]
dev = torch.device("cuda")


def med(fn, n=5):
    return statistics.median(time_graph(fn) for _ in range(n)) * 1000


def kernel_times(fn, replays=40):
    """Mean device µs per call of each kernel, over ``replays`` graph replays."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    acc = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            acc[ev.name[:40]] += ev.device_time / replays
    return dict(acc)


real_combine = K._launch_combine
CASES = [(16, "fp8_ds_mla", 64), (8, "fp8_ds_mla", 64), (16, "bf16", 64), (8, "bf16", 64), (16, "fp8_ds_mla", 256),
         (16, "bf16", 256)]
QUICK = len(sys.argv) > 2 and sys.argv[2] == "quick"  # the B=64 cases at 16 and 8 heads (fp8) and 16 (bf16), one round
for h, fmt, b in CASES[:3] if QUICK else CASES:
    c = decode_case(h, b, fmt)
    inp = build_inputs(c, dev)
    q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale

    def fn(**over):
        return sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt, **over)

    try:  # trees with the in-kernel split merge
        merged = fn(merge=True)
        plain = fn(merge=False)
        torch.cuda.synchronize()
        same = torch.equal(merged, plain)
        variants = {"combine": dict(merge=False), "merge": dict(merge=True)}
    except (TypeError, ValueError):
        same, variants = None, {"table": {}}
    for rnd in range(1 if QUICK else 2):
        parts = []
        for name, over in variants.items():
            K._launch_combine = real_combine
            parts.append(f"{name} {med(lambda: fn(**over)):7.2f}")
        K._launch_combine = lambda *a, **k: None
        parts.append(f"split kernel alone {med(lambda: fn(merge=False) if same is not None else fn()):7.2f}")
        K._launch_combine = real_combine
        print(f"{tag} decode h{h} B={b} {fmt:10s} round {rnd}: " + ", ".join(parts) + " us"
              + ("" if same is None else f" (merge == combine bitwise: {same})"), flush=True)
    if b == 64:
        for name, us in kernel_times(lambda: fn(**list(variants.values())[-1])).items():
            print(f"{tag}   profiler h{h} {fmt:10s} {name:40s} {us:7.2f} us", flush=True)
    del inp

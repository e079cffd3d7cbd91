"""GPU tier of the cached launcher (_common/launch.py): repeated launches of a known specialisation (through the
cached ``CompiledKernel``) give the same results as the first, Triton-launched call, and a launch-enter hook (as
profilers set) sees every launch. Skipped without a CUDA GPU."""

from __future__ import annotations

import pytest
import torch

import triton_mla_sparse as tms

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _case(T=8, Hi=32, bs=64, ctx=1024):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(T, Hi, 128, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(T, Hi, device="cuda", generator=g)
    k = torch.randn(T * ctx // bs, bs, 128, device="cuda", generator=g).to(torch.bfloat16)
    bt = torch.arange(T * ctx // bs, dtype=torch.int32, device="cuda").view(T, -1)
    req = torch.arange(T, dtype=torch.int32, device="cuda")
    pos = torch.randint(0, ctx, (T,), dtype=torch.int32, device="cuda", generator=g)
    return q, w, k, bt, req, pos, ctx


def test_cached_launches_match_the_first_call():
    from triton_mla_sparse.ops.indexer import kernels as logits_kernels
    from triton_mla_sparse.ops.topk import split_select

    q, w, k, bt, req, pos, ctx = _case()
    first = tms.indexer_logits(q, w, k, bt, req, pos, ctx)  # may compile: Triton's own launch
    first_topk = tms.indexer_topk(q, w, k, bt, req, pos, 64, select="split")
    for _ in range(3):
        assert torch.equal(tms.indexer_logits(q, w, k, bt, req, pos, ctx), first)
        assert torch.equal(torch.sort(tms.indexer_topk(q, w, k, bt, req, pos, 64, select="split"), 1).values,
                           torch.sort(first_topk, 1).values)
    torch.cuda.synchronize()
    for launcher in (logits_kernels._launch_logits, split_select._launch_hist, split_select._launch_split_select):
        assert launcher.cache, launcher.kernel  # the later calls went through the cache


def test_launch_enter_hook_sees_every_launch():
    from triton import knobs

    q, w, k, bt, req, pos, ctx = _case()
    tms.indexer_logits(q, w, k, bt, req, pos, ctx)  # compiled and cached before the hook is set
    seen = []
    old = knobs.runtime.launch_enter_hook
    knobs.runtime.launch_enter_hook = lambda metadata: seen.append(metadata)
    try:
        for _ in range(3):
            tms.indexer_logits(q, w, k, bt, req, pos, ctx)
    finally:
        knobs.runtime.launch_enter_hook = old
    assert len(seen) == 3 and all(m is not None for m in seen)

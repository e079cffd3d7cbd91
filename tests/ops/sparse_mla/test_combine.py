"""The split-merge kernel alone, on hand-made partials: the exact log-sum-exp merge its docstring defines, for every
split count around its group size (a last group part-filled), empty splits (lse -inf) whose partial output is
garbage, splits whose weight underflows to 0, heads past H, and the sink."""

import math

import pytest
import torch

from helpers import DEVICE

from triton_mla_sparse.ops.sparse_mla import kernels as K

H, D = 5, 512


def _merge_reference(part_o, part_lse2, sink):
    """float64 merge of [S, H, D] partial outputs with base-2 lse [S, H]: splits of weight 0 add nothing."""
    lse2 = part_lse2.double()
    m = lse2.max(0).values
    m_use = torch.where(m == -math.inf, torch.zeros_like(m), m)
    w = torch.exp2(lse2 - m_use)
    acc = torch.where(w[:, :, None] > 0, part_o.double() * w[:, :, None], torch.zeros((), dtype=torch.float64)).sum(0)
    wsum = w.sum(0)
    lse = torch.where(wsum > 0, m_use + torch.log2(wsum), torch.full_like(wsum, -math.inf))
    inv = torch.where(wsum > 0, 1 / wsum, torch.zeros_like(wsum))
    if sink is not None:
        inv = torch.where(lse == -math.inf, torch.zeros_like(inv),
                          inv / (1 + torch.exp2(sink.double() * math.log2(math.e) - lse)))
    return acc * inv[:, None], lse * math.log(2)


@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("splits", [1, 2, 3, 4, 5])
def test_combine_merges_exactly(splits, sink):
    part_o = torch.randn(1, splits, H, D)
    part_lse = torch.randn(1, splits, H) * 4
    part_lse[0, 0, 1] = -math.inf  # an empty split of one head: its output is garbage and must not count
    part_o[0, 0, 1] = float("nan")
    part_lse[0, :, 2] = -math.inf  # a head with no entry in any split: output 0, lse -inf
    part_o[0, :, 2] = float("nan")
    if splits > 1:  # a split whose weight underflows to 0 beside one 2010 octaves up: adds nothing, NaN or not
        part_lse[0, -1, 3] = -2000.0
        part_lse[0, 0, 3] = 10.0
        part_o[0, -1, 3] = float("nan")
    attn_sink = torch.randn(H) if sink else None
    want_o, want_lse = _merge_reference(part_o[0], part_lse[0], attn_sink)
    out = torch.full((1, H, D), float("nan"), dtype=torch.float32)
    lse = torch.full((1, H), float("nan"), dtype=torch.float32)
    sink_t = attn_sink if sink else lse
    part_o, part_lse, out, lse, sink_t = (t.to(DEVICE) for t in (part_o, part_lse, out, lse, sink_t))
    K._launch_combine((1, 2), (
        part_o, part_lse, sink_t, out, lse,
        part_o.stride(0), part_o.stride(1), part_o.stride(2),
        part_lse.stride(0), part_lse.stride(1), part_lse.stride(2),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1), sink_t.stride(0),
        H, splits), dict(HAS_SINK=sink, BLOCK_H=4, PDL=False), num_warps=4)
    torch.testing.assert_close(out[0].cpu().double(), want_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse[0].cpu().double(), want_lse, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[0, 2].cpu(), torch.zeros(D)) and lse[0, 2].item() == -math.inf

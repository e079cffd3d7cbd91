"""Triton kernels (decode and prefill) against the float64 reference over the full shape matrix:
format × heads × top-k × block size × rows × kernel.

Secondary features rotate deterministically across the matrix so that each one meets every (format, kernel) pair
in many shapes: cache layout (contiguous 3D, FlashMLA's 4D view, flat 2D, NaN-padded blocks/rows with a storage
offset), ``out=`` pre-filled with NaN, inferred vs explicit kv_format, k_scale as float vs tensor, pow2 vs fp32
fp8_ds_mla scales, topk_length, attn_sink and decode split counts.
"""

import pytest
import torch

from helpers import DEVICE, FORMATS, LAYOUTS, assert_matches, make_problem, nan_out, run_kernel, \
    run_reference

HEADS = (1, 3, 16)
TOPKS = (1, 7, 64, 130)
BLOCK_SIZES = (1, 16, 64)
ROWS = (1, 5)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("topk", TOPKS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_reference(fmt, heads, topk, block_size, rows, kernel):
    ih, ik, ib, ir = HEADS.index(heads), TOPKS.index(topk), BLOCK_SIZES.index(block_size), ROWS.index(rows)
    layout = LAYOUTS[(ih + ik + ib + ir) % len(LAYOUTS)]
    use_out = (ir + ik) % 2 == (kernel == "decode")
    prob = make_problem(fmt, rows, heads, topk, block_size, layout=layout,
                        scale_format=("pow2", "fp32")[(ih + ib) % 2],
                        infer_format=(ik + ir) % 2 == 1, k_scale_tensor=(ib + ir) % 2 == 1)
    call = {}
    if (ih + ib + ir) % 3 == 0:
        call["topk_length"] = torch.randint(-2, topk + 3, (rows,), dtype=torch.int32, device=DEVICE)
    if (ik + ib) % 3 == 1:
        call["attn_sink"] = (torch.randn(heads) * 2).to(DEVICE)
    overrides = {}
    if kernel == "decode" and rows == 1:
        overrides["num_splits"] = 3
    out_buf = nan_out(rows, heads) if use_out else None

    out, lse, cfg = run_kernel(prob, kernel, out=out_buf, return_config=True, **call, **overrides)
    assert cfg.kernel == kernel
    if "num_splits" in overrides and topk > cfg.block_n:
        assert cfg.num_splits >= 2, cfg
    if out_buf is not None:
        assert out is out_buf
    assert out.dtype == torch.float16 and out.shape == (rows, heads, 512)

    ref_out, ref_lse = run_reference(prob, **call)
    assert_matches(out, lse, ref_out, ref_lse, **prob.tol, what=f"{fmt} {kernel} {layout} {cfg}")

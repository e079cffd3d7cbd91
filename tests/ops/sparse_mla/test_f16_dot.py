"""fp8_ds_mla with ``f16_dot`` (float16 dots on the unscaled e4m3 values, the tile scales on scores and
probabilities; kernels.py) through the interpreter, against the float64 reference: both kernels, hardware and
integer e4m3 decodes, NoPE rows, invalid indices, and the ranges float16 cannot hold by itself (large q, tile scales
far from 1, a tile whose rows are all invalid)."""

import pytest
import torch

from helpers import LSE_ATOL, assert_matches, make_problem, nan_out, run_kernel, run_reference

# bf16 output (the range test needs bf16 q): its rounding alone is 2^-9 relative per value, ~1.1e-3 in L2
REL_TOL_BF16_OUT = 4e-3


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("sw_fp8", [False, True])
@pytest.mark.parametrize("scale_format", ["pow2", "fp32"])
@pytest.mark.parametrize("heads,d_qk", [(3, 576), (16, 576), (5, 512)])
def test_f16_dot_matches_the_reference(kernel, sw_fp8, scale_format, heads, d_qk):
    prob = make_problem("fp8_ds_mla", 4, heads, 37, 16, d_qk=d_qk, scale_format=scale_format)
    out, lse, cfg = run_kernel(prob, kernel, out=nan_out(4, heads), f16_dot=True, sw_fp8=sw_fp8, return_config=True)
    assert cfg.f16_dot and cfg.sw_fp8 == sw_fp8
    assert_matches(out, lse, *run_reference(prob), **prob.tol, what=f"f16_dot {kernel} sw={sw_fp8}")


def _scale_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The four float32 tile scales of every 656-byte row, as a writable view [num_slots, 4]."""
    rows = kv_cache.reshape(-1, kv_cache.shape[-1])
    return rows[:, 512:528].view(torch.float32)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("q_max,lo,hi", [(2e5, -42, -22), (1e-3, 0, 12)])
def test_f16_dot_holds_ranges_float16_does_not(kernel, q_max, lo, hi):
    """bf16 q beyond float16's range (2e5) with tiny tile scales, and tiny q with scales up to 2^12 (scores of a few
    units either way; the reference reads the stored scales as they are). NoPE rows, so that every dot is float16:
    the interpreter's bf16 dots are wrong, float16 ones are not."""
    prob = make_problem("fp8_ds_mla", 4, 16, 40, 16, d_qk=512, scale_format="pow2", invalid_frac=0.3,
                        q_dtype=torch.bfloat16)
    sc = _scale_view(prob.kv_cache)
    g = torch.Generator().manual_seed(3)
    expo = torch.randint(lo, hi + 1, sc.shape, generator=g).to(sc.device)
    sc.copy_(sc * torch.exp2(expo.float()))
    prob.q.mul_(q_max / prob.q.float().abs().max())
    out, lse = run_kernel(prob, kernel, out=nan_out(4, 16, dtype=torch.bfloat16), f16_dot=True)
    ref_out, ref_lse = run_reference(prob)
    assert_matches(out, lse, ref_out, ref_lse, tol=REL_TOL_BF16_OUT, lse_atol=LSE_ATOL,
                   what=f"f16_dot ranges {kernel} q_max={q_max}")


def test_f16_dot_is_only_for_fp8_ds_mla():
    for fmt in ("fp8_e4m3", "fp16"):
        prob = make_problem(fmt, 2, 8, 20, 16)
        out, lse, cfg = run_kernel(prob, "prefill", out=nan_out(2, 8), f16_dot=True, return_config=True)
        assert_matches(out, lse, *run_reference(prob), **prob.tol, what=f"{fmt} with f16_dot asked")


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_f16_dot_keeps_a_heavy_row_with_a_small_scale(kernel):
    """A tile whose dominant row (score ~100 nats above the rest, whose latents are 0) has tile scales 2^26 below
    the others': its weight must keep full precision in the float16 p · V (normalised by the tile's largest scale it
    would be 2^-26, below float16's smallest subnormal). NoPE and bf16 q (6.5e6), so that every dot is float16 in
    the interpreter."""
    prob = make_problem("fp8_ds_mla", 1, 1, 16, 16, d_qk=512, invalid_frac=0.0, q_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    signs = torch.randint(0, 2, (512,), generator=g).bool()
    prob.q.copy_(torch.where(signs, -1.0, 1.0).mul(6.5e6).to(prob.q.dtype).view(prob.q.shape).to(prob.q.device))
    rows = prob.kv_cache.reshape(-1, prob.kv_cache.shape[-1])
    slots = [int(s) for s in prob.indices[0].tolist()]
    heavy = slots[0]
    rows[slots[1:], :512] = 0
    rows[heavy, :512] = torch.where(signs, 0xFE, 0x7E).to(torch.uint8).to(rows.device)  # +-448 along q's signs
    sc = _scale_view(prob.kv_cache)
    sc[slots[1:]] = 2.0 ** -4
    sc[heavy] = 2.0 ** -30
    out, lse = run_kernel(prob, kernel, out=nan_out(1, 1, dtype=torch.bfloat16), f16_dot=True)
    ref_out, ref_lse = run_reference(prob)
    assert float(ref_lse.max()) > 50  # the heavy row dominates
    assert_matches(out, lse, ref_out, ref_lse, tol=REL_TOL_BF16_OUT, lse_atol=LSE_ATOL,
                   what=f"f16_dot heavy row, small scale, {kernel}")

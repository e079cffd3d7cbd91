"""The software e4m3 decode (integer bit operations; used where Triton cannot lower float8 conversions: sm80,
sm86, gfx942) through the interpreter: exact on every byte, and through both kernels against the reference."""

import pytest
import torch
import triton
import triton.language as tl

from helpers import DEVICE, assert_matches, make_problem, nan_out, run_kernel, run_reference

from triton_mla_sparse._common.fp8 import e4m3_to_f32


@triton.jit
def _decode_all(src, dst, SW_FP8: tl.constexpr):
    o = tl.arange(0, 256)
    tl.store(dst + o, e4m3_to_f32(tl.load(src + o), SW_FP8))


def test_software_decode_is_exact_on_every_finite_byte():
    raw = torch.arange(256, dtype=torch.uint8, device=DEVICE)
    ref = raw.view(torch.float8_e4m3fn).float()
    out = torch.full((256,), float("nan"), device=DEVICE)
    _decode_all[(1,)](raw, out, True)
    finite = torch.isfinite(ref)
    assert int(finite.sum()) == 254
    assert torch.equal(out[finite], ref[finite])  # bit-exact, signed zeros and subnormals included
    assert torch.equal(torch.signbit(out[finite]), torch.signbit(ref[finite]))
    assert out[~finite].tolist() == [480.0, -480.0]  # 0x7F / 0xFF, the NaN encodings (documented)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("fmt,scale_format", [("fp8_e4m3", "pow2"), ("fp8_ds_mla", "pow2"), ("fp8_ds_mla", "fp32")])
@pytest.mark.parametrize("heads,d_qk", [(3, 576), (16, 576), (5, 512)])
def test_software_decode_through_the_kernels(fmt, scale_format, kernel, heads, d_qk):
    prob = make_problem(fmt, 4, heads, 37, 16, d_qk=d_qk, scale_format=scale_format)
    out, lse, cfg = run_kernel(prob, kernel, out=nan_out(4, heads), sw_fp8=True, return_config=True)
    assert cfg.sw_fp8
    assert_matches(out, lse, *run_reference(prob), **prob.tol, what=f"{fmt} sw_fp8")

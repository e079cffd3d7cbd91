"""The low-register variant (``low_reg``: q and each cache chunk loaded where its dot needs it, V gathered again for
``p · V``, scores in 64-column parts; the RDNA table's choice) through the interpreter, against the float64
reference: both kernels, every cache format, with and without RoPE, the integer e4m3 decode and float16 dots."""

import pytest

from helpers import assert_matches, make_problem, nan_out, run_kernel, run_reference

FORMATS = [("fp16", "pow2"), ("fp8_e4m3", "pow2"), ("fp8_ds_mla", "pow2"), ("fp8_ds_mla", "fp32")]


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("fmt,scale_format", FORMATS)
@pytest.mark.parametrize("heads,d_qk", [(3, 576), (16, 576), (5, 512)])
@pytest.mark.parametrize("sw_fp8", [False, True])
def test_low_reg_matches_the_reference(kernel, fmt, scale_format, heads, d_qk, sw_fp8):
    if sw_fp8 and fmt == "fp16":
        pytest.skip("the integer e4m3 decode is for fp8 caches")
    prob = make_problem(fmt, 4, heads, 37, 16, d_qk=d_qk, scale_format=scale_format)
    f16 = fmt == "fp8_ds_mla"
    out, lse, cfg = run_kernel(prob, kernel, out=nan_out(4, heads), low_reg=True, f16_dot=f16, sw_fp8=sw_fp8,
                               return_config=True)
    assert cfg.low_reg and cfg.f16_dot == f16
    assert_matches(out, lse, *run_reference(prob), **prob.tol, what=f"low_reg {fmt} {kernel} sw={sw_fp8}")


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_low_reg_without_f16_dot_on_fp8_ds_mla(kernel):
    prob = make_problem("fp8_ds_mla", 3, 8, 29, 16)
    out, lse = run_kernel(prob, kernel, out=nan_out(3, 8), low_reg=True, f16_dot=False)
    assert_matches(out, lse, *run_reference(prob), **prob.tol, what=f"low_reg fp8_ds_mla {kernel}")

"""DeepSeek-V4's fp8 cache pages: :func:`triton_mla_sparse.formats.quantize_fp8_ds_mla_v4` against vLLM 0.33's own
writer, ``vllm.models.deepseek_v4.common.ops.cache_utils.quantize_and_insert_k_cache``, byte for byte.

vLLM swaps Triton for a placeholder on a machine without a GPU, so its writer kernel's own function (source and
constants) is compiled here with the real Triton, in the interpreter the vLLM tier runs under, and vLLM's host
wrapper launches it with the arguments it always passes. The interpreter's float32 -> e4m3 cast is not the GPU's
round-to-nearest-even ``cvt.rn.satfinite`` (seen with triton 3.9: 1.97 -> 1.0, the mantissa's carry into the exponent
dropped; some ties rounded the other way), so an e4m3 byte may differ from ours by exactly those two patterns;
every other byte (the footer's exponents, the RoPE part, the pad bytes, the page padding) must be identical."""

from __future__ import annotations

import types

import pytest
import torch

from triton_mla_sparse import formats as F


@pytest.fixture
def vllm_v4_writer(monkeypatch):
    import triton
    import triton.language as tl
    from vllm.models.deepseek_v4.common.ops import cache_utils as cu

    fn = cu.quantize_and_insert_k_kernel
    fn = getattr(fn, "fn", fn)  # vLLM's placeholder jit hands the plain function back
    env = dict(fn.__globals__, tl=tl, triton=triton)
    kernel = triton.jit(types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__))
    monkeypatch.setattr(cu, "quantize_and_insert_k_kernel", kernel)
    return cu.quantize_and_insert_k_cache


@pytest.mark.parametrize("bs", [64, 16])
def test_v4_pages_equal_vllms_writer(vllm_v4_writer, bs):
    torch.manual_seed(41)
    nb = 3
    k = (torch.randn(nb * bs, 512) * torch.logspace(-6, 4, nb * bs)[:, None]).to(torch.bfloat16)
    k[1] = 0  # an all-zero row: the 1e-4 floor of the scale
    k[2, 100] = 448.0 * 2.0 ** 20  # a block whose largest value sets a large scale
    cache = torch.zeros(nb, F.v4_page_bytes(bs), dtype=torch.uint8)
    vllm_v4_writer(k, cache, torch.arange(nb * bs, dtype=torch.int64), block_size=bs)
    ours = F.quantize_fp8_ds_mla_v4(k.reshape(nb, bs, 512))
    e4m3 = torch.zeros_like(ours, dtype=torch.bool)
    e4m3[:, :bs * 576].view(nb, bs, 576)[..., :448] = True
    assert torch.equal(ours[~e4m3], cache[~e4m3]), f"{(ours != cache)[~e4m3].sum().item()} non-e4m3 bytes differ"
    o, t = ours[e4m3].int(), cache[e4m3].int()
    diff = o != t
    step = (o & 0x7F) - (t & 0x7F)
    o_abs = ours[e4m3].view(torch.float8_e4m3fn).float().abs()
    t_abs = cache[e4m3].view(torch.float8_e4m3fn).float().abs()
    carry_dropped = ((o & 7) == 0) & (t_abs < o_abs) & (t_abs >= o_abs / 2)  # ours rounded up to a power of two
    interpreter_rounding = ((o & 0x80) == (t & 0x80)) & ((step.abs() == 1) | carry_dropped)
    assert (interpreter_rounding | ~diff).all(), "e4m3 bytes differ beyond the interpreter's cast"
    # a systematic difference (another scale or rounding) would move far more than the interpreter's ~6 %
    assert diff.float().mean() < 0.1, f"{diff.sum().item()} of {diff.numel()} e4m3 bytes differ"

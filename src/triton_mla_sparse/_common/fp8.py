"""``@triton.jit`` helpers for float8 e4m3 values, shared by the operators' kernels (importing this imports
triton)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e4m3_to_f32(raw, SW_FP8: tl.constexpr):
    """float8_e4m3fn bytes -> float32. With SW_FP8 (GPUs whose Triton cannot lower fp8 conversions: sm80/sm86,
    gfx942) by integer bit operations: sign and the 7 exponent/mantissa bits moved into a float16 (e4m3 shares
    float16's layout shifted by 7 bits with an exponent bias 8 lower), then scaled by 2^8 — exact for every finite
    value and subnormal; the NaN encodings (0x7F, 0xFF) decode to ±480 instead of NaN."""
    if SW_FP8:
        x = raw.to(tl.int16)
        h = ((x & 0x80) << 8) | ((x & 0x7F) << 7)
        return h.to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    else:
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def f32_to_e4m3(x):
    """float32 -> float8_e4m3fn bits (uint8) by integer operations only, for targets without a native e4m3 cast:
    round to nearest even, bit-identical to torch's ``x.to(torch.float8_e4m3fn)`` for every |x| <= 464 (subnormals
    and ±0 included); beyond that it saturates like ``cvt.rn.satfinite`` (|x| > 464 and ±inf -> ±448) where torch
    gives NaN, and NaN -> 0x7F with x's sign bit (as torch)."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    # Normal range [2^-6, 464]: round the 23-bit mantissa to 3 bits (ties to even), then rebias 127 -> 7.
    an = tl.minimum(a, 0x43F00000)
    normal = ((an + 0x7FFFF + ((an >> 20) & 1)) >> 20) - 960
    # Below 2^-6: the value in units of 2^-9 (e4m3's subnormal step), rounded to nearest even.
    m = (a & 0x7FFFFF) | 0x800000
    s = tl.minimum(tl.maximum(141 - (a >> 23), 21), 25)  # s >= 25 leaves 0 (below half a step)
    q = m >> s
    rem = m & ((1 << s) - 1)
    half = 1 << (s - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    out = tl.where(a < 0x3C800000, q, normal)
    out = tl.where(a > 0x43E80000, 0x7E, out)
    out = tl.where(a > 0x7F800000, 0x7F, out)
    return (out | sign).to(tl.uint8)

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

"""The software float32 -> e4m3 encode (``f32_to_e4m3``, integer bit operations; what the vLLM plugin routes vLLM's
DSA kernels through on GPUs without native fp8 conversions) through the interpreter.

Compared with torch's ``x.to(torch.float8_e4m3fn)`` wherever torch's result is not NaN, plus every NaN input, for all
65536 bf16 (and fp16) bit patterns, 2^20 random float32 bit patterns, values at and next to every rounding boundary
and tie, and the subnormal range. Torch's result differs between versions only where the input is not NaN but the
result is: older torch (c10's first ``fp8e4m3fn_from_fp32_value``) gives NaN for |x| > 464 (464, the tie between
448 and the NaN code, rounds to even, 448); torch 2.13/2.14 saturate there. Ours saturates like the hardware's
``cvt.rn.satfinite.e4m3x2.f32`` (|x| > 464 and ±inf -> ±448, 0x7E / 0xFE), asserted separately, and gives a NaN
input 0x7F with its sign bit (as torch does), so with torch >= 2.13 the bytes are identical for every float32.
"""

import pytest
import torch
import triton
import triton.language as tl

from triton_mla_sparse._common.fp8 import e4m3_to_f32, f32_to_e4m3

BLOCK = 1 << 16
LAST_FINITE_TIE = 464.0  # halfway between 448 (0x7E) and 480 (0x7F, NaN): rounds to even, 448


@triton.jit
def _encode(src, dst, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(dst + o, f32_to_e4m3(tl.load(src + o, mask=m, other=0.0)), mask=m)


@triton.jit
def _round_trip(dst):
    o = tl.arange(0, 256)
    tl.store(dst + o, f32_to_e4m3(e4m3_to_f32(o.to(tl.uint8), True)))


def encode(x: torch.Tensor) -> torch.Tensor:
    x = x.float().contiguous().flatten()
    out = torch.empty(x.numel(), dtype=torch.uint8)
    _encode[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    return out


def torch_bits(x: torch.Tensor) -> torch.Tensor:
    return x.float().flatten().to(torch.float8_e4m3fn).view(torch.uint8)


def f32(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def assert_matches_torch(x: torch.Tensor, what: str) -> int:
    """Ours == torch's bytes wherever torch is not NaN or x is; returns how many values were compared."""
    x = x.float().flatten()
    ours, ref = encode(x), torch_bits(x)
    keep = ((ref & 0x7F) != 0x7F) | torch.isnan(x)
    bad = (ours != ref) & keep
    if bad.any():
        i = bad.nonzero()[:8, 0]
        pairs = [(f"{x[j].item():.9g}", hex(x[j:j + 1].view(torch.int32).item()), int(ours[j]), int(ref[j]))
                 for j in i]
        raise AssertionError(f"{what}: {int(bad.sum())} mismatches (value, bits, ours, torch): {pairs}")
    return int(keep.sum())


def e4m3_values() -> torch.Tensor:
    """Every finite e4m3 value as float32, ascending (non-negative half)."""
    v = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return torch.sort(v).values


def test_every_bf16_pattern():
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    n = assert_matches_torch(x, "bf16 patterns")
    assert n > 60000  # the NaN regime (|x| > 464, inf, NaN) is the rest


def test_random_float32_bit_patterns():
    bits = torch.randint(-(1 << 31), 1 << 31, (1 << 22,), dtype=torch.int64).to(torch.int32)
    assert_matches_torch(bits.view(torch.float32), "random bit patterns")


def test_identical_to_a_saturating_torch():
    if int(torch_bits(torch.tensor([465.0]))[0]) != 0x7E:
        pytest.skip(f"torch {torch.__version__} gives NaN beyond 464 (compared where it is not NaN elsewhere)")
    bits = torch.randint(-(1 << 31), 1 << 31, (1 << 20,), dtype=torch.int64).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.tensor([float("inf"), -float("inf"), 3.4e38, -500.0])])
    assert torch.equal(encode(x), torch_bits(x))


def test_random_float32_in_range():
    # Uniform over the normal range's magnitude scale and the subnormal range, both signs.
    e = torch.empty(1 << 19).uniform_(-12.0, 9.0)
    x = torch.exp2(e) * torch.where(torch.rand(1 << 19) < 0.5, -1.0, 1.0)
    x = x.clamp(-LAST_FINITE_TIE, LAST_FINITE_TIE)
    sub = torch.empty(1 << 19).uniform_(-2.0 ** -6, 2.0 ** -6)
    assert_matches_torch(torch.cat([x, sub]), "random float32")


def test_rounding_boundaries_and_ties():
    v = e4m3_values()
    mids = (v[:-1] + v[1:]) / 2  # exact in float32: the ties
    edges = torch.cat([v, mids, torch.tensor([LAST_FINITE_TIE])])
    bits = edges.view(torch.int32)
    # Each value and tie with its 64 float32 neighbours either side (a changing mantissa bit below the cut).
    near = torch.cat([bits + d for d in range(-64, 65)])
    near = near[near >= 0]
    x = f32(near)
    x = x[x <= LAST_FINITE_TIE]
    assert_matches_torch(torch.cat([x, -x]), "boundaries and ties")


def test_ties_round_to_even():
    v = e4m3_values()
    mids = (v[:-1] + v[1:]) / 2
    ours = encode(mids)
    lower, upper = torch.arange(0, 0x7E), torch.arange(1, 0x7F)
    want = torch.where(lower % 2 == 0, lower, upper).to(torch.uint8)  # ascending e4m3 values are ascending codes
    assert torch.equal(ours, want)
    assert encode(torch.tensor([LAST_FINITE_TIE, -LAST_FINITE_TIE])).tolist() == [0x7E, 0xFE]


def test_zeros_and_subnormals():
    x = torch.tensor([0.0, -0.0, 2.0 ** -9, -(2.0 ** -9), 2.0 ** -10, 1.5 * 2.0 ** -10, 3 * 2.0 ** -10,
                      7 * 2.0 ** -9, 7.5 * 2.0 ** -9, 2.0 ** -6, 1e-45, -1e-45, 2.0 ** -149])
    assert encode(x).tolist() == [0x00, 0x80, 0x01, 0x81, 0x00, 0x01, 0x02, 0x07, 0x08, 0x08, 0x00, 0x80, 0x00]
    assert torch.equal(encode(x), torch_bits(x))


def test_saturates_where_torch_gives_nan():
    above = f32(torch.tensor([LAST_FINITE_TIE]).view(torch.int32) + 1)  # the next float32 after 464
    x = torch.cat([above, torch.tensor([465.0, 480.0, 1e4, 3.4e38, float("inf")]),
                   torch.empty(10000).uniform_(464.0, 1e6)])
    x = torch.cat([x, -x])
    ours = encode(x)
    want = torch.where(x > 0, 0x7E, 0xFE).to(torch.uint8)
    assert torch.equal(ours, want)
    ref = torch_bits(x)
    assert bool((((ref & 0x7F) == 0x7F) | (ref == want)).all())  # torch: NaN (older) or the same saturation


def test_nan_stays_nan_with_its_sign():
    bits = torch.tensor([0x7FC00000, 0x7F800001, 0x7FFFFFFF, -0x00400000, -0x007FFFFF, -1], dtype=torch.int32)
    x = bits.view(torch.float32)
    assert bool(torch.isnan(x).all())
    ours = encode(x)
    assert ours.tolist() == [0x7F, 0x7F, 0x7F, 0xFF, 0xFF, 0xFF]
    assert torch.equal(ours, torch_bits(x))  # torch keeps the sign of a NaN too


@pytest.mark.parametrize("src", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_widened_exactly(src):
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(src)
    assert_matches_torch(x.float(), f"{src} patterns")


def test_round_trip_through_the_decode():
    out = torch.empty(256, dtype=torch.uint8)
    _round_trip[(1,)](out)
    codes = torch.arange(256).to(torch.uint8)
    finite = (codes & 0x7F) != 0x7F
    assert torch.equal(out[finite], codes[finite])
    # The decode reads the NaN codes as ±480 (its documented value); the encode saturates that to ±448.
    assert out[~finite].tolist() == [0x7E, 0xFE]

"""The fp8_ds_mla row format: quantize_fp8_ds_mla / dequantize_fp8_ds_mla."""

import pytest
import torch

import triton_mla_sparse as tms
from triton_mla_sparse import formats as F
from triton_mla_sparse.formats import dequantize_fp8_ds_mla_float, unpack_fp8_ds_mla

E4M3_REL = 2.0 ** -4  # round-to-nearest with 3 mantissa bits: |error| <= 2^-4 · |x| for normal values
E4M3_SUBNORMAL_HALF_ULP = 2.0 ** -10  # e4m3 subnormal spacing is 2^-9


def scales_of(packed: torch.Tensor) -> torch.Tensor:
    return packed[..., 512:528].contiguous().view(torch.float32)


def tiles(x: torch.Tensor) -> torch.Tensor:
    return x[..., :512].reshape(*x.shape[:-1], 4, 128)


@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale_format", ["pow2", "fp32"])
def test_round_trip(scale_format, dtype, magnitude):
    x = (torch.randn(300, 576) * magnitude * torch.empty(300, 1).uniform_(-2, 2).exp()).to(dtype)
    packed = tms.quantize_fp8_ds_mla(x, scale_format=scale_format)
    assert packed.dtype == torch.uint8 and packed.shape == (300, 656)
    xf = x.float()
    deq = dequantize_fp8_ds_mla_float(packed)  # e4m3 · scale, no extra rounding
    assert torch.isfinite(deq).all()
    # per element: within e4m3 rounding (normal range) or half a subnormal step (tiny values)
    bound = E4M3_REL * tiles(xf).abs() + E4M3_SUBNORMAL_HALF_ULP * scales_of(packed)[..., None]
    assert ((tiles(deq) - tiles(xf)).abs() <= bound).all()
    # per 128-wide tile: relative L2 error (measured max ~0.035 for Gaussian data)
    tile_err = (tiles(deq) - tiles(xf)).norm(dim=-1) / tiles(xf).norm(dim=-1)
    assert tile_err.max() < E4M3_REL, tile_err.max()
    # rope stays bf16-exact
    assert torch.equal(deq[:, 512:], xf[:, 512:].bfloat16().float())
    # the public dequantizer is the same values rounded once to bf16
    pub = tms.dequantize_fp8_ds_mla(packed)
    assert pub.dtype == torch.bfloat16 and pub.shape == (300, 576)
    assert torch.equal(pub, deq.bfloat16())


def test_pow2_scales_are_minimal_powers_of_two():
    x = torch.randn(500, 576) * torch.logspace(-6, 6, 500)[:, None]
    s = scales_of(tms.quantize_fp8_ds_mla(x, scale_format="pow2"))
    assert (torch.frexp(s).mantissa == 0.5).all(), "pow2 scales must be exact powers of two"
    need = tiles(x).abs().amax(-1) / 448.0
    assert (s >= need * (1 - 2 ** -20)).all()  # large enough: amax / scale <= 448
    assert (s / 2 < need).all()  # the smallest such power of two


def test_fp32_scales_are_amax_over_448():
    x = torch.randn(500, 576) * torch.logspace(-6, 6, 500)[:, None]
    s = scales_of(tms.quantize_fp8_ds_mla(x, scale_format="fp32"))
    assert torch.equal(s, tiles(x).abs().amax(-1) / 448.0)
    assert (torch.frexp(s).mantissa != 0.5).any()


@pytest.mark.parametrize("scale_format", ["pow2", "fp32"])
def test_byte_layout(scale_format):
    """Bytes 0..511 e4m3 latent (x / tile scale, round to nearest), 512..527 four float32 scales (tile i covers
    values 128·i..128·i+127), 528..655 the rope as bf16."""
    x = torch.randn(7, 576)
    x[:, :512] *= torch.tensor([1.0, 0.01, 100.0, 3.0]).repeat_interleave(128)
    packed = tms.quantize_fp8_ds_mla(x, scale_format=scale_format)
    scales = scales_of(packed)
    assert scales.shape == (7, 4)
    assert (scales[:, 2] > 100 * scales[:, 1]).all()  # tile order follows the latent
    want_latent = (tiles(x) / scales[..., None]).reshape(7, 512).to(torch.float8_e4m3fn)
    assert torch.equal(packed[:, :512], want_latent.view(torch.uint8))
    assert torch.equal(packed[:, 528:].contiguous().view(torch.bfloat16), x[:, 512:].bfloat16())
    lat, sc, rope = unpack_fp8_ds_mla(packed)
    assert torch.equal(sc, scales) and torch.equal(rope, x[:, 512:].bfloat16())
    assert torch.equal(lat.view(torch.uint8), packed[:, :512])


@pytest.mark.parametrize("scale_format", ["pow2", "fp32"])
def test_zero_rows_and_tiles(scale_format):
    x = torch.randn(4, 576)
    x[0] = 0  # all-zero row
    x[1, 128:256] = 0  # one zero tile
    x[2, :512] = 0  # zero latent, non-zero rope
    x[3, 0:128] = -0.0
    packed = tms.quantize_fp8_ds_mla(x, scale_format=scale_format)
    s = scales_of(packed)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert s[0].eq(1.0).all() and s[1, 1] == 1.0 and s[2].eq(1.0).all()
    deq = dequantize_fp8_ds_mla_float(packed)
    assert torch.isfinite(deq).all()
    assert (deq[0] == 0).all() and (deq[1, 128:256] == 0).all() and (deq[2, :512] == 0).all()
    assert (deq[3, :128] == 0).all()
    assert torch.equal(deq[2, 512:], x[2, 512:].bfloat16().float())
    assert torch.isfinite(tms.dequantize_fp8_ds_mla(packed).float()).all()


@pytest.mark.parametrize("lead", [(), (1,), (3,), (2, 5), (2, 1, 3), (0,), (4, 0)])
def test_leading_dims_preserved(lead):
    x = torch.randn(*lead, 576)
    packed = tms.quantize_fp8_ds_mla(x)
    assert packed.shape == (*lead, 656)
    deq = tms.dequantize_fp8_ds_mla(packed)
    assert deq.shape == (*lead, 576)
    if x.numel():
        flat = tms.quantize_fp8_ds_mla(x.reshape(-1, 576))
        assert torch.equal(packed.reshape(-1, 656), flat)


def test_non_contiguous_input():
    x = torch.randn(6, 576)
    xt = torch.randn(576, 6).t()  # non-contiguous
    xt.copy_(x)
    assert not xt.is_contiguous()
    assert torch.equal(tms.quantize_fp8_ds_mla(xt), tms.quantize_fp8_ds_mla(x))
    packed = tms.quantize_fp8_ds_mla(x)
    wide = torch.zeros(6, 700, dtype=torch.uint8)
    wide[:, :656] = packed
    assert torch.equal(tms.dequantize_fp8_ds_mla(wide[:, :656]), tms.dequantize_fp8_ds_mla(packed))


def test_quantize_keeps_device_and_is_deterministic():
    x = torch.randn(3, 576)
    a, b = tms.quantize_fp8_ds_mla(x), tms.quantize_fp8_ds_mla(x.clone())
    assert a.device == x.device and torch.equal(a, b)


@pytest.mark.parametrize("bad, name", [
    (torch.zeros(3, 576, dtype=torch.int32), "kv"),
    (torch.zeros(3, 576, dtype=torch.uint8), "kv"),
    (torch.zeros(3, 575), "kv"),
    (torch.zeros(3, 656), "kv"),
    (torch.zeros(576, 3), "kv"),
    (torch.tensor(1.0), "kv"),
    ([0.0] * 576, "kv"),
    (None, "kv"),
])
def test_quantize_rejects(bad, name):
    with pytest.raises(ValueError) as e:
        tms.quantize_fp8_ds_mla(bad)
    assert name in str(e.value)


@pytest.mark.parametrize("scale_format", ["e8m0", "POW2", None, 2])
def test_quantize_rejects_scale_format(scale_format):
    with pytest.raises(ValueError) as e:
        tms.quantize_fp8_ds_mla(torch.zeros(2, 576), scale_format=scale_format)
    assert "scale_format" in str(e.value)


@pytest.mark.parametrize("bad", [
    torch.zeros(3, 656, dtype=torch.float32),
    torch.zeros(3, 656, dtype=torch.int8),
    torch.zeros(3, 655, dtype=torch.uint8),
    torch.zeros(3, 576, dtype=torch.uint8),
    torch.zeros(3, 656, dtype=torch.float8_e4m3fn),
    torch.tensor(0, dtype=torch.uint8),
    None,
])
def test_dequantize_rejects(bad):
    with pytest.raises(ValueError) as e:
        tms.dequantize_fp8_ds_mla(bad)
    assert "packed" in str(e.value)


# ----- vLLM's fp8 indexer cache

def test_indexer_cache_layout_and_round_trip():
    from triton_mla_sparse.formats import (INDEXER_ROW_BYTES, dequantize_indexer_cache, quantize_indexer_cache,
                                           unpack_indexer_cache)

    values = torch.randn(3, 16, 128) * torch.empty(3, 16, 1).uniform_(0.1, 10.0)
    values[1, 5] = 0.0  # an all-zero token stays exactly zero
    cache = quantize_indexer_cache(values)
    assert cache.dtype == torch.uint8 and cache.shape == (3, 16 * INDEXER_ROW_BYTES)
    vals, scales = unpack_indexer_cache(cache)
    # Per block: the 16 x 128 e4m3 values token-major, then 16 float32 scales = amax / 448.
    assert torch.equal(cache[:, :16 * 128].reshape(3, 16, 128), vals.view(torch.uint8))
    assert torch.equal(cache[:, 16 * 128:].contiguous().view(torch.float32), scales)
    expect = (values.abs().amax(-1) / 448.0).clamp_min(1e-8)
    assert torch.equal(scales, expect)
    back = dequantize_indexer_cache(cache)
    assert (back[1, 5] == 0).all()
    assert ((back - values).norm() / values.norm()).item() < 0.04
    # vLLM's [num_blocks, block_size, 1, 132] view of the same bytes, and a wider block stride, read the same.
    assert torch.equal(dequantize_indexer_cache(cache.view(3, 16, 1, INDEXER_ROW_BYTES)), back)
    wide = torch.full((3, 16 * INDEXER_ROW_BYTES + 64), 0xFF, dtype=torch.uint8)
    wide[:, :16 * INDEXER_ROW_BYTES] = cache
    assert torch.equal(dequantize_indexer_cache(wide[:, :16 * INDEXER_ROW_BYTES]), back)


@pytest.mark.parametrize("bad", [torch.randn(4, 128), torch.randn(2, 4, 64), torch.zeros(2, 4, 128, dtype=torch.int8),
                                 "x"])
def test_quantize_indexer_cache_rejects(bad):
    from triton_mla_sparse.formats import quantize_indexer_cache

    with pytest.raises(ValueError, match="values"):
        quantize_indexer_cache(bad)


@pytest.mark.parametrize("bad", [torch.zeros(2, 131, dtype=torch.uint8), torch.zeros(2, 132, dtype=torch.int8),
                                 torch.zeros(2, 4, 2, 132, dtype=torch.uint8), torch.zeros(132, dtype=torch.uint8)])
def test_unpack_indexer_cache_rejects(bad):
    from triton_mla_sparse.formats import dequantize_indexer_cache

    with pytest.raises(ValueError, match="cache"):
        dequantize_indexer_cache(bad)


def test_indexer_cache_pow2_scales():
    from triton_mla_sparse.formats import dequantize_indexer_cache, quantize_indexer_cache, unpack_indexer_cache

    values = torch.randn(2, 8, 128) * 3.0
    _, scales = unpack_indexer_cache(quantize_indexer_cache(values, scale_format="pow2"))
    assert torch.equal(scales, torch.exp2(torch.ceil(torch.log2(values.abs().amax(-1) / 448.0))))
    back = dequantize_indexer_cache(quantize_indexer_cache(values, scale_format="pow2"))
    assert ((back - values).norm() / values.norm()).item() < 0.05
    with pytest.raises(ValueError, match="scale_format"):
        quantize_indexer_cache(values, scale_format="ue8m0")


def test_unpack_indexer_cache_rejects_layouts_it_would_misread():
    from triton_mla_sparse.formats import dequantize_indexer_cache, quantize_indexer_cache

    cache = quantize_indexer_cache(torch.randn(3, 4, 128))
    buf = torch.full((3, 2 * 528), 0xFF, dtype=torch.uint8)
    buf[:, :528] = cache
    # A wider block stride is fine, in both forms; rows padded inside a block, or overlapping blocks, are not.
    assert torch.equal(dequantize_indexer_cache(torch.as_strided(buf, (3, 4, 1, 132), (1056, 132, 132, 1))),
                       dequantize_indexer_cache(cache))
    for bad in (torch.as_strided(buf, (3, 4, 1, 132), (1056, 264, 132, 1)), torch.as_strided(buf, (3, 528), (10, 1)),
                torch.as_strided(buf, (3, 4, 1, 132), (10, 132, 132, 1))):
        with pytest.raises(ValueError, match="cache"):
            dequantize_indexer_cache(bad)


# ------------------------------------------------------------------ DeepSeek-V4 fp8 pages (584 bytes per token)

@pytest.mark.parametrize("bs,expected", [(64, 37440), (16, 9792), (1, 1152), (72, 42048)])
def test_v4_page_bytes(bs, expected):
    """rows (576 B) and footer (8 B) per token, the page padded to a multiple of 576 bytes."""
    used = bs * 584
    assert F.v4_page_bytes(bs) == expected and expected % 576 == 0 and used <= expected < used + 576


def test_v4_byte_layout_and_round_trip():
    torch.manual_seed(40)
    nb, bs = 3, 16
    k = torch.randn(nb, bs, 512) * torch.logspace(-3, 3, nb * bs).reshape(nb, bs, 1)
    pages = F.quantize_fp8_ds_mla_v4(k)
    assert pages.dtype == torch.uint8 and pages.shape == (nb, F.v4_page_bytes(bs))
    kb = k.to(torch.bfloat16).float()
    rows = pages[:, :bs * 576].reshape(nb, bs, 576)
    footer = pages[:, bs * 576:bs * 584].reshape(nb, bs, 8)
    # RoPE part: the bf16 values as stored; pad byte and page padding: zero
    assert torch.equal(rows[..., 448:].contiguous().view(torch.bfloat16).float(), kb[..., 448:])
    assert (footer[..., 7] == 0).all() and (pages[:, bs * 584:] == 0).all()
    # scales: the smallest power of two with amax / scale <= 448, encoded as exponent + 127
    amax = kb[..., :448].reshape(nb, bs, 7, 64).abs().amax(-1)
    scale = torch.exp2(footer[..., :7].float() - 127)
    assert (amax / scale <= 448).all() and (amax / (scale / 2) > 448).all()
    nope = rows[..., :448].contiguous().view(torch.float8_e4m3fn).float().reshape(nb, bs, 7, 64)
    assert torch.equal(nope, (kb[..., :448].reshape(nb, bs, 7, 64) / scale[..., None]).to(torch.float8_e4m3fn).float())
    out = F.dequantize_fp8_ds_mla_v4(pages, bs)
    assert out.dtype == torch.float32 and out.shape == (nb, bs, 512)
    rel = (out[..., :448] - kb[..., :448]).reshape(nb, bs, 7, 64).abs() / scale[..., None]
    assert rel.max() <= 16  # half an e4m3 step at the top of the range: 2^(8-4)
    assert torch.equal(out[..., 448:], kb[..., 448:])
    assert F.dequantize_fp8_ds_mla_v4(pages, bs, torch.bfloat16).dtype == torch.bfloat16


def test_v4_zero_rows_stay_zero():
    pages = F.quantize_fp8_ds_mla_v4(torch.zeros(2, 4, 512))
    out = F.dequantize_fp8_ds_mla_v4(pages, 4)
    assert torch.equal(out, torch.zeros_like(out))
    # max(amax, 1e-4): the exponent of 1e-4 / 448, as the writer stores it
    assert (pages[:, 4 * 576:4 * 584].reshape(2, 4, 8)[..., :7] == 127 - 22).all()


@pytest.mark.parametrize("bad", [torch.zeros(2, 4, 576), torch.zeros(4, 512), torch.zeros(2, 0, 512),
                                 torch.zeros(2, 4, 512, dtype=torch.int32), "k"])
def test_v4_quantize_rejects(bad):
    with pytest.raises(ValueError, match="^k: expected"):
        F.quantize_fp8_ds_mla_v4(bad)


def test_v4_unpack_rejects():
    pages = F.quantize_fp8_ds_mla_v4(torch.randn(2, 4, 512))
    with pytest.raises(ValueError, match="^pages: expected at least"):
        F.unpack_fp8_ds_mla_v4(pages, 5)
    with pytest.raises(ValueError, match="^pages: expected uint8"):
        F.unpack_fp8_ds_mla_v4(pages.float(), 4)
    with pytest.raises(ValueError, match="^block_size: expected a positive int"):
        F.unpack_fp8_ds_mla_v4(pages, 0)

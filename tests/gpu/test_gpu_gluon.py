"""GPU tier: the Gluon kernels (``family="mma2"``: kernels_mma2.py, with ``dsplit``: kernels_mma2d.py, written
``"mma2d"`` here; ``"wgmma"``: kernels_wgmma.py, ``"wgmma_t"``: kernels_wgmma_t.py, ``"wgmma_ws"``: kernels_wgmma_ws.py)
against the float32 reference, at launch configurations beyond the table's (tile rows, stages, warps, head blocks),
on poisoned caches (NaN everywhere outside the selection and in the slack of a strided cache), garbage indices,
topk_length and sinks, with and without RoPE. The interpreter cannot run Gluon: CUDA only."""

from __future__ import annotations

import pytest
import torch

from ._env import DEV, GPU_TIER, gpu_only
from .test_gpu import (BS, NB, NUM_SLOTS, ROWS, SCALE, TOPK, _fill_nan_, _with_garbage,  # noqa: F401
                       check_against_reference, make_indices, make_q, poisoned_cache, pool)
from triton_mla_sparse.testing import rel_err
from triton_mla_sparse.capabilities import arch_for_device
from triton_mla_sparse.ops.sparse_mla.api import sparse_mla_attention_with_config
from triton_mla_sparse.ops.sparse_mla.configs import GLUON_TABLE, gluon_supported

pytestmark = [*GPU_TIER, gpu_only]

# the Ampere-class tables' mma2 shape above 16 heads (32-head blocks of 16-row tiles), as overrides; with the dims
# split (16-bit caches there), also its stages
_WIDE = GLUON_TABLE["sm120"][(64, "16bit")]
MMA2_WIDE = {"block_h": _WIDE.block_h, "block_n": _WIDE.block_n, "num_warps": _WIDE.num_warps}
MMA2D_WIDE = dict(MMA2_WIDE, num_stages=_WIDE.num_stages, dsplit=True)

# (family, heads, block_h, block_n, num_warps, stages)
SHAPES = [("mma2", 8, 16, 32, 4, 2), ("mma2", 16, 16, 32, 4, 1), ("mma2", 16, 16, 32, 4, 3), ("mma2", 16, 16, 32, 4, 4),
          ("mma2", 16, 16, 64, 8, 2), ("mma2", 64, 32, 64, 8, 2), ("mma2", 128, 64, 32, 8, 2),
          ("mma2", 128, 16, 32, 4, 2), ("mma2", 64, 32, 16, 4, 2), ("mma2", 64, 32, 16, 4, 3),
          ("mma2", 40, 64, 16, 8, 1), ("mma2", 48, 32, 16, 8, 2), ("mma2", 24, 32, 32, 8, 1),
          ("mma2", 16, 16, 16, 4, 2), ("mma2", 12, 16, 16, 8, 2),
          ("wgmma", 64, 64, 64, 8, 2), ("wgmma", 128, 64, 32, 8, 3),
          ("wgmma", 40, 64, 32, 8, 4), ("wgmma", 16, 64, 64, 8, 2),
          ("wgmma_t", 16, 16, 64, 4, 2), ("wgmma_t", 16, 16, 64, 4, 3), ("wgmma_t", 8, 8, 64, 4, 2),
          ("wgmma_t", 12, 16, 64, 4, 3), ("wgmma_t", 32, 32, 64, 4, 2), ("wgmma_t", 40, 16, 64, 4, 2),
          ("wgmma_t", 16, 16, 64, 8, 2), ("wgmma_t", 24, 32, 64, 8, 2),
          ("wgmma_ws", 16, 16, 64, 8, 2), ("wgmma_ws", 8, 8, 64, 8, 2), ("wgmma_ws", 12, 16, 64, 12, 2),
          ("wgmma_ws", 32, 32, 64, 8, 2), ("wgmma_ws", 40, 16, 64, 12, 2),
          ("mma2d", 64, 32, 16, 4, 2), ("mma2d", 40, 32, 16, 4, 3), ("mma2d", 128, 32, 16, 4, 2),
          ("mma2d", 16, 16, 16, 4, 2), ("mma2d", 12, 16, 32, 4, 2), ("mma2d", 24, 32, 32, 4, 2),
          ("mma2d", 16, 16, 32, 4, 3), ("mma2d", 128, 32, 16, 4, 4)]


def _family(name: str) -> tuple[str, dict]:
    """A test's family name as the config's family and switches: "mma2d" is mma2 with the dims split, "mma2" without
    it (which the sm8x / sm120 tables would add above 16 heads on 16-bit caches)."""
    return ("mma2", {"dsplit": name == "mma2d"}) if name in ("mma2", "mma2d") else (name, {})


def _skip_unless_supported(fmt: str, family: str = "mma2"):
    if family == "mma2d":
        if fmt not in ("bf16", "fp16"):
            pytest.skip("dsplit: the mma2 kernel's bf16/fp16 variant")
        family = "mma2"
    arch = arch_for_device(torch.device(DEV))
    if not gluon_supported(family, arch, fmt.split("_pow2")[0].split("_fp32")[0]):
        pytest.skip(f"the {family} kernel does not run on {arch.name if arch else DEV}")



# fp8_ds_mla both ways: float16 tiles in units of each chunk's scale (f16_dot, opt-in) and bf16 exact tiles (the table's)
FORMATS = [("bf16", False), ("fp16", False), ("fp8_ds_mla_pow2", True), ("fp8_ds_mla_fp32", True),
           ("fp8_ds_mla_pow2", False), ("fp8_ds_mla_fp32", False)]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("fmt,f16_dot", FORMATS)
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("family,heads,block_h,block_n,num_warps,stages", SHAPES)
def test_gluon_poisoned_cache_garbage_indices_lengths_sinks(pool, gluon_launches, fmt, f16_dot, kernel, family, heads,
                                                            block_h, block_n, num_warps, stages, overlap):
    _skip_unless_supported(fmt, family)
    if family in ("wgmma_t", "wgmma_ws") and f16_dot:
        pytest.skip(f"the {family} kernel dots exact bf16 tiles only")
    if overlap and (family != "wgmma_t" or not fmt.startswith("fp8_ds_mla")):
        pytest.skip("overlap: the wgmma_t kernel's fp8_ds_mla variant")
    if family == "wgmma_t" and stages > 2 and not fmt.startswith("fp8_ds_mla"):
        pytest.skip("wgmma_t: two stages of 64 bf16 rows fill the shared memory")
    torch.manual_seed(heads * 131 + block_n * 7 + stages)
    T = ROWS[64]
    idx = _with_garbage(make_indices(pool, T), NUM_SLOTS, frac=0.2)
    c, cache = poisoned_cache(pool, fmt, idx)
    q = make_q(T, heads, c.q_dtype)
    tl = torch.randint(-5, TOPK + 10, (T,), dtype=torch.int32, device=DEV)
    tl[1:6] = torch.tensor([0, TOPK, 1, block_n - 1, block_n + 1], dtype=torch.int32, device=DEV)
    sink = torch.randn(heads, dtype=torch.float32, device=DEV)
    sink[0], sink[1] = float("inf"), float("-inf")
    out = torch.full((T, heads, 512), float("nan"), dtype=c.q_dtype, device=DEV)
    fam, switches = _family(family)
    _, lse, cfg = sparse_mla_attention_with_config(
        q, cache, idx, SCALE, kv_format=c.kv_format, out=out, return_lse=True, kernel=kernel, return_config=True,
        topk_length=tl, attn_sink=sink, family=fam, block_h=block_h, block_n=block_n, num_warps=num_warps,
        num_stages=stages, f16_dot=f16_dot, overlap=overlap, **switches)
    assert (cfg.family, cfg.kernel, cfg.block_h, cfg.block_n, cfg.num_stages, cfg.f16_dot, cfg.overlap) == (
        fam, kernel, block_h, block_n, stages, f16_dot, overlap)
    assert cfg.dsplit == switches.get("dsplit", False)
    assert gluon_launches[family] == 1 and sum(gluon_launches.values()) == 1
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format, topk_length=tl, attn_sink=sink,
                            all_rows=True)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_pow2"])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("family,heads", [("mma2", 16), ("mma2", 128), ("wgmma", 128), ("wgmma_t", 16),
                                          ("wgmma_ws", 16), ("mma2d", 64)])
def test_gluon_nope_512(pool, fmt, kernel, family, heads):
    """No RoPE part: 512-value bf16 rows; fp8_ds_mla rows keep their 656 bytes and the RoPE bytes go unread."""
    _skip_unless_supported(fmt, family)
    torch.manual_seed(9 + heads)
    T = ROWS[64]
    c = pool.caches[fmt]
    cache = c.tensor[..., :512].contiguous() if fmt == "bf16" else c.tensor
    q = torch.randn(T, heads, 512, dtype=c.q_dtype, device=DEV)
    idx = _with_garbage(make_indices(pool, T), NUM_SLOTS, frac=0.1)
    out = torch.full((T, heads, 512), float("nan"), dtype=c.q_dtype, device=DEV)
    fam, switches = _family(family)
    if family == "mma2d":  # the tables' shape of it
        switches = dict(MMA2D_WIDE)
    _, lse, cfg = sparse_mla_attention_with_config(q, cache, idx, SCALE, kv_format=c.kv_format, out=out,
                                                   return_lse=True, kernel=kernel, return_config=True, family=fam,
                                                   **switches)
    assert (cfg.family, cfg.dsplit) == (fam, switches.get("dsplit", False))
    check_against_reference(out, lse, q, cache, idx, kv_format=c.kv_format, all_rows=True)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_pow2"])
@pytest.mark.parametrize("family,heads", [("mma2", 16), ("wgmma", 64), ("wgmma_t", 16), ("wgmma_t", 8),
                                          ("wgmma_ws", 16), ("wgmma_ws", 8)])
def test_gluon_and_tl_agree(pool, fmt, family, heads):
    """The two kernels of one problem: both within the tolerance of the reference and of each other."""
    _skip_unless_supported(fmt, family)
    torch.manual_seed(77)
    T, H = ROWS[64], heads
    c = pool.caches[fmt]
    q = make_q(T, H, c.q_dtype)
    idx = make_indices(pool, T)
    outs = {}
    for fam in ("tl", family):
        outs[fam], lse, cfg = sparse_mla_attention_with_config(q, c.tensor, idx, SCALE, kv_format=c.kv_format,
                                                               return_lse=True, return_config=True, family=fam)
        assert cfg.family == fam
        check_against_reference(outs[fam], lse, q, c.tensor, idx, kv_format=c.kv_format)
    d = (outs["tl"].float() - outs[family].float()).norm() / outs["tl"].float().norm()
    assert d <= 1e-2, f"the kernels differ by {d:.2e}"


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_fp32"])
@pytest.mark.parametrize("stages,cap", [(2, 128), (3, 128)])
def test_gluon_register_cap(pool, gluon_launches, fmt, stages, cap):
    """``max_registers`` (ptxas maxnreg) reaches the mma2 build: the uncapped build of these shapes takes more
    registers than the cap, the capped one at most the cap, and both match the reference."""
    from triton_mla_sparse._common import launch
    from triton_mla_sparse.ops.sparse_mla.kernels_mma2 import _sparse_mla_fwd_mma2

    if not launch._ENABLED:
        pytest.skip("TRITON_MLA_SPARSE_FAST_LAUNCH=0: no launcher cache to read the builds from")
    _skip_unless_supported(fmt)
    torch.manual_seed(78)
    T, H = ROWS[64], 16
    c = pool.caches[fmt]
    q = make_q(T, H, c.q_dtype)
    idx = make_indices(pool, T)
    for reg in (None, cap):
        out, lse, cfg = sparse_mla_attention_with_config(q, c.tensor, idx, SCALE, kv_format=c.kv_format,
                                                         return_lse=True, return_config=True, family="mma2",
                                                         num_stages=stages, max_registers=reg)
        assert (cfg.family, cfg.max_registers) == ("mma2", reg)
        check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format)
    assert gluon_launches["mma2"] == 2
    # the launcher's key holds the launch options: the capped build, and the uncapped one with the same key otherwise
    cache = _launcher_cache(_sparse_mla_fwd_mma2)
    pairs = [(cache[k[:4] + ((),) + k[5:]].n_regs, cache[k].n_regs) for k in cache if k[4] == (("maxnreg", cap),)
             and dict(zip(k[0], k[1]))["STAGES"] == stages and k[:4] + ((),) + k[5:] in cache]
    assert pairs and all(capped <= cap < uncapped for uncapped, capped in pairs), pairs


def _launcher_cache(fn):
    from triton_mla_sparse.ops.sparse_mla import kernels_mma2

    launcher = kernels_mma2.launch_fwd_mma2
    launcher = getattr(launcher, "__wrapped_launcher__", launcher)
    assert launcher.kernel is fn
    return launcher.cache


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_pow2"])
@pytest.mark.parametrize("family,H", [("mma2", 16), ("wgmma", 64), ("wgmma_t", 16), ("wgmma_ws", 16)])
def test_gluon_cache_rows_off_16_bytes_run_the_tl_kernel(pool, gluon_launches, fmt, family, H):
    """cp.async copies 16-byte vectors: a cache whose row stride is not a multiple of 16 elements is read by the tl
    kernel instead, with the same result."""
    _skip_unless_supported(fmt, family)
    torch.manual_seed(13)
    T = ROWS[64]
    c = pool.caches[fmt]
    row = c.tensor.shape[-1]
    cache = torch.empty(NB, BS, row + 4 // c.tensor.element_size(), dtype=c.tensor.dtype, device=DEV)[..., :row]
    cache.copy_(c.tensor)
    assert (cache.stride(1) * cache.element_size()) % 16 != 0
    q = make_q(T, H, c.q_dtype)
    idx = make_indices(pool, T)
    out = torch.full((T, H, 512), float("nan"), dtype=c.q_dtype, device=DEV)
    _, lse, cfg = sparse_mla_attention_with_config(q, cache, idx, SCALE, kv_format=c.kv_format, out=out,
                                                   return_lse=True, return_config=True, family=family)
    assert sum(gluon_launches.values()) == 0
    assert cfg.family == "tl" and cfg.block_h <= 32  # the tl kernel's own entry, not the Gluon sizes
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format)


def test_fp16_q_with_fp8_ds_mla_runs_the_tl_kernel(pool, gluon_launches):
    """The rows' RoPE part is bf16 and the Gluon kernels copy it as stored: fp16 q reads them with the tl kernel."""
    torch.manual_seed(15)
    T, H = ROWS[64], 16
    c = pool.caches["fp8_ds_mla_pow2"]
    q = make_q(T, H, torch.float16)
    idx = make_indices(pool, T)
    out, lse, cfg = sparse_mla_attention_with_config(q, c.tensor, idx, SCALE, kv_format=c.kv_format,
                                                     return_lse=True, return_config=True)
    assert cfg.family == "tl" and sum(gluon_launches.values()) == 0
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format)


def test_family_for_a_format_it_never_runs_is_a_value_error(pool):
    """The API sends caches the Gluon kernels cannot read to the tl kernel, but a family asked for a format it never
    runs (per-tensor fp8) is still choose_config's ValueError, not a silent tl run."""
    _skip_unless_supported("bf16")
    c = pool.caches["fp8_e4m3"]
    q = make_q(ROWS[64], 16, c.q_dtype)
    with pytest.raises(ValueError, match="family: the mma2 kernel"):
        sparse_mla_attention_with_config(q, c.tensor, make_indices(pool, ROWS[64]), SCALE, kv_format=c.kv_format,
                                         k_scale=c.k_scale, family="mma2")


_UNITS_LIMIT = pytest.mark.xfail(
    strict=True, raises=AssertionError,
    reason="known limit (benchmarks/NOTES.md, session 5): with f16_dot the Gluon fp8_ds_mla path keeps each output "
           "chunk in units of the latest tile's chunk scale; tiles whose scales are more than ~2^108 apart overflow "
           "the change of units")


@pytest.mark.parametrize("family,heads,f16_dot", [pytest.param("mma2", 16, True, marks=_UNITS_LIMIT),
                                                   pytest.param("wgmma", 64, True, marks=_UNITS_LIMIT),
                                                   ("mma2", 16, False), ("wgmma", 64, False), ("wgmma_t", 16, False),
                                                   ("wgmma_ws", 16, False)])
@pytest.mark.parametrize("overlap", [False, True])
def test_gluon_fp8_scales_far_apart_across_tiles(family, heads, f16_dot, overlap):
    """fp8_ds_mla rows whose scales differ by 2^200 between the tiles of one list (the tl kernel and the reference
    hold them: bf16 / float32 have the range; so do the Gluon kernels' exact bf16 tiles, f16_dot off)."""
    _skip_unless_supported("fp8_ds_mla", family)
    from triton_mla_sparse import reference
    from triton_mla_sparse.testing import encode_cache

    torch.manual_seed(16)
    T, K, S = 4, 256, 512
    values = torch.randn(S, 576, device=DEV)
    values[:, :512] /= values[:, :512].abs().amax(1, keepdim=True)
    gain = torch.where(torch.arange(S, device=DEV) < S // 2, 2.0 ** 100, 2.0 ** -100)
    values[:, :512] *= gain[:, None]
    cache, _ = encode_cache(values.reshape(S // 64, 64, 576), "fp8_ds_mla", scale_format="pow2")
    # each list: its first 64 entries from the large rows, the rest from the small ones (tile 0, then tiles 1..)
    idx = torch.cat([torch.randint(0, S // 2, (T, 64), device=DEV), torch.randint(S // 2, S, (T, K - 64), device=DEV)],
                    1).to(torch.int32)
    q = torch.randn(T, heads, 576, device=DEV).to(torch.bfloat16)
    scale = 576 ** -0.5 / 2.0 ** 100
    if overlap and family != "wgmma_t":
        pytest.skip("overlap: the wgmma_t kernel's fp8_ds_mla variant")
    out, lse = sparse_mla_attention_with_config(q, cache, idx, scale, kv_format="fp8_ds_mla", return_lse=True,
                                                family=family, kernel="prefill", f16_dot=f16_dot, overlap=overlap)
    ref = reference.sparse_mla_attention(q, cache, idx, scale, kv_format="fp8_ds_mla", compute_dtype=torch.float32,
                                         out_dtype=torch.float32)
    assert torch.isfinite(out).all()
    assert rel_err(out[..., :128], ref[..., :128]) <= 2e-2


@pytest.mark.parametrize("family,heads,f16_dot", [("mma2", 16, True), ("mma2", 32, True), ("wgmma", 64, True),
                                                   ("mma2", 16, False), ("mma2", 32, False), ("wgmma", 64, False),
                                                   ("wgmma_t", 16, False), ("wgmma_t", 32, False),
                                                   ("wgmma_ws", 16, False), ("wgmma_ws", 32, False)])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("overlap", [False, True])
def test_gluon_fp8_chunk_scales_differ(gluon_launches, family, heads, kernel, f16_dot, overlap):
    """Each 128-column chunk of a row with its own scale, 2^-20 .. 2^15 apart and different per row (float32 scales):
    every chunk of the output matches the reference (a chunk read with another chunk's scale cannot)."""
    _skip_unless_supported("fp8_ds_mla", family)
    from triton_mla_sparse import reference
    from triton_mla_sparse.testing import encode_cache

    torch.manual_seed(17)
    T, K, S = 64, 512, 4096
    values = torch.randn(S, 576, device=DEV)
    gains = 2.0 ** torch.randint(-20, 16, (S, 4), device=DEV).float() * (1 + torch.rand(S, 4, device=DEV))
    values[:, :512] *= gains.repeat_interleave(128, dim=1)
    cache, _ = encode_cache(values.reshape(S // 64, 64, 576), "fp8_ds_mla", scale_format="fp32")
    idx = torch.stack([torch.randperm(S, device=DEV)[:K] for _ in range(T)]).to(torch.int32)
    q = torch.randn(T, heads, 576, device=DEV).to(torch.bfloat16)
    scale = 576 ** -0.5 / 2.0 ** 15
    if overlap and family != "wgmma_t":
        pytest.skip("overlap: the wgmma_t kernel's fp8_ds_mla variant")
    out, lse = sparse_mla_attention_with_config(q, cache, idx, scale, kv_format="fp8_ds_mla", return_lse=True,
                                                family=family, kernel=kernel, f16_dot=f16_dot, overlap=overlap)
    assert gluon_launches[family] == 1
    ref = reference.sparse_mla_attention(q, cache, idx, scale, kv_format="fp8_ds_mla", compute_dtype=torch.float32,
                                         out_dtype=torch.float32)
    assert torch.isfinite(out).all()
    for c in range(4):
        cols = slice(c * 128, c * 128 + 128)
        err = rel_err(out[..., cols], ref[..., cols])
        assert err <= 1e-2, f"chunk {c}: relative error {err:.2e}"


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_pow2"])
@pytest.mark.parametrize("family,heads", [("tl", 16), ("mma2", 16), ("wgmma", 64), ("wgmma_t", 16), ("wgmma_ws", 16)])
def test_combine_as_dependent_launch(pool, fmt, family, heads):
    """``pdl``: the combine kernel, launched as a programmatic dependent of the split kernel, reads the partials only
    once they are written — calls on alternating q, back to back (a combine that did not wait would read the
    previous call's partials), give the ordinary launch's output and lse bitwise, eager and replayed in a graph."""
    if family != "tl":
        _skip_unless_supported(fmt, family)
    from triton_mla_sparse.ops.sparse_mla.configs import pdl_supported

    if not pdl_supported(arch_for_device(torch.device(DEV))):
        pytest.skip("programmatic dependent launch: NVIDIA sm90 on")
    torch.manual_seed(5)
    T, H = ROWS[64], heads
    c = pool.caches[fmt]
    qs = [make_q(T, H, c.q_dtype) for _ in range(2)]
    idx = make_indices(pool, T)

    def run(q, pdl, out):
        return sparse_mla_attention_with_config(q, c.tensor, idx, SCALE, kv_format=c.kv_format, kernel="decode",
                                                family=family, num_splits=4, pdl=pdl, out=out, return_lse=True)

    want = [run(q, False, None) for q in qs]
    outs = [torch.full_like(want[0][0], float("nan")) for _ in qs]
    for _ in range(3):
        got = [run(q, True, o) for q, o in zip(qs, outs)]
    torch.cuda.synchronize()
    for (o, lse), (wo, wl) in zip(got, want):
        assert torch.equal(o, wo) and torch.equal(lse, wl)
    _replays_match(run, qs, outs, want, 1)


def _replays_match(run, qs, outs, want, replays):
    """``run(q, True, out)`` for each q captured into one CUDA graph (after a warm-up call on a side stream), then
    ``replays`` replays, each into outputs poisoned with NaN, giving ``want``'s outputs and lse bitwise."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(qs[0], True, outs[0])
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        got = [run(q, True, o) for q, o in zip(qs, outs)]
    for _ in range(replays):
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for (o, lse), (wo, wl) in zip(got, want):
            assert torch.equal(o, wo) and torch.equal(lse, wl)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_pow2", "fp8_ds_mla_fp32"])
@pytest.mark.parametrize("rows,splits,heads", [(64, 2, 16), (5, 2, 16), (64, 2, 5), (5, 2, 40), (64, 1, 16),
                                               (64, 3, 16)])
def test_split_merge_in_kernel(pool, fmt, rows, splits, heads, monkeypatch):
    """``merge``: with two splits the last of a row's splits to finish merges them in the wgmma_t kernel (no
    combine kernel runs) and gives the combine kernel's output and lse bitwise — with a sink and topk_length, heads
    short of a block and several head blocks, on alternating q back to back (a stale or unreset counter would merge
    the wrong partials), eager and replayed several times in a graph; every counter is back at 0 afterwards. One or
    three splits run the combine kernel."""
    _skip_unless_supported(fmt, "wgmma_t")
    from triton_mla_sparse._common import counters
    from triton_mla_sparse.ops.sparse_mla import kernels as K

    torch.manual_seed(7)
    T, H = ROWS[rows] if rows in ROWS else rows, heads
    c = pool.caches[fmt]
    qs = [make_q(T, H, c.q_dtype) for _ in range(2)]
    idx = make_indices(pool, T)
    extra = dict(attn_sink=torch.randn(H, device=DEV), topk_length=torch.randint(0, TOPK + 1, (T,), device=DEV,
                                                                                 dtype=torch.int32))

    def run(q, merge, out):
        return sparse_mla_attention_with_config(q, c.tensor, idx, SCALE, kv_format=c.kv_format, kernel="decode",
                                                family="wgmma_t", block_h=16, num_splits=splits, merge=merge,
                                                out=out, return_lse=True, **extra)

    want = [run(q, False, None) for q in qs]
    combines = []
    real = K._launch_combine
    monkeypatch.setattr(K, "_launch_combine", lambda *a, **k: (combines.append(1), real(*a, **k)))
    outs = [torch.full_like(want[0][0], float("nan")) for _ in qs]
    for _ in range(3):
        got = [run(q, True, o) for q, o in zip(qs, outs)]
    torch.cuda.synchronize()
    assert len(combines) == (0 if splits == 2 else 6)
    for (o, lse), (wo, wl) in zip(got, want):
        assert torch.equal(o, wo) and torch.equal(lse, wl)
    _replays_match(run, qs, outs, want, 3)
    ring = counters.ring(torch.device(DEV))
    assert ring is not None or splits != 2
    assert ring is None or not ring.any()


def _regrouped(cache: torch.Tensor, kv_format: str, bs: int) -> torch.Tensor:
    """The same slots (and NaN poison) in blocks of ``bs`` rows with a spare NaN row after each block and 16 spare
    elements after each row: another block size and other strides than the main cache's."""
    row = cache.shape[-1]
    flat = cache.reshape(-1, row)  # slot order
    storage = torch.empty(flat.shape[0] // bs, bs + 1, row + 16, dtype=cache.dtype, device=DEV)
    _fill_nan_(storage, kv_format)
    view = storage[:, :bs, :row]
    view.copy_(flat.view(-1, bs, row))
    return view


@pytest.mark.parametrize("family", [None, "tl", "mma2", "mma2-bh32", "mma2d-bh32", "wgmma_t", "wgmma", "wgmma_ws"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_pow2"])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_extra_cache(pool, gluon_launches, fmt, kernel, family):
    """An extra cache (DeepSeek-V4's second list) read by each kernel family (None: the table's choice) on a
    problem the table gives a Gluon kernel: both caches (the extra one NaN outside its selected rows, in blocks of
    another size with other strides), garbage ids and lengths in both lists, a sink; "mma2-bh32": mma2 with the
    32-head blocks of 16-row tiles of the sm8x / sm120 tables; "mma2d-bh32": the same asking for the dims split,
    which reads no extra cache: the mma2 kernel runs it."""
    if family == "mma2d-bh32" and fmt != "bf16":
        pytest.skip("dsplit: the mma2 kernel's bf16/fp16 variant")
    # (the dims split names its stages too: a forced mma2 prefill on sm90 takes one, which it refuses)
    over = {"mma2-bh32": MMA2_WIDE, "mma2d-bh32": MMA2D_WIDE}.get(family, {})
    family = "mma2" if over else family
    if family not in (None, "tl"):
        _skip_unless_supported(fmt, family)
    torch.manual_seed(9)
    T, H = ROWS[64], 16
    c = pool.caches[fmt]
    q = make_q(T, H, c.q_dtype)
    idx = _with_garbage(make_indices(pool, T), NUM_SLOTS, frac=0.2)
    idx2 = _with_garbage(make_indices(pool, T), NUM_SLOTS, frac=0.2)[:, : max(1, TOPK // 3)].contiguous()
    cache2 = _regrouped(poisoned_cache(pool, fmt, idx2)[1], c.kv_format, BS // 4)
    tl1 = torch.randint(0, TOPK + 1, (T,), dtype=torch.int32, device=DEV)
    tl2 = torch.randint(0, idx2.shape[1] + 1, (T,), dtype=torch.int32, device=DEV)
    sink = torch.randn(H, device=DEV)
    out = torch.full((T, H, 512), float("nan"), dtype=c.q_dtype, device=DEV)
    extra = dict(extra_kv_cache=cache2, extra_indices=idx2, extra_topk_length=tl2)
    _, lse, cfg = sparse_mla_attention_with_config(q, c.tensor, idx, SCALE, kv_format=c.kv_format, topk_length=tl1,
                                                   attn_sink=sink, out=out, kernel=kernel, return_lse=True,
                                                   return_config=True, **({"family": family} if family else {}),
                                                   **over, **extra)
    assert family is None or cfg.family == family
    assert all(getattr(cfg, k) == v for k, v in over.items())
    if over:
        assert (gluon_launches["mma2"], gluon_launches["mma2d"]) == (1, 0)
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format, topk_length=tl1, attn_sink=sink,
                            **extra)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_mma2d_running_max_jumps(pool, kernel, stages):
    """The dims split's running max moving twice in mid-list, in both loops (two stages, and three: pipelined): rows
    whose slots at a quarter of the list and near its end hold one head's q times 0.5 and 1 (scores ~26 and ~52 in
    log2 units, the rest below ~8), so that the output accumulated so far is rescaled by ~2^-20 each time."""
    _skip_unless_supported("bf16", "mma2d")
    torch.manual_seed(77 + stages)
    T, H = ROWS[64], 64
    c = pool.caches["bf16"]
    q = make_q(T, H, c.q_dtype)
    idx = make_indices(pool, T)
    cache = c.tensor.clone()
    flat = cache.view(-1, cache.shape[-1])
    for t in range(T):
        for pos, mult in ((TOPK // 4 + 3 + t % 5, 0.5), (TOPK - 5 - t % 7, 1.0)):
            flat[idx[t, pos]] = (q[t, t % H] * mult).to(cache.dtype)
    out = torch.full((T, H, 512), float("nan"), dtype=c.q_dtype, device=DEV)
    _, lse, cfg = sparse_mla_attention_with_config(q, cache, idx, SCALE, kv_format=c.kv_format, out=out,
                                                   return_lse=True, kernel=kernel, return_config=True,
                                                   **dict(MMA2D_WIDE, num_stages=stages, family="mma2"))
    assert (cfg.family, cfg.dsplit, cfg.num_stages) == ("mma2", True, stages)
    check_against_reference(out, lse, q, cache, idx, kv_format=c.kv_format, all_rows=True)

"""GPU reliability tier: limits, garbage indices (under compute-sanitizer: the ``memcheck`` cases), no leaks of
unselected data, numerics at the edges, two CUDA streams and CUDA-graph replay. Skipped without a CUDA GPU.

* Limits: 70 000 query rows (grid axis 0; decode with 2 splits puts 140 000 programs there), a cache of more than
  2^31 bytes and 3.7 M slots read at its far end (int64 offsets), top-k 16 384, heads 1 / 3 / 127 / 128 (129 is
  rejected up front, as is top-k 16 385).
* ``memcheck`` cases (``bash benchmarks/memcheck.sh`` runs them under ``compute-sanitizer --tool memcheck``):
  garbage indices (random int32, INT32_MIN/MAX, negatives, >= num_slots) with the cache and every other tensor in a
  dedicated allocation that ends exactly where the tensor ends, NaN everywhere the kernels must not read.
* NaN/±inf in every unselected slot, in the padding of rows and blocks and past topk_length, for every format.
* Numerics at real sizes in bfloat16: huge and tiny softmax scales, logits far beyond float16's range, all-equal
  scores, a single valid index, valid entries only at the end of the list, fp8 scales near the ends of float32.
* Two streams launching different problems concurrently give bitwise the sequential results; CUDA-graph replay
  gives bitwise the eager results, also after new inputs are copied in.

Developer hook, as in test_gpu.py: ``TMS_GPU_TESTS_ON_CPU=1 pytest tests/gpu`` runs the cases at tiny sizes through
the Triton interpreter (float16 q; large-memory, stream and graph cases skip).
"""

from __future__ import annotations

import math

import pytest
import torch

from ._env import DEV, GPU_TIER, INT32_MAX, INT32_MIN, ON_CPU, QD, gpu_only  # first: may switch on the interpreter
from triton_mla_sparse import reference, sparse_mla_attention
from triton_mla_sparse.ops.sparse_mla.api import sparse_mla_attention_with_config
from triton_mla_sparse.ops.sparse_mla.configs import COMPILED_ONLY_SWITCHES, GLUON_ONLY_SWITCHES, AttentionConfig
from triton_mla_sparse.formats import FP8_E4M3_MAX, KV_FORMAT_DTYPES, KV_FORMATS, kv_row_width
from triton_mla_sparse.testing import encode_cache, take_rows

pytestmark = GPU_TIER

OUT_TOL = 5e-3 if ON_CPU else 1e-2  # relative L2 error of out against the float64 reference (bf16 rounding)
LSE_TOL = 1e-2  # |lse - ref| <= LSE_TOL + 1e-5 · |ref| (as test_gpu.py, plus a relative term for huge logits)
SCALE = 192 ** -0.5
# Boolean switches of the launch configuration (whatever this version of the kernels has).
# every switch of the tl kernel's configuration (the Gluon kernels' own: GLUON_MEMCHECK)
# (not the compiled-launch ones: pdl has its own GPU test, and the interpreter and pre-sm90 targets refuse it)
SWITCHES = sorted(n for n, f in AttentionConfig.__dataclass_fields__.items()
                  if f.type in ("bool", bool) and n not in GLUON_ONLY_SWITCHES + COMPILED_ONLY_SWITCHES)

if ON_CPU:
    TOPK, BS, NB, CHECK_ROWS = 40, 16, 8, 8
else:
    TOPK, BS, NB, CHECK_ROWS = 2048, 64, 256, 256


# ------------------------------------------------------------------------------------------ building blocks

def buffer_at_end(shape, dtype, *, strides=None, fill: int = 0xFF) -> torch.Tensor:
    """A view of ``shape`` (contiguous, or with ``strides``) in a dedicated uint8 allocation of a multiple of 512
    bytes whose LAST byte is the view's last byte; everything else holds ``fill`` bytes (0xFF is NaN in every float
    format). The slack needed to reach 512 bytes sits in front.

    What this buys under ``compute-sanitizer --tool memcheck``: with PyTorch's caching allocator off
    (PYTORCH_NO_CUDA_MEMORY_CACHING=1, as memcheck.sh sets) this tensor is one cudaMalloc of exactly n_bytes, so the
    first byte past the view lies outside every allocation (memcheck.sh also asks for padding after each
    allocation), and a kernel that reads one row too far — a slot id of num_slots, the RoPE part of a NoPE row, an
    entry past topk — is reported instead of silently reading a neighbour. With the caching allocator on (normal
    runs) a multiple of 512 bytes leaves no rounding slack after the view inside its block, but other tensors may
    follow in the same segment: there the NaN fill and the comparisons catch what the sanitizer would."""
    es = torch.empty((), dtype=dtype).element_size()
    if strides is None:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
    if any(n == 0 for n in shape):
        return torch.empty(shape, dtype=dtype, device=DEV)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    n_bytes = -(-span * es // 512) * 512
    buf = torch.full((n_bytes,), fill, dtype=torch.uint8, device=DEV)
    view = buf.view(dtype).as_strided(tuple(shape), tuple(strides), n_bytes // es - span)
    assert view.data_ptr() + (span - 1) * es + es == buf.data_ptr() + n_bytes
    return view


def copy_to_end(t: torch.Tensor, **kw) -> torch.Tensor:
    """``t`` copied into :func:`buffer_at_end` (contiguous)."""
    v = buffer_at_end(tuple(t.shape), t.dtype, **kw)
    v.copy_(t)
    return v


def cache_at_end(stored: torch.Tensor, *, row_pad: int = 0, block_pad: int = 0) -> torch.Tensor:
    """Cache rows [nb, bs, row] in an allocation ending at the last row, with ``row_pad`` spare elements after each
    row and ``block_pad`` after each block (NaN bytes), as a [nb, bs, row] view."""
    nb, bs, row = stored.shape
    rs = row + row_pad
    v = buffer_at_end((nb, bs, row), stored.dtype, strides=(bs * rs + block_pad, rs, 1))
    v.copy_(stored)
    return v


def random_values(n: int) -> torch.Tensor:
    return torch.randn(n, 576, device=DEV)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8) if t.element_size() == 1 else t


def sample_rows(T: int, n: int = CHECK_ROWS) -> torch.Tensor | None:
    """A sorted random subset of rows that always holds the first and the last row (None: all rows)."""
    if T <= n:
        return None
    g = torch.Generator().manual_seed(T)
    rows = torch.cat([torch.tensor([0, T - 1]), torch.randperm(T - 2, generator=g)[: n - 2] + 1])
    return rows.sort().values.to(DEV)


def compare(out, lse, q, cache, idx, *, kv_format, k_scale=None, topk_length=None, attn_sink=None, scale=SCALE,
            rows=None, tol=OUT_TOL, lse_tol=LSE_TOL, tiles=False, what=""):
    """out must be finite everywhere (it is pre-filled with NaN) and lse free of NaN/+inf; on ``rows`` (None: all)
    out and lse must match the float64 reference: relative L2 error of out <= tol (per 128-wide latent tile too
    with ``tiles``), |lse - ref| <= lse_tol + 1e-5 · |ref|, -inf exactly where the reference has it, rows without
    a valid index exactly 0."""
    assert torch.isfinite(out).all(), f"{what}: out holds NaN/inf (unwritten or polluted)"
    assert not torch.isnan(lse).any() and not (lse == math.inf).any(), f"{what}: lse holds NaN/+inf"
    ref, ref_lse = reference.sparse_mla_attention(
        take_rows(q, rows), cache, take_rows(idx, rows), scale, kv_format=kv_format, k_scale=k_scale,
        topk_length=take_rows(topk_length, rows), attn_sink=attn_sink, return_lse=True, compute_dtype=torch.float64,
        out_dtype=torch.float64)
    o, lg = take_rows(out, rows).double(), take_rows(lse, rows).double()
    parts = [slice(0, 512)] + ([slice(128 * c, 128 * c + 128) for c in range(4)] if tiles else [])
    for sl in parts:
        num, den = (o[..., sl] - ref[..., sl]).norm().item(), ref[..., sl].norm().item()
        floor = 2.0 ** -126 * math.sqrt(ref[..., sl].numel())
        err = num / max(den, floor)
        assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e} (columns {sl.start}..{sl.stop})"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lg), fin), f"{what}: lse finite/-inf pattern differs from the reference"
    if fin.any():
        d = ((lg[fin] - ref_lse[fin]).abs() - 1e-5 * ref_lse[fin].abs()).max().item()
        assert d <= lse_tol, f"{what}: lse error {d:.3e} > {lse_tol:.0e} (+ 1e-5 · |lse|)"
    if (~fin).any():
        assert torch.all(o[~fin] == 0), f"{what}: rows without a valid index must be exactly 0"


class _NoCheck:
    violations = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _bounds_check():
    """On the CPU hook, the interpreter's bounds check of tests/helpers.py (what memcheck does on the GPU)."""
    if ON_CPU:
        from helpers import interpreter_memcheck  # tests/ is on sys.path (rootdir-relative imports)

        return interpreter_memcheck()
    return _NoCheck()


def run(q, cache, idx, *, kv_format, kernel="auto", scale=SCALE, out=None, **kw):
    """The Triton path into a NaN-filled (or the given) out; returns (out, lse, cfg)."""
    q0 = q[0] if isinstance(q, tuple) else q
    if out is None:
        out = torch.full((q0.shape[0], q0.shape[1], 512), float("nan"), dtype=q0.dtype, device=DEV)
    with _bounds_check() as mc:
        res, lse, cfg = sparse_mla_attention_with_config(q, cache, idx, scale, kv_format=kv_format, out=out,
                                                         return_lse=True, return_config=True, kernel=kernel, **kw)
    assert not mc.violations, f"out-of-bounds accesses ({cfg}):\n" + "\n".join(mc.violations)
    assert res is out
    if kernel != "auto":
        assert cfg.kernel == kernel
    return out, lse, cfg


def distinct_indices(T: int, topk: int, num_slots: int, *, invalid_frac: float = 0.1, lo: int = 0) -> torch.Tensor:
    """int32 [T, topk]: distinct slots of [lo, num_slots) per row (as the indexer gives), a fraction replaced by
    invalid values of every kind."""
    span = num_slots - lo
    assert span >= topk
    keys = torch.rand(T, span, device=DEV)
    idx = keys.topk(topk, dim=1).indices + lo
    bad = torch.tensor([-1, -1, -2, num_slots, num_slots + 1, INT32_MIN, INT32_MAX, -num_slots], device=DEV)
    pick = bad[torch.randint(0, len(bad), (T, topk), device=DEV)]
    idx = torch.where(torch.rand(T, topk, device=DEV) < invalid_frac, pick, idx)
    return idx.to(torch.int32)


def garbage_indices(T: int, topk: int, num_slots: int) -> torch.Tensor:
    """int32 [T, topk] built to reach every edge: row 0 only garbage (random int32 over the whole range), row 1 only
    the last slot (plus garbage), row 2 valid entries only at the end, other rows a mix; every row holds INT32_MIN,
    INT32_MAX, -1, -num_slots, num_slots and num_slots + 1."""
    g = torch.randint(INT32_MIN, INT32_MAX, (T, topk), dtype=torch.int64, device=DEV)
    g = torch.where((g >= 0) & (g < num_slots), g - num_slots, g)  # guaranteed invalid
    valid = torch.randint(0, num_slots, (T, topk), device=DEV)
    idx = torch.where(torch.rand(T, topk, device=DEV) < 0.5, g, valid)
    idx[0] = g[0]
    idx[1] = torch.where(torch.rand(topk, device=DEV) < 0.5, g[1], num_slots - 1)
    idx[2, : topk - 3] = g[2, : topk - 3]
    idx[2, topk - 3:] = torch.tensor([0, num_slots - 1, num_slots // 2], device=DEV)
    specials = [INT32_MIN, INT32_MAX, -1, -num_slots, num_slots, num_slots + 1, INT32_MIN + 1, INT32_MAX - 1]
    for j, v in enumerate(specials):
        idx[3:, 3 + j] = v
    return idx.to(torch.int32)


# ------------------------------------------------------------------------------------------ limits

@pytest.mark.parametrize("kernel,heads,overrides", [("prefill", 16, {}),
                                                    ("decode", 16, {"num_splits": 2, "block_n": 32}),
                                                    ("auto", 128, {})])
def test_70000_rows(kernel, heads, overrides):
    """More rows than a grid's y/z axes allow (65 535): rows (× splits) go on axis 0. Checked on a subset of rows
    that holds the first and the last; every row must be written (out starts as NaN)."""
    torch.manual_seed(1)
    T = 20 if ON_CPU else 70_000
    topk = 64
    S = NB * BS
    cache, _ = encode_cache(random_values(S).reshape(NB, BS, 576), "bf16")
    q = torch.randn(T, heads, 576, dtype=QD, device=DEV)
    idx = torch.randint(-16, S + 16, (T, topk), dtype=torch.int32, device=DEV)
    out, lse, cfg = run(q, cache, idx, kv_format="bf16", kernel=kernel, **overrides)
    if not ON_CPU:
        assert T * cfg.num_splits > 65_535
    if "num_splits" in overrides:
        assert cfg.num_splits == overrides["num_splits"]
    compare(out, lse, q, cache, idx, kv_format="bf16", rows=sample_rows(T), what=f"{cfg}")


@gpu_only
@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "fp8_ds_mla"])
def test_cache_over_2_31_bytes_read_at_its_far_end(fmt):
    """A cache of 4.26 M slots (> 2^31 bytes in every format, > 2^31 elements for bf16) that ends its allocation,
    NaN everywhere except the selected slots, which sit in its last 4096 slots (the last one included): slot ·
    row stride must be computed in int64."""
    torch.manual_seed(2)
    bs = 64
    nb = (1 << 22) // bs + 1024
    S = nb * bs
    row, dtype = kv_row_width(fmt), KV_FORMAT_DTYPES[fmt]
    cache = buffer_at_end((nb, bs, row), dtype)  # 0xFF bytes: NaN
    assert S > 3_700_000 and cache.numel() * cache.element_size() > 2 ** 31
    T, H, K = 16, 16, 256
    idx = torch.randint(S - 4096, S, (T, K), device=DEV)
    idx[:, 0] = S - 1
    idx[:, 1] = S  # one past the end: invalid
    idx[:, 2] = INT32_MAX
    idx[:, 3] = -1
    valid = (idx >= 0) & (idx < S)
    used = idx[valid].unique()
    stored, ks = encode_cache(random_values(used.numel()), fmt)
    flat = as_bytes(cache.view(-1, row))  # the view is contiguous: [num_slots, row] (bytes for the fp8 formats)
    flat[used] = as_bytes(stored)
    idx = idx.to(torch.int32)
    q = torch.randn(T, H, 576, dtype=QD, device=DEV)
    for kernel in ("decode", "prefill"):
        out, lse, cfg = run(q, cache, idx, kv_format=fmt, k_scale=ks, kernel=kernel)
        compare(out, lse, q, cache, idx, kv_format=fmt, k_scale=ks, what=f"{fmt} {cfg}")
    del cache, flat
    torch.cuda.empty_cache()


@pytest.mark.parametrize("kernel,fmt,heads", [("decode", "bf16", 16), ("prefill", "fp8_ds_mla", 64),
                                              ("auto", "fp8_e4m3", 128)])
def test_topk_16384(kernel, fmt, heads):
    """The longest supported list (16 384 distinct slots, some invalid, the last slot included)."""
    torch.manual_seed(3)
    K = 16384 if not ON_CPU else 200
    nb = (2 * K) // BS
    S = nb * BS
    stored, ks = encode_cache(random_values(S).reshape(nb, BS, 576), fmt)
    T = 3
    q = torch.randn(T, heads, 576, dtype=QD, device=DEV)
    idx = distinct_indices(T, K, S)
    idx[:, -1] = S - 1
    out, lse, cfg = run(q, stored, idx, kv_format=fmt, k_scale=ks, kernel=kernel)
    assert idx.shape[1] == K
    compare(out, lse, q, stored, idx, kv_format=fmt, k_scale=ks, what=f"{cfg}")


@pytest.mark.parametrize("heads", [1, 3, 127, 128])
def test_head_counts(heads):
    """Head counts that are not a multiple of any head block, and the largest supported one."""
    torch.manual_seed(4 + heads)
    T = 64 if not ON_CPU else 3
    S = NB * BS
    cache, _ = encode_cache(random_values(S).reshape(NB, BS, 576), "fp8_ds_mla")
    q = torch.randn(T, heads, 576, dtype=QD, device=DEV)
    idx = distinct_indices(T, TOPK, S)
    for kernel in ("decode", "prefill"):
        out, lse, cfg = run(q, cache, idx, kv_format="fp8_ds_mla", kernel=kernel)
        compare(out, lse, q, cache, idx, kv_format="fp8_ds_mla", rows=sample_rows(T), what=f"H={heads} {cfg}")


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_unsupported_sizes_rejected_up_front(impl):
    """129 heads and top-k 16 385: one ValueError naming the argument (with the reason), out untouched."""
    fn = sparse_mla_attention if impl == "triton" else reference.sparse_mla_attention
    cache, _ = encode_cache(random_values(64).reshape(4, 16, 576), "bf16")
    for H, K, name in ((129, 64, "q"), (16, 16385, "indices")):
        q = torch.randn(2, H, 576, dtype=QD, device=DEV)
        idx = torch.zeros(2, K, dtype=torch.int32, device=DEV)
        out = torch.full((2, H, 512), 7.0, dtype=QD, device=DEV)
        with pytest.raises(ValueError, match=rf"^{name}: expected .*\(") as e:
            fn(q, cache, idx, SCALE, out=out)
        assert str(129 if H == 129 else 16385) in str(e.value)
        assert (out == 7.0).all()


# ------------------------------------------------------------------------------------------ memcheck cases

MEMCHECK_CASES = [  # (format, D_qk): every code path of the gather (NoPE rows end 64 elements earlier)
    ("bf16", 576), ("fp8_e4m3", 576), ("fp8_ds_mla", 576), ("bf16", 512), ("fp8_ds_mla", 512),
]


@pytest.mark.memcheck
@pytest.mark.parametrize("fmt,d_qk", MEMCHECK_CASES, ids=[f"{f}-{d}" for f, d in MEMCHECK_CASES])
def test_garbage_indices_stay_in_bounds(fmt, d_qk):
    """Garbage indices against a padded cache whose last row ends its allocation, with q, indices, topk_length,
    attn_sink and out in allocations of their own that end where they end; everything the kernels must not read
    holds NaN. Decode (4 splits) and prefill; results equal the reference on a clean copy of the cache."""
    torch.manual_seed(5)
    nb, bs = 12, 64
    S = nb * bs
    T, H, K = 8, 16, 256
    stored, ks = encode_cache(random_values(S).reshape(nb, bs, 576)[..., :d_qk], fmt)
    pad = 16  # elements (bytes for the fp8 formats, a multiple of 4 as fp8_ds_mla needs)
    cache = cache_at_end(stored, row_pad=pad, block_pad=3 * pad)
    q = copy_to_end(torch.randn(T, H, d_qk, dtype=QD, device=DEV))
    idx = copy_to_end(garbage_indices(T, K, S))
    tl = copy_to_end(torch.tensor([K, K, K, INT32_MAX, K - 5, 0, -3, 1], dtype=torch.int32, device=DEV))
    sink = copy_to_end(torch.randn(H, device=DEV))
    variants = [("decode", {"num_splits": 4}), ("prefill", {})]
    for name in SWITCHES:  # each switch of the configuration both ways (once per kernel)
        variants += [("decode", {"num_splits": 3, name: True}), ("prefill", {name: False})]
    for kernel, over in variants:
        out = copy_to_end(torch.full((T, H, 512), float("nan"), dtype=QD, device=DEV))
        out, lse, cfg = run(q, cache, idx, kv_format=fmt, k_scale=ks, kernel=kernel, out=out, topk_length=tl,
                            attn_sink=sink, **over)
        assert cfg.kernel == kernel
        compare(out, lse, q, stored.to(DEV), idx, kv_format=fmt, k_scale=ks, topk_length=tl, attn_sink=sink,
                what=f"{fmt}/{d_qk} {cfg}")
        assert torch.all(out[0] == 0) and torch.all(lse[0] == -math.inf)  # row 0: nothing valid


GLUON_MEMCHECK = [("mma2", 16, {}), ("wgmma", 64, {}), ("wgmma_t", 16, {"overlap": False}),
                  ("wgmma_t", 16, {"overlap": True}), ("wgmma_ws", 16, {}),
                  ("mma2", 64, {"dsplit": True, "block_h": 32, "block_n": 16, "num_stages": 2}),
                  ("mma2", 64, {"dsplit": True, "block_h": 32, "block_n": 16, "num_stages": 3})]  # pipelined


# each kernel with the formats it reads (the dims split: bf16/fp16; wgmma_ws: fp8_ds_mla), so that a memcheck run
# skips nothing on sm90 (benchmarks/memcheck.sh counts a skip as a failure: no CUDA under the sanitizer)
GLUON_MEMCHECK_CASES = [(f, h, e, fmt, d) for f, h, e in GLUON_MEMCHECK
                        for fmt, d in (("bf16", 576), ("fp8_ds_mla", 576), ("fp8_ds_mla", 512))
                        if (fmt == "bf16" or not e.get("dsplit")) and (fmt != "bf16" or f != "wgmma_ws")]


@pytest.mark.memcheck
@pytest.mark.parametrize("family,H,extra,fmt,d_qk", GLUON_MEMCHECK_CASES,
                         ids=[f"{f}-h{h}" + "".join(f"-{k}-{v}" for k, v in e.items()) + f"-{fmt}-{d}"
                              for f, h, e, fmt, d in GLUON_MEMCHECK_CASES])
def test_gluon_garbage_indices_stay_in_bounds(gluon_launches, family, H, extra, fmt, d_qk):
    """The Gluon kernels (asked for by family) on the setting above: garbage indices, a cache whose last row ends its
    allocation, every tensor ending its own allocation, NaN wherever they must not read; decode and prefill."""
    from triton_mla_sparse.capabilities import arch_for_device
    from triton_mla_sparse.ops.sparse_mla.configs import gluon_supported

    if ON_CPU or not gluon_supported(family, arch_for_device(torch.device(DEV)), fmt):
        pytest.skip(f"the {family} kernel does not run here")
    launched = "mma2d" if extra.get("dsplit") else family  # kernels_mma2d.py counts apart
    torch.manual_seed(7)
    nb, bs = 12, 64
    S = nb * bs
    T, K = 8, 256
    stored, _ = encode_cache(random_values(S).reshape(nb, bs, 576)[..., :d_qk], fmt)
    cache = cache_at_end(stored, row_pad=16, block_pad=48)
    q = copy_to_end(torch.randn(T, H, d_qk, dtype=QD, device=DEV))
    idx = copy_to_end(garbage_indices(T, K, S))
    tl = copy_to_end(torch.tensor([K, K, K, INT32_MAX, K - 5, 0, -3, 1], dtype=torch.int32, device=DEV))
    sink = copy_to_end(torch.randn(H, device=DEV))
    for n, (kernel, over) in enumerate((("decode", {"num_splits": 4}), ("prefill", {}))):
        out = copy_to_end(torch.full((T, H, 512), float("nan"), dtype=QD, device=DEV))
        out, lse, cfg = run(q, cache, idx, kv_format=fmt, kernel=kernel, out=out, topk_length=tl, attn_sink=sink,
                            family=family, **over, **extra)
        assert (cfg.kernel, cfg.family, gluon_launches[launched]) == (kernel, family, n + 1)  # no silent fallback
        compare(out, lse, q, stored.to(DEV), idx, kv_format=fmt, topk_length=tl, attn_sink=sink,
                what=f"{family} {kernel} {cfg}")


@pytest.mark.memcheck
@pytest.mark.parametrize("family", ["tl", "mma2", "wgmma", "wgmma_t"])
def test_v4_pages_garbage_indices_stay_in_bounds(family):
    """DeepSeek-V4 pages (fp8_ds_mla_v4, each kernel family that reads them here): both caches in allocations that
    end at the last page's last footer byte (the page padding of every other page NaN bytes), garbage indices and
    lengths in both lists, a sink; decode and prefill against the reference on clean copies."""
    from triton_mla_sparse.capabilities import arch_for_device
    from triton_mla_sparse.formats import (FP8_DS_MLA_V4, V4_TOKEN_BYTES, quantize_fp8_ds_mla_v4, v4_page_bytes,
                                           v4_token_view)
    from triton_mla_sparse.ops.sparse_mla.configs import gluon_supported

    if family != "tl" and (ON_CPU or not gluon_supported(family, arch_for_device(torch.device(DEV)), FP8_DS_MLA_V4,
                                                         QD)):
        pytest.skip(f"the {family} kernel does not run here")

    torch.manual_seed(9)
    T, H, bs = 8, 16, 64

    def pages_at_end(nb: int, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        clean = v4_token_view(quantize_fp8_ds_mla_v4(torch.randn(nb, bs, 512)).to(DEV), bs)  # vLLM's view
        view = buffer_at_end(tuple(clean.shape), torch.uint8, strides=(v4_page_bytes(bs), V4_TOKEN_BYTES, 1))
        view.copy_(clean)
        return view, clean

    swa, swa_clean = pages_at_end(3, bs)
    cmp, cmp_clean = pages_at_end(288, 2)  # C128A's compressed cache: pages of 2 rows
    q = copy_to_end(torch.randn(T, H, 512, dtype=QD, device=DEV))
    idx = copy_to_end(garbage_indices(T, 96, swa.shape[0] * bs))
    idx2 = copy_to_end(garbage_indices(T, 160, cmp.shape[0] * 2))
    tl1 = copy_to_end(torch.tensor([96, 96, 96, INT32_MAX, 91, 0, -3, 1], dtype=torch.int32, device=DEV))
    tl2 = copy_to_end(torch.tensor([0, 160, INT32_MIN, 160, 7, 160, 160, 2], dtype=torch.int32, device=DEV))
    sink = copy_to_end(torch.randn(H, device=DEV))
    for kernel in ("decode", "prefill"):
        out, lse, cfg = run(q, swa, idx, kv_format=FP8_DS_MLA_V4, kernel=kernel, topk_length=tl1, attn_sink=sink,
                            extra_kv_cache=cmp, extra_indices=idx2, extra_topk_length=tl2, family=family)
        assert cfg.family == family  # no silent fallback
        ref, ref_lse = reference.sparse_mla_attention(
            q, swa_clean, idx, SCALE, kv_format=FP8_DS_MLA_V4, topk_length=tl1, attn_sink=sink, return_lse=True,
            extra_kv_cache=cmp_clean, extra_indices=idx2, extra_topk_length=tl2, out_dtype=torch.float32)
        assert torch.isfinite(out).all() and not torch.isnan(lse).any(), kernel
        err = (out.float() - ref).norm().item() / max(ref.norm().item(), 1e-30)
        assert err <= OUT_TOL, f"{kernel}: relative error {err:.3e}"
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), kernel


@pytest.mark.memcheck
def test_degenerate_caches_stay_in_bounds():
    """A cache of one slot (ending its allocation) and a cache of no slot at all, with garbage indices."""
    torch.manual_seed(6)
    T, H, K = 3, 16, 64
    q = copy_to_end(torch.randn(T, H, 576, dtype=QD, device=DEV))
    stored, _ = encode_cache(random_values(1).reshape(1, 1, 576), "bf16")
    one = cache_at_end(stored)
    idx = copy_to_end(garbage_indices(T, K, 1))
    for kernel in ("decode", "prefill"):
        out, lse, _ = run(q, one, idx, kv_format="bf16", kernel=kernel)
        compare(out, lse, q, stored.to(DEV), idx, kv_format="bf16", what=f"one slot {kernel}")
        empty = torch.empty(0, 64, 576, dtype=torch.bfloat16, device=DEV)
        out, lse, _ = run(q, empty, idx, kv_format="bf16", kernel=kernel)
        assert (out == 0).all() and torch.isneginf(lse).all()


# ------------------------------------------------------------------------------------------ no leaks

NAN_CASES = [(f, 576) for f in KV_FORMATS] + [("fp8_ds_mla", 512), ("bf16", 512)]


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("fmt,d_qk", NAN_CASES, ids=[f"{f}-{d}" for f, d in NAN_CASES])
def test_nan_inf_in_unselected_data_never_reach_out_or_lse(fmt, d_qk, kernel):
    """Every slot that no used entry selects — slot 0, slots only invalid ids or entries past topk_length point
    at — holds NaN, +inf or -inf (fp8_ds_mla: NaN bytes, +inf tile scales, or NaN RoPE), and so does the padding
    after every row and block; NoPE fp8_ds_mla rows have NaN RoPE bytes even where selected."""
    torch.manual_seed(7)
    T, H = (64, 64) if not ON_CPU else (4, 16)
    S = NB * BS
    clean, ks = encode_cache(random_values(S).reshape(NB, BS, 576)[..., :d_qk], fmt)
    idx = distinct_indices(T, TOPK, S, invalid_frac=0.2, lo=1)
    idx[:, 0] = 0  # slot 0 ...
    tl = torch.full((T,), TOPK, dtype=torch.int32, device=DEV)
    tl[::2] = TOPK // 2  # ... lies past topk_length in even rows, as does everything after TOPK // 2
    tl[1::4] = 0
    n = tl.long().clamp(0, TOPK)
    live = torch.arange(TOPK, device=DEV)[None, :] < n[:, None]
    sel = idx.long()[live & (idx >= 0) & (idx < S)].unique()
    cache = cache_at_end(clean, row_pad=16, block_pad=48)  # padding and the bytes in front: NaN
    # poison everything unselected
    keep = torch.zeros(S, dtype=torch.bool, device=DEV)
    keep[sel] = True
    blk, off = (~keep).nonzero()[:, 0] // BS, (~keep).nonzero()[:, 0] % BS
    kind = torch.randint(0, 3, blk.shape, device=DEV)
    b = as_bytes(cache)
    if fmt in ("bf16", "fp16"):
        for k, v in enumerate((float("nan"), float("inf"), float("-inf"))):
            cache[blk[kind == k], off[kind == k]] = v
    elif fmt == "fp8_e4m3":
        b[blk, off] = 0x7F  # NaN (e4m3fn has no inf)
    else:
        inf4 = torch.tensor([math.inf] * 4, dtype=torch.float32, device=DEV).view(torch.uint8)
        b[blk[kind == 0], off[kind == 0]] = 0xFF
        b[blk[kind == 1], off[kind == 1], 512:528] = inf4
        b[blk[kind == 2], off[kind == 2], 528:] = 0xFF
    q = torch.randn(T, H, d_qk, dtype=QD, device=DEV)
    out, lse, cfg = run(q, cache, idx, kv_format=fmt, k_scale=ks, kernel=kernel, topk_length=tl)
    compare(out, lse, q, clean, idx, kv_format=fmt, k_scale=ks, topk_length=tl, rows=sample_rows(T),
            what=f"{fmt}/{d_qk} {cfg}")


# ------------------------------------------------------------------------------------------ numerics at the edges

EDGES = ["huge_scale", "tiny_scale", "big_logits_scaled", "big_logits_one_hot", "equal_scores", "zero_q",
         "single_valid", "valid_only_at_end", "ds_mla_pow2_2^-100", "ds_mla_pow2_2^+100", "ds_mla_fp32_extremes",
         "e4m3_k_scale_1e-30", "e4m3_k_scale_1e+30"]


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("edge", EDGES)
def test_numerics_edges(edge, kernel):
    torch.manual_seed(8)
    T, H = (16, 64) if not ON_CPU else (3, 16)
    S = NB * BS
    fmt, scale, scale_format = "bf16", SCALE, "pow2"
    values = random_values(S)
    qv = torch.randn(T, H, 576, device=DEV)
    idx = distinct_indices(T, TOPK, S)
    over, tiles, ks_override = {}, False, None
    if edge == "huge_scale":  # scores in the hundreds: one-hot weights
        scale = 40.0
    elif edge == "tiny_scale":  # uniform weights
        scale = 1e-8
    elif edge.startswith("big_logits"):  # q·k ~ 1e7, far beyond float16's 65504
        if ON_CPU:
            pytest.skip("float16 q cannot hold these values")
        qv *= 100
        values *= 100
        scale = SCALE / 1e4 if edge.endswith("scaled") else SCALE
    elif edge == "equal_scores":
        values[:] = values[0]
    elif edge == "zero_q":
        qv.zero_()
    elif edge == "single_valid":
        keep = torch.randint(0, TOPK, (T,), device=DEV)
        one = torch.randint(0, S, (T,), device=DEV, dtype=torch.int32)
        idx[:] = -1
        idx[torch.arange(T, device=DEV), keep] = one
    elif edge == "valid_only_at_end":  # every decode split but the last is empty
        idx[:, :-3] = INT32_MIN
        over = {"num_splits": 8} if kernel == "decode" else {}
    elif edge.startswith("ds_mla"):
        if ON_CPU:
            pytest.skip("float16 q cannot hold these values")
        fmt, tiles = "fp8_ds_mla", True
        if edge == "ds_mla_fp32_extremes":  # arbitrary float32 scales around 3e-30 .. 3e+29, tiles 2^40 apart
            scale_format = "fp32"
            gains = torch.tensor([3.1e-30, 7.7e-18, 1.3e-5, 2.9e29], device=DEV)
        else:
            e = -100 if "-100" in edge else 100
            gains = torch.tensor([2.0 ** e, 2.0 ** (e + 3), 2.0 ** (e - 4), 2.0 ** e], device=DEV)
        values = values / values[:, :512].abs().amax(1, keepdim=True)  # latents in [-1, 1] per row
        values[:, :512] *= gains.repeat_interleave(128)
        values[:, 512:] *= float(gains.max())  # RoPE (bf16 in the row) as large as the largest tile
        scale = SCALE / float(gains.max())  # scores stay O(1) (dots are summed in float32)
    elif edge.startswith("e4m3"):
        if ON_CPU:
            pytest.skip("float16 q cannot hold these values")
        fmt = "fp8_e4m3"
        ks_override = 1e-30 if "-30" in edge else 1e30
    if fmt == "fp8_e4m3":  # stored values span e4m3's range; the real values are stored · 1e±30
        amax = float(values.abs().amax())
        cache, enc_scale = encode_cache(values.reshape(NB, BS, 576), fmt, k_scale=amax / FP8_E4M3_MAX)
        ks = ks_override
        scale = SCALE * enc_scale / ks  # scores as with the unscaled values
    else:
        cache, ks = encode_cache(values.reshape(NB, BS, 576), fmt, scale_format=scale_format)
    q = qv.to(QD)
    out, lse, cfg = run(q, cache, idx, kv_format=fmt, k_scale=ks, kernel=kernel, scale=scale, **over)
    compare(out, lse, q, cache, idx, kv_format=fmt, k_scale=ks, scale=scale, tiles=tiles, what=f"{edge} {cfg}")
    if edge == "equal_scores":  # the output is the (bf16-rounded) row itself
        want = cache[0, 0, :512].to(out.dtype).expand_as(out)
        ok = torch.isfinite(lse)[..., None].expand_as(out)
        assert (out[ok] - want[ok]).abs().max() <= 2 ** -7 * want.abs().max()


# ------------------------------------------------------------------------------------------ concurrency

def _problem(T, H, fmt, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    S = NB * BS
    cache, ks = encode_cache(torch.randn(S, 576, device=DEV, generator=g).reshape(NB, BS, 576), fmt)
    q = torch.randn(T, H, 576, device=DEV, generator=g).to(QD)
    idx = distinct_indices(T, TOPK, S)
    return dict(q=q, cache=cache, idx=idx, fmt=fmt,
                ks=None if ks is None else torch.tensor([ks], dtype=torch.float32, device=DEV),
                tl=torch.randint(0, TOPK + 1, (T,), dtype=torch.int32, device=DEV),
                sink=torch.randn(H, device=DEV))


def _call(p, kernel, out):
    return sparse_mla_attention_with_config(p["q"], p["cache"], p["idx"], SCALE, kv_format=p["fmt"], k_scale=p["ks"],
                                            topk_length=p["tl"], attn_sink=p["sink"], out=out, return_lse=True,
                                            kernel=kernel)


@gpu_only
def test_two_streams_concurrently_equal_sequential():
    """A decode problem and a prefill problem launched over and over on two streams at once (no synchronisation
    between launches) give bitwise the results of one stream."""
    torch.manual_seed(9)
    a = _problem(4, 128, "fp8_ds_mla", 1)
    b = _problem(1024, 16, "bf16", 2)
    seq = {}
    for name, p, kernel in (("a", a, "decode"), ("b", b, "prefill")):
        o = torch.empty(p["q"].shape[0], p["q"].shape[1], 512, dtype=QD, device=DEV)
        seq[name] = tuple(t.clone() for t in _call(p, kernel, o))
    torch.cuda.synchronize()
    n = 6
    outs = {k: [torch.full_like(seq[k][0], float("nan")) for _ in range(n)] for k in seq}
    lses = {k: [] for k in seq}
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    for i in range(n):
        with torch.cuda.stream(s1):
            lses["a"].append(_call(a, "decode", outs["a"][i])[1])
        with torch.cuda.stream(s2):
            lses["b"].append(_call(b, "prefill", outs["b"][i])[1])
    torch.cuda.current_stream().wait_stream(s1)
    torch.cuda.current_stream().wait_stream(s2)
    torch.cuda.synchronize()
    for k in seq:
        for i in range(n):
            assert torch.equal(outs[k][i], seq[k][0]), f"problem {k}, launch {i}: out differs from one stream"
            assert torch.equal(lses[k][i], seq[k][1]), f"problem {k}, launch {i}: lse differs from one stream"


@gpu_only
def test_cuda_graph_replay_equals_eager():
    """One graph holding a decode call (fp8_e4m3, k_scale as a tensor) and a prefill call (fp8_ds_mla), both with
    topk_length and attn_sink: replay equals eager bitwise, also after new q / indices / lengths are copied in."""
    torch.manual_seed(10)
    a = _problem(8, 64, "fp8_e4m3", 3)
    b = _problem(512, 16, "fp8_ds_mla", 4)
    outs = [torch.full((p["q"].shape[0], p["q"].shape[1], 512), float("nan"), dtype=QD, device=DEV) for p in (a, b)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compile outside the capture
        _call(a, "decode", outs[0])
        _call(b, "prefill", outs[1])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _, lse_a = _call(a, "decode", outs[0])
        _, lse_b = _call(b, "prefill", outs[1])
    for step in range(3):
        if step:  # new inputs, in place
            for p, seed in ((a, 20 + step), (b, 30 + step)):
                fresh = _problem(p["q"].shape[0], p["q"].shape[1], p["fmt"], seed)
                for k in ("q", "idx", "tl", "sink"):
                    p[k].copy_(fresh[k])
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for p, kernel, o, lse in ((a, "decode", outs[0], lse_a), (b, "prefill", outs[1], lse_b)):
            e_out, e_lse = _call(p, kernel, torch.empty_like(o))
            assert torch.equal(o, e_out) and torch.equal(lse, e_lse), f"step {step} {kernel}: replay != eager"
    compare(outs[1], lse_b, b["q"], b["cache"], b["idx"], kv_format="fp8_ds_mla", topk_length=b["tl"],
            attn_sink=b["sink"], rows=sample_rows(512))
    del g

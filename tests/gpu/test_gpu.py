"""GPU tier: the Triton kernels against the float32 reference at production shapes (heads 8–128, top-k 2048,
1 / 64 / 4096 rows, block 64), every cache format, both kernels, CUDA-graph capture and replay, NaN planted outside
the selection, garbage indices, 64-bit offsets. Skipped without a CUDA GPU.

Developer hook: ``TMS_GPU_TESTS_ON_CPU=1 pytest tests/gpu`` runs the same tests at tiny sizes through the Triton
interpreter (float16 q instead of bfloat16; graph and large-cache tests skip) to check the tier's own logic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from ._env import DEV, GPU_TIER, INT32_MAX, INT32_MIN, ON_CPU, QD, gpu_only  # first: may switch on the interpreter
from triton_mla_sparse import quantize_fp8_ds_mla, reference, sparse_mla_attention, topk_to_slots
from triton_mla_sparse.ops.sparse_mla.api import sparse_mla_attention_with_config
from triton_mla_sparse.capabilities import arch_for_device
from triton_mla_sparse.ops.sparse_mla.configs import MAX_BLOCK_H
from triton_mla_sparse.testing import encode_cache, random_block_table, random_topk_positions, rel_err, take_rows

pytestmark = GPU_TIER

if ON_CPU:
    TOPK, CTX, BS, NREQ, CHECK_ROWS = 32, 128, 16, 4, 4
    ROWS = {1: 1, 64: 4, 4096: 8}
else:
    TOPK, CTX, BS, NREQ, CHECK_ROWS = 2048, 8192, 64, 8, 256
    ROWS = {1: 1, 64: 64, 4096: 4096}
SCALE = 256 ** -0.5
NB = NREQ * CTX // BS  # blocks in the pool
NUM_SLOTS = NB * BS
FORMATS = ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla_pow2", "fp8_ds_mla_fp32"]
HEADS = [8, 16, 64, 128]
LSE_ATOL = 1e-2


@dataclass
class Cache:
    tensor: torch.Tensor  # [NB, BS, row] in the format
    kv_format: str
    k_scale: float | None
    q_dtype: torch.dtype


@dataclass
class Pool:
    values: torch.Tensor  # float32 [NB, BS, 576]
    block_table: torch.Tensor  # int32 [NREQ, CTX // BS]
    caches: dict


@pytest.fixture(scope="module")
def pool() -> Pool:
    torch.manual_seed(0)
    values = torch.randn(NB, BS, 576, dtype=torch.float32, device=DEV)
    bt = random_block_table(NREQ, CTX // BS, DEV)

    def cache(fmt: str, q_dtype: torch.dtype = QD, scale_format: str = "pow2") -> Cache:
        stored, k_scale = encode_cache(values, fmt, scale_format=scale_format)
        return Cache(stored, fmt, k_scale, q_dtype)

    caches = {"bf16": cache("bf16"), "fp16": cache("fp16", torch.float16), "fp8_e4m3": cache("fp8_e4m3"),
              "fp8_ds_mla_pow2": cache("fp8_ds_mla"), "fp8_ds_mla_fp32": cache("fp8_ds_mla", scale_format="fp32")}
    return Pool(values=values, block_table=bt, caches=caches)


def make_indices(pool: Pool, T: int) -> torch.Tensor:
    """int32 [T, TOPK]: distinct random positions of the row's request (row t -> request t % NREQ), as slots."""
    req = (torch.arange(T, device=DEV) % NREQ).to(torch.int32)
    pos = random_topk_positions(T, CTX, TOPK, DEV)
    return topk_to_slots(pos, req, pool.block_table, BS)


def make_q(T: int, H: int, dtype) -> torch.Tensor:
    return torch.randn(T, H, 576, dtype=dtype, device=DEV)


def subset(T: int) -> torch.Tensor | None:
    if T <= CHECK_ROWS:
        return None
    g = torch.Generator().manual_seed(T)
    return torch.randperm(T, generator=g)[:CHECK_ROWS].sort().values.to(DEV)


def tol_for(q_dtype) -> float:
    return 1e-2 if q_dtype == torch.bfloat16 else 5e-3


def check_against_reference(out, lse, q, cache_tensor, idx, *, kv_format, k_scale=None, topk_length=None,
                            attn_sink=None, tol=None, all_rows=False, extra_kv_cache=None, extra_indices=None,
                            extra_topk_length=None):
    """out must be finite everywhere (it was pre-filled with NaN); on the checked rows out and lse must match the
    float32 reference; lse is -inf exactly where the reference's is."""
    T = idx.shape[0]
    assert torch.isfinite(out).all(), "output holds NaN/inf (unwritten or polluted rows)"
    assert not torch.isnan(lse).any() and not (lse == math.inf).any()
    sel = None if all_rows else subset(T)
    qd = q[0].dtype if isinstance(q, tuple) else q.dtype
    ks = k_scale
    ref, ref_lse = reference.sparse_mla_attention(
        take_rows(q, sel), cache_tensor, take_rows(idx, sel), SCALE, kv_format=kv_format, k_scale=ks,
        topk_length=take_rows(topk_length, sel), attn_sink=attn_sink, return_lse=True, compute_dtype=torch.float32,
        out_dtype=torch.float32, extra_kv_cache=extra_kv_cache, extra_indices=take_rows(extra_indices, sel),
        extra_topk_length=take_rows(extra_topk_length, sel))
    o, l = take_rows(out, sel), take_rows(lse, sel)
    err = rel_err(o, ref)
    limit = tol if tol is not None else tol_for(qd)
    assert err <= limit, f"relative error {err:.3e} > {limit:.0e}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(l), fin), "lse finite/-inf pattern differs from the reference"
    assert torch.all(l[~fin] == -math.inf)
    if fin.any():
        d = (l[fin] - ref_lse[fin]).abs().max().item()
        assert d <= LSE_ATOL, f"lse differs by {d:.3e}"
    # rows with no valid entry: exactly zero
    empty = ~fin
    if empty.any():
        assert torch.all(o.float()[empty] == 0)
    return err


def run(q, c: Cache, idx, *, kernel="auto", out=None, **kw):
    T, H = idx.shape[0], (q[0] if isinstance(q, tuple) else q).shape[1]
    dt = (q[0] if isinstance(q, tuple) else q).dtype
    if out is None:
        out = torch.full((T, H, 512), float("nan"), dtype=dt, device=DEV)
    res, lse, cfg = sparse_mla_attention_with_config(q, c.tensor, idx, SCALE, kv_format=c.kv_format,
                                                     k_scale=c.k_scale, out=out, return_lse=True, kernel=kernel,
                                                     return_config=True, **kw)
    assert res is out
    return out, lse, cfg


# ------------------------------------------------------------------------------------------ main matrix

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 64, 4096])
@pytest.mark.parametrize("heads", HEADS)
def test_matrix(pool, heads, rows, fmt):
    torch.manual_seed(1000 * heads + rows)
    T = ROWS[rows]
    c = pool.caches[fmt]
    q = make_q(T, heads, c.q_dtype)
    idx = make_indices(pool, T)
    out, lse, cfg = run(q, c, idx)
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format, k_scale=c.k_scale)


@pytest.mark.parametrize("heads,rows,fmt,kernel,overrides", [
    (16, 64, "bf16", "prefill", {}),
    (128, 64, "fp8_ds_mla_pow2", "prefill", {}),
    (64, 1, "fp8_e4m3", "prefill", {}),
    (8, 1, "fp8_ds_mla_fp32", "prefill", {}),
    (16, 4096, "bf16", "decode", {}),
    (128, 4096, "fp8_ds_mla_fp32", "decode", {"num_splits": 2}),
    (8, 64, "fp8_ds_mla_fp32", "decode", {"num_splits": 7}),
    (128, 1, "bf16", "decode", {"num_splits": 32, "block_n": 64}),
    (64, 64, "fp16", "decode", {"num_splits": 3}),
    # the 64-head block that the sm90 table no longer picks (it spills): still reachable there; refused where it
    # cannot be built (sm100: tensor memory)
    (128, 64, "bf16", "prefill", {"block_h": 64, "block_n": 64, "family": "tl"}),
    (64, 64, "fp8_ds_mla_pow2", "decode", {"block_h": 64, "block_n": 64, "num_splits": 4, "family": "tl"}),
])
def test_forced_kernel(pool, heads, rows, fmt, kernel, overrides):
    torch.manual_seed(7 * heads + rows)
    T = ROWS[rows]
    c = pool.caches[fmt]
    q = make_q(T, heads, c.q_dtype)
    idx = make_indices(pool, T)
    arch = arch_for_device(torch.device(DEV))
    if arch is not None and overrides.get("block_h", 0) > MAX_BLOCK_H.get(arch.name, 64):
        with pytest.raises(ValueError, match="block_h"):
            run(q, c, idx, kernel=kernel, **overrides)
        return
    out, lse, cfg = run(q, c, idx, kernel=kernel, **overrides)
    assert cfg.kernel == kernel
    # every override is taken as given (on the interpreter's short lists a split count can shrink to fit)
    assert {k: getattr(cfg, k) for k in overrides if not (ON_CPU and k == "num_splits")} == \
        {k: v for k, v in overrides.items() if not (ON_CPU and k == "num_splits")}
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format, k_scale=c.k_scale)


@pytest.mark.parametrize("q_dtype,fmt", [(torch.bfloat16, "fp16"), (torch.float16, "bf16")])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_q_dtype_differs_from_cache(pool, q_dtype, fmt, kernel):
    if ON_CPU and q_dtype == torch.bfloat16:
        pytest.skip("bf16 dots in the interpreter")
    torch.manual_seed(3)
    T = ROWS[64]
    c = pool.caches[fmt]
    q = make_q(T, 16, q_dtype)
    idx = make_indices(pool, T)
    out, lse, _ = run(q, c, idx, kernel=kernel)
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_pow2"])
def test_q_tuple_noncontiguous_views(pool, fmt):
    """vLLM's form: q = (q_nope view of a wider tensor, q_pe), out a strided view."""
    torch.manual_seed(4)
    T, H = ROWS[64], 16
    c = pool.caches[fmt]
    wide = torch.randn(T, H, 640, dtype=c.q_dtype, device=DEV)
    q_nope = wide[..., 64:576]
    q_pe = torch.randn(T, H, 64, dtype=c.q_dtype, device=DEV)
    idx = make_indices(pool, T)
    out_wide = torch.full((T, H, 600), float("nan"), dtype=c.q_dtype, device=DEV)
    out = out_wide[..., 8:520]
    res, lse = sparse_mla_attention((q_nope, q_pe), c.tensor, idx, SCALE, kv_format=c.kv_format, out=out,
                                    return_lse=True)
    assert res is out
    assert torch.isnan(out_wide[..., :8]).all() and torch.isnan(out_wide[..., 520:]).all(), "wrote outside out"
    check_against_reference(out, lse, (q_nope, q_pe), c.tensor, idx, kv_format=c.kv_format)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla_pow2"])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_nope_512(pool, fmt, kernel):
    """D_qk = 512 (no RoPE part): bf16 rows of 512 values; fp8_ds_mla rows keep 656 bytes, rope bytes unread."""
    torch.manual_seed(5)
    T, H = ROWS[64], 16
    c = pool.caches[fmt]
    cache = c.tensor[..., :512].contiguous() if fmt == "bf16" else c.tensor
    q = torch.randn(T, H, 512, dtype=c.q_dtype, device=DEV)
    idx = make_indices(pool, T)
    out = torch.full((T, H, 512), float("nan"), dtype=c.q_dtype, device=DEV)
    _, lse = sparse_mla_attention_with_config(q, cache, idx, SCALE, kv_format=c.kv_format, out=out,
                                              return_lse=True, kernel=kernel)
    check_against_reference(out, lse, q, cache, idx, kv_format=c.kv_format)


# ------------------------------------------------------------------------------------------ CUDA graphs

@gpu_only
@pytest.mark.parametrize("rows,heads,fmt", [(64, 16, "bf16"), (64, 128, "fp8_ds_mla_pow2"), (4096, 64, "bf16"),
                                            (1, 8, "fp8_e4m3"), (64, 64, "fp8_ds_mla_fp32")])
def test_cuda_graph_capture_and_replay_with_new_inputs(pool, rows, heads, fmt):
    torch.manual_seed(11 + rows + heads)
    T = ROWS[rows]
    c = pool.caches[fmt]
    # fp8_e4m3: the scale as a device tensor (read at replay time, as under graph capture in vLLM)
    ks = None if c.k_scale is None else torch.tensor([c.k_scale], dtype=torch.float32, device=DEV)
    kw = dict(kv_format=c.kv_format, k_scale=ks)
    q = make_q(T, heads, c.q_dtype)
    idx = make_indices(pool, T)
    out = torch.full((T, heads, 512), float("nan"), dtype=c.q_dtype, device=DEV)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles the kernels outside the capture
        sparse_mla_attention(q, c.tensor, idx, SCALE, out=out, **kw)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _, lse = sparse_mla_attention(q, c.tensor, idx, SCALE, out=out, return_lse=True, **kw)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    e_out, e_lse = sparse_mla_attention(q, c.tensor, idx, SCALE, return_lse=True, **kw)
    assert torch.equal(out, e_out) and torch.equal(lse, e_lse), "replay differs from eager on the same inputs"

    # New q values and new indices (a few invalid), written in place; replay must see them.
    q.copy_(make_q(T, heads, c.q_dtype))
    new_idx = make_indices(pool, T)
    new_idx[:, :5] = -1
    idx.copy_(new_idx)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    e_out2, e_lse2 = sparse_mla_attention(q, c.tensor, idx, SCALE, return_lse=True, **kw)
    assert not torch.equal(e_out2, e_out)
    assert torch.equal(out, e_out2) and torch.equal(lse, e_lse2), "replay after in-place input changes differs"
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format, k_scale=c.k_scale)
    del g


# ------------------------------------------------------------------------------------------ NaN and garbage

def _fill_nan_(t: torch.Tensor, kv_format: str):
    if kv_format in ("bf16", "fp16"):
        t.fill_(float("nan"))
    elif kv_format == "fp8_e4m3":
        t.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
    else:
        t.fill_(0xFF)  # fp8_ds_mla: NaN latent bytes, NaN float32 scales, NaN bf16 rope


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _with_garbage(idx: torch.Tensor, num_slots: int, frac: float = 0.3) -> torch.Tensor:
    idx = idx.clone()
    T, K = idx.shape
    g = torch.randint(INT32_MIN, INT32_MAX, (T, K), dtype=torch.int64, device=DEV)
    g = torch.where(g.abs() < num_slots, g - num_slots, g).to(torch.int32)  # guaranteed invalid
    idx = torch.where(torch.rand(T, K, device=DEV) < frac, g, idx)
    specials = [INT32_MIN, INT32_MAX, -1, num_slots, num_slots + 1, -num_slots, INT32_MIN + 1, INT32_MAX - 1]
    for j, v in enumerate(specials[:K]):
        idx[:, j] = v
    if T > 1:
        idx[0] = g[0]  # row 0: nothing valid -> out 0, lse -inf
    if K > 12 and T > 2:
        idx[2, 11] = idx[2, 12]  # a duplicated valid slot counts twice
    return idx


def poisoned_cache(pool: Pool, fmt: str, idx: torch.Tensor) -> tuple[Cache, torch.Tensor]:
    """``(the pool's cache in fmt, a strided NaN-filled copy)``: the copy holds the clean rows only at the slots
    ``idx`` selects; every other slot, the slack between blocks and after each row is NaN."""
    c = pool.caches[fmt]
    clean = c.tensor
    row = clean.shape[-1]
    storage = torch.empty(NB, BS + 3, row + 16, dtype=clean.dtype, device=DEV)
    _fill_nan_(storage, c.kv_format)
    cache = storage[:, :BS, :row]
    valid = idx[(idx >= 0) & (idx < NUM_SLOTS)].long().unique()
    blk, off = valid // BS, valid % BS
    _bytes(cache)[blk, off] = _bytes(clean)[blk, off]
    return c, cache


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_nan_outside_the_selection_never_reaches_output(pool, fmt, kernel):
    """Every unselected slot, and the slack between blocks and after each row of a strided cache, holds NaN."""
    torch.manual_seed(21)
    T, H = ROWS[64], 16
    idx = _with_garbage(make_indices(pool, T), NUM_SLOTS, frac=0.1)
    c, cache = poisoned_cache(pool, fmt, idx)
    clean = c.tensor
    q = make_q(T, H, c.q_dtype)
    out = torch.full((T, H, 512), float("nan"), dtype=c.q_dtype, device=DEV)
    _, lse = sparse_mla_attention_with_config(q, cache, idx, SCALE, kv_format=c.kv_format, k_scale=c.k_scale,
                                              out=out, return_lse=True, kernel=kernel)
    # reference on the clean cache: same values at every selected slot, finite everywhere else
    check_against_reference(out, lse, q, clean, idx, kv_format=c.kv_format, k_scale=c.k_scale, all_rows=True)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "fp8_ds_mla_pow2"])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_garbage_indices_match_reference(pool, fmt, kernel):
    torch.manual_seed(31)
    T, H = ROWS[64], 64
    c = pool.caches[fmt]
    q = make_q(T, H, c.q_dtype)
    idx = _with_garbage(make_indices(pool, T), NUM_SLOTS, frac=0.5)
    out, lse, cfg = run(q, c, idx, kernel=kernel)
    assert cfg.kernel == kernel
    if T > 1:
        assert torch.all(out[0] == 0) and torch.all(lse[0] == -math.inf)
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format, k_scale=c.k_scale, all_rows=True)


@pytest.mark.parametrize("rows,heads,kernel", [(64, 16, "decode"), (64, 16, "prefill"), (4096, 64, "auto")])
def test_topk_length_and_attn_sink(pool, rows, heads, kernel):
    torch.manual_seed(41)
    T = ROWS[rows]
    c = pool.caches["bf16"]
    q = make_q(T, heads, c.q_dtype)
    idx = make_indices(pool, T)
    tl = torch.randint(-5, TOPK + 10, (T,), dtype=torch.int32, device=DEV)
    for j, v in enumerate([0, TOPK, TOPK + 100, -1, 1, BS - 1]):
        if j < T:
            tl[j] = v
    sink = torch.randn(heads, dtype=torch.float32, device=DEV)
    out, lse, _ = run(q, c, idx, kernel=kernel, topk_length=tl, attn_sink=sink)
    check_against_reference(out, lse, q, c.tensor, idx, kv_format=c.kv_format, topk_length=tl, attn_sink=sink)


@gpu_only
@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
def test_large_cache_64bit_offsets(fmt):
    """More than 2^22 slots: slot · row stride passes 2^31 elements/bytes."""
    torch.manual_seed(51)
    bs = 64
    nb = (1 << 22) // bs + 512
    n_slots = nb * bs
    row = 576 if fmt == "bf16" else 656
    dtype = torch.bfloat16 if fmt == "bf16" else torch.uint8
    cache = torch.zeros(nb, bs, row, dtype=dtype, device=DEV)
    T, H = 16, 16
    hi = torch.randint(n_slots - 50_000, n_slots, (T, TOPK // 2), device=DEV)
    anywhere = torch.randint(0, n_slots, (T, TOPK - TOPK // 2), device=DEV)
    idx = torch.cat([hi, anywhere], dim=1).to(torch.int32)
    used = idx.long().unique()
    vals = torch.randn(used.numel(), 576, device=DEV)
    enc = vals.to(torch.bfloat16) if fmt == "bf16" else quantize_fp8_ds_mla(vals)
    cache.view(-1, row)[used] = enc
    q = make_q(T, H, torch.bfloat16)
    for kernel in ("decode", "prefill"):
        out = torch.full((T, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
        _, lse = sparse_mla_attention_with_config(q, cache, idx, SCALE, kv_format=fmt, out=out, return_lse=True,
                                                  kernel=kernel)
        check_against_reference(out, lse, q, cache, idx, kv_format=fmt, all_rows=True)
    del cache
    torch.cuda.empty_cache()


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_cached_launch_follows_each_specialisation(pool, kernel):
    """The cached launcher (_common/launch.py) must never reuse a compiled kernel across specialisations: calls
    alternate between 16-byte aligned and misaligned tensors and between strides divisible by 16 and not, and
    each result must match the reference (a reused aligned build on misaligned data reads the wrong elements or
    faults)."""
    T, H = 64 if DEV == "cuda" else 4, 16
    c = pool.caches["bf16"]
    idx = make_indices(pool, T)
    base = make_q(T, H, c.q_dtype)
    flat = torch.empty(T * H * 576 + 1, dtype=c.q_dtype, device=DEV)
    misaligned = flat[1:].view(T, H, 576)  # starts 2 bytes past an aligned address
    misaligned.copy_(base)
    wide = torch.empty(T, H, 584, dtype=c.q_dtype, device=DEV)[..., :576]  # head stride 584: not divisible by 16
    wide.copy_(base)
    out_mis = torch.full((T * H * 512 + 1,), float("nan"), dtype=c.q_dtype, device=DEV)[1:].view(T, H, 512)
    for _ in range(2):
        for q, out in ((base, None), (misaligned, None), (wide, None), (base, out_mis), (misaligned, out_mis)):
            o, lse, _ = run(q, c, idx, kernel=kernel, out=None if out is None else out.fill_(float("nan")))
            check_against_reference(o, lse, base, c.tensor, idx, kv_format=c.kv_format)

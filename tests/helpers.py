"""Attention-test builders and checks: a layer over :mod:`triton_mla_sparse.testing` (the shared fixtures).

Inputs are random but realistic: q ~ N(0, 1) in float16 (the interpreter's bf16 dots are garbage), cache latents
with different magnitudes per 128-wide tile (so a kernel applying the wrong fp8_ds_mla tile scale fails), scores
with a spread of a few units (neither uniform nor one-hot softmax weights).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from triton_mla_sparse import reference
from triton_mla_sparse import testing
from triton_mla_sparse.formats import D_V, infer_kv_format
from triton_mla_sparse.formats import KV_FORMATS as FORMATS  # noqa: F401  (re-exported to the tests)
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config
from triton_mla_sparse.testing import LAYOUTS, kv_values, rel_err  # noqa: F401  (re-exported to the tests)
from triton_mla_sparse.testing import encode_cache as encode

# Optional config switches (tests exercise them only where this version of the package has them).

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# Tolerances of the kernel's float16 output against the float64 reference: (relative L2 error of out, absolute
# error of lse). With bf16/fp16/fp8_e4m3 caches and pow2-scaled fp8_ds_mla every dequantised cache value is exactly
# representable in float16, so only float16 rounding of the output and of the softmax weights remains (measured
# max over the matrix: out 3.0e-4, lse 4e-6). With fp32-scaled fp8_ds_mla the kernel rounds e4m3 · scale to q's
# dtype before its dots (2^-11 relative per value in float16): measured max out 9.6e-4, lse 1.8e-3 (the typical lse
# error is ~5e-4 = sm_scale · sqrt(Σ q²k²) · 2^-11/sqrt(3)). test_attention_features pins that path tightly
# against the reference evaluated on the same values rounded to float16.
REL_TOL = 1e-3
LSE_ATOL = 1e-4
REL_TOL_FP32_SCALES = 2.5e-3
LSE_ATOL_FP32_SCALES = 5e-3


def tolerances(fmt: str, scale_format: str = "pow2") -> dict:
    """Keyword arguments (tol, lse_atol) of :func:`assert_matches` for a cache format."""
    if fmt == "fp8_ds_mla" and scale_format == "fp32":
        return dict(tol=REL_TOL_FP32_SCALES, lse_atol=LSE_ATOL_FP32_SCALES)
    return dict(tol=REL_TOL, lse_atol=LSE_ATOL)


def place(stored: torch.Tensor, layout: str) -> torch.Tensor:
    """:func:`triton_mla_sparse.testing.place` on the test device."""
    return testing.place(stored.to(DEVICE), layout)


@dataclass
class Problem:
    """One attention call's inputs plus the real (float32) cache values they encode."""

    q: Any
    kv_cache: torch.Tensor
    indices: torch.Tensor
    softmax_scale: float
    kv_format: str | None
    k_scale: Any = None
    num_slots: int = 0
    scale_format: str = "pow2"
    extra: dict = field(default_factory=dict)

    @property
    def tol(self) -> dict:
        return tolerances(self.kv_format_name, self.scale_format)

    @property
    def kv_format_name(self) -> str:
        return self.kv_format or infer_kv_format(self.kv_cache)

    @property
    def T(self):
        return self.indices.shape[0]

    @property
    def H(self):
        q = self.q[0] if isinstance(self.q, tuple) else self.q
        return q.shape[1]

    def args(self):
        return (self.q, self.kv_cache, self.indices, self.softmax_scale)

    def kwargs(self, **kw):
        d = dict(kv_format=self.kv_format, k_scale=self.k_scale)
        d.update(self.extra)
        d.update(kw)
        return d


def make_indices(T: int, topk: int, num_slots: int, invalid_frac: float = 0.15) -> torch.Tensor:
    """int32 [T, topk] random slots (duplicates allowed) with a fraction of every kind of invalid value."""
    if num_slots > 0:
        idx = torch.randint(0, num_slots, (T, topk), dtype=torch.int64)
    else:
        idx = torch.full((T, topk), -1, dtype=torch.int64)
    bad_values = torch.tensor([-1, -1, -7, num_slots, num_slots + 5, INT32_MIN, INT32_MAX], dtype=torch.int64)
    bad = torch.rand(T, topk) < invalid_frac
    idx = torch.where(bad, bad_values[torch.randint(0, len(bad_values), (T, topk))], idx)
    return idx.to(torch.int32).to(DEVICE)


def make_problem(fmt: str, T: int, H: int, topk: int, block_size: int, *, num_blocks: int | None = None,
                 d_qk: int = 576, layout: str = "3d", scale_format: str = "pow2", invalid_frac: float = 0.15,
                 infer_format: bool = False, k_scale_tensor: bool = False, softmax_scale: float = 192 ** -0.5,
                 q_dtype=torch.float16) -> Problem:
    if num_blocks is None:
        num_blocks = max(2, -(-(5 * topk // 2) // block_size))
    values = kv_values(num_blocks * block_size, d_qk).reshape(num_blocks, block_size, d_qk)
    stored, k_scale = encode(values, fmt, scale_format=scale_format)
    kv_cache = place(stored, layout)
    if k_scale is not None and k_scale_tensor:
        k_scale = torch.tensor([k_scale], dtype=torch.float32, device=DEVICE)
    q = torch.randn(T, H, d_qk).to(q_dtype).to(DEVICE)
    num_slots = num_blocks * block_size
    indices = make_indices(T, topk, num_slots, invalid_frac)
    return Problem(q=q, kv_cache=kv_cache, indices=indices, softmax_scale=softmax_scale,
                   kv_format=None if infer_format else fmt, k_scale=k_scale, num_slots=num_slots,
                   scale_format=scale_format)


def run_kernel(prob: Problem, kernel: str = "auto", **kw):
    """(out, lse) from the Triton path with the given kernel; ``kw`` may hold call arguments and config overrides."""
    call = {k: kw.pop(k) for k in list(kw) if k in ("kv_format", "k_scale", "topk_length", "attn_sink", "out")}
    return sparse_mla_attention_with_config(*prob.args(), **prob.kwargs(**call), kernel=kernel, return_lse=True, **kw)


def run_reference(prob: Problem, **kw):
    """(out, lse) from the reference in float64 (out float64 too unless ``out=`` is given)."""
    kw.setdefault("out_dtype", torch.float64)
    return reference.sparse_mla_attention(*prob.args(), **prob.kwargs(**kw), return_lse=True,
                                          compute_dtype=torch.float64)


def assert_matches(out, lse, ref_out, ref_lse, *, tol: float = REL_TOL, lse_atol: float = LSE_ATOL, what: str = ""):
    """Kernel (out, lse) against the float64 reference with :func:`triton_mla_sparse.testing.assert_close`: the
    same NaN/inf positions (the reference has none in out, -inf lse exactly for rows without a valid index), such
    rows exactly 0, relative L2 error of out <= tol, |lse - ref| <= lse_atol where finite."""
    out, lse, ref_out, ref_lse = (x.cpu() for x in (out, lse, ref_out, ref_lse))
    assert lse.dtype == torch.float32, (what, lse.dtype)
    # The contract's outputs: out always finite, lse finite or -inf (so matching positions means none elsewhere).
    assert torch.isfinite(ref_out).all(), f"{what}: the reference's out is not finite"
    assert not (torch.isnan(ref_lse) | torch.isposinf(ref_lse)).any(), f"{what}: the reference's lse is NaN or +inf"
    testing.assert_close(lse, ref_lse, atol=lse_atol, what=f"{what} lse")
    empty = torch.isneginf(ref_lse)
    if empty.any():
        assert (out[empty] == 0).all(), f"{what}: rows with no valid index must be exactly 0"
    return testing.assert_close(out, ref_out, tol=tol, what=f"{what} out")


def nan_out(T: int, H: int, dtype=torch.float16) -> torch.Tensor:
    """An all-NaN ``out`` buffer [T, H, 512] on the test device (:func:`triton_mla_sparse.testing.nan_filled`)."""
    return testing.nan_filled((T, H, D_V), dtype, DEVICE)


def stored_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache's stored rows as [num_slots, row] (a copy when the layout needs one), on the CPU."""
    kv = kv_cache[:, :, 0] if kv_cache.dim() == 4 else kv_cache
    return kv.reshape(-1, kv.shape[-1]).cpu()


def real_rows(prob: Problem) -> torch.Tensor:
    """Real values float64 [num_slots, 576] (or 512 / NaN rope for NoPE fp8_ds_mla) of every cache slot."""
    from triton_mla_sparse.formats import dequantize_fp8_ds_mla_float

    fmt = prob.kv_format_name
    rows = stored_rows(prob.kv_cache)
    if fmt == "fp8_ds_mla":
        return dequantize_fp8_ds_mla_float(rows, torch.float64)
    vals = rows.double()
    if fmt == "fp8_e4m3":
        vals = vals * float(prob.k_scale)
    return vals


def full_q(q) -> torch.Tensor:
    """q as one float64 tensor [T, H, D_qk] on the CPU (tuple forms concatenated, NoPE forms 512 wide)."""
    if isinstance(q, tuple):
        q_nope, q_pe = q
        if q_pe is None or q_pe.shape[-1] == 0:
            return q_nope.double().cpu()
        return torch.cat([q_nope.double(), q_pe.double()], dim=-1).cpu()
    return q.double().cpu()


def manual_attention(prob: Problem, *, topk_length=None, attn_sink=None):
    """Independent oracle for small cases: a Python loop over rows following the docstring literally.
    Returns (out float64 [T, H, 512], lse float64 [T, H])."""
    q = full_q(prob.q)
    T, H, d = q.shape
    K = real_rows(prob)[:, :d]
    S = K.shape[0]
    idx = prob.indices.cpu().tolist()
    topk = prob.indices.shape[1]
    out = torch.zeros(T, H, 512, dtype=torch.float64)
    lse = torch.full((T, H), -math.inf, dtype=torch.float64)
    for t in range(T):
        n = topk if topk_length is None else min(max(int(topk_length[t]), 0), topk)
        js = [i for i in idx[t][:n] if 0 <= i < S]
        if not js:
            continue
        Ks = K[js]
        s = (q[t] @ Ks.T) * prob.softmax_scale  # [H, n]
        lse[t] = torch.logsumexp(s, dim=-1)
        out[t] = torch.softmax(s, dim=-1) @ Ks[:, :512]
    if attn_sink is not None:
        out = out * torch.sigmoid(lse - attn_sink.double().cpu())[..., None]
    return out, lse


def place_at_end(stored: torch.Tensor, *, row_pad: int = 0, block_pad: int = 0, align: int = 512,
                 fill: int = 0xFF) -> torch.Tensor:
    """Put stored rows [nb, bs, row] into a view whose LAST element is the last element of its own allocation.

    The buffer is one flat uint8 tensor of a multiple of ``align`` bytes, filled with ``fill`` bytes (0xFF: NaN in
    every float format); ``row_pad`` elements after each row and ``block_pad`` elements after each block become
    strides (row stride row + row_pad, block stride bs · row stride + block_pad), except after the very last row,
    which ends exactly at the buffer's end. The slack needed to reach ``align`` goes in front. On a GPU under
    compute-sanitizer (with PyTorch's caching allocator off) the first byte past the cache is outside any
    allocation; on the CPU :func:`interpreter_memcheck` checks the same bound.
    """
    nb, bs, row = stored.shape
    dtype = stored.dtype
    es = stored.element_size()
    rs = row + row_pad
    bstride = bs * rs + block_pad
    if nb * bs == 0:
        return stored.to(DEVICE).contiguous()
    span = (nb - 1) * bstride + (bs - 1) * rs + row  # elements from the first to the last element of the view
    n_bytes = -(-(span * es) // align) * align
    buf = torch.full((n_bytes,), fill, dtype=torch.uint8, device=DEVICE).view(dtype)
    view = buf.as_strided((nb, bs, row), (bstride, rs, 1), n_bytes // es - span)
    view.copy_(stored.to(DEVICE))
    assert view[-1, -1, -1].data_ptr() + es == buf.data_ptr() + n_bytes
    return view


def tensor_extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses that a strided view can reach (empty range for an empty tensor)."""
    if t.numel() == 0:
        return (0, 0)
    es = t.element_size()
    lo = sum(min(0, (n - 1) * s) for n, s in zip(t.shape, t.stride()))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(t.shape, t.stride()))
    return (t.data_ptr() + lo * es, t.data_ptr() + (hi + 1) * es)


class interpreter_memcheck:
    """Context manager: every load and store that Triton's interpreter performs (mask on) must fall inside the
    extent of one of the tensor arguments of the running launch (the strided view, not its whole storage).

    The interpreter runs kernels on the CPU tensors' own memory (no copies), so an address past a view's last
    element is exactly what would be an out-of-bounds access on a GPU when the view ends its allocation (see
    :func:`place_at_end`). Violations are collected in ``self.violations`` (at most 20) and the launch continues.
    ``self.active`` is False where the interpreter's internals differ from what this relies on (then nothing is
    checked); ``self.launches`` counts the checked launches.
    """

    def __init__(self):
        self.violations: list[str] = []
        self.launches = 0
        self.active = False
        self._stack: list[list[tuple[int, int, str]]] = []

    def __enter__(self):
        try:
            from triton.runtime import interpreter as interp

            builder = interp.interpreter_builder
            self._interp, self._builder = interp, builder
            self._orig_call = interp.GridExecutor.__call__
            self._np_dtype = interp._get_np_dtype
            builder.create_masked_load  # noqa: B018  (the methods this wraps)
            builder.create_masked_store  # noqa: B018
        except (ImportError, AttributeError):
            return self
        check = self

        def call(ge, *args, **kwargs):
            ranges = []
            named = list(zip(list(ge.arg_names) + [f"arg{i}" for i in range(len(args))], args))
            for name, a in named + list(kwargs.items()):
                if isinstance(a, torch.Tensor) and a.numel() > 0:
                    lo, hi = tensor_extent(a)
                    ranges.append((lo, hi, name))
            check._stack.append(ranges)
            check.launches += 1
            try:
                return check._orig_call(ge, *args, **kwargs)
            finally:
                check._stack.pop()

        def load(ptrs, mask, other, *a, **k):
            check._check("load", ptrs, mask)
            return orig_load(ptrs, mask, other, *a, **k)

        def store(ptrs, value, mask, *a, **k):
            check._check("store", ptrs, mask)
            return orig_store(ptrs, value, mask, *a, **k)

        orig_load, orig_store = builder.create_masked_load, builder.create_masked_store
        interp.GridExecutor.__call__ = call
        builder.create_masked_load = load
        builder.create_masked_store = store
        self.active = True
        return self

    def __exit__(self, *exc):
        if self.active:
            self._interp.GridExecutor.__call__ = self._orig_call
            del self._builder.create_masked_load  # back to the class's methods
            del self._builder.create_masked_store
            self.active = False
        return False

    def _check(self, kind, ptrs, mask):
        import numpy as np

        if not self._stack:
            return
        addr = np.asarray(ptrs.data, dtype=np.uint64)
        m = np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)
        addr = addr[m].astype(np.int64)
        if addr.size == 0:
            return
        size = self._np_dtype(ptrs.get_element_ty()).itemsize
        ok = np.zeros(addr.shape, dtype=bool)
        for lo, hi, _ in self._stack[-1]:
            ok |= (addr >= lo) & (addr + size <= hi)
        if ok.all() or len(self.violations) >= 20:
            return
        bad = addr[~ok]
        near = min(self._stack[-1], key=lambda r: min(abs(int(bad[0]) - r[0]), abs(int(bad[0]) - r[1])))
        self.violations.append(f"{kind} of {bad.size} element(s) of {size} B outside every argument; first at "
                               f"{int(bad[0]) - near[0]:+d} B from the start of {near[2]!r} "
                               f"(extent {near[1] - near[0]} B)")


@contextlib.contextmanager
def poisoned_allocations_probe_select():
    """While active, every fresh int32 ``torch.empty`` holds 0x5A5A5A5A and every float32 one NaN (uninitialised
    memory made visible), and each split-select launch appends to the yielded list whether the workspace it was
    given is all zeros (``indexer_topk`` leaves zeroing it to the logits launch)."""
    from triton_mla_sparse.ops.topk import split_select as K

    real_empty, real_select = torch.empty, K.launch_split_select
    seen: list[bool] = []

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.dtype == torch.int32:
            t.fill_(0x5A5A5A5A)
        elif t.dtype == torch.float32:
            t.fill_(float("nan"))
        return t

    def checking_select(logits, out, topk, cfg, ws=None):
        seen.append(ws is not None and bool((ws == 0).all()))
        return real_select(logits, out, topk, cfg, ws)

    torch.empty, K.launch_split_select = poisoned_empty, checking_select
    try:
        yield seen
    finally:
        torch.empty, K.launch_split_select = real_empty, real_select

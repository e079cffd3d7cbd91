"""Argument validation shared by the reference and the Triton path.

Every check runs before any kernel launches or any output is written, and each failure is one ``ValueError`` that
names the argument and what was expected. The result is a normalised :class:`AttentionProblem`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from .capabilities import MAX_HEADS, MAX_TOPK  # the declared limits: one source
from .formats import D_ROPE, D_V, FP8_DS_MLA_BYTES, KV_FORMAT_DTYPES, KV_FORMATS, infer_kv_format, kv_row_width

Q_DTYPES = (torch.float16, torch.bfloat16)

# Limits, checked up front (each with its reason in the error message).
MAX_ROWS = 2**31 - 1  # query rows go on axis 0 of the launch grid (CUDA's limit: 2^31 - 1 programs)


def _desc(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}" if isinstance(x, (int, float, str)) else type(x).__name__



def _fail(arg: str, expected: str, got) -> None:
    raise ValueError(f"{arg}: expected {expected}, got {got if isinstance(got, str) else _desc(got)}")


@dataclass
class AttentionProblem:
    """Normalised inputs of one sparse MLA attention call."""

    q_nope: torch.Tensor  # [T, H, 512], unit last stride
    q_pe: torch.Tensor | None  # [T, H, d_rope] or None when d_rope == 0
    kv: torch.Tensor  # [num_blocks, block_size, row], unit last stride (uint8 view for fp8 formats)
    kv_format: str
    indices: torch.Tensor  # int32 [T, topk]
    softmax_scale: float
    k_scale: float | torch.Tensor | None
    topk_length: torch.Tensor | None
    attn_sink: torch.Tensor | None
    out: torch.Tensor | None
    T: int
    H: int
    d_rope: int
    topk: int
    block_size: int
    num_slots: int

    @property
    def device(self) -> torch.device:
        return self.q_nope.device

    @property
    def dtype(self) -> torch.dtype:
        return self.q_nope.dtype


def _check_q(q):
    if isinstance(q, (tuple, list)):
        if len(q) != 2:
            _fail("q", "a tensor or a tuple (q_nope, q_pe)", f"a {type(q).__name__} of {len(q)} items")
        q_nope, q_pe = q
        if not isinstance(q_nope, torch.Tensor):
            _fail("q[0] (q_nope)", f"a [T, H, {D_V}] tensor", q_nope)
        if q_pe is not None and not isinstance(q_pe, torch.Tensor):
            _fail("q[1] (q_pe)", f"a [T, H, {D_ROPE}] tensor or None", q_pe)
        if q_nope.dtype not in Q_DTYPES:
            _fail("q[0] (q_nope)", "dtype float16 or bfloat16", q_nope)
        if q_nope.dim() != 3 or q_nope.shape[2] != D_V:
            _fail("q[0] (q_nope)", f"shape [T, H, {D_V}]", q_nope)
        if q_nope.stride(2) != 1:
            _fail("q[0] (q_nope)", "a unit stride in the last dimension", f"strides {q_nope.stride()}")
        if q_pe is not None:
            if q_pe.dtype != q_nope.dtype:
                _fail("q[1] (q_pe)", f"the dtype of q_nope ({q_nope.dtype})", q_pe)
            if q_pe.dim() != 3 or q_pe.shape[:2] != q_nope.shape[:2] or q_pe.shape[2] not in (0, D_ROPE):
                _fail("q[1] (q_pe)", f"shape [{q_nope.shape[0]}, {q_nope.shape[1]}, {D_ROPE}] (or last dim 0)", q_pe)
            if q_pe.shape[2] and q_pe.stride(2) != 1:
                _fail("q[1] (q_pe)", "a unit stride in the last dimension", f"strides {q_pe.stride()}")
            if q_pe.device != q_nope.device:
                _fail("q[1] (q_pe)", f"device {q_nope.device}", q_pe)
            if q_pe.shape[2] == 0:
                q_pe = None
        return q_nope, q_pe
    if not isinstance(q, torch.Tensor):
        _fail("q", "a tensor [T, H, 576] or a tuple (q_nope, q_pe)", q)
    if q.dtype not in Q_DTYPES:
        _fail("q", "dtype float16 or bfloat16", q)
    if q.dim() != 3 or q.shape[2] not in (D_V + D_ROPE, D_V):
        _fail("q", f"shape [T, H, {D_V + D_ROPE}] (or [T, H, {D_V}] for NoPE)", q)
    if q.stride(2) != 1:
        _fail("q", "a unit stride in the last dimension", f"strides {q.stride()}")
    return q[..., :D_V], (q[..., D_V:] if q.shape[2] > D_V else None)


def _check_kv(kv_cache, kv_format, d_rope, device):
    if not isinstance(kv_cache, torch.Tensor):
        _fail("kv_cache", "a tensor [num_blocks, block_size, row] or [num_slots, row]", kv_cache)
    if kv_format is None:
        kv_format = infer_kv_format(kv_cache)
        if kv_format is None:
            _fail("kv_cache", "dtype bfloat16, float16, float8_e4m3fn or uint8 (fp8_ds_mla)", kv_cache)
    elif kv_format not in KV_FORMATS:
        _fail("kv_format", f"one of {KV_FORMATS} or None", repr(kv_format))
    if kv_cache.dtype != KV_FORMAT_DTYPES[kv_format]:
        _fail("kv_cache", f"dtype {KV_FORMAT_DTYPES[kv_format]} for kv_format {kv_format!r}", kv_cache)
    if kv_cache.device != device:
        _fail("kv_cache", f"device {device} (the device of q)", kv_cache)
    row = kv_row_width(kv_format, d_rope)
    kv = kv_cache
    if kv.dim() == 4 and kv.shape[2] == 1:  # [num_blocks, block_size, 1, row] (FlashMLA's view)
        kv = kv[:, :, 0]
    elif kv.dim() == 2:
        kv = kv[:, None]
    if kv.dim() != 3 or kv.shape[2] != row:
        unit = "bytes" if kv_format == "fp8_ds_mla" else "values"
        _fail("kv_cache", f"shape [num_blocks, block_size, {row}] or [num_slots, {row}] ({row} {unit} per row for "
              f"kv_format {kv_format!r} and D_qk {D_V + d_rope})", kv_cache)
    nb, bs, _ = kv.shape
    check_paged_strides("kv_cache", kv, kv_cache, row)
    if kv_format == "fp8_ds_mla":
        misaligned = (nb > 1 and kv.stride(0) % 4) or (bs > 1 and kv.stride(1) % 4) or kv.data_ptr() % 4
        if misaligned:
            _fail("kv_cache", "fp8_ds_mla rows aligned to 4 bytes (strides and start divisible by 4)",
                  f"strides {tuple(kv_cache.stride())}, start offset {kv.data_ptr() % 16} mod 16")
    return kv, kv_format, nb * bs, bs


def check_paged_strides(arg: str, view: torch.Tensor, given: torch.Tensor, row: int) -> None:
    """A paged cache ``view`` [num_blocks, block_size, row] (of the tensor ``given``) must have contiguous rows that
    do not overlap: unit last stride, row stride >= row, block stride >= block_size · row stride."""
    nb, bs, _ = view.shape
    if view.stride(2) != 1:
        _fail(arg, "a unit stride in the last dimension", f"strides {tuple(given.stride())}")
    if bs > 1 and view.stride(1) < row:
        _fail(arg, f"a row stride of at least {row}", f"strides {tuple(given.stride())}")
    if nb > 1 and view.stride(0) < bs * view.stride(1):
        _fail(arg, f"a block stride of at least block_size · row stride = {bs * view.stride(1)}",
              f"strides {tuple(given.stride())}")


def _check_k_scale(k_scale, kv_format, device):
    if kv_format != "fp8_e4m3":
        if k_scale is not None:
            _fail("k_scale", f"None for kv_format {kv_format!r} (it applies to 'fp8_e4m3' only)", k_scale)
        return None
    if k_scale is None:
        _fail("k_scale", "a float or a one-element float32 tensor for kv_format 'fp8_e4m3'", "None")
    if isinstance(k_scale, torch.Tensor):
        if k_scale.dtype != torch.float32 or k_scale.numel() != 1:
            _fail("k_scale", "a one-element float32 tensor", k_scale)
        if k_scale.device != device:
            _fail("k_scale", f"device {device} (the device of q)", k_scale)
        return k_scale.reshape(1)
    if isinstance(k_scale, bool) or not isinstance(k_scale, (int, float)):
        _fail("k_scale", "a float or a one-element float32 tensor", _desc(k_scale))
    if not math.isfinite(k_scale) or k_scale <= 0:
        _fail("k_scale", "a finite positive number", f"{k_scale!r}")
    return float(k_scale)


def _check_optional_vector(arg, x, dtype, n, device):
    """An optional 1-D tensor of ``n`` values of ``dtype`` on q's device (any stride)."""
    if x is None:
        return
    if not isinstance(x, torch.Tensor) or x.dtype != dtype:
        _fail(arg, f"a {str(dtype).replace('torch.', '')} tensor [{n}] or None", x)
    if x.shape != (n,):
        _fail(arg, f"shape [{n}]", x)
    if x.device != device:
        _fail(arg, f"device {device} (the device of q)", x)


def check_attention_inputs(q, kv_cache, indices, softmax_scale, *, kv_format=None, k_scale=None, topk_length=None,
                           attn_sink=None, out=None) -> AttentionProblem:
    """Validate the arguments of ``sparse_mla_attention`` and return them normalised (no copies)."""
    q_nope, q_pe = _check_q(q)
    T, H = q_nope.shape[:2]
    device = q_nope.device
    d_rope = 0 if q_pe is None else q_pe.shape[2]
    if H < 1:
        _fail("q", "at least one head", q_nope)
    if H > MAX_HEADS:
        _fail("q", f"at most {MAX_HEADS} heads (the kernels are tuned and tested for 1..{MAX_HEADS} heads, the "
              f"largest count of the supported models; split the heads into calls of at most {MAX_HEADS})", q_nope)
    if T > MAX_ROWS:
        _fail("q", f"at most {MAX_ROWS} rows (each row is one program on axis 0 of the launch grid, whose limit is "
              f"2^31 - 1; split the batch)", q_nope)
    kv, kv_format, num_slots, block_size = _check_kv(kv_cache, kv_format, d_rope, device)
    if kv_format == "fp8_ds_mla" and d_rope not in (0, D_ROPE):
        _fail("q", f"D_rope {D_ROPE} or 0 for fp8_ds_mla", q_nope)

    if isinstance(indices, torch.Tensor) and indices.dim() == 3 and indices.shape[1] == 1:
        indices = indices[:, 0]  # FlashMLA's [T, 1, topk]
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32:
        _fail("indices", "an int32 tensor [T, topk]", indices)
    if indices.dim() != 2 or indices.shape[0] != T or indices.shape[1] < 1:
        _fail("indices", f"shape [{T}, topk] with topk >= 1", indices)
    if indices.shape[1] > MAX_TOPK:
        _fail("indices", f"topk <= {MAX_TOPK} (the longest top-k list the kernels are tested for; a longer list "
              f"can be split into chunks whose (out, lse) pairs are merged by log-sum-exp)", indices)
    if indices.device != device:
        _fail("indices", f"device {device} (the device of q)", indices)

    if isinstance(softmax_scale, torch.Tensor) or isinstance(softmax_scale, bool) or \
            not isinstance(softmax_scale, (int, float)):
        _fail("softmax_scale", "a Python float", _desc(softmax_scale))
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        _fail("softmax_scale", "a finite positive number", f"{softmax_scale!r}")

    k_scale = _check_k_scale(k_scale, kv_format, device)

    _check_optional_vector("topk_length", topk_length, torch.int32, T, device)
    _check_optional_vector("attn_sink", attn_sink, torch.float32, H, device)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != q_nope.dtype:
            _fail("out", f"a {q_nope.dtype} tensor [{T}, {H}, {D_V}] (q's dtype)", out)
        if out.shape != (T, H, D_V):
            _fail("out", f"shape [{T}, {H}, {D_V}]", out)
        if out.stride(2) != 1:
            _fail("out", "a unit stride in the last dimension", f"strides {out.stride()}")
        if out.device != device:
            _fail("out", f"device {device} (the device of q)", out)
    return AttentionProblem(q_nope=q_nope, q_pe=q_pe, kv=kv, kv_format=kv_format, indices=indices,
                            softmax_scale=float(softmax_scale), k_scale=k_scale, topk_length=topk_length,
                            attn_sink=attn_sink, out=out, T=T, H=H, d_rope=d_rope, topk=indices.shape[1],
                            block_size=block_size, num_slots=num_slots)


def check_kernel_device(dev: torch.device) -> None:
    """The Triton kernels run on CUDA/ROCm devices, or on CPU tensors through Triton's interpreter (which needs
    TRITON_INTERPRET=1 set before triton is imported, and numpy)."""
    from .kernels.configs import interpreting

    if dev.type != "cuda" and not (dev.type == "cpu" and interpreting()):
        raise ValueError(f"q: expected CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 set before triton is "
                         f"imported; triton_mla_sparse.reference runs anywhere), got a tensor on {dev}")
    if dev.type == "cpu":
        try:
            import numpy  # noqa: F401  (Triton's interpreter imports it)
        except ImportError:
            raise ValueError("q: CPU tensors run through Triton's interpreter, which needs numpy "
                             "(pip install numpy, or triton-mla-sparse[cpu])") from None


def device_guard(dev: torch.device):
    """A context making ``dev`` the current device for Triton's launches (which go to the current device); a no-op
    (no device switch on the per-call path) when it already is current, and for CPU tensors."""
    if dev.type == "cuda" and dev.index is not None and dev.index != torch.cuda.current_device():
        return torch.cuda.device(dev)
    return contextlib.nullcontext()

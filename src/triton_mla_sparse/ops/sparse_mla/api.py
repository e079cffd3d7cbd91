"""Sparse MLA attention on the Triton kernels: validation, capability check, launch configuration and dispatch.

:func:`check_attention_inputs` is shared with the reference: every check runs before any kernel launches or any
output is written, and each failure is one ``ValueError`` that names the argument and what was expected. The result
is a normalised :class:`AttentionProblem`. Importing this module touches neither CUDA nor triton.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch

from ..._common.runtime import check_kernel_device, device_guard
from ..._common.validate import MAX_GRID, check_paged_strides, desc, dtype_names, fail
from ...capabilities import (D_ROPES, MAX_HEADS, MAX_TOPK, Q_DTYPES, arch_for_device, describe_device,
                             unsupported_reasons)
from ...formats import (ALL_KV_FORMATS, D_QK, D_ROPE, D_V, FP8_DS_MLA_V4, KV_FORMAT_DTYPES, V4_TOKEN_BYTES,
                        infer_kv_format, kv_row_width, v4_block_size)
from .configs import choose_config, extra_cache_supported, gluon_supported, v4_supported

__all__ = ["AttentionProblem", "check_attention_inputs", "sparse_mla_attention", "sparse_mla_attention_with_config"]

Query = torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]  # q, or (q_nope, q_pe)

MAX_ROWS = MAX_GRID  # query rows go on axis 0 of the launch grid


@dataclass
class AttentionProblem:
    """Normalised inputs of one sparse MLA attention call."""

    q_nope: torch.Tensor  # [T, H, 512], unit last stride
    q_pe: torch.Tensor | None  # [T, H, d_rope] or None when d_rope == 0
    kv: torch.Tensor  # [num_blocks, block_size, row], unit last stride (uint8 view for fp8 formats); fp8_ds_mla_v4:
    # uint8 pages [num_blocks, block_size · 584] (each page's rows, then its footer), unit last stride
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
    # the extra cache (DeepSeek-V4's second list: FlashMLA's extra_k_cache / extra_indices_in_kvcache /
    # extra_topk_length), in kv's format, with its own slot ids and lengths; None / 0 without one
    kv2: torch.Tensor | None = None
    indices2: torch.Tensor | None = None
    topk_length2: torch.Tensor | None = None
    topk2: int = 0
    block_size2: int = 0
    num_slots2: int = 0

    def list_len(self, block_n: int) -> int:
        """Entries per row the kernel walks in tiles of ``block_n``: the main list, then (with an extra cache) the
        extra list from the next whole tile on, so that no tile mixes the two caches."""
        return self.topk if self.kv2 is None else -(-self.topk // block_n) * block_n + self.topk2

    @property
    def device(self) -> torch.device:
        return self.q_nope.device

    @property
    def dtype(self) -> torch.dtype:
        return self.q_nope.dtype


def _check_q(q):
    if isinstance(q, (tuple, list)):
        if len(q) != 2:
            fail("q", "a tensor or a tuple (q_nope, q_pe)", f"a {type(q).__name__} of {len(q)} items")
        q_nope, q_pe = q
        if not isinstance(q_nope, torch.Tensor):
            fail("q[0] (q_nope)", f"a [T, H, {D_V}] tensor", q_nope)
        if q_pe is not None and not isinstance(q_pe, torch.Tensor):
            fail("q[1] (q_pe)", f"a [T, H, {D_ROPE}] tensor or None", q_pe)
        if q_nope.dtype not in Q_DTYPES:
            fail("q[0] (q_nope)", f"dtype {dtype_names(Q_DTYPES)}", q_nope)
        if q_nope.dim() != 3 or q_nope.shape[2] != D_V:
            fail("q[0] (q_nope)", f"shape [T, H, {D_V}]", q_nope)
        if q_nope.stride(2) != 1:
            fail("q[0] (q_nope)", "a unit stride in the last dimension", f"strides {q_nope.stride()}")
        if q_pe is not None:
            if q_pe.dtype != q_nope.dtype:
                fail("q[1] (q_pe)", f"the dtype of q_nope ({q_nope.dtype})", q_pe)
            if q_pe.dim() != 3 or q_pe.shape[:2] != q_nope.shape[:2] or q_pe.shape[2] not in D_ROPES:
                fail("q[1] (q_pe)", f"shape [{q_nope.shape[0]}, {q_nope.shape[1]}, {D_ROPE}] (or last dim 0)", q_pe)
            if q_pe.shape[2] and q_pe.stride(2) != 1:
                fail("q[1] (q_pe)", "a unit stride in the last dimension", f"strides {q_pe.stride()}")
            if q_pe.device != q_nope.device:
                fail("q[1] (q_pe)", f"device {q_nope.device}", q_pe)
            if q_pe.shape[2] == 0:
                q_pe = None
        return q_nope, q_pe
    if not isinstance(q, torch.Tensor):
        fail("q", f"a tensor [T, H, {D_QK}] or a tuple (q_nope, q_pe)", q)
    if q.dtype not in Q_DTYPES:
        fail("q", f"dtype {dtype_names(Q_DTYPES)}", q)
    if q.dim() != 3 or q.shape[2] - D_V not in D_ROPES:
        fail("q", f"shape [T, H, {D_QK}] (or [T, H, {D_V}] for NoPE)", q)
    if q.stride(2) != 1:
        fail("q", "a unit stride in the last dimension", f"strides {q.stride()}")
    return q[..., :D_V], (q[..., D_V:] if q.shape[2] > D_V else None)


def _v4_hint(kv_cache):
    """A pointer to kv_format 'fp8_ds_mla_v4' for a uint8 cache shaped like DeepSeek-V4's (else empty)."""
    if kv_cache.dtype == torch.uint8 and ((kv_cache.dim() in (3, 4) and kv_cache.shape[-1] == V4_TOKEN_BYTES) or
                                          (kv_cache.dim() == 2 and v4_block_size(kv_cache.shape[1]) is not None)):
        # also a 2-D tensor of whole pages: what quantize_fp8_ds_mla_v4 returns
        return f"; a DeepSeek-V4 cache ({V4_TOKEN_BYTES} bytes per token) needs kv_format={FP8_DS_MLA_V4!r}"
    return ""


def _check_kv(kv_cache, kv_format, d_rope, device, arg="kv_cache"):
    if not isinstance(kv_cache, torch.Tensor):
        fail(arg, "a tensor [num_blocks, block_size, row] or [num_slots, row]", kv_cache)
    if kv_format is None:
        kv_format = infer_kv_format(kv_cache)
        if kv_format is None:
            fail(arg, "dtype bfloat16, float16, float8_e4m3fn or uint8 (fp8_ds_mla)", kv_cache)
    elif kv_format not in ALL_KV_FORMATS:
        fail("kv_format", f"one of {ALL_KV_FORMATS} or None", repr(kv_format))
    if kv_cache.dtype != KV_FORMAT_DTYPES[kv_format]:
        fail(arg, f"dtype {KV_FORMAT_DTYPES[kv_format]} for kv_format {kv_format!r}", kv_cache)
    if kv_cache.device != device:
        fail(arg, f"device {device} (the device of q)", kv_cache)
    if kv_format == FP8_DS_MLA_V4:
        return _check_kv_v4(kv_cache, d_rope, arg)
    row = kv_row_width(kv_format, d_rope)
    kv = kv_cache
    if kv.dim() == 4 and kv.shape[2] == 1:  # [num_blocks, block_size, 1, row] (FlashMLA's view)
        kv = kv[:, :, 0]
    elif kv.dim() == 2:
        kv = kv[:, None]
    if kv.dim() != 3 or kv.shape[2] != row:
        unit = "bytes" if kv_format == "fp8_ds_mla" else "values"
        fail(arg, f"shape [num_blocks, block_size, {row}] or [num_slots, {row}] ({row} {unit} per row for "
             f"kv_format {kv_format!r} and D_qk {D_V + d_rope}){_v4_hint(kv_cache)}", kv_cache)
    nb, bs, _ = kv.shape
    if bs < 1:
        fail(arg, "a block size (dimension 1) of at least 1", kv_cache)
    check_paged_strides(arg, kv, kv_cache, row)
    if kv_format == "fp8_ds_mla":
        misaligned = (nb > 1 and kv.stride(0) % 4) or (bs > 1 and kv.stride(1) % 4) or kv.data_ptr() % 4
        if misaligned:
            fail(arg, "fp8_ds_mla rows aligned to 4 bytes (strides and start divisible by 4)",
                 f"strides {tuple(kv_cache.stride())}, start offset {kv.data_ptr() % 16} mod 16")
    return kv, kv_format, nb * bs, bs


def _check_kv_v4(kv_cache, d_rope, arg):
    """DeepSeek-V4 pages in one of the views vLLM and FlashMLA use: ``[num_blocks, block_size, 584]`` (vLLM's,
    strides (page stride, 584, 1)), ``[num_blocks, block_size, 1, 584]`` (FlashMLA's) or ``[num_blocks, block_size ·
    584]`` (vLLM's writer's, ``.view(num_blocks, -1)`` of the first; any page stride). A 2-D tensor of whole padded
    pages is refused: its width would not say the block size (most multiples of 576 are some block size's page).
    Returns the pages as uint8 ``[num_blocks, block_size · 584]`` (the bytes read: rows and footer), the format, the
    slot count and the block size."""
    if d_rope:
        fail("q", f"D_qk {D_V} (q_nope [T, H, {D_V}] and no RoPE part) for kv_format {FP8_DS_MLA_V4!r} (DeepSeek-V4: "
             f"the RoPE values are the last 64 of the 512)", f"a RoPE part of {d_rope}")
    shapes = (f"uint8 [num_blocks, block_size, {V4_TOKEN_BYTES}] (vLLM's view), [num_blocks, block_size, 1, "
              f"{V4_TOKEN_BYTES}] (FlashMLA's) or [num_blocks, block_size · {V4_TOKEN_BYTES}] (vLLM's writer's; whole "
              f"pages [num_blocks, v4_page_bytes(block_size)]: pass formats.v4_token_view(pages, block_size))")
    kv = kv_cache
    if kv.dim() == 4 and kv.shape[2] == 1:
        kv = kv[:, :, 0]
    if kv.dim() == 3 and kv.shape[2] == V4_TOKEN_BYTES:
        nb, bs, _ = kv.shape
        if bs < 1:
            fail(arg, "a block size (dimension 1) of at least 1", kv_cache)
        if kv.stride(2) != 1 or (bs > 1 and kv.stride(1) != V4_TOKEN_BYTES):
            fail(arg, f"strides (page stride, {V4_TOKEN_BYTES}, 1) (a view of each page's contiguous bytes, as vLLM "
                 f"holds it)", f"strides {tuple(kv_cache.stride())}")
        block_stride = kv.stride(0)
    elif kv.dim() == 2:
        nb, width = kv.shape
        bs = width // V4_TOKEN_BYTES
        if bs < 1 or width % V4_TOKEN_BYTES:
            fail(arg, f"{shapes}; {width} bytes is no multiple of {V4_TOKEN_BYTES}", kv_cache)
        if kv.stride(1) != 1:
            fail(arg, "a unit stride in the last dimension", f"strides {tuple(kv_cache.stride())}")
        block_stride = kv.stride(0)
    else:
        fail(arg, shapes, kv_cache)
    used = bs * V4_TOKEN_BYTES
    if nb > 1 and block_stride < used:
        fail(arg, f"a page stride of at least block_size · {V4_TOKEN_BYTES} = {used} bytes (pages must not overlap)",
             f"strides {tuple(kv_cache.stride())}")
    if (nb > 1 and block_stride % 2) or kv.data_ptr() % 2:
        fail(arg, "pages aligned to 2 bytes (page stride and start even: the RoPE values are bfloat16)",
             f"strides {tuple(kv_cache.stride())}, start offset {kv.data_ptr() % 16} mod 16")
    pages = kv.as_strided((nb, used), (block_stride if nb > 1 else used, 1), kv.storage_offset())
    return pages, FP8_DS_MLA_V4, nb * bs, bs


def _check_k_scale(k_scale, kv_format, device):
    if kv_format != "fp8_e4m3":
        if k_scale is not None:
            fail("k_scale", f"None for kv_format {kv_format!r} (it applies to 'fp8_e4m3' only)", k_scale)
        return None
    if k_scale is None:
        fail("k_scale", "a float or a one-element float32 tensor for kv_format 'fp8_e4m3'", "None")
    if isinstance(k_scale, torch.Tensor):
        if k_scale.dtype != torch.float32 or k_scale.numel() != 1:
            fail("k_scale", "a one-element float32 tensor", k_scale)
        if k_scale.device != device:
            fail("k_scale", f"device {device} (the device of q)", k_scale)
        return k_scale.reshape(1)
    if isinstance(k_scale, bool) or not isinstance(k_scale, (int, float)):
        fail("k_scale", "a float or a one-element float32 tensor", desc(k_scale))
    if not math.isfinite(k_scale) or k_scale <= 0:
        fail("k_scale", "a finite positive number", f"{k_scale!r}")
    return float(k_scale)


def _check_optional_vector(arg, x, dtype, n, device):
    """An optional 1-D tensor of ``n`` values of ``dtype`` on q's device (any stride)."""
    if x is None:
        return
    if not isinstance(x, torch.Tensor) or x.dtype != dtype:
        fail(arg, f"a {str(dtype).replace('torch.', '')} tensor [{n}] or None", x)
    if x.shape != (n,):
        fail(arg, f"shape [{n}]", x)
    if x.device != device:
        fail(arg, f"device {device} (the device of q)", x)


def _check_indices(arg, indices, T, device):
    if isinstance(indices, torch.Tensor) and indices.dim() == 3 and indices.shape[1] == 1:
        indices = indices[:, 0]  # FlashMLA's [T, 1, topk]
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32:
        fail(arg, "an int32 tensor [T, topk]", indices)
    if indices.dim() != 2 or indices.shape[0] != T or indices.shape[1] < 1:
        fail(arg, f"shape [{T}, topk] with topk >= 1", indices)
    if indices.shape[1] > MAX_TOPK:
        fail(arg, f"topk <= {MAX_TOPK} (the longest top-k list the kernels are tested for; a longer list "
             f"can be split into chunks whose (out, lse) pairs are merged by log-sum-exp)", indices)
    if indices.device != device:
        fail(arg, f"device {device} (the device of q)", indices)
    return indices


def check_attention_inputs(q: Query, kv_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float, *,
                           kv_format: str | None = None, k_scale: float | torch.Tensor | None = None,
                           topk_length: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
                           out: torch.Tensor | None = None, extra_kv_cache: torch.Tensor | None = None,
                           extra_indices: torch.Tensor | None = None,
                           extra_topk_length: torch.Tensor | None = None) -> AttentionProblem:
    """Validate the arguments of ``sparse_mla_attention`` and return them normalised (no copies)."""
    q_nope, q_pe = _check_q(q)
    T, H = q_nope.shape[:2]
    device = q_nope.device
    d_rope = 0 if q_pe is None else q_pe.shape[2]
    if H < 1:
        fail("q", "at least one head", q_nope)
    if H > MAX_HEADS:
        fail("q", f"at most {MAX_HEADS} heads (the kernels are tuned and tested for 1..{MAX_HEADS} heads, the "
             f"largest count of the supported models; split the heads into calls of at most {MAX_HEADS})", q_nope)
    if T > MAX_ROWS:
        fail("q", f"at most {MAX_ROWS} rows (each row is one program on axis 0 of the launch grid, whose limit is "
             f"2^31 - 1; split the batch)", q_nope)
    kv, kv_format, num_slots, block_size = _check_kv(kv_cache, kv_format, d_rope, device)
    if kv_format == "fp8_ds_mla" and d_rope not in D_ROPES:
        fail("q", f"D_rope {D_ROPE} or 0 for fp8_ds_mla", q_nope)

    indices = _check_indices("indices", indices, T, device)
    extra = {}
    if extra_kv_cache is None:
        for arg, x in (("extra_indices", extra_indices), ("extra_topk_length", extra_topk_length)):
            if x is not None:
                fail(arg, "None without extra_kv_cache (it indexes the extra cache)", x)
    else:
        if extra_indices is None:
            fail("extra_indices", "an int32 tensor [T, topk] of slot ids in extra_kv_cache (extra_kv_cache is given)",
                 "None")
        kv2, _, num_slots2, block_size2 = _check_kv(extra_kv_cache, kv_format, d_rope, device, "extra_kv_cache")
        indices2 = _check_indices("extra_indices", extra_indices, T, device)
        _check_optional_vector("extra_topk_length", extra_topk_length, torch.int32, T, device)
        extra = dict(kv2=kv2, indices2=indices2, topk_length2=extra_topk_length, topk2=indices2.shape[1],
                     block_size2=block_size2, num_slots2=num_slots2)

    if isinstance(softmax_scale, torch.Tensor) or isinstance(softmax_scale, bool) or \
            not isinstance(softmax_scale, (int, float)):
        fail("softmax_scale", "a Python float", desc(softmax_scale))
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        fail("softmax_scale", "a finite positive number", f"{softmax_scale!r}")

    k_scale = _check_k_scale(k_scale, kv_format, device)

    _check_optional_vector("topk_length", topk_length, torch.int32, T, device)
    _check_optional_vector("attn_sink", attn_sink, torch.float32, H, device)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != q_nope.dtype:
            fail("out", f"a {q_nope.dtype} tensor [{T}, {H}, {D_V}] (q's dtype)", out)
        if out.shape != (T, H, D_V):
            fail("out", f"shape [{T}, {H}, {D_V}]", out)
        if out.stride(2) != 1:
            fail("out", "a unit stride in the last dimension", f"strides {out.stride()}")
        if out.device != device:
            fail("out", f"device {device} (the device of q)", out)
    return AttentionProblem(q_nope=q_nope, q_pe=q_pe, kv=kv, kv_format=kv_format, indices=indices,
                            softmax_scale=float(softmax_scale), k_scale=k_scale, topk_length=topk_length,
                            attn_sink=attn_sink, out=out, T=T, H=H, d_rope=d_rope, topk=indices.shape[1],
                            block_size=block_size, num_slots=num_slots, **extra)


def sparse_mla_attention(q: Query, kv_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float, *,
                         kv_format: str | None = None, k_scale: float | torch.Tensor | None = None,
                         topk_length: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
                         out: torch.Tensor | None = None, return_lse: bool = False,
                         extra_kv_cache: torch.Tensor | None = None, extra_indices: torch.Tensor | None = None,
                         extra_topk_length: torch.Tensor | None = None
                         ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA attention with the Triton kernels.

    Same arguments, semantics and results as :func:`triton_mla_sparse.reference.sparse_mla_attention` (whose
    docstring is the contract; an extra cache is taken on NVIDIA GPUs and under the interpreter; ``fp8_ds_mla_v4``
    pages on NVIDIA, CDNA and RDNA4 GPUs and under the interpreter): returns ``out [T, H, 512]`` in q's dtype
    (written into ``out=`` when given) and,
    with ``return_lse=True``, ``lse [T, H]`` float32 (natural log, -inf for a row with no valid index).
    The decode (split top-k) or prefill kernel is chosen from rows × heads against the GPU's multiprocessor count.
    Tensors must be on a CUDA device (or on the CPU with ``TRITON_INTERPRET=1`` set before triton is imported).
    """
    return sparse_mla_attention_with_config(q, kv_cache, indices, softmax_scale, kv_format=kv_format,
                                            k_scale=k_scale, topk_length=topk_length, attn_sink=attn_sink, out=out,
                                            return_lse=return_lse, extra_kv_cache=extra_kv_cache,
                                            extra_indices=extra_indices, extra_topk_length=extra_topk_length)


def sparse_mla_attention_with_config(q: Query, kv_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                                     *, kv_format: str | None = None, k_scale: float | torch.Tensor | None = None,
                                     topk_length: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
                                     out: torch.Tensor | None = None, return_lse: bool = False, kernel: str = "auto",
                                     return_config: bool = False, extra_kv_cache: torch.Tensor | None = None,
                                     extra_indices: torch.Tensor | None = None,
                                     extra_topk_length: torch.Tensor | None = None, **config_overrides: object
                                     ) -> torch.Tensor | tuple:
    """:func:`sparse_mla_attention` with the kernel choice exposed: ``kernel`` is ``"auto"``, ``"decode"`` or
    ``"prefill"``; ``config_overrides`` replace fields of the chosen
    :class:`~triton_mla_sparse.ops.sparse_mla.configs.AttentionConfig`; ``return_config`` appends the config used.
    With an extra cache (``extra_*``) a Gluon kernel runs only where it reads both caches (else the tl kernel)."""
    p = check_attention_inputs(q, kv_cache, indices, softmax_scale, kv_format=kv_format, k_scale=k_scale,
                               topk_length=topk_length, attn_sink=attn_sink, out=out, extra_kv_cache=extra_kv_cache,
                               extra_indices=extra_indices, extra_topk_length=extra_topk_length)
    dev = p.device
    check_kernel_device(dev)
    arch = None
    if dev.type == "cuda":
        arch = arch_for_device(dev)
        reasons = _unsupported(arch, p.dtype, p.kv_format, p.d_rope, p.H, p.topk, p.block_size, dev)
        if not reasons and p.kv_format == FP8_DS_MLA_V4 and not v4_supported(arch):
            fail("kv_format", f"a format other than {FP8_DS_MLA_V4!r} on {describe_device(dev)} (the kernel that reads "
                 f"DeepSeek-V4 pages spills registers on {arch.name}; NVIDIA, CDNA and RDNA4 GPUs only for now)",
                 repr(p.kv_format))
        if not reasons and p.kv2 is not None:
            if not extra_cache_supported(arch):
                fail("extra_kv_cache", f"None on {describe_device(dev)} (the kernel that reads an extra cache spills "
                     f"registers on {arch.name}; NVIDIA GPUs only for now)", "a cache")
            extra_reasons = _unsupported(arch, p.dtype, p.kv_format, p.d_rope, p.H, p.topk2, p.block_size2, dev)
            if extra_reasons:
                raise ValueError(f"extra_kv_cache: this configuration is not supported on {describe_device(dev)}: "
                                 + "; ".join(extra_reasons))
        if reasons:
            raise ValueError(f"q: this configuration is not supported on {describe_device(dev)}: "
                             + "; ".join(reasons))
    tl_only = False
    if dev.type == "cuda":
        from .kernels import gluon_reads_problem

        # a cache the Gluon kernels cannot read (rows off 16 elements, converted rows, fp16 q with fp8_ds_mla) gets
        # the tl kernel's own table entry, whatever the table or a family override would give
        tl_only = not gluon_reads_problem(p)
    # with an extra cache the kernel walks one list of both, as long as the two together
    topk = p.topk + p.topk2
    if config_overrides:
        family = config_overrides.get("family")
        # a family that cannot run this problem at all still gets choose_config's ValueError
        refused = family not in (None, "tl") and not gluon_supported(family, arch, p.kv_format, p.dtype)
        over = dict(config_overrides, family="tl") if tl_only and not refused else config_overrides
        cfg = choose_config(p.T, p.H, topk, dev, kernel, kv_format=p.kv_format, arch=arch, q_dtype=p.dtype, **over)
    else:
        cfg = _choose_config(p.T, p.H, topk, dev, kernel, p.kv_format, arch, p.dtype, tl_only)
    if cfg.kernel == "decode":  # the splits that cover the list (overrides of both fields, an extra cache's padding)
        num_splits = -(-p.list_len(cfg.block_n) // cfg.split_len)
        if num_splits != cfg.num_splits:
            cfg = replace(cfg, num_splits=num_splits)
    result = out if out is not None else torch.empty(p.T, p.H, D_V, dtype=p.dtype, device=dev)
    lse = torch.empty(p.T, p.H, dtype=torch.float32, device=dev) if return_lse else None
    if p.T > 0:
        from .kernels import launch_sparse_mla

        with device_guard(dev):
            lse = launch_sparse_mla(p, cfg, result, lse)
    ret = (result, lse) if return_lse else result
    if return_config:
        return (*ret, cfg) if return_lse else (ret, cfg)
    return ret


# Per-call host work is part of every eager decode step (tens of microseconds against a ~60 µs kernel), so the
# pure functions of the problem's shape are memoised: the capability check and the launch configuration.
@functools.lru_cache(maxsize=4096)
def _unsupported(arch, q_dtype, kv_format, d_rope, heads, topk, block_size, dev):
    return tuple(unsupported_reasons(arch, q_dtype=q_dtype, kv_format=kv_format, d_rope=d_rope, heads=heads,
                                     topk=topk, block_size=block_size, device_desc=describe_device(dev)))


@functools.lru_cache(maxsize=4096)
def _choose_config(T, H, topk, dev, kernel, kv_format, arch, q_dtype, tl_only=False):
    over = {"family": "tl"} if tl_only else {}
    return choose_config(T, H, topk, dev, kernel, kv_format=kv_format, arch=arch, q_dtype=q_dtype, **over)

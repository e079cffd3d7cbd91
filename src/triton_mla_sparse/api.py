"""The public entry point: validation, configuration and dispatch to the Triton kernels."""

from __future__ import annotations

import functools

import torch

from ._checks import check_attention_inputs, check_kernel_device, device_guard
from .capabilities import arch_for_device, describe_device, unsupported_reasons
from .formats import D_V
from .kernels.configs import choose_config

__all__ = ["sparse_mla_attention", "sparse_mla_attention_with_config"]


def sparse_mla_attention(q, kv_cache, indices, softmax_scale, *, kv_format=None, k_scale=None, topk_length=None,
                         attn_sink=None, out=None, return_lse=False):
    """Sparse MLA attention with the Triton kernels.

    Same arguments, semantics and results as :func:`triton_mla_sparse.reference.sparse_mla_attention` (whose
    docstring is the contract): returns ``out [T, H, 512]`` in q's dtype (written into ``out=`` when given) and,
    with ``return_lse=True``, ``lse [T, H]`` float32 (natural log, -inf for a row with no valid index).
    The decode (split top-k) or prefill kernel is chosen from rows × heads against the GPU's multiprocessor count.
    Tensors must be on a CUDA device (or on the CPU with ``TRITON_INTERPRET=1`` set before triton is imported).
    """
    return sparse_mla_attention_with_config(q, kv_cache, indices, softmax_scale, kv_format=kv_format,
                                            k_scale=k_scale, topk_length=topk_length, attn_sink=attn_sink, out=out,
                                            return_lse=return_lse)


def sparse_mla_attention_with_config(q, kv_cache, indices, softmax_scale, *, kv_format=None, k_scale=None,
                                     topk_length=None, attn_sink=None, out=None, return_lse=False,
                                     kernel="auto", return_config=False, **config_overrides):
    """:func:`sparse_mla_attention` with the kernel choice exposed: ``kernel`` is ``"auto"``, ``"decode"`` or
    ``"prefill"``; ``config_overrides`` replace fields of the chosen
    :class:`~triton_mla_sparse.kernels.configs.AttentionConfig`; ``return_config`` appends the config used."""
    p = check_attention_inputs(q, kv_cache, indices, softmax_scale, kv_format=kv_format, k_scale=k_scale,
                               topk_length=topk_length, attn_sink=attn_sink, out=out)
    dev = p.device
    check_kernel_device(dev)
    arch = None
    if dev.type == "cuda":
        arch = arch_for_device(dev)
        reasons = _unsupported(arch, p.dtype, p.kv_format, p.d_rope, p.H, p.topk, p.block_size, dev)
        if reasons:
            raise ValueError(f"q: this configuration is not supported on {describe_device(dev)}: "
                             + "; ".join(reasons))
    if config_overrides:
        cfg = choose_config(p.T, p.H, p.topk, dev, kernel, kv_format=p.kv_format, arch=arch, **config_overrides)
    else:
        cfg = _choose_config(p.T, p.H, p.topk, dev, kernel, p.kv_format, arch)
    result = out if out is not None else torch.empty(p.T, p.H, D_V, dtype=p.dtype, device=dev)
    lse = torch.empty(p.T, p.H, dtype=torch.float32, device=dev) if return_lse else None
    if p.T > 0:
        from .kernels.attention import launch_sparse_mla

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
def _choose_config(T, H, topk, dev, kernel, kv_format, arch):
    return choose_config(T, H, topk, dev, kernel, kv_format=kv_format, arch=arch)

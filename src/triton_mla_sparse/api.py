"""The public entry point: validation, configuration and dispatch to the Triton kernels."""

from __future__ import annotations

import contextlib

import torch

from ._checks import check_attention_inputs, check_kernel_device
from .capabilities import arch_for_device, describe_device, unsupported_reasons
from .formats import D_V
from .kernels.configs import choose_config, interpreting

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
        reasons = unsupported_reasons(arch, q_dtype=p.dtype, kv_format=p.kv_format, d_rope=p.d_rope, heads=p.H,
                                      topk=p.topk, block_size=p.block_size, device_desc=describe_device(dev))
        if reasons:
            raise ValueError(f"q: this configuration is not supported on {describe_device(dev)}: "
                             + "; ".join(reasons))
    cfg = choose_config(p.T, p.H, p.topk, dev, kernel, kv_format=p.kv_format, arch=arch, **config_overrides)
    result = out if out is not None else torch.empty(p.T, p.H, D_V, dtype=p.dtype, device=dev)
    lse = torch.empty(p.T, p.H, dtype=torch.float32, device=dev)
    if p.T > 0:
        from .kernels.attention import launch_sparse_mla

        with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
            launch_sparse_mla(p, cfg, result, lse)
    ret = (result, lse) if return_lse else result
    if return_config:
        return (*ret, cfg) if return_lse else (ret, cfg)
    return ret

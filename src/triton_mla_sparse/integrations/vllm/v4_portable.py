"""Portable stand-ins for the pieces of vLLM 0.33's DeepSeek-V4 path that have no fallback on SM 8.x GPUs.

* **The o_proj fp8 einsum** (``deep_gemm_fp8_o_proj``: inverse RoPE, then DeepGEMM's ``fp8_einsum`` over the
  grouped ``wo_a``). vLLM's own function already has a bf16 branch (``fused_inv_rope_fp8_quant(..., quantize=False)``
  then ``torch.bmm``), taken when ``wo_a.weight`` is not e4m3. Below SM 9.0 vLLM would hand ``wo_a`` to Marlin, whose
  weight repack makes it unusable there; :func:`dequantize_wo_a` takes the layer's place in
  ``process_weights_after_loading``: it turns the e4m3 weight (128 × 128 block scales, or MXFP8's 32-wide UE8M0
  ones) into bf16 once (twice the fp8 bytes of ``wo_a``; ``wo_b`` stays vLLM's), so vLLM's bf16 branch runs (V4.1's
  ``dsv41_o_proj`` calls the same function off SM 10.x). Installed per layer by this package's V4 and V4.1 attention
  layers (:func:`route_wo_a`).
* **V4's first-layer mHC prenorm GEMM** (``mhc_pre_broadcast_tilelang`` asks ``_hc_prenorm_gemm_outputs`` for
  DeepGEMM's ``tf32_hc_prenorm_gemm`` with ``use_tilelang_fallback=False``, whatever the GPU). :func:`install`
  wraps that function: such calls get ``out = x·fnᵀ`` and ``sqrsum = Σ x²`` in float32 torch, one split (the
  TileLang kernel that consumes them reads the split count from the tensors); every other call is vLLM's.

* **V4's two CuTeDSL kernels** (sm_89+ PTX: they pack e4m3 with ``cvt.rn.satfinite.e4m3x2.f32``): the head-512
  KV compressor (``DeepseekCompressor`` takes ``_SPARSE_ATTN_COMPRESSOR_CUTEDSL_KERNEL`` on every CUDA GPU) and the
  indexer's q quantization (``fused_indexer_q_rope_quant`` takes the CuTeDSL kernel whenever cutlass's DSL is
  installed). vLLM has Triton kernels for both (its path on AMD and without CuTeDSL); :func:`install_cutedsl_routes`
  sends the calls there — the compressor through :func:`portable_compress` (vLLM's
  ``compress_norm_rope_store_triton``; the fp8_ds_mla cache this package's layer uses), the indexer q by answering
  ``has_cutedsl()`` False in that module — and keeps the CuTeDSL kernels out of vLLM's JIT warm-up (which would
  compile them). Their e4m3 casts are then the software casts' (``TRITON_MLA_SPARSE_SOFT_FP8``).

Where (``TRITON_MLA_SPARSE_DSV4_PORTABLE``), wherever this package's V4 layer runs: ``auto`` (default) where vLLM's
``is_deep_gemm_supported()`` is false (SM 8.x) for the DeepGEMM stand-ins and below SM 8.9 for the CuTeDSL routes,
``always`` on every GPU (to compare them with vLLM's kernels on one GPU), ``off`` never — then :mod:`.v4`'s build
check counts these components as blocking (below SM 9.0 / 8.9). Importing this module imports neither vLLM nor CUDA.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .policy import dsv4_portable_mode, warn_once

__all__ = ["BLOCK", "MX_BLOCK", "PRENORM_MODULE", "PRENORM_HOOK", "COMPRESSOR_MODULE", "COMPRESSOR_KERNEL",
           "COMPRESSOR_WARMUPS", "INDEXER_Q_MODULE", "INDEXER_Q_CUTEDSL_MODULE", "INDEXER_Q_WARMUPS",
           "CUTEDSL_MIN_CAPABILITY",
           "cutedsl_route_wanted", "dequantize_block_fp8", "dequantize_wo_a", "install", "install_cutedsl_routes",
           "installed", "cutedsl_routes_installed", "portable_compress", "portable_wanted", "prenorm_outputs",
           "route_wo_a", "uninstall", "uninstall_cutedsl_routes"]

BLOCK = 128  # DeepSeek-V4's fp8 weights: one scale per 128 x 128 block
MX_BLOCK = 32  # MXFP8 weights (a V4.1 checkpoint may ship them): one UE8M0 scale (uint8) per 32 values of a row
PRENORM_MODULE = "vllm.model_executor.kernels.mhc.tilelang"
PRENORM_HOOK = "_hc_prenorm_gemm_outputs"
_MARK = "_triton_mla_sparse_portable_prenorm"
COMPRESSOR_MODULE = "vllm.models.deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl"
COMPRESSOR_KERNEL = "_SPARSE_ATTN_COMPRESSOR_CUTEDSL_KERNEL"
#: The compressor's CuTeDSL kernels that ``DeepseekCompressor`` registers for vLLM's JIT warm-up.
COMPRESSOR_WARMUPS = ("_SPARSE_ATTN_COMPRESS_NORM_ROPE_STORE_C4_KERNEL",
                      "_SPARSE_ATTN_COMPRESS_NORM_ROPE_STORE_FULL_C4_KERNEL",
                      "_SPARSE_ATTN_COMPRESS_C128_BLOCK8_KERNEL", "_SPARSE_ATTN_NORM_ROPE_STORE_KERNEL",
                      "_SPARSE_ATTN_NORM_ROPE_STORE_FULL_KERNEL")
INDEXER_Q_MODULE = "vllm.models.deepseek_v4.common.ops.fused_indexer_q"
INDEXER_Q_CUTEDSL_MODULE = "vllm.models.deepseek_v4.nvidia.ops.fused_indexer_q_cutedsl"
#: The indexer-q CuTeDSL kernels that ``DeepseekV4Indexer`` registers for vLLM's JIT warm-up.
INDEXER_Q_WARMUPS = ("_INDEXER_Q_FP8_KERNEL", "_INDEXER_Q_MXFP4_KERNEL")
#: The CuTeDSL kernels' e4m3 packing instruction needs this capability.
CUTEDSL_MIN_CAPABILITY = (8, 9)
_ROUTE_MARK = "_triton_mla_sparse_cutedsl_route"


def portable_wanted(mode: str | None = None) -> bool:
    """Whether the portable stand-ins run in this process: ``always``; ``auto`` where DeepGEMM is not supported
    (vLLM's ``is_deep_gemm_supported``, which imports vLLM); never with ``off``."""
    mode = dsv4_portable_mode() if mode is None else mode
    if mode == "off":
        return False
    if mode == "always":
        return True
    from vllm.utils.deep_gemm import is_deep_gemm_supported

    return not is_deep_gemm_supported()


def dequantize_block_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16
                         ) -> torch.Tensor:
    """``weight`` e4m3 ``[N, K]`` times its block scales ``scale`` ``[ceil(N/128), ceil(K/128)]`` (float32 or
    UE8M0 ``float8_e8m0fnu``; multipliers, as vLLM's block-fp8 matmuls apply them), as ``dtype``: the weight
    DeepGEMM's einsum multiplies by on SM 9.0 (SM 10.x re-quantizes float32 scales to UE8M0 first; the bf16
    result rounds either way). One block row at a time: the float32 temporaries stay 128 rows tall."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"weight: expected a float8_e4m3fn tensor [N, K], got "
                         f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")
    n, k = weight.shape
    blocks = (-(-n // BLOCK), -(-k // BLOCK))
    if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != blocks:
        raise ValueError(f"scale: expected the block scales {list(blocks)} of a weight [{n}, {k}] (one per "
                         f"{BLOCK} x {BLOCK} block), got {tuple(getattr(scale, 'shape', ()))}")
    s = scale.to(torch.float32).repeat_interleave(BLOCK, 1)[:, :k]
    out = torch.empty(n, k, dtype=dtype, device=weight.device)
    for i in range(blocks[0]):
        rows = slice(i * BLOCK, min(n, (i + 1) * BLOCK))
        out[rows] = (weight[rows].to(torch.float32) * s[i]).to(dtype)
    return out


def _is_mxfp8_scale(weight: torch.Tensor, scale: Any) -> bool:
    """Whether ``scale`` is the MXFP8 scale of ``weight`` [N, K]: UE8M0 bytes (uint8, vLLM's ``kMxfp8StaticScale``)
    ``[N, K / 32]``."""
    n, k = weight.shape
    return (isinstance(scale, torch.Tensor) and scale.dtype == torch.uint8 and k % MX_BLOCK == 0
            and tuple(scale.shape) == (n, k // MX_BLOCK))


def dequantize_wo_a(layer: torch.nn.Module) -> None:
    """``process_weights_after_loading`` for a V4 / V4.1 ``wo_a`` with e4m3 weights: its weight as bf16 (a new
    parameter; the e4m3 one and its scales are dropped), so that ``deep_gemm_fp8_o_proj`` takes its bf16 branch —
    128 x 128 block scales by :func:`dequantize_block_fp8`, MXFP8 scales (:func:`_is_mxfp8_scale`) by vLLM's own
    ``dequant_mxfp8_to_bf16``. A weight that is not e4m3 is left alone. The new parameter has no weight loader:
    reloading weights into a built engine (a refit) is not supported on this path."""
    weight = layer.weight
    if weight.dtype != torch.float8_e4m3fn:
        return
    # the scale deep_gemm_fp8_o_proj would hand fp8_einsum: weight_scale where the layer has one, else weight_scale_inv
    scale = getattr(layer, "weight_scale", None)
    if scale is None:
        scale = getattr(layer, "weight_scale_inv", None)
    if scale is None:
        raise ValueError("wo_a: an e4m3 weight without block scales (weight_scale / weight_scale_inv)")
    if _is_mxfp8_scale(weight, scale):
        from vllm.model_executor.layers.quantization.utils.mxfp8_utils import dequant_mxfp8_to_bf16

        dense = dequant_mxfp8_to_bf16(weight.data, scale.data)
    else:
        dense = dequantize_block_fp8(weight.data, scale.data)
    layer.weight = torch.nn.Parameter(dense, requires_grad=False)
    for name in ("weight_scale_inv", "weight_scale", "input_scale"):
        if hasattr(layer, name):
            delattr(layer, name)


def route_wo_a(wo_a: torch.nn.Module) -> bool:
    """Make ``wo_a``'s quant method dequantize its weight to bf16 after loading instead of vLLM's processing (e.g.
    Marlin's repack below SM 9.0) — when :func:`portable_wanted` and its weight is created e4m3 with 128 × 128
    block scales (an fp8 checkpoint as DeepSeek-V4's) or MXFP8 scales (32-wide UE8M0, ``uint8``); other e4m3 scales
    raise ``ValueError`` when the layer is built. Returns whether it did."""
    method = getattr(wo_a, "quant_method", None)
    weight = getattr(wo_a, "weight", None)
    if method is None or weight is None or weight.dtype != torch.float8_e4m3fn or not portable_wanted():
        return False
    blocks = (-(-weight.shape[0] // BLOCK), -(-weight.shape[1] // BLOCK))
    scales = [getattr(wo_a, n, None) for n in ("weight_scale", "weight_scale_inv")]
    if not any(isinstance(t, torch.Tensor) and tuple(t.shape) == blocks or _is_mxfp8_scale(weight, t)
               for t in scales):
        raise ValueError(f"wo_a: the portable o_proj dequantizes e4m3 weights with 128 x 128 block scales "
                         f"({list(blocks)} for a weight {list(weight.shape)}) or MXFP8 scales (uint8 "
                         f"[{weight.shape[0]}, K / {MX_BLOCK}]), got scales "
                         f"{[tuple(t.shape) for t in scales if isinstance(t, torch.Tensor)]}; DeepGEMM's einsum "
                         f"does not run on this GPU")
    method.process_weights_after_loading = dequantize_wo_a  # this layer's method object only
    return True


def prenorm_outputs(x: torch.Tensor, fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``tf32_hc_prenorm_gemm`` leaves with one split: ``out`` float32 ``[1, T, fn rows] = x·fnᵀ`` and
    ``sqrsum`` float32 ``[1, T] = Σ x²`` (in float32: no TF32 rounding)."""
    xf = x.to(torch.float32)
    return (xf @ fn.to(torch.float32).T).unsqueeze(0), xf.square().sum(-1).unsqueeze(0)


def _wrap(original: Any) -> Any:
    """vLLM's ``_hc_prenorm_gemm_outputs`` with its forced-DeepGEMM calls (V4's first layer) taken by
    :func:`prenorm_outputs` where :func:`portable_wanted`; ``original`` kept on the wrapper for :func:`uninstall`."""

    @functools.wraps(original)
    def _hc_prenorm_gemm_outputs(x: torch.Tensor, fn: torch.Tensor, *, hidden_size: int, hc_mult: int,
                                 use_tilelang_fallback: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        if not use_tilelang_fallback and portable_wanted():
            return prenorm_outputs(x, fn)
        return original(x, fn, hidden_size=hidden_size, hc_mult=hc_mult,
                        use_tilelang_fallback=use_tilelang_fallback)

    setattr(_hc_prenorm_gemm_outputs, _MARK, original)
    return _hc_prenorm_gemm_outputs


def install() -> bool:
    """Wrap vLLM's ``_hc_prenorm_gemm_outputs`` (idempotent; imports the module, which needs neither CUDA nor
    TileLang). Returns whether the wrapper is in place; a missing function logs one warning."""
    import importlib

    try:
        module = importlib.import_module(PRENORM_MODULE)
    except ImportError as e:
        warn_once("prenorm-import", "triton-mla-sparse: %s does not import (%s); V4's first-layer mHC prenorm "
                  "keeps DeepGEMM.", PRENORM_MODULE, e)
        return False
    current = getattr(module, PRENORM_HOOK, None)
    if current is None:
        warn_once("prenorm-missing", "triton-mla-sparse: %s.%s is missing (not vLLM 0.33); V4's first-layer mHC "
                  "prenorm keeps DeepGEMM.", PRENORM_MODULE, PRENORM_HOOK)
        return False
    if not hasattr(current, _MARK):
        setattr(module, PRENORM_HOOK, _wrap(current))
    return True


def installed() -> bool:
    """Whether the prenorm wrapper is in place (without importing the module)."""
    import sys

    module = sys.modules.get(PRENORM_MODULE)
    return module is not None and hasattr(getattr(module, PRENORM_HOOK, None), _MARK)


def uninstall() -> None:
    """Put vLLM's function back (for tests)."""
    import sys

    module = sys.modules.get(PRENORM_MODULE)
    current = getattr(module, PRENORM_HOOK, None) if module is not None else None
    if current is not None and hasattr(current, _MARK):
        setattr(module, PRENORM_HOOK, getattr(current, _MARK))


def cutedsl_route_wanted(mode: str | None = None) -> bool:
    """Whether V4's CuTeDSL compressor and indexer-q calls go to vLLM's Triton kernels in this process: ``always``;
    ``auto`` below :data:`CUTEDSL_MIN_CAPABILITY` (vLLM's ``current_platform``); never with ``off``."""
    mode = dsv4_portable_mode() if mode is None else mode
    if mode == "off":
        return False
    if mode == "always":
        return True
    from vllm.platforms import current_platform

    capability = current_platform.get_device_capability()
    return capability is not None and (capability.major, capability.minor) < CUTEDSL_MIN_CAPABILITY


def portable_compress(**kwargs: Any) -> None:
    """The head-512 compressor call (``_SPARSE_ATTN_COMPRESSOR_CUTEDSL_KERNEL``'s keyword arguments) on vLLM's
    Triton kernel (``compress_norm_rope_store_triton``), which writes the fp8_ds_mla cache only: a full-row cache
    (``store_full_kv``) raises ``ValueError``."""
    if kwargs.pop("store_full_kv", False) or kwargs.pop("store_full_fp8", False):
        raise ValueError("store_full_kv: the portable V4 compressor writes the fp8_ds_mla cache only, not full rows")
    kwargs.pop("fp8_scale", None)
    if kwargs["positions"].numel() == 0:  # as the CuTeDSL kernel: nothing to store (and no empty grid)
        return
    from vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache import compress_norm_rope_store_triton

    compress_norm_rope_store_triton(**kwargs)


def _compressor_route(original: Any) -> Any:
    """``original`` (vLLM's CuTeDSL compressor object) with its calls sent to :func:`portable_compress` where
    :func:`cutedsl_route_wanted`."""

    def compressor(**kwargs: Any) -> None:
        if cutedsl_route_wanted():
            return portable_compress(**kwargs)
        return original(**kwargs)

    setattr(compressor, _ROUTE_MARK, original)
    return compressor


def _has_cutedsl_route(original: Any) -> Any:
    """vLLM's ``has_cutedsl`` as ``fused_indexer_q`` asks it: False where :func:`cutedsl_route_wanted`."""

    @functools.wraps(original)
    def has_cutedsl() -> bool:
        return False if cutedsl_route_wanted() else original()

    setattr(has_cutedsl, _ROUTE_MARK, original)
    return has_cutedsl


def _warmup_route(kernel: Any) -> None:
    """Keep ``kernel`` (a CuTeDSL ``VllmJitKernel``) out of vLLM's JIT warm-up where :func:`cutedsl_route_wanted`:
    its ``register_warmup`` then registers nothing (an instance attribute; the class method stays)."""
    if _ROUTE_MARK in vars(kernel):
        return
    original = kernel.register_warmup

    def register_warmup(*args: Any, **kwargs: Any) -> None:
        if not cutedsl_route_wanted():
            original(*args, **kwargs)

    kernel.register_warmup = register_warmup
    setattr(kernel, _ROUTE_MARK, True)


def install_cutedsl_routes() -> bool:
    """Route V4's CuTeDSL compressor and indexer-q kernels (idempotent; imports vLLM's three modules, which import
    cutlass's DSL but touch no GPU). Returns whether every route is in place; a missing module or name logs one
    warning (those kernels then stay vLLM's)."""
    import importlib

    try:
        compressor = importlib.import_module(COMPRESSOR_MODULE)
        indexer_q = importlib.import_module(INDEXER_Q_MODULE)
        indexer_q_cutedsl = importlib.import_module(INDEXER_Q_CUTEDSL_MODULE)
    except ImportError as e:
        warn_once("cutedsl-import", "triton-mla-sparse: DeepSeek-V4's CuTeDSL modules do not import (%s); its "
                  "compressor and indexer q stay vLLM's.", e)
        return False
    names = [(compressor, n) for n in (COMPRESSOR_KERNEL, *COMPRESSOR_WARMUPS)]
    names += [(indexer_q, "has_cutedsl")] + [(indexer_q_cutedsl, n) for n in INDEXER_Q_WARMUPS]
    missing = [f"{m.__name__}.{n}" for m, n in names if getattr(m, n, None) is None]
    if missing:
        warn_once("cutedsl-missing", "triton-mla-sparse: %s missing (not vLLM 0.33); DeepSeek-V4's compressor and "
                  "indexer q stay vLLM's.", ", ".join(missing))
        return False
    if not hasattr(getattr(compressor, COMPRESSOR_KERNEL), _ROUTE_MARK):
        setattr(compressor, COMPRESSOR_KERNEL, _compressor_route(getattr(compressor, COMPRESSOR_KERNEL)))
    if not hasattr(indexer_q.has_cutedsl, _ROUTE_MARK):
        indexer_q.has_cutedsl = _has_cutedsl_route(indexer_q.has_cutedsl)
    for module, warmups in ((compressor, COMPRESSOR_WARMUPS), (indexer_q_cutedsl, INDEXER_Q_WARMUPS)):
        for name in warmups:
            _warmup_route(getattr(module, name))
    return True


def cutedsl_routes_installed() -> bool:
    """Whether the compressor and indexer-q routes are in place (without importing anything)."""
    import sys

    compressor, indexer_q = sys.modules.get(COMPRESSOR_MODULE), sys.modules.get(INDEXER_Q_MODULE)
    return (compressor is not None and indexer_q is not None
            and hasattr(getattr(compressor, COMPRESSOR_KERNEL, None), _ROUTE_MARK)
            and hasattr(getattr(indexer_q, "has_cutedsl", None), _ROUTE_MARK))


def uninstall_cutedsl_routes() -> None:
    """Put vLLM's compressor object, ``has_cutedsl`` and warm-up registration back (for tests)."""
    import sys

    compressor, indexer_q = sys.modules.get(COMPRESSOR_MODULE), sys.modules.get(INDEXER_Q_MODULE)
    indexer_q_cutedsl = sys.modules.get(INDEXER_Q_CUTEDSL_MODULE)
    for module, name in ((compressor, COMPRESSOR_KERNEL), (indexer_q, "has_cutedsl")):
        current = getattr(module, name, None) if module is not None else None
        if current is not None and hasattr(current, _ROUTE_MARK):
            setattr(module, name, getattr(current, _ROUTE_MARK))
    for module, warmups in ((compressor, COMPRESSOR_WARMUPS), (indexer_q_cutedsl, INDEXER_Q_WARMUPS)):
        for name in warmups if module is not None else ():
            kernel = getattr(module, name, None)
            if kernel is not None and _ROUTE_MARK in vars(kernel):
                del kernel.register_warmup
                delattr(kernel, _ROUTE_MARK)

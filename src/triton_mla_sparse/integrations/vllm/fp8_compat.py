"""Software e4m3 casts for vLLM's DSA Triton kernels on GPUs without native fp8 conversions (SM 8.0/8.6/8.7).

vLLM 0.33's ``vllm.models.deepseek_v32.common.kernels`` (``fused_norm_rope``, ``fused_q`` and their helpers) casts
float32 to ``tl.float8e4nv`` and writes through fp8e4nv pointers; Triton refuses that type below sm89 (``ValueError:
type fp8e4nv not supported in this architecture``), so DeepSeek-V3.2 / GLM-5 cannot run there. DeepSeek-V4's Triton
kernels in ``vllm.models.deepseek_v4.common.ops`` do the same: ``cache_utils`` (``quantize_and_insert_k_kernel``, the
SWA-cache insert; ``DequantizeAndGatherKCacheKernel.kernel``, which bitcasts the cache bytes to fp8e4nv and decodes
them), ``fused_compress_quant_cache`` (the head-512 sparse-attention compressor stores
``_fused_kv_compress_norm_rope_insert_sparse_attn`` and ``_finalize_norm_rope_quant_store_sparse_attn``, and the
head-128 indexer one ``_fused_kv_compress_norm_rope_insert_indexer_attn``), ``fused_indexer_q``
(``FusedIndexerQRopeQuantTritonKernel.kernel``) and ``fused_inv_rope_fp8_quant``
(``FusedInvRopeFP8QuantKernel.kernel``). DeepSeek-V4.1's own modules do too: in ``vllm.models.deepseek_v41.common.ops``
``cache_utils`` (the SWA inserts and the dequantize-gathers of V4's 584-byte record, which V4.1 writes off SM 10.x,
and of SM 10.x's MXFP8 and NVFP4 records), ``fused_compress_quant_cache`` (the compressed-cache stores
``_rope_quant_insert_kernel``, its MXFP8/NVFP4 forms and the per-tensor-fp8 ``_rope_plain_insert_kernel``) and
``indexer_k_store`` (``_indexer_k_norm_rope_quant_store_kernel``, the FP8 indexer K cache), and
``vllm.models.deepseek_v41.common.engram`` (``_engram_lookup_kernel``, which decodes an e4m3 table it may reach
through an int-to-fp8e4nv pointer cast). Kernels defined in a class body (``@staticmethod @triton.jit``) keep their
module's name as ``__module__``, so routing by module covers them. All of them cast values with ``.to(...)`` only;
their FNUZ branches (``tl.float8e4b8``, behind ``use_fnuz``/``USE_FNUZ`` constexprs, false on CUDA) are left alone.
A pointer cast to fp8e4nv, or the constant ``other`` of a masked fp8e4nv load (folded to an fp8 constant), converts
nothing and only needs the type the front end is given below. V4.1's NVFP4 compressed-cache store still cannot be
built below SM 10.x: it packs e2m1 with inline ``cvt.rn.satfinite.e2m1x2.f32``, which ptxas refuses there. The vLLM
tier AOT-compiles every one of these kernels for sm80 and sm86 (routed: no e4m3 conversion instruction; unrouted:
Triton's error); none of the V4 / V4.1 ones has run on an SM 8.x GPU. :func:`install` changes how Triton compiles
exactly the kernels of :data:`ROUTED_MODULES`, without touching vLLM's files:

* ``ASTSource.make_ir`` (Triton's front end): when the kernel being compiled is defined in a routed module
  (:data:`ROUTED_MODULES`) and the target is CUDA below sm89 (mode ``auto``) or any CUDA target (``always``), the
  front end sees ``fp8e4nv`` among the target's supported fp8 types and a flag for the casts below is set for the
  duration of that kernel's code generation (its whole call tree); every other kernel compiles as before.
* ``tensor.to`` (a Triton builtin): while the flag is set, a float32/float16/bfloat16 -> ``float8e4nv`` value cast
  calls :func:`~triton_mla_sparse._common.fp8.f32_to_e4m3` (integer operations: round to nearest even, saturating
  like ``cvt.rn.satfinite``) through the code generator and bitcasts its bytes; ``float8e4nv`` -> float decodes with
  integer operations (NaN codes stay NaN). Bitcasts, other types and ``fp_downcast_rounding="rtz"`` are untouched.
  Only ``.to`` casts are routed (``tl.cast`` and implicit casts are not): vLLM 0.33's kernels use ``.to`` only, and
  the vLLM tier checks that their routed builds hold no e4m3 conversion instruction.
* ``get_cache_key`` (Triton's on-disk cache key): a routed build's key gets a suffix naming the router's version and
  the helpers' source hashes, so a routed build and a native one (``always`` on an SM 9.0 GPU) never share a cache
  entry, and editing a helper invalidates the routed builds.

Switch: ``TRITON_MLA_SPARSE_SOFT_FP8=auto|always|off`` (:func:`~.policy.soft_fp8_mode`). ``auto`` installs the hooks
in CUDA processes and routes builds for targets below sm89 (so nothing changes on SM 8.9+); ``always`` routes every
CUDA target (for comparing with the hardware path on an SM 9.0 GPU); ``off`` installs nothing. The mode is read when
:func:`install` runs (from the plugin's ``register()``, before vLLM compiles anything); kernels Triton already holds
in memory are not rebuilt. Where an internal this relies on differs from Triton 3.6/3.8/3.9, one warning is logged
and nothing is patched. Importing this module imports triton.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import re
from typing import Any

import triton
import triton.language as tl

from ..._common.fp8 import e4m3_to_f32, f32_to_e4m3
from .policy import logger, soft_fp8_mode

__all__ = ["ROUTED_MODULES", "ROUTER_VERSION", "install", "uninstall", "installed", "routes", "state"]

#: Modules whose ``@triton.jit`` kernels get the software casts (a kernel's ``__module__``, also for kernels defined
#: in a class body or a function): DeepSeek-V3.2 / GLM-5's DSA kernels, DeepSeek-V4's and V4.1's (see the module doc).
ROUTED_MODULES: tuple[str, ...] = (
    "vllm.models.deepseek_v32.common.kernels",
    "vllm.models.deepseek_v4.common.ops.cache_utils",
    "vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache",
    "vllm.models.deepseek_v4.common.ops.fused_indexer_q",
    "vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant",
    "vllm.models.deepseek_v41.common.engram",
    "vllm.models.deepseek_v41.common.ops.cache_utils",
    "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache",
    "vllm.models.deepseek_v41.common.ops.indexer_k_store",
)
ROUTER_VERSION = "1"
_MARK = "_triton_mla_sparse_soft_fp8"
_FP8 = "fp8e4nv"
_active: contextvars.ContextVar[bool] = contextvars.ContextVar("tms_soft_fp8_active", default=False)


@dataclasses.dataclass
class _State:
    mode: str = "off"
    modules: tuple[str, ...] = ROUTED_MODULES
    originals: dict[str, tuple[Any, str, Any]] = dataclasses.field(default_factory=dict)  # key -> (owner, attr, fn)
    warned: bool = False


state = _State()


@triton.jit
def _e4m3_decode(bits):
    """e4m3 bytes -> float32 with integer operations; the NaN codes (0x7F, 0xFF) decode to NaN, as the hardware."""
    v = e4m3_to_f32(bits, True)
    return tl.where((bits & 0x7F) == 0x7F, float("nan"), v)


def _cuda_arch(options: Any) -> int | None:
    m = re.fullmatch(r"sm(\d+)a?", str(getattr(options, "arch", "")))
    return int(m.group(1)) if m else None


def routes(fn: Any, options: Any) -> bool:
    """Whether the build of kernel ``fn`` with Triton backend ``options`` gets the software casts (see module doc)."""
    if state.mode == "off" or getattr(fn, "__module__", None) not in state.modules:
        return False
    arch = _cuda_arch(options)
    return arch is not None and (state.mode == "always" or arch < 89)


def _key_suffix() -> str:
    return f"-tms-soft-fp8-v{ROUTER_VERSION}-{f32_to_e4m3.cache_key}-{_e4m3_decode.cache_key}"


def _soft_cast(x: Any, dtype: Any, rounding: Any, bitcast: Any, semantic: Any, generator: Any) -> Any:
    """The software cast of ``x`` to ``dtype``, or None where the native cast applies."""
    unwrap = tl.core._unwrap_if_constexpr
    dtype, rounding, bitcast = unwrap(dtype), unwrap(rounding), unwrap(bitcast)
    if bitcast or not isinstance(dtype, tl.dtype) or not hasattr(x, "dtype"):
        return None
    src = x.dtype
    if dtype == tl.float8e4nv and src in (tl.float32, tl.float16, tl.bfloat16) and rounding in (None, "rtne"):
        x32 = x if src == tl.float32 else semantic.cast(x, tl.float32)
        return semantic.bitcast(generator.call_JitFunction(f32_to_e4m3, [x32], {}), tl.float8e4nv)
    if src == tl.float8e4nv and dtype in (tl.float32, tl.float16, tl.bfloat16):
        f = generator.call_JitFunction(_e4m3_decode, [semantic.bitcast(x, tl.uint8)], {})
        return f if dtype == tl.float32 else semantic.cast(f, dtype)
    return None


def _make_to(original: Any) -> Any:
    @tl.core.builtin
    def to(self, dtype, fp_downcast_rounding=None, bitcast=False, _semantic=None, _generator=None):
        if _generator is not None and _active.get():
            out = _soft_cast(self, dtype, fp_downcast_rounding, bitcast, _semantic, _generator)
            if out is not None:
                return out
        return original(self, dtype, fp_downcast_rounding, bitcast, _semantic=_semantic)

    to.__doc__ = original.__doc__
    setattr(to, _MARK, True)
    return to


def _make_make_ir(original: Any) -> Any:
    def make_ir(self, target, options, codegen_fns, module_map, context):
        routed = routes(self.fn, options)
        if routed and _FP8 not in options.supported_fp8_dtypes:
            options = dataclasses.replace(
                options, supported_fp8_dtypes=tuple(sorted(set(options.supported_fp8_dtypes) | {_FP8})))
        token = _active.set(routed)
        try:
            return original(self, target, options, codegen_fns, module_map, context)
        finally:
            _active.reset(token)

    setattr(make_ir, _MARK, True)
    return make_ir


def _make_cache_key(original: Any, ast_source: type) -> Any:
    def get_cache_key(src, backend, backend_options, env_vars):
        key = original(src, backend, backend_options, env_vars)
        if isinstance(src, ast_source) and routes(src.fn, backend_options):
            key += _key_suffix()
        return key

    setattr(get_cache_key, _MARK, True)
    return get_cache_key


def _params(fn: Any) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(inspect.unwrap(fn)).parameters)
    except (TypeError, ValueError):
        return ()


def _check_internals() -> str | None:
    """Why Triton's internals differ from what the hooks were written against (3.6, 3.8, 3.9), or None."""
    try:
        import triton.compiler.code_generator as cg
        import triton.compiler.compiler as cc
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception as e:  # noqa: BLE001 - any import problem means: do not patch
        return f"cannot import Triton's compiler modules ({type(e).__name__}: {e})"
    want = {
        "triton.compiler.compiler.ASTSource.make_ir": (getattr(getattr(cc, "ASTSource", None), "make_ir", None),
                                                       ("self", "target", "options", "codegen_fns", "module_map",
                                                        "context")),
        "triton.compiler.compiler.get_cache_key": (getattr(cc, "get_cache_key", None),
                                                   ("src", "backend", "backend_options", "env_vars")),
        "triton.language.core.tensor.to": (getattr(tl.core.tensor, "to", None),
                                           ("self", "dtype", "fp_downcast_rounding", "bitcast", "_semantic")),
    }
    for name, (fn, params) in want.items():
        if fn is None or (not getattr(fn, _MARK, False) and _params(fn) != params):
            return f"{name} is missing or its signature is not {params}"
    gen = getattr(cg, "CodeGenerator", None)
    call_jit = getattr(gen, "call_JitFunction", None)
    if call_jit is None or _params(call_jit)[:4] != ("self", "fn", "args", "kwargs"):
        return "CodeGenerator.call_JitFunction(self, fn, args, kwargs) is missing"
    try:
        passes_generator = "'_generator'" in inspect.getsource(gen.call_Function)
    except (OSError, TypeError):
        passes_generator = False
    if not passes_generator:
        return "CodeGenerator.call_Function does not pass _generator to builtins"
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    if "supported_fp8_dtypes" not in fields or "arch" not in fields:
        return "CUDAOptions has no supported_fp8_dtypes/arch fields"
    if not all(isinstance(f, triton.runtime.jit.JITFunction) for f in (f32_to_e4m3, _e4m3_decode)):
        return "the helpers are not JIT functions (TRITON_INTERPRET is set)"
    return None


def installed() -> bool:
    """Whether the hooks are in place."""
    return bool(state.originals)


def install(mode: str | None = None, modules: tuple[str, ...] | None = None) -> bool:
    """Install the hooks (idempotent) for ``mode`` (default: ``TRITON_MLA_SPARSE_SOFT_FP8``, which raises
    ``ValueError`` for a bad value) and ``modules`` (default :data:`ROUTED_MODULES`). ``auto`` installs only in a
    process on vLLM's CUDA platform. Returns whether the hooks are in place and routing after the call; ``off``
    leaves any installed hooks inert."""
    mode = soft_fp8_mode() if mode is None else mode
    if mode not in ("auto", "always", "off"):
        raise ValueError(f"mode: expected one of ('auto', 'always', 'off'), got {mode!r}")
    if modules is not None:
        state.modules = tuple(modules)
    if mode == "auto" and not installed():
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return False
    state.mode = mode
    if mode == "off" or installed():
        return mode != "off" and installed()
    why = _check_internals()
    if why is not None:
        if not state.warned:
            state.warned = True
            logger.warning("triton-mla-sparse: not routing vLLM's DSA fp8 casts through software (%s); on GPUs "
                           "below SM 8.9 those kernels fail as without the plugin.", why)
        state.mode = "off"
        return False
    import triton.compiler.compiler as cc
    import triton.runtime.jit as jit

    state.originals["make_ir"] = (cc.ASTSource, "make_ir", cc.ASTSource.make_ir)
    state.originals["to"] = (tl.core.tensor, "to", tl.core.tensor.to)
    state.originals["key"] = (cc, "get_cache_key", cc.get_cache_key)
    if getattr(jit, "get_cache_key", None) is cc.get_cache_key:  # the async-compile path's copy
        state.originals["jit_key"] = (jit, "get_cache_key", jit.get_cache_key)
    cc.ASTSource.make_ir = _make_make_ir(state.originals["make_ir"][2])
    tl.core.tensor.to = _make_to(state.originals["to"][2])
    new_key = _make_cache_key(state.originals["key"][2], cc.ASTSource)
    cc.get_cache_key = new_key
    if "jit_key" in state.originals:
        jit.get_cache_key = new_key
    logger.info("triton-mla-sparse: vLLM's DSA fp8 casts go through the software e4m3 path (%s: %s)",
                mode, "every CUDA target" if mode == "always" else "CUDA targets below sm89")
    return True


def uninstall() -> None:
    """Put Triton's original functions back (for tests)."""
    for owner, attr, fn in state.originals.values():
        setattr(owner, attr, fn)
    state.originals.clear()
    state.mode = "off"
    state.modules = ROUTED_MODULES

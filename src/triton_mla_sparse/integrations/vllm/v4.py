"""DeepSeek-V4 / V4.1 on GPUs where vLLM 0.33's model cannot run: our attention, or one error when it is built.

vLLM 0.33 builds DeepSeek-V4 (``vllm.models.deepseek_v4``) and V4.1 (``vllm.models.deepseek_v41``) on the CUDA
platform from its ``nvidia`` model modules on every GPU. Each decoder layer (main model, MTP and DSpark drafters)
asks the module's ``_select_dsv4_attn_cls(vllm_config)`` for its attention class: FlashInfer on SM 12.x, FlashMLA
(or, for V4.1 on SM 10.x, FlashMLA mega attention) everywhere else. Nothing checks the GPU, so on SM 8.0/8.6/8.9
the model builds and then fails inside the kernels at run time; on SM 12.x without FlashInfer's SM120 V4 kernels
vLLM refuses to build the layer. :data:`COMPONENTS` lists each piece of that path that needs a newer GPU, with the
lowest compute capability it runs on.

Where :func:`routes_attention` says so, the wrapper returns this package's V4 / V4.1 attention layer
(:func:`.v4_attention.triton_attention_cls` / :func:`.v4_attention.triton_attention_cls_v41`: both caches and the sink
read by the Triton kernels) instead of vLLM's class, and the attention row no longer blocks; nor do the rows the
plugin's other switches take over there (:func:`taken_components`: the Triton indexer on V4's and V4.1's compressed
caches, the portable o_proj and mHC prenorm of :mod:`.v4_portable` and its routes from the CuTeDSL compressor and
indexer-q kernels to vLLM's Triton ones, the software e4m3 casts). So from SM 8.0 on nothing blocks DeepSeek-V4 with the
default switches; nor DeepSeek-V4.1 (the attention layer, the Triton indexer with its two-level candidate blocks, the
portable o_proj, the indexer-q route and the software casts). A backend named with ``--attention-backend`` is vLLM's to
honour: ``auto`` then leaves the choice to vLLM, ``triton`` refuses the combination.

:func:`install` (called by :func:`triton_mla_sparse.integrations.vllm.register` on vLLM's CUDA platform) wraps
``_select_dsv4_attn_cls`` of both model modules: when the module is already imported at once, otherwise when it is
(an import hook, so that ``register`` does not import the models in every vLLM process). The wrapper reads the
device capability exactly as vLLM's function does (the module's ``current_platform``) and, where a component of
that model needs more, raises one ``ValueError`` naming every such component — the error type vLLM's own function
raises for a configuration it cannot serve (an unsuitable ``--attention-backend``). It is raised while the first
decoder layer is built, before any weight is allocated or loaded. On every other capability (or when the
capability is unknown) vLLM's function runs unchanged.

Switch: ``TRITON_MLA_SPARSE_DSV4`` = ``auto`` (default: the check above; our attention where vLLM has none: below
SM 9.0, and on SM 12.x without FlashInfer's V4 kernels for the model's heads and window) | ``triton`` (our attention
for DeepSeek-V4 and V4.1 on every CUDA GPU from SM 8.0 on but V4.1 on SM 10.x, e.g. to compare it with vLLM's in
one engine) | ``off`` (nothing is wrapped; vLLM then fails at run time as without the plugin), read by
:func:`install`. Where vLLM's function is
missing or has another signature than vLLM 0.33's, one warning is logged and that module is left alone. This
module imports vLLM inside functions only and never touches CUDA.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
from collections.abc import Callable, Collection, Sequence
from types import ModuleType
from typing import Any

from .policy import (DSV4_ENV, DSV4_MODES, dsv4_mode, dsv4_portable_mode, indexer_mode, logger, soft_fp8_mode,
                     warn_once)

__all__ = ["Component", "COMPONENTS", "ATTENTION", "INDEXER", "EINSUM", "PRENORM", "COMPRESSOR", "INDEXER_Q", "CASTS",
           "MODEL_MODULES",
           "HOOK_NAME", "EXPECTED_HOOK_PARAMS", "taken_components", "blocking_components", "error_message",
           "check_capability", "routes_attention", "flashinfer_sm120_ready", "wrap_module", "install", "uninstall",
           "installed_modules"]


@dataclasses.dataclass(frozen=True)
class Component:
    """A piece of vLLM 0.33's DeepSeek-V4 path that runs only from ``min_capability`` on."""

    name: str
    #: Where vLLM calls it (the function or kernel that fails below ``min_capability``).
    vllm_function: str
    min_capability: tuple[int, int]
    #: The models whose path uses it (``"DeepSeek-V4"``, ``"DeepSeek-V4.1"``).
    models: tuple[str, ...]
    note: str


V4 = "DeepSeek-V4"
V41 = "DeepSeek-V4.1"

#: What vLLM 0.33's CUDA DeepSeek-V4 / V4.1 path needs that not every GPU has. SM 12.x runs all of it (FlashInfer's
#: SM120 attention, DeepGEMM built for arch 9/10/12), so only capabilities below a row's minimum are rejected.
COMPONENTS: tuple[Component, ...] = (
    Component(
        "sparse MLA attention (FlashMLA)",
        "vllm.v1.attention.ops.flashmla.flash_mla_sparse_fwd",
        (9, 0), (V4, V41),
        "DeepseekV4FlashMLAAttention (flash_mla_sparse_fwd, flash_mla_with_kvcache): built for SM90/SM100; "
        "_select_dsv4_attn_cls picks it on every GPU but SM 12.x (FlashInfer there). For DeepSeek-V4 the plugin "
        "routes the layer of both models to its own kernels below SM 9.0 (routes_attention)."),
    Component(
        "indexer logits (DeepGEMM fp8_fp4_mqa_logits / fp8_fp4_paged_mqa_logits)",
        "vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits",
        (9, 0), (V4, V41),
        "Called by vllm.model_executor.layers.sparse_attn_indexer.sparse_attn_indexer (SparseAttnIndexer); "
        "DeepGEMM runs on arch 9/10/12 only. The plugin's Triton indexer (integrations.vllm.indexer) takes V4's "
        "compressed FP8 indexer cache (compress_ratio 4, the C4A layers' DeepseekV4Indexer; run in a live V4 engine "
        "on an H200 with TRITON_MLA_SPARSE_INDEXER=always) and V4.1's (ratios 1 and 2, with its two-level "
        "candidate blocks: integrations.vllm.candidates); it rejects the MXFP4 indexer cache at construction."),
    Component(
        "o_proj fp8 einsum (DeepGEMM fp8_einsum)",
        "vllm.utils.deep_gemm.fp8_einsum",
        (9, 0), (V4, V41),
        "vllm.models.deepseek_v4.nvidia.ops.o_proj.deep_gemm_fp8_o_proj: the grouped wo_a projection of every "
        "attention layer (FlashMLA and FlashInfer classes); no fallback in vLLM for e4m3 weights (below SM 9.0 "
        "Marlin repacks wo_a; V4.1's dsv41_o_proj calls the same function off SM 10.x). The plugin's V4 and V4.1 "
        "layers dequantize an e4m3 wo_a (128 x 128 blocks, or MXFP8) to bf16 after loading, so vLLM's bf16 branch "
        "runs (v4_portable.route_wo_a)."),
    Component(
        "mHC first-layer prenorm GEMM (DeepGEMM tf32_hc_prenorm_gemm)",
        "vllm.utils.deep_gemm.tf32_hc_prenorm_gemm",
        (9, 0), (V4,),
        "vllm.model_executor.kernels.mhc.tilelang.mhc_pre_broadcast_tilelang (V4's first layer) passes "
        "use_tilelang_fallback=False; the other layers (and V4.1's mhc_pre_delayed_tilelang) fall back to "
        "TileLang where DeepGEMM is unsupported. The plugin computes that call's GEMM and sum of squares in "
        "float32 torch (v4_portable.install)."),
    Component(
        "KV compressor (CuTeDSL)",
        "vllm.models.deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl",
        (8, 9), (V4,),
        "DeepseekCompressor with head dim 512 on CUDA always takes it; it packs e4m3 with "
        "cvt.rn.satfinite.e4m3x2.f32, a PTX instruction of sm_89+. The plugin sends its calls to vLLM's Triton "
        "compressor (compress_norm_rope_store_triton, vLLM's path on AMD; its casts are the casts row) below SM 8.9 "
        "(v4_portable.install_cutedsl_routes). V4.1 compresses with Triton (the casts row)."),
    Component(
        "indexer q quantization (CuTeDSL)",
        "vllm.models.deepseek_v4.nvidia.ops.fused_indexer_q_cutedsl",
        (8, 9), (V4, V41),
        "fused_indexer_q_rope_quant (vllm.models.deepseek_v4.common.ops.fused_indexer_q) runs the CuTeDSL kernel "
        "whenever cutlass's DSL is installed (vLLM ships it), which packs e4m3 with cvt.rn.satfinite.e4m3x2.f32 "
        "(sm_89+ PTX); its Triton kernel (the casts row) runs without CuTeDSL only. V4.1's indexer calls the "
        "same function. The plugin answers that module's has_cutedsl() False below SM 8.9 "
        "(v4_portable.install_cutedsl_routes)."),
    Component(
        "fp8 casts in V4's Triton kernels (tl.float8e4nv)",
        "vllm.models.deepseek_v4.common.ops, vllm.models.deepseek_v41.common.ops, vllm.models.deepseek_v41.common"
        ".engram",
        (8, 9), (V4, V41),
        "Cache inserts, compressor quantization, indexer q, inverse-RoPE fp8 quant: Triton has no native e4m3 "
        "conversion before sm_89. The plugin's software cast (TRITON_MLA_SPARSE_SOFT_FP8) now routes V4's: "
        "cache_utils (SWA insert quantize_and_insert_k_kernel, dequantize-gather), fused_compress_quant_cache "
        "(head-512 sparse-attn compressor stores, head-128 indexer compressor), fused_indexer_q (its Triton "
        "kernel; the CuTeDSL one, taken when installed, is the row above) and "
        "fused_inv_rope_fp8_quant; compile-tested for sm80/sm86 (no e4m3 conversion left) and forced in a live "
        "V4 engine on an H200 (first-token logprobs within the engines' eager-vs-graphs drift of the hardware "
        "casts), not run on an SM 8.x GPU. V4.1's own (deepseek_v41.common.ops cache_utils, "
        "fused_compress_quant_cache, indexer_k_store; deepseek_v41.common.engram) are routed and compile-tested "
        "likewise, not run on a GPU; their SM 10.x-only NVFP4 store keeps an e2m1 instruction."),
)

#: The attention row: routed to this package's layer (not blocking) wherever :func:`routes_attention` holds.
ATTENTION = COMPONENTS[0]
#: The rows :func:`taken_components` may take over where the attention is routed.
INDEXER, EINSUM, PRENORM, COMPRESSOR, INDEXER_Q, CASTS = COMPONENTS[1:7]

#: vLLM 0.33's CUDA model modules whose ``_select_dsv4_attn_cls`` every decoder layer calls, and their model.
MODEL_MODULES: dict[str, str] = {
    "vllm.models.deepseek_v4.nvidia.model": V4,
    "vllm.models.deepseek_v41.nvidia.model": V41,
}
HOOK_NAME = "_select_dsv4_attn_cls"
#: Parameters of ``_select_dsv4_attn_cls`` in vLLM 0.33 (both modules).
EXPECTED_HOOK_PARAMS = ("vllm_config",)
_WRAPPED_MARK = "_triton_mla_sparse_dsv4_check"


def _cap(capability: Any) -> tuple[int, int]:
    """(major, minor) of vLLM's ``DeviceCapability`` or a pair."""
    major, minor = (capability.major, capability.minor) if hasattr(capability, "major") else capability
    return int(major), int(minor)


def taken_components(model: str) -> tuple[Component, ...]:
    """The components besides the attention that this package takes over for ``model`` where its attention layer
    runs, by the plugin's switches: DeepSeek-V4's indexer logits (``TRITON_MLA_SPARSE_INDEXER`` not ``off``: ``auto``
    picks the Triton indexer wherever DeepGEMM cannot run), its o_proj einsum, first-layer mHC prenorm, CuTeDSL
    compressor and indexer-q kernels (``TRITON_MLA_SPARSE_DSV4_PORTABLE`` not ``off``: :mod:`.v4_portable`), its
    Triton kernels' e4m3 casts (``TRITON_MLA_SPARSE_SOFT_FP8`` not ``off``). V4.1's path has no forced-DeepGEMM
    prenorm and no CuTeDSL compressor; the rest is the same."""
    if model not in (V4, V41):
        return ()
    taken = []
    if indexer_mode() != "off":
        taken.append(INDEXER)
    if dsv4_portable_mode() != "off":
        taken += [EINSUM, PRENORM, COMPRESSOR, INDEXER_Q] if model == V4 else [EINSUM, INDEXER_Q]
    if soft_fp8_mode() != "off":
        taken.append(CASTS)
    return tuple(taken)


def blocking_components(capability: Any, model: str = V4, components: Sequence[Component] = COMPONENTS,
                        routed: bool = False, taken: Collection[Component] = ()) -> list[Component]:
    """The components of ``model``'s path (:data:`COMPONENTS` by default) that do not run at ``capability``
    (a ``DeviceCapability`` or a ``(major, minor)`` pair); ``routed``: the attention runs on this package's layer
    (:data:`ATTENTION` does not block); ``taken``: other components this package runs instead (e.g.
    :func:`taken_components`), which do not block either."""
    cap = _cap(capability)
    return [c for c in components if model in c.models and cap < c.min_capability
            and not (routed and c is ATTENTION) and c not in taken]


def error_message(capability: Any, model: str, blocking: Sequence[Component], routed: bool = False) -> str:
    """The text of the build error for ``model`` at ``capability`` with these blocking components (``routed``:
    the attention itself is routed to this package's kernels)."""
    major, minor = _cap(capability)
    lines = [f"triton-mla-sparse: {model} cannot run on this GPU (compute capability {major}.{minor}) with vLLM "
             f"0.33: these components of its model need a newer GPU and would fail inside their kernels at run "
             f"time:"]
    for c in blocking:
        lines.append(f"  - {c.name} ({c.vllm_function}): needs compute capability "
                     f"{c.min_capability[0]}.{c.min_capability[1]} or newer")
    done = "runs the attention of" if routed else "does not route"
    lines.append(f"triton-mla-sparse {done} {model} {'on its own kernels' if routed else 'to portable kernels'} on "
                 f"this GPU{'' if routed else ' yet'}; the components above have no portable path yet. Use a GPU "
                 f"with compute capability 9.0, 10.x or 12.x, or set {DSV4_ENV}=off to let vLLM build the model "
                 f"anyway (it then fails at run time).")
    return "\n".join(lines)


def check_capability(capability: Any, model: str, routed: bool = False,
                     taken: Collection[Component] = ()) -> None:
    """Raise the build error (``ValueError``) when a component of ``model`` does not run at ``capability``
    (``routed``: the attention runs on this package's layer; ``taken``: components it runs instead of vLLM's);
    None (capability unknown) passes."""
    if capability is None:
        return
    blocking = blocking_components(capability, model, routed=routed, taken=taken)
    if blocking:
        raise ValueError(error_message(capability, model, blocking, routed))


#: The module of each model's FlashInfer layers (its SM 12.x head padding and window questions).
_FLASHINFER_MODULES = {V4: "vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
                       V41: "vllm.models.deepseek_v41.nvidia.flashinfer_sparse"}


def flashinfer_sm120_ready(vllm_config: Any, model: str = V4) -> bool:
    """Whether vLLM's SM 12.x layer of ``model`` can be built: FlashInfer's SM120 sparse MLA decode API and its
    specialisation for the layer's padded heads and window (what ``DeepseekV4FlashInferSM120Attention`` checks in
    its constructor, asked here with vLLM's own functions). False when any of that is missing or cannot be
    asked."""
    try:
        import importlib

        from vllm.utils.flashinfer import has_flashinfer_sparse_mla_sm120, has_flashinfer_sparse_mla_sm120_config

        fi = importlib.import_module(_FLASHINFER_MODULES[model])
        if not has_flashinfer_sparse_mla_sm120():
            return False
        hf = vllm_config.model_config.hf_config
        heads = hf.num_attention_heads // vllm_config.parallel_config.tensor_parallel_size
        return bool(has_flashinfer_sparse_mla_sm120_config(
            fi._pad_to_supported_q_heads(heads), fi._required_sm120_sparse_topk(vllm_config, hf.sliding_window)))
    except Exception as e:  # noqa: BLE001 (vLLM refuses to build the layer then: ours is the only path)
        warn_once("sm120-ready", "triton-mla-sparse: could not ask FlashInfer for its SM120 DeepSeek-V4 kernels "
                  "(%s: %s); taken as missing.", type(e).__name__, e)
        return False


def _named_backend(vllm_config: Any) -> Any:
    """The attention backend named with ``--attention-backend`` (None: vLLM chooses)."""
    return getattr(getattr(vllm_config, "attention_config", None), "backend", None)


def routes_attention(capability: Any, model: str, mode: str, vllm_config: Any = None) -> bool:
    """Whether ``model``'s attention layers (DeepSeek-V4 or V4.1) get this package's layer at ``capability`` in
    ``mode`` (``auto`` / ``triton``), from SM 8.0 on: ``triton`` everywhere there; ``auto`` where vLLM has no layer
    that runs — below SM 9.0, and on SM 12.x when :func:`flashinfer_sm120_ready` does not hold — unless a backend
    was named (vLLM's choice then). ``triton`` with a named backend raises ``ValueError`` (two requests), and so
    does ``triton`` for V4.1 on SM 10.x (its 528-byte MXFP8 record there), which ``auto`` leaves to vLLM."""
    if model not in (V4, V41) or capability is None:
        return False
    cap = _cap(capability)
    if cap < (8, 0) or mode not in ("auto", "triton"):
        return False
    named = _named_backend(vllm_config)
    if model == V41 and cap[0] == 10:  # V4.1 writes its 528-byte MXFP8 record there, which our kernels do not read
        if mode == "triton":
            raise ValueError(f"{DSV4_ENV}=triton: DeepSeek-V4.1 on SM 10.x keeps its caches in the 528-byte MXFP8 "
                             f"record, which triton-mla-sparse's kernels do not read (they read V4's 584-byte "
                             f"record, what V4.1 writes on every other GPU); unset {DSV4_ENV} there")
        return False
    if mode == "triton":
        if named is not None:
            raise ValueError(f"{DSV4_ENV}=triton asks for triton-mla-sparse's DeepSeek-V4 attention, but "
                             f"--attention-backend names {getattr(named, 'name', named)}: unset one of them")
        return True
    if named is not None:
        return False
    return cap < (9, 0) or (cap[0] == 12 and not flashinfer_sm120_ready(vllm_config, model))


def _make_wrapper(original: Callable[..., Any], module: ModuleType, model: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def _select_dsv4_attn_cls(vllm_config: Any) -> Any:
        platform = getattr(module, "current_platform", None)
        if platform is None:
            from vllm.platforms import current_platform as platform
        if platform.is_cuda():
            capability = platform.get_device_capability()
            routed = routes_attention(capability, model, dsv4_mode(), vllm_config)
            taken = taken_components(model) if routed else ()
            if PRENORM in taken:  # the first layer's mHC prenorm (the layer itself routes its o_proj)
                from .v4_portable import install as install_portable

                if not install_portable():  # vLLM's hook is missing: the prenorm stays DeepGEMM's
                    taken = tuple(c for c in taken if c is not PRENORM)
            if INDEXER_Q in taken:
                from .v4_portable import cutedsl_route_wanted, install_cutedsl_routes

                # installed where they route (below SM 8.9, or always); vLLM's modules missing: both stay CuTeDSL,
                # but without cutlass at all vLLM's indexer q takes its own Triton kernel (the casts row)
                if cutedsl_route_wanted() and not install_cutedsl_routes():
                    from vllm.utils.import_utils import has_cutedsl

                    lost = (COMPRESSOR, INDEXER_Q) if has_cutedsl() else (COMPRESSOR,)
                    taken = tuple(c for c in taken if c not in lost)
            check_capability(capability, model, routed, taken)
            if routed:
                from .v4_attention import triton_attention_cls, triton_attention_cls_v41

                return triton_attention_cls() if model == V4 else triton_attention_cls_v41()
        return original(vllm_config)

    setattr(_select_dsv4_attn_cls, _WRAPPED_MARK, True)
    return _select_dsv4_attn_cls


def wrap_module(module: ModuleType, model: str | None = None) -> bool:
    """Wrap ``module._select_dsv4_attn_cls`` (idempotent). ``model`` defaults to :data:`MODEL_MODULES`' entry for
    the module. Returns whether the wrapper is in place after the call; a missing function or another signature
    than vLLM 0.33's logs one warning and leaves the module alone."""
    model = model or MODEL_MODULES.get(module.__name__, V4)
    current = getattr(module, HOOK_NAME, None)
    if current is not None and getattr(current, _WRAPPED_MARK, False):
        return True
    if current is None or not callable(current):
        warn_once(f"missing:{module.__name__}",
                   "triton-mla-sparse: %s.%s is missing (not vLLM 0.33); %s is built without the plugin's GPU "
                   "check and may fail at run time on GPUs below SM 9.0.", module.__name__, HOOK_NAME, model)
        return False
    try:
        params = tuple(inspect.signature(current).parameters)
    except (TypeError, ValueError):
        params = ()
    if params != EXPECTED_HOOK_PARAMS:
        warn_once(f"signature:{module.__name__}",
                   "triton-mla-sparse: %s.%s%s differs from the vLLM 0.33 signature %s; %s is built without the "
                   "plugin's GPU check and may fail at run time on GPUs below SM 9.0.",
                   module.__name__, HOOK_NAME, params, EXPECTED_HOOK_PARAMS, model)
        return False
    setattr(module, HOOK_NAME, _make_wrapper(current, module, model))
    return True


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps each module of ``targets`` right after it is first executed (its loader's ``exec_module``)."""

    def __init__(self) -> None:
        self.targets: dict[str, str] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        model = self.targets.get(fullname)
        if model is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        # One file loader object per spec: patching its exec_module touches this import only.
        if isinstance(loader, (importlib.machinery.SourceFileLoader, importlib.machinery.SourcelessFileLoader)):
            exec_module = loader.exec_module

            def _exec_module(module: ModuleType) -> None:
                exec_module(module)
                try:
                    wrap_module(module, model)
                except Exception:  # never break vLLM's import
                    logger.exception("triton-mla-sparse: could not add the GPU check to %s.%s", fullname,
                                     HOOK_NAME)

            loader.exec_module = _exec_module  # type: ignore[method-assign]
        else:
            warn_once(f"loader:{fullname}", "triton-mla-sparse: %s is loaded by %r, not from a file; %s is built "
                       "without the plugin's GPU check.", fullname, loader, model)
        return spec


_finder = _WrapOnImport()


def installed_modules() -> dict[str, str]:
    """The modules :func:`install` watches (name -> model); empty when not installed."""
    return dict(_finder.targets) if _finder in sys.meta_path else {}


def install(mode: str | None = None, modules: dict[str, str] | None = None) -> bool:
    """Add the build check to ``modules`` (default :data:`MODEL_MODULES`: name -> model) for ``mode`` (default:
    ``TRITON_MLA_SPARSE_DSV4``; a bad value raises ``ValueError``). ``auto`` installs only on vLLM's CUDA platform.
    Modules already imported are wrapped now, the others when they are imported. Returns whether the check is in
    place (or waits for the import) for every module after the call."""
    mode = dsv4_mode() if mode is None else mode
    if mode not in DSV4_MODES:
        raise ValueError(f"mode: expected one of {DSV4_MODES}, got {mode!r}")
    if mode == "off":
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return False
    targets = dict(MODEL_MODULES if modules is None else modules)
    ok = True
    for name, model in targets.items():
        loaded = sys.modules.get(name)
        if loaded is not None:
            ok = wrap_module(loaded, model) and ok
        else:
            _finder.targets[name] = model
    if _finder.targets and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return ok


def uninstall(modules: dict[str, str] | None = None) -> None:
    """Put vLLM's functions back in ``modules`` (default: :data:`MODEL_MODULES`) and stop watching imports (for
    tests)."""
    for name in (MODEL_MODULES if modules is None else modules):
        _finder.targets.pop(name, None)
        mod = sys.modules.get(name)
        current = getattr(mod, HOOK_NAME, None) if mod is not None else None
        if current is not None and getattr(current, _WRAPPED_MARK, False):
            setattr(mod, HOOK_NAME, current.__wrapped__)
    if not _finder.targets and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)

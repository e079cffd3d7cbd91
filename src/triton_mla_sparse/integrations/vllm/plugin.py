"""vLLM plugin: registers the ``TRITON_MLA_SPARSE`` sparse-MLA attention backend with vLLM 0.33.

Installed with ``pip install triton-mla-sparse[vllm]``; vLLM finds :func:`register` through the entry point group
``vllm.general_plugins`` and calls it in every process it starts (API server, engine core, workers), before it
parses arguments. ``register`` is idempotent and never changes vLLM's files. It

1. registers the name ``TRITON_MLA_SPARSE`` in vLLM's attention-backend registry, pointing at
   :class:`triton_mla_sparse.integrations.vllm.backend.TritonMLASparseBackend`, so that
   ``--attention-backend TRITON_MLA_SPARSE`` works on any platform, and
2. on the CUDA platform, wraps ``vllm.platforms.cuda._get_backend_priorities`` (the function vLLM's automatic
   selection walks in order, keeping the first backend whose ``validate_configuration`` accepts the layer) so that
   the MLA list also holds ``TRITON_MLA_SPARSE``. Where (``TRITON_MLA_SPARSE_PRIORITY=default``,
   :func:`~triton_mla_sparse.integrations.vllm.policy.policy_index`):

   ========================= ============================================================================
   compute capability        place of TRITON_MLA_SPARSE in vLLM's MLA list
   ========================= ============================================================================
   8.x (A100, A10, L40S, …)  first: no other sparse MLA backend of vLLM 0.33 runs there
   12.x (RTX 50xx, RTX PRO)  right after FLASHINFER_MLA_SPARSE_SM120, which only takes bf16 models with
                             top-k 2048 and an fp8_ds_mla cache (vLLM turns auto/fp8 into fp8_ds_mla for
                             it), so every other configuration (e.g. --kv-cache-dtype bfloat16) gets ours
   9.0                       first for an fp8_ds_mla cache with <= 16 heads per GPU (policy.FASTEST_FIRST:
                             measured faster than FLASHMLA_SPARSE there), otherwise last
   10.0, 10.3                last: the fallback after vLLM's own sparse backends
   any other                 not added: not a declared architecture (triton_mla_sparse.capabilities)
   ========================= ============================================================================

   ``TRITON_MLA_SPARSE_PRIORITY=first`` puts it first on every declared capability; ``off`` leaves vLLM's lists
   alone (the backend then runs only when asked for by name). The variable is read when vLLM computes a priority
   list; the lists are cached (``_get_backend_priorities.cache_clear()`` empties the cache of the wrapper and of
   vLLM's function). Dense-MLA and non-MLA lists are never changed; our backend is sparse-only and rejects dense
   layers.

   If vLLM's function does not have the signature this plugin was written against, one warning is logged and only
   the automatic-selection part is skipped: the backend stays registered by name.

   On the ROCm platform the same holds for ``vllm.platforms.rocm._get_backend_priorities(use_mla, use_sparse,
   use_kv_connector)``, whose sparse-MLA list is ``[ROCM_AITER_MLA_SPARSE]`` alone: ``default`` puts
   ``TRITON_MLA_SPARSE`` right after it on gfx942/gfx950 (where aiter's kernels exist) and first on every other
   declared gfx target (RDNA: vLLM's backend passes validation there but has no aiter kernels to run). The gfx name
   is vLLM's ``vllm.platforms.rocm._GCN_ARCH``, read when the list is computed (vLLM does not cache this list).
   Each process wraps only its own platform's module (or one already imported): CUDA processes never import
   ``vllm.platforms.rocm``, ROCm processes never import ``vllm.platforms.cuda``. vLLM 0.33's DeepSeek-V3.2 /
   GLM-5 model for ROCm (``vllm.models.deepseek_v32.amd``) passes ``ROCMAiterMLASparseBackend`` to its attention
   layer itself, so the list decides only for layers that ask vLLM's selector.

3. on the CUDA platform, registers the DSA lightning indexer on Triton (``SparseAttnIndexer`` out of tree) for GPUs
   where DeepGEMM is not usable, and on the ROCm platform for declared gfx targets where vLLM's ``forward_hip``
   would not run on aiter's kernels (it raises there, or computes the logits with its PyTorch reference);
   ``TRITON_MLA_SPARSE_INDEXER=auto|always|off``, see :mod:`triton_mla_sparse.integrations.vllm.indexer`.

4. routes vLLM's DSA Triton kernels (``fused_norm_rope``, ``fused_q``) through a software e4m3 cast where Triton
   has no native one (below SM 8.9); ``TRITON_MLA_SPARSE_SOFT_FP8=auto|always|off``, see
   :mod:`triton_mla_sparse.integrations.vllm.fp8_compat`.

5. on the CUDA platform, gives DeepSeek-V4's and V4.1's attention layers this package's kernels where vLLM 0.33 has
   no layer that runs (SM 12.x without FlashInfer's V4 kernels; below SM 9.0) unless ``--attention-backend`` names one,
   and stops the build of a DeepSeek-V4 / V4.1 model with one ``ValueError`` naming the components of vLLM's V4 path
   that still do not run on the GPU (with the default switches none from SM 8.0 on; a switch set to ``off`` brings its
   components back) instead of letting it fail inside the kernels at run time;
   ``TRITON_MLA_SPARSE_DSV4=auto|triton|off``, see :mod:`triton_mla_sparse.integrations.vllm.v4`.

A value of any of these variables outside its modes raises ``ValueError`` from :func:`register` (see
:mod:`~triton_mla_sparse.integrations.vllm.policy`); any other failure is logged and leaves vLLM running. This
module imports vLLM inside functions only.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from types import ModuleType
from typing import Any, Callable

from .policy import (
    BACKEND_CLASS_PATH,
    BACKEND_NAME,
    ROCM_PEER,
    dsv4_mode,
    dsv4_portable_mode,
    indexer_mode,
    logger,
    place_backend,
    policy_index,
    priority_mode,
    soft_fp8_mode,
    warn_once,
)

__all__ = ["register", "backend_member", "install_priority_hook", "install_indexer", "install_soft_fp8",
           "install_dsv4_check", "install_rocm_dsa_route", "EXPECTED_ROCM_PRIORITY_PARAMS", "ROCM_DSA_MODULE",
           "ROCM_DSA_GLOBAL"]

#: Parameters of ``vllm.platforms.cuda._get_backend_priorities`` in vLLM 0.33.
EXPECTED_PRIORITY_PARAMS = (
    "use_mla",
    "device_capability",
    "num_heads",
    "kv_cache_dtype",
    "use_non_causal",
    "head_size",
    "use_mm_prefix",
)
#: Parameters of ``vllm.platforms.rocm._get_backend_priorities`` in vLLM 0.33.
EXPECTED_ROCM_PRIORITY_PARAMS = ("use_mla", "use_sparse", "use_kv_connector")
PLATFORMS = ("cuda", "rocm")
_WRAPPED_MARK = "_triton_mla_sparse_wrapped"


def _register_name() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if BACKEND_NAME in AttentionBackendEnum.__members__:
        # Already a member (a second call, or a vLLM that knows the name): (re)point it at our class.
        register_backend(AttentionBackendEnum[BACKEND_NAME], BACKEND_CLASS_PATH)
    else:
        # Always with class_path: the decorator form would collide with TORCH_SDPA's "" value.
        register_backend(BACKEND_NAME, BACKEND_CLASS_PATH)
    # vLLM's spawned engine core unpickles its config before it loads plugins; by value the new member would not
    # exist there ("... is not a valid AttentionBackendEnum"), so it pickles as a call that registers it first.
    AttentionBackendEnum[BACKEND_NAME].__reduce_ex__ = _reduce_member


def backend_member() -> Any:
    """``AttentionBackendEnum.TRITON_MLA_SPARSE``, registered first if this process has not loaded the plugin."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if BACKEND_NAME not in AttentionBackendEnum.__members__:
        _register_name()
    return AttentionBackendEnum[BACKEND_NAME]


def _reduce_member(protocol: int) -> tuple[Callable[[], Any], tuple[()]]:
    return backend_member, ()


def _platform_module(name: str) -> ModuleType | None:
    """``vllm.platforms.<name>`` (``cuda`` or ``rocm``) when this process runs that vLLM platform (or has imported the
    module), else None.

    The module is not imported on other platforms: importing ``cuda`` on ROCm, XPU, TPU or CPU builds would load
    CUDA-only extensions; importing ``rocm`` queries the GPU's gfx name (amdsmi, else HIP)."""
    mod = sys.modules.get(f"vllm.platforms.{name}")
    if mod is not None:
        return mod
    from vllm.platforms import current_platform

    if not getattr(current_platform, f"is_{name}")():
        return None
    return importlib.import_module(f"vllm.platforms.{name}")


def _dcp_size() -> int:
    """Decode context parallelism of the vLLM config being built: its MLA layers gather q over the DCP group, so
    the kernels see ``num_heads`` (the per-rank count vLLM passes to the priority function) × this many heads."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return max(1, int(getattr(getattr(config, "parallel_config", None), "decode_context_parallel_size", 1) or 1))


def _make_wrapper(original: Callable) -> Callable:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    @functools.cache
    def _priorities(use_mla, device_capability, num_heads, kv_cache_dtype, use_non_causal, head_size, use_mm_prefix,
                    dcp):
        backends = original(
            use_mla,
            device_capability,
            num_heads=num_heads,
            kv_cache_dtype=kv_cache_dtype,
            use_non_causal=use_non_causal,
            head_size=head_size,
            use_mm_prefix=use_mm_prefix,
        )
        if not use_mla:
            return backends
        ours = AttentionBackendEnum[BACKEND_NAME]
        heads = num_heads * dcp if num_heads is not None else None
        return place_backend(backends, (device_capability.major, device_capability.minor), priority_mode(), ours,
                             num_heads=heads, kv_cache_dtype=kv_cache_dtype)

    def _get_backend_priorities(
        use_mla,
        device_capability,
        num_heads=None,
        kv_cache_dtype=None,
        use_non_causal=False,
        head_size=None,
        use_mm_prefix=False,
    ):
        return _priorities(use_mla, device_capability, num_heads, kv_cache_dtype, use_non_causal, head_size,
                           use_mm_prefix, _dcp_size())

    def cache_clear() -> None:
        _priorities.cache_clear()
        original.cache_clear()

    functools.update_wrapper(_get_backend_priorities, original)
    _get_backend_priorities.cache_clear = cache_clear
    _get_backend_priorities.cache_info = _priorities.cache_info  # the functools.cache interface vLLM's function has
    _get_backend_priorities.__wrapped__ = original
    setattr(_get_backend_priorities, _WRAPPED_MARK, True)
    return _get_backend_priorities


def _make_rocm_wrapper(original: Callable, module: ModuleType) -> Callable:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    def _get_backend_priorities(use_mla, use_sparse, use_kv_connector=False):
        backends = original(use_mla, use_sparse, use_kv_connector)
        if not (use_mla and use_sparse):
            return backends
        ours = AttentionBackendEnum[BACKEND_NAME]
        # The module's gfx name at call time (what vLLM's own flags derive from; select's simulation sets it).
        return place_backend(backends, None, priority_mode(), ours, hip_arch=module._GCN_ARCH)

    functools.update_wrapper(_get_backend_priorities, original)
    setattr(_get_backend_priorities, _WRAPPED_MARK, True)
    return _get_backend_priorities


def _module_platform(module: ModuleType, platform: str | None) -> str:
    if platform is None:
        return "rocm" if module.__name__.endswith("rocm") else "cuda"
    if platform not in PLATFORMS:
        raise ValueError(f"platform: expected one of {PLATFORMS}, got {platform!r}")
    return platform


def install_priority_hook(module: ModuleType | None = None, platform: str | None = None) -> bool:
    """Wrap ``module._get_backend_priorities`` (default: ``vllm.platforms.cuda`` and/or ``vllm.platforms.rocm``,
    those of this process's platform or already imported).

    ``platform`` (``"cuda"`` or ``"rocm"``) says which of vLLM's two functions ``module`` holds; None: ``"rocm"``
    for a module whose name ends in ``rocm``, else ``"cuda"``. Returns True when a wrapper is in place after the
    call (installed now or before), False when none is (mode ``off``, neither platform, or an unexpected
    signature: then one warning is logged). A bad ``TRITON_MLA_SPARSE_PRIORITY`` raises ``ValueError`` here and in
    the wrapper."""
    if module is None:
        hooked = False
        for name in PLATFORMS:
            found = _platform_module(name)
            if found is not None:
                hooked = install_priority_hook(found, name) or hooked
        return hooked
    platform = _module_platform(module, platform)
    current = getattr(module, "_get_backend_priorities", None)
    if current is not None and getattr(current, _WRAPPED_MARK, False):
        return True
    if priority_mode() == "off":
        return False
    needs_cache = platform == "cuda"  # vLLM caches the CUDA lists, not the ROCm ones
    cached = callable(getattr(current, "cache_clear", None))
    if current is None or not callable(current) or (needs_cache and not cached):
        warn_once(
            f"missing:{platform}",
            "triton-mla-sparse: %s._get_backend_priorities is missing or not %s as in vLLM 0.33; %s stays "
            "registered (--attention-backend %s) but is not auto-selected.",
            module.__name__, "cached" if needs_cache else "a function", BACKEND_NAME, BACKEND_NAME,
        )
        return False
    expected = EXPECTED_PRIORITY_PARAMS if platform == "cuda" else EXPECTED_ROCM_PRIORITY_PARAMS
    try:
        params = tuple(inspect.signature(current).parameters)
    except (TypeError, ValueError):
        params = ()
    if params != expected or (platform == "rocm" and not hasattr(module, "_GCN_ARCH")):
        warn_once(
            f"signature:{platform}",
            "triton-mla-sparse: %s._get_backend_priorities%s differs from the vLLM 0.33 signature %s; %s stays "
            "registered (--attention-backend %s) but is not auto-selected.",
            module.__name__, params, expected, BACKEND_NAME, BACKEND_NAME,
        )
        return False
    module._get_backend_priorities = _make_wrapper(current) if platform == "cuda" else _make_rocm_wrapper(current,
                                                                                                          module)
    return True


#: vLLM 0.33's ROCm DeepSeek-V3.2 / GLM-5 attention layer passes this module global as its backend itself
#: (``DeepseekV32MLAAttention.__init__``: ``attn_backend=ROCMAiterMLASparseBackend``), bypassing the selector.
ROCM_DSA_MODULE = "vllm.models.deepseek_v32.amd.rocm"
ROCM_DSA_GLOBAL = "ROCMAiterMLASparseBackend"


def install_rocm_dsa_route(module: ModuleType | None = None, hip_arch: str | None = None) -> bool:
    """On ROCm, point the DSA model's own backend choice (:data:`ROCM_DSA_GLOBAL` of :data:`ROCM_DSA_MODULE`) at
    ``TRITON_MLA_SPARSE`` where :func:`~.policy.policy_index` puts ours before vLLM's aiter backend: RDNA by
    default (aiter has no kernels there), every declared gfx target with ``TRITON_MLA_SPARSE_PRIORITY=first``.

    ``module``/``hip_arch`` default to vLLM's model module and ``vllm.platforms.rocm._GCN_ARCH`` (only in a ROCm
    process). Returns whether the model's layers get ours; idempotent."""
    if module is None:
        rocm = _platform_module("rocm")
        from vllm.platforms import current_platform

        if rocm is None or not current_platform.is_rocm():
            return False
        hip_arch = rocm._GCN_ARCH
        module = importlib.import_module(ROCM_DSA_MODULE)
    from .backend import TritonMLASparseBackend

    current = getattr(module, ROCM_DSA_GLOBAL, None)
    if current is TritonMLASparseBackend:
        return True
    if current is None or getattr(current, "get_name", lambda: None)() != ROCM_PEER:
        warn_once("rocm-dsa", "triton-mla-sparse: %s.%s is not vLLM 0.33's %s; the ROCm DSA model keeps its own "
                   "backend.", module.__name__, ROCM_DSA_GLOBAL, ROCM_PEER)
        return False
    if policy_index([ROCM_PEER], None, priority_mode(), hip_arch=hip_arch) != 0:
        return False
    setattr(module, ROCM_DSA_GLOBAL, TritonMLASparseBackend)
    return True


def install_indexer() -> bool:
    """Register the Triton DSA indexer with vLLM (see :mod:`.indexer`) unless ``TRITON_MLA_SPARSE_INDEXER=off``
    or (``auto``) the platform is neither CUDA nor ROCm. Returns whether it is registered after the call; a bad
    ``TRITON_MLA_SPARSE_INDEXER`` raises ``ValueError``."""
    mode = indexer_mode()
    if mode == "off":
        return False
    if mode == "auto":
        from vllm.platforms import current_platform

        if not (current_platform.is_cuda() or current_platform.is_rocm()):
            return False
    from .indexer import install

    return install()


def install_soft_fp8() -> bool:
    """Route vLLM's DSA Triton kernels through the software e4m3 cast (see :mod:`.fp8_compat`) unless
    ``TRITON_MLA_SPARSE_SOFT_FP8=off`` or (``auto``) the platform is not CUDA. Returns whether the routing is in
    place after the call; a bad ``TRITON_MLA_SPARSE_SOFT_FP8`` raises ``ValueError``."""
    mode = soft_fp8_mode()
    if mode == "off":
        return False
    if mode == "auto":
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():  # before importing triton: builds without it must start quietly
            return False
    from .fp8_compat import install

    return install(mode)


def install_dsv4_check() -> bool:
    """Route DeepSeek-V4's attention and stop V4 / V4.1 builds on GPUs where vLLM's V4 path does not run (see
    :mod:`.v4`) unless ``TRITON_MLA_SPARSE_DSV4=off`` or the platform is not CUDA. Returns whether the check is in
    place after the call; a bad ``TRITON_MLA_SPARSE_DSV4`` raises ``ValueError``."""
    if dsv4_mode() == "off":
        return False
    from .v4 import install

    return install()


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent; safe in every vLLM process and on every platform.

    Raises ``ValueError`` when ``TRITON_MLA_SPARSE_PRIORITY``, ``TRITON_MLA_SPARSE_INDEXER``,
    ``TRITON_MLA_SPARSE_SOFT_FP8``, ``TRITON_MLA_SPARSE_DSV4`` or ``TRITON_MLA_SPARSE_DSV4_PORTABLE`` holds a value
    outside its modes; logs any other failure and returns."""
    priority_mode()  # a bad value stops here, before anything is registered
    indexer_mode()
    soft_fp8_mode()
    dsv4_mode()
    dsv4_portable_mode()
    try:
        _register_name()
    except Exception:  # never take vLLM's start-up down with us
        logger.exception("triton-mla-sparse: could not register the %s attention backend", BACKEND_NAME)
        return
    try:
        install_priority_hook()
    except Exception:
        logger.exception("triton-mla-sparse: could not add %s to vLLM's backend priorities; it stays "
                         "available through --attention-backend %s", BACKEND_NAME, BACKEND_NAME)
    try:
        install_rocm_dsa_route()
    except Exception:
        logger.exception("triton-mla-sparse: could not route vLLM's ROCm DSA model to %s; it keeps aiter's backend",
                         BACKEND_NAME)
    try:
        install_indexer()
    except Exception:
        logger.exception("triton-mla-sparse: could not register the Triton DSA indexer; vLLM's own indexer stays")
    try:
        install_soft_fp8()
    except Exception:
        logger.exception("triton-mla-sparse: could not route vLLM's DSA fp8 casts through software; they stay native")
    try:
        install_dsv4_check()
    except Exception:
        logger.exception("triton-mla-sparse: could not add the DeepSeek-V4 GPU check; V4 models build as in vLLM")

"""What the ``TRITON_MLA_SPARSE`` vLLM backend declares and where it goes in vLLM's priorities; no vLLM needed.

Everything the backend accepts is derived from :mod:`triton_mla_sparse.capabilities`, the source the kernels'
own up-front check (``sparse_mla_attention``) reads: compute capabilities, q dtypes, head sizes (``D_v`` + each
``D_rope``), the model limits (``kv_lora_rank``, ``qk_rope_head_dim``, ``index_topk``, heads per GPU).

The five environment variables are read through :func:`env_mode` only. Unset or empty means the default mode;
the value is compared without case or surrounding spaces; any other value raises ``ValueError`` naming the variable
and its modes (so :func:`~triton_mla_sparse.integrations.vllm.register` stops vLLM's start-up with that message):

* ``TRITON_MLA_SPARSE_PRIORITY`` = ``default`` | ``first`` | ``off`` (``auto`` is read as ``default``): where
  :func:`policy_index` puts the backend in vLLM's CUDA MLA list and in its ROCm sparse-MLA list;
* ``TRITON_MLA_SPARSE_INDEXER`` = ``auto`` | ``always`` | ``off``: whether the Triton DSA indexer replaces vLLM's
  (see :mod:`triton_mla_sparse.integrations.vllm.indexer`);
* ``TRITON_MLA_SPARSE_SOFT_FP8`` = ``auto`` | ``always`` | ``off``: whether vLLM's DSA Triton kernels cast to e4m3
  in software (``auto``: builds for CUDA targets below sm89; ``always``: every CUDA target; see
  :mod:`triton_mla_sparse.integrations.vllm.fp8_compat`);
* ``TRITON_MLA_SPARSE_DSV4`` = ``auto`` | ``triton`` | ``off``: DeepSeek-V4's attention on this package's kernels
  where vLLM 0.33 has none that runs (``auto``: SM 12.x without FlashInfer's V4 kernels; below SM 9.0 too) or on
  every CUDA GPU from SM 8.0 (``triton``), and a build that stops with one ``ValueError``
  naming the components that still cannot run; ``off``: left to vLLM (it then fails inside the kernels at run
  time); see :mod:`triton_mla_sparse.integrations.vllm.v4`;
* ``TRITON_MLA_SPARSE_DSV4_PORTABLE`` = ``auto`` | ``always`` | ``off``: where this package's DeepSeek-V4 layer
  runs, its o_proj einsum and the first-layer mHC prenorm on portable code where DeepGEMM is not supported, and its
  CuTeDSL compressor and indexer-q calls on vLLM's Triton kernels below SM 8.9 (``auto``), everywhere (``always``)
  or nowhere; see :mod:`triton_mla_sparse.integrations.vllm.v4_portable`.
"""

from __future__ import annotations

import logging
import os

from ...capabilities import D_ROPES, Q_DTYPES, capability_reasons, problem_reasons, supports_capability
from ...formats import D_V, KV_FORMATS

__all__ = [
    "BACKEND_NAME",
    "BACKEND_CLASS_PATH",
    "PRIORITY_ENV",
    "PRIORITY_MODES",
    "INDEXER_ENV",
    "INDEXER_MODES",
    "SOFT_FP8_ENV",
    "SOFT_FP8_MODES",
    "DSV4_ENV",
    "DSV4_MODES",
    "DSV4_PORTABLE_ENV",
    "DSV4_PORTABLE_MODES",
    "SM120_PEER",
    "FASTEST_FIRST",
    "ROCM_PEER",
    "ROCM_PEER_TARGETS",
    "SUPPORTED_DTYPES",
    "SUPPORTED_KV_CACHE_DTYPES",
    "SUPPORTED_HEAD_SIZES",
    "KV_CACHE_FORMATS",
    "KV_LORA_RANK",
    "ROPE_DIMS",
    "env_mode",
    "priority_mode",
    "indexer_mode",
    "soft_fp8_mode",
    "dsv4_mode",
    "dsv4_portable_mode",
    "warn_once",
    "batch_invariant",
    "model_reasons",
    "static_reasons",
    "platform_reasons",
    "FNUZ_FP8_TARGETS",
    "policy_index",
    "place_backend",
    "policy_sentence",
    "check_capability",
]

BACKEND_NAME = "TRITON_MLA_SPARSE"
BACKEND_CLASS_PATH = "triton_mla_sparse.integrations.vllm.backend.TritonMLASparseBackend"
PRIORITY_ENV = "TRITON_MLA_SPARSE_PRIORITY"
PRIORITY_MODES = ("default", "first", "off")
INDEXER_ENV = "TRITON_MLA_SPARSE_INDEXER"
INDEXER_MODES = ("auto", "always", "off")
SOFT_FP8_ENV = "TRITON_MLA_SPARSE_SOFT_FP8"
SOFT_FP8_MODES = ("auto", "always", "off")
DSV4_ENV = "TRITON_MLA_SPARSE_DSV4"
DSV4_MODES = ("auto", "triton", "off")
DSV4_PORTABLE_ENV = "TRITON_MLA_SPARSE_DSV4_PORTABLE"
DSV4_PORTABLE_MODES = ("auto", "always", "off")
_ENV_MODES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    PRIORITY_ENV: (PRIORITY_MODES, {"auto": "default"}),
    INDEXER_ENV: (INDEXER_MODES, {}),
    SOFT_FP8_ENV: (SOFT_FP8_MODES, {}),
    DSV4_ENV: (DSV4_MODES, {}),
    DSV4_PORTABLE_ENV: (DSV4_PORTABLE_MODES, {}),
}
#: The one vLLM sparse backend that precedes ours on SM 12.x.
SM120_PEER = "FLASHINFER_MLA_SPARSE_SM120"
#: Where ours goes first although vLLM has sparse backends of its own there, because the bench measured it the
#: fastest: (compute capability major, vLLM kv-cache dtype) -> the most heads per GPU. SM 9.x, fp8_ds_mla, <= 16
#: heads (benchmarks/results/h200-2026-12-02.json, graph replay: decode B=64 h8 / h16 0.059 / 0.059 ms against
#: FlashMLA's 0.078 / 0.078, B=256 h16 0.208 against 0.223, prefill h16 3.12 against 3.31 ms). Faster too there, not
#: yet run in a live engine: fp8_ds_mla decode at 32 heads (0.067 against 0.078) and bf16 decode at 8-32 heads
#: (0.047-0.054 against FLASH_ATTN_MLA_SPARSE's 0.052-0.058).
FASTEST_FIRST = {(9, "fp8_ds_mla"): 16}
#: vLLM 0.33's only sparse MLA backend on ROCm (``vllm.platforms.rocm._get_backend_priorities``).
ROCM_PEER = "ROCM_AITER_MLA_SPARSE"
#: The gfx targets ROCM_PEER's aiter kernels are built for (CDNA 3 and 4: vLLM's ``is_aiter_found_and_supported``
#: requires ``get_cdna_version() > 2``); it precedes ours there. Its ``validate_configuration`` checks no
#: architecture, so on other targets (RDNA) vLLM would pick it and fail at run time: ours goes first there.
ROCM_PEER_TARGETS = ("gfx942", "gfx950")

#: vLLM kv-cache dtype -> this package's kv_format (None: inferred from the cache tensor, bf16 or fp16).
KV_CACHE_FORMATS: dict[str, str | None] = {
    "auto": None,
    "bfloat16": None,
    "float16": None,
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_ds_mla": "fp8_ds_mla",
}
assert all(f is None or f in KV_FORMATS for f in KV_CACHE_FORMATS.values())
SUPPORTED_KV_CACHE_DTYPES = tuple(KV_CACHE_FORMATS)
SUPPORTED_DTYPES = tuple(str(d).removeprefix("torch.") for d in Q_DTYPES)
KV_LORA_RANK = D_V
ROPE_DIMS = D_ROPES
SUPPORTED_HEAD_SIZES = tuple(D_V + r for r in D_ROPES)  # 512 (NoPE), 576 (DeepSeek-V3.2, GLM-5)

logger = logging.getLogger("vllm.plugins.triton_mla_sparse")
_warned: set[str] = set()  # the keys warn_once has logged in this process


def warn_once(key: str, msg: str, *args: object) -> None:
    """Log ``msg % args`` as a warning the first time ``key`` comes (the plugin's wrappers, each vLLM process)."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)


def env_mode(name: str) -> str:
    """The mode set by environment variable ``name`` (:data:`PRIORITY_ENV`, :data:`INDEXER_ENV`,
    :data:`SOFT_FP8_ENV`, :data:`DSV4_ENV` or :data:`DSV4_PORTABLE_ENV`); see the module docstring. Raises
    ``ValueError`` for a value that is not one of the variable's modes."""
    modes, aliases = _ENV_MODES[name]
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return modes[0]
    mode = aliases.get(raw, raw)
    if mode not in modes:
        raise ValueError(f"{name}: expected one of {modes} (or unset), got {os.environ[name]!r}")
    return mode


def priority_mode() -> str:
    """The placement mode from ``TRITON_MLA_SPARSE_PRIORITY`` (:func:`env_mode`)."""
    return env_mode(PRIORITY_ENV)


def indexer_mode() -> str:
    """The indexer mode from ``TRITON_MLA_SPARSE_INDEXER`` (:func:`env_mode`)."""
    return env_mode(INDEXER_ENV)


def soft_fp8_mode() -> str:
    """The software-e4m3 mode from ``TRITON_MLA_SPARSE_SOFT_FP8`` (:func:`env_mode`)."""
    return env_mode(SOFT_FP8_ENV)


def dsv4_portable_mode() -> str:
    """``TRITON_MLA_SPARSE_DSV4_PORTABLE``: where DeepSeek-V4's o_proj einsum and first-layer mHC prenorm run on
    portable code (:mod:`.v4_portable`)."""
    return env_mode(DSV4_PORTABLE_ENV)


def dsv4_mode() -> str:
    """The DeepSeek-V4 build-check mode from ``TRITON_MLA_SPARSE_DSV4`` (:func:`env_mode`)."""
    return env_mode(DSV4_ENV)


def batch_invariant() -> bool:
    """Whether vLLM runs in its batch-invariant mode (``VLLM_BATCH_INVARIANT=1``, read through ``vllm.envs``: one
    parser for vLLM's variable). The backend and the indexer then compute every token's row independently of its
    batch (see :mod:`~triton_mla_sparse.integrations.vllm.backend`)."""
    from vllm import envs

    return bool(envs.VLLM_BATCH_INVARIANT)


def model_reasons(*, kv_lora_rank: int, qk_rope_head_dim: int, index_topk: int | None = 2048,
                  heads: int | None = None) -> list[str]:
    """Why the kernels cannot serve this model's sparse MLA layers (empty: they can): the problem checks of
    :func:`~triton_mla_sparse.capabilities.problem_reasons` for the model's dims, top-k (None: not a DSA model) and
    ``heads`` per GPU (not checked when None)."""
    if index_topk is None:
        return [f"{BACKEND_NAME} requires a DSA model (index_topk in the model config)"]
    reasons = problem_reasons(d_v=kv_lora_rank, d_rope=qk_rope_head_dim, topk=index_topk,
                              heads=1 if heads is None else heads)
    return [f"{BACKEND_NAME}: {r}" for r in reasons]


def check_capability(capability: object) -> tuple[int, int]:
    """``capability`` as a ``(major, minor)`` tuple: a pair of ints (a tuple, a list or vLLM's ``DeviceCapability``).

    Anything else raises ``ValueError("capability: expected a (major, minor) pair of ints, got ...")``, including a
    bare major such as ``9``: the form :func:`policy_index`, :func:`place_backend` and ``static_reasons(major=)``
    took before the vLLM integration became a package. That form is refused rather than read as "major.x", because
    the kernels are declared per (major, minor) (:data:`triton_mla_sparse.capabilities.ARCHS`): 10.0 and 10.3 run,
    10.1 does not, 11.x is no longer a fallback, so a major alone no longer has one answer."""
    if (isinstance(capability, (tuple, list)) and len(capability) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in capability)):
        return int(capability[0]), int(capability[1])
    raise ValueError(f"capability: expected a (major, minor) pair of ints, got {capability!r}")


#: ROCm targets whose fp8 KV cache vLLM writes as float8_e4m3fnuz (``current_platform.fp8_dtype()``); the kernels read
#: OCP e4m3 (float8_e4m3fn), which would decode each stored value as twice the written one.
FNUZ_FP8_TARGETS = ("gfx942",)


def platform_reasons(kv_cache_dtype: str, hip_arch: str | None) -> list[str]:
    """Why this KV cache format cannot be used on this GPU (beyond the capability declaration); empty when it can.

    On ROCm, fp8 caches: vLLM 0.33's DSA model there (the only sparse MLA model that reaches a backend on ROCm)
    quantizes q to fp8 for them whatever the backend declares, and these kernels take bf16/fp16 q; on gfx942 vLLM
    also writes float8_e4m3fnuz."""
    gfx = hip_arch.split(":")[0] if hip_arch else None
    fp8 = kv_cache_dtype in KV_CACHE_FORMATS and (KV_CACHE_FORMATS[kv_cache_dtype] or "").startswith("fp8")
    if not (fp8 and gfx):
        return []
    why = f"vLLM's ROCm DSA model quantizes q to fp8 for fp8 caches and {BACKEND_NAME} takes bf16/fp16 q"
    if gfx in FNUZ_FP8_TARGETS:
        why += "; vLLM writes float8_e4m3fnuz there and the kernels read float8_e4m3fn"
    return [f"kv_cache_dtype {kv_cache_dtype} on {gfx}: {why} (use a bfloat16 cache)"]


def static_reasons(*, capability: tuple[int, int], head_size: int, dtype: str, kv_cache_dtype: str,
                   kv_lora_rank: int = KV_LORA_RANK, qk_rope_head_dim: int = 64, index_topk: int | None = 2048,
                   heads: int | None = None, hip_arch: str | None = None) -> list[str]:
    """What vLLM's ``validate_configuration`` of the backend reports for a sparse MLA decoder layer, computed from
    the same declarations without vLLM (vLLM's wording for its own checks); empty when accepted. ``hip_arch``: the
    gfx name on ROCm (see :func:`~triton_mla_sparse.capabilities.arch_for_target`).

    ``capability``: a ``(major, minor)`` pair of ints, checked by :func:`check_capability` (``ValueError``
    otherwise). It replaces the old ``major=`` keyword, which is gone: a call with ``major=`` fails with Python's
    ``TypeError`` naming it (a major alone has no exact meaning now, see :func:`check_capability`)."""
    capability = check_capability(capability)
    reasons = []
    if head_size not in SUPPORTED_HEAD_SIZES:
        reasons.append("head_size not supported")
    if dtype not in SUPPORTED_DTYPES:
        reasons.append("dtype not supported")
    if kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
        reasons.append("kv_cache_dtype not supported")
    if not supports_capability(capability, hip_arch):
        reasons.append("compute capability not supported")
    reasons += platform_reasons(kv_cache_dtype, hip_arch)
    model = model_reasons(kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim, index_topk=index_topk,
                          heads=heads)
    if model:
        reasons.append("; ".join(model))
    return reasons


def _name(backend: object) -> str:
    return backend if isinstance(backend, str) else backend.name


def _fastest_here(capability: tuple[int, int], num_heads: int | None, kv_cache_dtype: str | None) -> bool:
    limit = FASTEST_FIRST.get((capability[0], kv_cache_dtype))
    return limit is not None and num_heads is not None and num_heads <= limit


def policy_index(names: list[str], capability: tuple[int, int] | None, mode: str = "default", *,
                 hip_arch: str | None = None, num_heads: int | None = None,
                 kv_cache_dtype: str | None = None) -> int | None:
    """Where ``TRITON_MLA_SPARSE`` goes in vLLM's priority list ``names``, or None when it is not added (mode
    ``off``, a GPU the kernels do not support, or already listed).

    CUDA (``hip_arch`` None): vLLM's MLA list on a GPU of compute capability ``capability``; ``default``: first on
    SM 8.x and 11.x, and where :data:`FASTEST_FIRST` has the capability's major and ``kv_cache_dtype`` with
    ``num_heads`` (the heads each GPU's kernels see) at most its limit (``num_heads`` None never qualifies); right
    after :data:`SM120_PEER` on SM 12.x, last elsewhere. ``capability`` is a ``(major,
    minor)`` pair of ints (:func:`check_capability`); the old form, the major alone (``policy_index(names, 9)``), raises
    ``ValueError``: which capabilities run is declared per (major, minor).

    ROCm (``hip_arch``: the gfx name, e.g. ``"gfx942"`` or ``"gfx1201:xnack-"``; ``capability`` is then ignored, as
    in :func:`~triton_mla_sparse.capabilities.arch_for_target`): vLLM's sparse-MLA list; ``default``: right after
    :data:`ROCM_PEER` on :data:`ROCM_PEER_TARGETS`, first elsewhere (RDNA). ``first``: first everywhere."""
    if hip_arch is None:
        capability = check_capability(capability)
    if mode not in PRIORITY_MODES:
        raise ValueError(f"mode: expected one of {PRIORITY_MODES}, got {mode!r}")
    if hip_arch is not None:
        if mode == "off" or not supports_capability(None, hip_arch) or BACKEND_NAME in names:
            return None
        if mode == "default" and hip_arch.split(":")[0] in ROCM_PEER_TARGETS and ROCM_PEER in names:
            return names.index(ROCM_PEER) + 1
        return 0
    if mode == "off" or not supports_capability(capability) or BACKEND_NAME in names:
        return None
    major = capability[0]
    if mode == "first" or major in (8, 11):  # no vLLM 0.33 sparse MLA backend runs on SM 8.x or 11.x (Thor)
        return 0
    if _fastest_here(capability, num_heads, kv_cache_dtype):
        return 0
    if major == 12 and SM120_PEER in names:
        return names.index(SM120_PEER) + 1
    return len(names)


def place_backend(backends: list, capability: tuple[int, int] | None, mode: str, ours: object, *,
                  hip_arch: str | None = None, num_heads: int | None = None,
                  kv_cache_dtype: str | None = None) -> list:
    """A copy of ``backends`` (enum members or names) with ``ours`` inserted where :func:`policy_index` says.
    The keywords as for :func:`policy_index` (on CUDA a bare major raises ``ValueError``)."""
    backends = list(backends)
    idx = policy_index([_name(b) for b in backends], capability, mode, hip_arch=hip_arch, num_heads=num_heads,
                       kv_cache_dtype=kv_cache_dtype)
    if idx is not None:
        backends.insert(idx, ours)
    return backends


def policy_sentence(capability: tuple[int, int] | None, mode: str, *, hip_arch: str | None = None) -> str:
    """One sentence on where :func:`policy_index` puts the backend on this GPU in ``mode`` (``hip_arch``: a ROCm
    gfx name, which replaces ``capability``)."""
    name = BACKEND_NAME
    if hip_arch is None:
        major, minor = capability = check_capability(capability)
    if mode == "off":
        return f"{PRIORITY_ENV}=off: {name} only runs when selected with --attention-backend {name}"
    if hip_arch is not None:
        gfx = hip_arch.split(":")[0]
        reasons = capability_reasons(hip_arch=hip_arch)
        if reasons:
            return f"{name} does not run here: {reasons[0]}"
        if mode == "default" and gfx in ROCM_PEER_TARGETS:
            return f"{name} is placed right after {ROCM_PEER} in vLLM's sparse MLA list on {gfx}"
        return f"{name} is placed first in vLLM's sparse MLA list on {gfx}"
    reasons = capability_reasons(capability)
    if reasons:
        return f"{name} does not run here: {reasons[0]}"
    if mode == "first" or major in (8, 11):
        return f"{name} is placed first in vLLM's MLA list on SM {major}.{minor}"
    if major == 12:
        return f"{name} is placed right after {SM120_PEER} on SM {major}.{minor}"
    first = [f"{kv} caches with at most {heads} heads per GPU" for (m, kv), heads in FASTEST_FIRST.items()
             if m == major]
    if first:
        return (f"{name} is placed first in vLLM's MLA list on SM {major}.{minor} for {', '.join(first)} (measured "
                f"fastest there), last otherwise (fallback)")
    return f"{name} is placed last in vLLM's MLA list on SM {major}.{minor} (fallback)"

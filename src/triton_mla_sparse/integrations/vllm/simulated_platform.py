"""vLLM's current platform answering for a GPU this host does not have: vLLM's CUDA platform class with a compute
capability substituted, or its ROCm platform class for a gfx name (``vllm.platforms.rocm`` imported with an
``amdsmi`` stand-in, its ``_GCN_ARCH`` and ``_ON_*`` flags set for the target), installed as vLLM's current platform
for the duration of a ``with`` block and then restored. ``triton-mla-sparse select`` evaluates vLLM's backend
selection under it (:mod:`.select`); the vLLM tests build layers under it. This module imports vLLM inside
functions only."""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["cuda_platform_for", "rocm_platform_for", "current_platform_as", "quiet_vllm_logs"]


@contextlib.contextmanager
def quiet_vllm_logs() -> Iterator[None]:
    """vLLM's logger at ERROR for the duration (its selection loop logs every backend it rejects)."""
    lg = logging.getLogger("vllm")
    old = lg.level
    lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        lg.setLevel(old)


@contextlib.contextmanager
def cuda_platform_for(cuda_mod: types.ModuleType, major: int, minor: int, simulate: bool) -> Iterator[Any]:
    """vLLM's current platform for the evaluation: the real one, or vLLM's CUDA platform class answering for
    compute capability ``major.minor`` (installed as vLLM's current platform for the duration, then restored)."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability

    if not simulate:
        yield platforms.current_platform
        return

    class SimulatedCudaPlatform(cuda_mod.CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(major, minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"simulated NVIDIA GPU SM {major}.{minor}"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 << 30

        @classmethod
        def is_fully_connected(cls, device_ids) -> bool:
            return True

    sim = SimulatedCudaPlatform()
    # Importing a backend module may run GPU code at import time (CUTLASS_MLA allocates a workspace on SM100):
    # on this host that fails with a RuntimeError, which vLLM's loop (catching ImportError/OSError) would not
    # record as a rejection reason. Turn it into an ImportError naming the cause.
    get_class = cuda_mod._get_attn_backend_class

    def _get_attn_backend_class(backend):
        try:
            return get_class(backend)
        except (ImportError, OSError):
            raise
        except Exception as e:
            raise ImportError(f"not importable on this host ({type(e).__name__}: {str(e)[:80]})") from e

    cuda_mod._get_attn_backend_class = _get_attn_backend_class
    try:
        with current_platform_as(sim):
            yield sim
    finally:
        cuda_mod._get_attn_backend_class = get_class


@contextlib.contextmanager
def current_platform_as(sim: Any) -> Iterator[Any]:
    """vLLM's current platform replaced by ``sim`` for the duration, in vLLM and in every module that bound it."""
    import vllm.platforms as platforms

    old = platforms.current_platform
    for m in list(sys.modules.values()):  # modules that bound `current_platform` when they were imported
        if getattr(m, "current_platform", None) is old:
            m.current_platform = sim
    platforms._current_platform = sim
    try:
        yield sim
    finally:
        platforms._current_platform = old
        for m in list(sys.modules.values()):  # incl. modules first imported during the evaluation
            if getattr(m, "current_platform", None) is sim:
                m.current_platform = old


def amdsmi_stand_in(gfx: str) -> types.ModuleType:
    """An ``amdsmi`` that reports one GPU of ``gfx``: what ``vllm.platforms.rocm`` queries at import, on a host
    without ROCm (the simulated platform answers the other device probes itself)."""
    mod = types.ModuleType("amdsmi", f"triton-mla-sparse stand-in: one simulated {gfx}")

    class AmdSmiException(Exception):
        pass

    mod.AmdSmiException = AmdSmiException
    mod.AmdSmiMemoryType = types.SimpleNamespace(VRAM=0)
    mod.amdsmi_init = mod.amdsmi_shut_down = lambda *args, **kwargs: None
    mod.amdsmi_get_processor_handles = lambda: [0]
    mod.amdsmi_get_gpu_asic_info = lambda handle: {"target_graphics_version": gfx, "device_id": "",
                                                   "market_name": f"simulated AMD GPU {gfx}"}
    mod.amdsmi_get_gpu_memory_total = lambda handle, kind: 192 << 30
    mod.amdsmi_get_gpu_device_uuid = lambda handle: ""
    mod.amdsmi_topo_get_link_type = lambda a, b: {"hops": 1, "type": 2}
    mod.amdsmi_topo_get_numa_node_number = lambda handle: 0
    return mod


def rocm_platform_module(gfx: str) -> types.ModuleType:
    """``vllm.platforms.rocm``; imported here when needed, on a host that is not a ROCm GPU with vLLM's import-time
    query (``_get_gcn_arch``: amdsmi, then HIP) answered by :func:`amdsmi_stand_in`."""
    mod = sys.modules.get("vllm.platforms.rocm")
    if mod is not None:
        return mod
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        import vllm.platforms.rocm as mod

        return mod
    saved = sys.modules.get("amdsmi")
    sys.modules["amdsmi"] = amdsmi_stand_in(gfx)
    try:
        import vllm.platforms.rocm as mod
    finally:
        if saved is None:
            del sys.modules["amdsmi"]
        else:
            sys.modules["amdsmi"] = saved
    return mod


@functools.lru_cache(maxsize=None)
def _gcn_flag_code(rocm: types.ModuleType) -> tuple[Any, tuple[str, ...]]:
    """vLLM's own module-level ``_ON_* = ...`` definitions (flags derived from ``_GCN_ARCH``), compiled."""
    tree = ast.parse(inspect.getsource(rocm))
    body = [n for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name) and n.targets[0].id.startswith("_ON_")]
    code = compile(ast.Module(body=body, type_ignores=[]), rocm.__file__, "exec")
    return code, tuple(n.targets[0].id for n in body)


def gcn_flags(rocm: types.ModuleType, gfx: str) -> dict[str, Any]:
    """The values of vLLM's ``_ON_*`` flags for a GPU whose ``_GCN_ARCH`` is ``gfx``."""
    code, names = _gcn_flag_code(rocm)
    namespace: dict[str, Any] = {"_GCN_ARCH": gfx}
    exec(code, namespace)
    return {name: namespace[name] for name in names}


@contextlib.contextmanager
def rocm_platform_for(gfx: str, simulate: bool = True) -> Iterator[tuple[Any, types.ModuleType]]:
    """(vLLM's current platform, ``vllm.platforms.rocm``) for the evaluation of ``gfx``: the real ones, or vLLM's
    ROCm platform class answering for ``gfx`` with the module's ``_GCN_ARCH`` and ``_ON_*`` flags set for it
    (installed as vLLM's current platform for the duration, then all restored)."""
    from vllm.platforms.interface import DeviceCapability

    rocm = rocm_platform_module(gfx)
    if not simulate:
        import vllm.platforms as platforms

        yield platforms.current_platform, rocm
        return

    class SimulatedRocmPlatform(rocm.RocmPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(*rocm._capability_from_gcn_arch(rocm._GCN_ARCH))  # vLLM's derivation

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"simulated AMD GPU {gfx}"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 192 << 30

        @classmethod
        def is_fully_connected(cls, physical_device_ids) -> bool:
            return True

    values = {"_GCN_ARCH": gfx, **gcn_flags(rocm, gfx)}
    saved = {name: getattr(rocm, name) for name in values}
    for name, value in values.items():
        setattr(rocm, name, value)
    try:
        with current_platform_as(SimulatedRocmPlatform()) as sim:
            yield sim, rocm
    finally:
        for name, value in saved.items():
            setattr(rocm, name, value)

"""What the kernels support, declared as data, and the reasons a configuration is not supported.

One place answers "does this run here?": the architectures (CUDA compute capabilities and ROCm gfx targets) with the
resources the launch-configuration table budgets for, and the problem limits. :func:`unsupported_reasons` returns
the list of reasons a configuration is not supported (empty = supported); ``sparse_mla_attention`` raises them as
one ``ValueError`` before anything is launched. The device part is :func:`capability_reasons` (the lookup
:func:`arch_for_target`, which :func:`arch_for_device` uses too), the problem part :func:`problem_reasons`; the vLLM
backend (``supports_compute_capability``, ``supports_combination``), ``triton-mla-sparse select`` and
``triton-mla-sparse info`` call the same functions.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .formats import ALL_KV_FORMATS, D_ROPE, D_V, FP8_DS_MLA_V4


@dataclass(frozen=True)
class Arch:
    """One architecture family the kernels are built and checked for."""

    name: str  # "sm80" … "sm120", "gfx942", "gfx950", "gfx1100" … "gfx1201"
    backend: str  # "cuda" | "hip"
    target: int | str  # Triton GPUTarget arch: 80 … 120, or "gfx942"
    warp_size: int
    shared_bytes: int  # shared memory (LDS) one program may use
    fp8_hw: bool  # Triton lowers float8e4nv conversions natively; otherwise the integer decode is used
    capabilities: tuple[tuple[int, int], ...] = ()  # CUDA compute capabilities served by this family
    note: str = ""
    # Why the attention kernels spill registers here (empty: they do not; the compile matrix holds both ways)
    spills: str = ""


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("sm80", "cuda", 80, 32, 163 * 1024, False, ((8, 0),), "A100, A30"),
    Arch("sm86", "cuda", 86, 32, 99 * 1024, False, ((8, 6), (8, 7)), "A10, A40, RTX 3090, Jetson Orin"),
    Arch("sm89", "cuda", 89, 32, 99 * 1024, True, ((8, 9),), "L4, L40S, RTX 4090"),
    Arch("sm90", "cuda", 90, 32, 227 * 1024, True, ((9, 0),), "H100, H200"),
    Arch("sm100", "cuda", 100, 32, 227 * 1024, True, ((10, 0), (10, 3)), "B200, B300"),
    Arch("sm110", "cuda", 110, 32, 227 * 1024, True, ((11, 0),), "Jetson Thor"),
    Arch("sm120", "cuda", 120, 32, 99 * 1024, True, ((12, 0), (12, 1)), "RTX PRO 6000 Blackwell, RTX 5090"),
    Arch("gfx942", "hip", "gfx942", 64, 64 * 1024, False, (), "MI300X, MI325X"),
    Arch("gfx950", "hip", "gfx950", 64, 64 * 1024, True, (), "MI350X, MI355X (160 KB LDS; budgeted at 64 KB)"),
    # RDNA: wave32, 64 KB of LDS per workgroup. Triton lowers e4m3 conversions on gfx11/gfx12 by emulation, not
    # with native instructions (the compile matrix reads the assembly): the integer decode.
    *(Arch(name, "hip", name, 32, 64 * 1024, False, (), note) for name, note in (
        ("gfx1100", "RDNA3: RX 7900 XTX/XT, Radeon PRO W7900"),
        ("gfx1101", "RDNA3: RX 7800 XT/7700 XT, Radeon PRO W7800"),
        ("gfx1151", "RDNA3.5: Ryzen AI Max (Strix Halo)"),
        ("gfx1200", "RDNA4: RX 9060 XT"),
        ("gfx1201", "RDNA4: RX 9070 XT/9070, Radeon AI PRO R9700"))),
)}

Q_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEADS = 128  # the largest head count of the supported models (DeepSeek-V3.2 without tensor parallelism)
MAX_TOPK = 16384  # the longest top-k list tested and supported (8 x DSA's index_topk of 2048)
D_ROPES = (0, D_ROPE)


def arch_for_capability(capability: tuple[int, int]) -> Arch | None:
    """The family serving a CUDA compute capability (None when undeclared)."""
    for arch in ARCHS.values():
        if tuple(capability) in arch.capabilities:
            return arch
    return None


def arch_for_target(capability: tuple[int, int] | None = None, hip_arch: str | None = None) -> Arch | None:
    """The family of a GPU: by its ROCm gfx name when ``hip_arch`` is given (e.g. "gfx942:sramecc+:xnack-"; the
    compute capability HIP derives from it is coarser: gfx940, gfx941 and gfx942 are all 9.4), else by its CUDA
    compute capability; None when undeclared."""
    if hip_arch is not None:
        arch = ARCHS.get(hip_arch.split(":")[0])
        return arch if arch is not None and arch.backend == "hip" else None
    if capability is None:
        raise ValueError("arch_for_target: give a capability or a hip_arch")
    return arch_for_capability(capability)


def target_desc(capability: tuple[int, int] | None = None, hip_arch: str | None = None) -> str:
    """How reasons name a GPU: "compute capability 8.9" (CUDA) or "gfx942" (ROCm)."""
    if hip_arch is not None:
        return hip_arch.split(":")[0]
    major, minor = capability
    return f"compute capability {major}.{minor}"


def _undeclared(device_desc: str) -> str:
    declared = ", ".join(f"{a.name} ({', '.join(f'{x}.{y}' for x, y in a.capabilities) or a.target})"
                         for a in ARCHS.values())
    return f"{device_desc} is not a declared architecture (declared: {declared})"


def capability_reasons(capability: tuple[int, int] | None = None, hip_arch: str | None = None) -> list[str]:
    """Why the kernels do not run on this GPU (empty list: they do); arguments as for :func:`arch_for_target`."""
    if arch_for_target(capability, hip_arch) is not None:
        return []
    return [_undeclared(target_desc(capability, hip_arch))]


def supports_capability(capability: tuple[int, int] | None = None, hip_arch: str | None = None) -> bool:
    """Whether the kernels run on this GPU (:func:`capability_reasons` is empty)."""
    return not capability_reasons(capability, hip_arch)


@functools.lru_cache(maxsize=None)
def arch_for_device(device: torch.device) -> Arch | None:
    """The family of a CUDA/ROCm device (None for an undeclared GPU). Queried lazily, cached per device."""
    if device.type != "cuda":
        return None
    if getattr(torch.version, "hip", None):
        return arch_for_target(hip_arch=torch.cuda.get_device_properties(device).gcnArchName)
    return arch_for_target(tuple(torch.cuda.get_device_capability(device)))


@functools.lru_cache(maxsize=None)
def describe_device(device: torch.device) -> str:
    """"compute capability X.Y" (CUDA) or the gfx name (ROCm) of a device; cached per device."""
    if getattr(torch.version, "hip", None):
        return target_desc(hip_arch=torch.cuda.get_device_properties(device).gcnArchName)
    return target_desc(tuple(torch.cuda.get_device_capability(device)))


def unsupported_reasons(arch: Arch | None, *, q_dtype: torch.dtype = torch.bfloat16, kv_format: str = "bf16",
                        d_v: int = D_V, d_rope: int = D_ROPE, heads: int = 16, topk: int = 2048,
                        block_size: int = 64, device_desc: str = "this GPU") -> list[str]:
    """Why the kernels do not support this configuration on ``arch`` (empty list: supported)."""
    reasons = [] if arch is not None else [_undeclared(device_desc)]
    return reasons + problem_reasons(q_dtype=q_dtype, kv_format=kv_format, d_v=d_v, d_rope=d_rope, heads=heads,
                                     topk=topk, block_size=block_size)


def problem_reasons(*, q_dtype: torch.dtype = torch.bfloat16, kv_format: str = "bf16", d_v: int = D_V,
                    d_rope: int = D_ROPE, heads: int = 16, topk: int = 2048, block_size: int = 64) -> list[str]:
    """Why the kernels do not support this problem on any GPU (empty list: supported)."""
    reasons = []
    if q_dtype not in Q_DTYPES:
        reasons.append(f"q dtype {q_dtype} is not supported (float16 or bfloat16)")
    if kv_format not in ALL_KV_FORMATS:
        reasons.append(f"kv_format {kv_format!r} is not supported (one of {ALL_KV_FORMATS})")
    if d_v != D_V:
        reasons.append(f"D_v = {d_v} is not supported (only {D_V})")
    if d_rope not in D_ROPES:
        reasons.append(f"D_rope = {d_rope} is not supported (only {D_ROPE}, or 0 for NoPE)")
    elif kv_format == FP8_DS_MLA_V4 and d_rope:
        reasons.append(f"D_rope = {d_rope} with kv_format {FP8_DS_MLA_V4!r}: DeepSeek-V4's q is 512 wide, its RoPE part "
                       f"the last 64 of them (D_rope 0)")
    if not 1 <= heads <= MAX_HEADS:
        reasons.append(f"{heads} heads are not supported (1 to {MAX_HEADS} per call)")
    if not 1 <= topk <= MAX_TOPK:
        reasons.append(f"top-k {topk} is not supported (1 to {MAX_TOPK})")
    if block_size < 1:
        reasons.append(f"block size {block_size} is not supported (>= 1)")
    return reasons

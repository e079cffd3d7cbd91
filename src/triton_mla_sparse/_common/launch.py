"""A cheaper launch for the operators' Triton kernels: call the compiled kernel of a known specialisation directly.

``kernel[grid](*args)`` binds and specialises every argument in Python on each call before it looks the compiled
kernel up; for the attention kernel's ~45 arguments that cost about 40 µs per launch on the H200 machine's host
(``benchmarks/scripts/host_overhead.py``), more than the GPU time of a small decode step. :class:`CachedLauncher`
keeps the ``CompiledKernel`` that the first normal launch of each specialisation returns, under a key holding
everything Triton specialises on for these arguments — the constexprs and launch options, each tensor's dtype and
16-byte alignment, each int's value class (== 1, divisible by 16, 32/64-bit) — and launches later calls through
``CompiledKernel[grid](*args)``. A new key always goes through Triton's own path, so the first call of a
specialisation (and every call under the interpreter) behaves exactly as a plain launch.
``TRITON_MLA_SPARSE_FAST_LAUNCH=0`` turns the cache off.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

_ENABLED = os.environ.get("TRITON_MLA_SPARSE_FAST_LAUNCH", "1") not in ("0", "")


_HIP = bool(getattr(torch.version, "hip", None))


def _specialisation_key(args) -> tuple:
    """What Triton specialises on, per argument: a tensor's dtype, 16-byte alignment and (ROCm, where buffer
    operations use 32-bit offsets into storages under 2 GiB) its storage size class; an int's value class (1,
    divisible by 16, otherwise) and width (i32, i64, u64); anything else (floats, None, bools) by type and value.
    (Dispatch on the exact type first: most arguments are ints, and this runs on every launch.)"""
    key = []
    add = key.append
    tensor = torch.Tensor
    for v in args:
        t = type(v)
        if t is int:
            if v == 1:
                add(-1)
            elif -2147483648 <= v < 2147483648:
                add(0 if v & 15 else 1)
            else:
                add((0 if v & 15 else 1) + (2 if v < 9223372036854775808 else 4))
        elif t is float:
            add(0.5)
        elif isinstance(v, tensor):
            if _HIP:
                add((v.dtype, not v.data_ptr() & 15, v.untyped_storage().nbytes() < 2**31))
            else:
                add((v.dtype, not v.data_ptr() & 15))
        else:
            add((t, v))
    return tuple(key)


class CachedLauncher:
    """``launcher(grid, args, constexprs, num_warps=, num_stages=)`` for one ``@triton.jit`` kernel; ``args`` are the
    runtime arguments in the kernel's parameter order, ``constexprs`` the constexpr parameters (which come last in
    our kernels; each always given with the same Python type by a call site)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.names = list(kernel.arg_names)
        if hasattr(kernel, "params"):  # JITFunction
            flags = [p.is_constexpr for p in kernel.params]
        else:  # the interpreter's wrapper: read the annotations
            sig = inspect.signature(kernel.fn)
            flags = ["constexpr" in str(p.annotation) for p in sig.parameters.values()]
        first = flags.index(True) if True in flags else len(flags)
        if not all(flags[first:]):
            raise TypeError(f"{kernel.__name__}: CachedLauncher needs the constexpr parameters last")
        self.cache: dict = {}

    def __call__(self, grid: tuple[int, ...], args: tuple, constexprs: dict, *, num_warps: int, num_stages: int = 1,
                 **options: Any) -> Any:
        """``options``: further compile options of Triton's launch (e.g. ``maxnreg``), part of the key."""
        if not _ENABLED or args and isinstance(args[0], torch.Tensor) and args[0].device.type != "cuda":
            return self.kernel[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages, **options)
        key = (tuple(constexprs), tuple(constexprs.values()), num_warps, num_stages,
               tuple(options.items()) if options else (), torch.cuda.current_device(), _specialisation_key(args))
        compiled = self.cache.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages, **options)
            if compiled is not None and hasattr(compiled, "__getitem__"):
                self.cache[key] = compiled
            return compiled
        grid = tuple(grid) + (1,) * (3 - len(grid))
        compiled[grid](*args, *[constexprs[n] for n in self.names[len(args):]])
        return compiled

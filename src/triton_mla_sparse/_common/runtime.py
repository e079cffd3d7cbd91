"""Where the kernels run: the interpreter switch, the device checks and guards, the multiprocessor count.

Importing this module touches neither CUDA nor triton.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import ContextManager

import torch


def interpreting() -> bool:
    """Triton's interpreter is on (``TRITON_INTERPRET`` set and not 0): kernels run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device: torch.device) -> int:
    """The device's multiprocessors (a small "device" of 4 under the interpreter, so both attention kernels get
    exercised)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def check_kernel_device(dev: torch.device, arg: str = "q",
                        anywhere: str = "triton_mla_sparse.reference runs anywhere") -> None:
    """The Triton kernels run on CUDA/ROCm devices, or on CPU tensors through Triton's interpreter (which needs
    TRITON_INTERPRET=1 set before triton is imported, and numpy); a failure names the argument ``arg`` and what runs
    on any device (``anywhere``)."""
    if dev.type != "cuda" and not (dev.type == "cpu" and interpreting()):
        raise ValueError(f"{arg}: expected CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 set before triton "
                         f"is imported; {anywhere}), got a tensor on {dev}")
    if dev.type == "cpu":
        try:
            import numpy  # noqa: F401  (Triton's interpreter imports it)
        except ImportError:
            raise ValueError(f"{arg}: CPU tensors run through Triton's interpreter, which needs numpy "
                             "(pip install numpy, or triton-mla-sparse[cpu])") from None


def device_guard(dev: torch.device) -> ContextManager:
    """A context making ``dev`` the current device for Triton's launches (which go to the current device); a no-op
    (no device switch on the per-call path) when it already is current, and for CPU tensors."""
    if dev.type == "cuda" and dev.index is not None and dev.index != torch.cuda.current_device():
        return torch.cuda.device(dev)
    return contextlib.nullcontext()

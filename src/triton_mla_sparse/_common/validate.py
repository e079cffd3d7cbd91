"""Generic argument checks shared by the operators' validation.

Each failure is one ``ValueError`` ``"<arg>: expected <what>, got <what was given>"``, raised before anything is
launched or written.
"""

from __future__ import annotations

import torch

MAX_GRID = 2**31 - 1  # programs on axis 0 of a launch grid (CUDA's limit)


def desc(x: object) -> str:
    """A short description of an argument for an error message (a tensor's dtype, shape and device)."""
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}" if isinstance(x, (int, float, str)) else type(x).__name__


def dtype_names(dtypes: tuple[torch.dtype, ...]) -> str:
    """``"float16 or bfloat16"``, ``"float8_e4m3fn, float16 or bfloat16"``: dtypes as an error message lists them."""
    names = [str(d).replace("torch.", "") for d in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def fail(arg: str, expected: str, got: object) -> None:
    """Raise the ``ValueError`` naming ``arg``, what was ``expected`` and what it ``got`` (a string as is, anything
    else through :func:`desc`)."""
    raise ValueError(f"{arg}: expected {expected}, got {got if isinstance(got, str) else desc(got)}")


def check_paged_strides(arg: str, view: torch.Tensor, given: torch.Tensor, row: int) -> None:
    """A paged cache ``view`` [num_blocks, block_size, row] (of the tensor ``given``) must have contiguous rows that
    do not overlap: unit last stride, row stride >= row, block stride >= block_size · row stride."""
    nb, bs, _ = view.shape
    if view.stride(2) != 1:
        fail(arg, "a unit stride in the last dimension", f"strides {tuple(given.stride())}")
    if bs > 1 and view.stride(1) < row:
        fail(arg, f"a row stride of at least {row}", f"strides {tuple(given.stride())}")
    if nb > 1 and view.stride(0) < bs * view.stride(1):
        fail(arg, f"a block stride of at least block_size · row stride = {bs * view.stride(1)}",
             f"strides {tuple(given.stride())}")


def check_int32(arg: str, x: object, shape_desc: str, dims: int, device: torch.device, first: int | None = None
                ) -> None:
    """An int32 tensor of ``dims`` dimensions on ``device`` (the device of q), with ``first`` rows when given."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.dim() != dims:
        fail(arg, f"an int32 tensor {shape_desc}", x)
    if first is not None and x.shape[0] != first:
        fail(arg, f"shape {shape_desc}", x)
    if x.device != device:
        fail(arg, f"device {device} (the device of q)", x)


def check_int(arg: str, x: object, lo: int, hi: int = MAX_GRID) -> None:
    """A Python int (not a bool) in ``[lo, hi]``."""
    if isinstance(x, bool) or not isinstance(x, int):
        fail(arg, f"a Python int >= {lo}", desc(x))
    if x < lo or x > hi:
        fail(arg, f"an int in [{lo}, {hi}]", f"{x!r}")


def check_out(out: object, dtype: torch.dtype, shape: tuple[int, int], device: torch.device, *, of: str = "q"
              ) -> None:
    """An optional 2-D output ``out`` of ``dtype`` and ``shape`` on ``device`` (any strides; the device of the
    argument ``of``); None passes."""
    if out is None:
        return
    dname = str(dtype).replace("torch.", "")
    if not isinstance(out, torch.Tensor) or out.dtype != dtype:
        fail("out", f"a {dname} tensor [{shape[0]}, {shape[1]}]", out)
    if tuple(out.shape) != tuple(shape):
        fail("out", f"shape [{shape[0]}, {shape[1]}]", out)
    if out.device != device:
        fail("out", f"device {device} (the device of {of})", out)

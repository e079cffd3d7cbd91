"""Ahead-of-time compilation helpers shared by the operators' ``aot`` modules (no GPU needed).

:func:`compile_kernel` builds a ``@triton.jit`` kernel for a ``GPUTarget`` (:func:`target_for`) with the
specialisation a real launch gets (16-byte aligned pointers, the strides a launch sees as divisible by 16, unit
strides as the constant 1); :func:`report` reads shared memory, registers and spills from the build and
:func:`count_traps` its trap instructions; :func:`matrix_row` turns one build into a row of the compile matrix
(:mod:`triton_mla_sparse.aot`, checked by ``tests/common/test_compile_matrix.py``). Importing this module imports
triton.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

if TYPE_CHECKING:
    from triton.compiler import CompiledKernel

    from ..capabilities import Arch

__all__ = ["CompileReport", "compile_kernel", "count_traps", "matrix_row", "report", "target_for"]


@dataclass(frozen=True)
class CompileReport:
    target: str
    shared_bytes: int
    registers: int | None  # NVIDIA only
    stack_bytes: int | None  # NVIDIA: stack frame (register spills land here)
    local_bytes: int | None
    traps: int = 0  # trap instructions in the assembly: a build the compiler gave up on compiles to a trap

    @property
    def spills(self) -> bool:
        return bool(self.stack_bytes) or bool(self.local_bytes)


def target_for(arch: Arch) -> GPUTarget:
    """The ``GPUTarget`` of a :class:`~triton_mla_sparse.capabilities.Arch`."""
    return GPUTarget(arch.backend, arch.target, arch.warp_size)


def compile_kernel(fn: Any, sig: dict[str, str], const: dict[str, Any], divisible: Iterable[str], arch: Arch,
                   num_warps: int, num_stages: int, ones: Iterable[str] = ()) -> CompiledKernel:
    """``triton.compile`` of ``fn`` for ``arch`` with ``sig`` (name -> type), constexprs ``const``, and what a real
    launch specialises: the names in ``divisible`` as divisible by 16, those in ``ones`` as the constant 1 (Triton
    turns an int argument equal to 1 into a constexpr)."""
    names = list(sig) + list(const)
    full = dict(sig, **{k: "constexpr" for k in const}, **{k: "constexpr" for k in ones})
    consts = {(names.index(k),): v for k, v in const.items()}
    consts.update({(names.index(k),): 1 for k in ones})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(fn=fn, signature=full, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=target_for(arch), options=dict(num_warps=num_warps, num_stages=num_stages))


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def report(arch: Arch, compiled: CompiledKernel) -> CompileReport:
    """Shared memory from Triton's metadata; registers, stack frame and local memory from the cubin."""
    shared = int(compiled.metadata.shared)
    traps = count_traps(arch, compiled)
    if arch.backend != "cuda":
        return CompileReport(arch.name, shared, None, None, None, traps)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
        path = f.name
    try:
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", path], capture_output=True, text=True,
                             check=True).stdout
    finally:
        os.unlink(path)
    fields = {}  # the largest value over the cubin's functions (one per kernel today)
    for key, val in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", out):
        fields[key] = max(int(val), fields.get(key, 0))
    return CompileReport(arch.name, shared, int(fields["REG"]), int(fields["STACK"]), int(fields["LOCAL"]), traps)


def count_traps(arch: Arch, compiled: CompiledKernel) -> int:
    """Trap instructions in the build's assembly (PTX ``trap;``, AMDGCN ``s_trap``). None of our kernels asks for
    one; Triton emits a bare trap as the whole kernel body when it cannot lay a kernel out on the target (seen: the
    64-head attention block on sm100 with triton 3.9, whose accumulators need more than the 512 tensor-memory
    columns) — such a build compiles, fits and does not spill, and would stop the GPU at its first launch."""
    if arch.backend == "cuda":
        return len(re.findall(r"^\s*(?:@!?%p\d+\s+)?trap;", compiled.asm["ptx"], flags=re.M))
    return len(re.findall(r"^\s*s_trap\b", compiled.asm.get("amdgcn", ""), flags=re.M))


def matrix_row(arch: Arch, key: tuple[int, str, str, str], config: object,
               build: Callable[[], CompiledKernel]) -> dict:
    """One row of the compile matrix: ``key`` = (hc, cc, fmt, kernel) as the operator names its entry, the
    configuration's repr, and :func:`report`'s fields of ``build()``, or ``error`` when it raised (a failed build is
    a result of the matrix)."""
    hc, cc, fmt, kernel = key
    row = dict(arch=arch.name, hc=hc, cc=cc, fmt=fmt, kernel=kernel, config=repr(config))
    try:
        row.update(vars(report(arch, build())))
    except Exception as e:  # noqa: BLE001 - a failed build is a result of the matrix
        row["error"] = f"{type(e).__name__}: {e}"
    return row

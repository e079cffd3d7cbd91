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
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

if TYPE_CHECKING:
    from triton.compiler import CompiledKernel

    from ..capabilities import Arch

__all__ = ["CompileReport", "compile_kernel", "count_traps", "fp8_conversion_row", "matrix_row", "report",
           "target_for"]


@dataclass(frozen=True)
class CompileReport:
    target: str
    shared_bytes: int
    registers: int | None  # NVIDIA: registers per thread; AMDGPU: VGPRs
    stack_bytes: int | None  # NVIDIA: stack frame (register spills land here); AMDGPU: scratch (private segment)
    local_bytes: int | None  # NVIDIA: local memory; AMDGPU: spilled VGPRs + SGPRs
    traps: int = 0  # trap instructions in the assembly: a build the compiler gave up on compiles to a trap
    gdc: int = 0  # NVIDIA: griddepcontrol instructions (programmatic dependent launch: _common/pdl.py)

    @property
    def spills(self) -> bool:
        return bool(self.stack_bytes) or bool(self.local_bytes)


def target_for(arch: Arch) -> GPUTarget:
    """The ``GPUTarget`` of a :class:`~triton_mla_sparse.capabilities.Arch`."""
    return GPUTarget(arch.backend, arch.target, arch.warp_size)


def compile_kernel(fn: Any, sig: dict[str, str], const: dict[str, Any], divisible: Iterable[str], arch: Arch,
                   num_warps: int, num_stages: int, ones: Iterable[str] = (),
                   max_registers: int | None = None) -> CompiledKernel:
    """``triton.compile`` of ``fn`` (``@triton.jit`` or ``@gluon.jit``) for ``arch`` with ``sig`` (name -> type),
    constexprs ``const``, and what a real launch specialises: the names in ``divisible`` as divisible by 16, those in
    ``ones`` as the constant 1 (Triton turns an int argument equal to 1 into a constexpr); ``max_registers``: NVIDIA's
    per-thread register cap (maxnreg), as the launch passes it."""
    names = list(fn.arg_names)  # indices by the kernel's parameter order, whatever order the dicts came in
    given = dict(sig, **{k: "constexpr" for k in const}, **{k: "constexpr" for k in ones})
    if set(given) != set(names):
        raise ValueError(f"sig / const / ones: expected exactly {fn.__name__}'s parameters {names}, got "
                         f"{sorted(given)}")
    full = {k: given[k] for k in names}
    consts = {(names.index(k),): v for k, v in const.items()}
    consts.update({(names.index(k),): 1 for k in ones})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    source = ASTSource
    if type(fn).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(fn=fn, signature=full, constexprs=consts, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    if max_registers is not None:
        options["maxnreg"] = max_registers
    return triton.compile(src, target=target_for(arch), options=options)


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def report(arch: Arch, compiled: CompiledKernel) -> CompileReport:
    """Shared memory from Triton's metadata; registers, stack frame and local memory from the cubin (NVIDIA) or the
    assembly's kernel metadata (AMDGPU)."""
    shared = int(compiled.metadata.shared)
    traps = count_traps(arch, compiled)
    if arch.backend != "cuda":  # AMDGPU: the assembly's metadata (VGPRs, scratch = the spill area, spill counts)
        asm = compiled.asm.get("amdgcn", "")

        def field(key: str) -> int:
            return max((int(v) for v in re.findall(rf"^\s*\.?{key}:?\s+(\d+)", asm, flags=re.M)), default=0)

        spilled = field("vgpr_spill_count") + field("sgpr_spill_count")
        return CompileReport(arch.name, shared, field("vgpr_count"), field("private_segment_fixed_size"), spilled,
                             traps)
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
    gdc = len(re.findall(r"^\s*griddepcontrol\.", compiled.asm["ptx"], flags=re.M))
    return CompileReport(arch.name, shared, int(fields["REG"]), int(fields["STACK"]), int(fields["LOCAL"]), traps,
                         gdc)


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


@triton.jit
def _e4m3_roundtrip_kernel(x_ptr, y_ptr):
    o = tl.arange(0, 128)
    e = tl.load(x_ptr + o).to(tl.float8e4nv)
    tl.store(y_ptr + o, e.to(tl.float32))


# Native e4m3 conversion instructions: PTX cvt with an e4m3x2 operand (sm89+); AMDGPU v_cvt_* with fp8 (gfx950 …).
_NATIVE_FP8 = {"cuda": re.compile(r"\bcvt\.[\w.]*e4m3x2"), "hip": re.compile(r"\bv_cvt\w*fp8")}


def fp8_conversion_row(arch: Arch) -> dict:
    """A compile-matrix row saying whether Triton lowers e4m3 conversions on ``arch`` to native instructions
    (``native``) — what :attr:`~triton_mla_sparse.capabilities.Arch.fp8_hw` declares — or the build's ``error``
    (Triton rejects float8e4nv below sm89)."""
    row = dict(arch=arch.name, hc=0, cc="", fmt="e4m3", kernel="fp8_cvt", config="")
    try:
        src = ASTSource(fn=_e4m3_roundtrip_kernel, signature={"x_ptr": "*fp32", "y_ptr": "*fp32"}, constexprs={})
        compiled = triton.compile(src, target=target_for(arch), options=dict(num_warps=4))
        asm = compiled.asm["ptx"] if arch.backend == "cuda" else compiled.asm.get("amdgcn", "")
        row["native"] = bool(_NATIVE_FP8[arch.backend].search(asm))
    except Exception as e:  # noqa: BLE001 - a failed build is a result of the matrix
        row["error"] = f"{type(e).__name__}: {e}"[:500]
    return row

"""AOT compile matrix: every kernel × every configuration the launch table can pick × every declared target
(attention: the table's entries and the split merge; indexer: logits for 64/32 heads with fp8 and bf16 operands;
top-k: the split select's kernels).

Compiled on the CPU with ``triton.compile(..., target=GPUTarget(...))`` and the specialisation a real launch gets
(each operator's ``aot`` module, gathered by ``python -m triton_mla_sparse.aot``), in a subprocess per target
because the rest of the suite runs Triton's interpreter. Each case asserts that it compiled, that its shared
memory fits the architecture's budget and (NVIDIA, read from the cubin with the cuobjdump shipped in the triton
wheel) that it has no stack frame or local memory, i.e. no register spills, and that its assembly holds no trap
instruction (Triton compiles a kernel it cannot lay out on a target to a bare trap). Select with
``pytest -k compile_matrix``; ids name the target (``sm80`` … ``sm120``, ``gfx942``, ``gfx950``, ``gfx1100`` …
``gfx1201``). Where a target declares that the attention kernels spill (``Arch.spills``), the matrix checks the
declaration instead; and each target's declared fp8 path is checked against the e4m3 conversions in its assembly.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from triton_mla_sparse.capabilities import ARCHS
from triton_mla_sparse.ops.indexer import aot as indexer_aot
from triton_mla_sparse.ops.sparse_mla.aot import matrix_entries
from triton_mla_sparse.ops.sparse_mla.configs import CACHE_CLASSES, HEAD_CLASSES, TABLE
from triton_mla_sparse.ops.topk import aot as topk_aot

_results = {}


def _compile_all():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}

    def one(arch):
        proc = subprocess.run([sys.executable, "-m", "triton_mla_sparse.aot", arch], capture_output=True,
                              text=True, env=env, timeout=1800)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return arch, rows, proc.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        for arch, rows, err in pool.map(one, ARCHS):
            _results[arch] = {(r["hc"], r["cc"], r["fmt"], r["kernel"]): r for r in rows}
            _results[arch]["stderr"] = err


def _result(arch, key):
    if not _results:
        _compile_all()
    row = _results[arch].get(key)
    assert row is not None, f"{arch} {key}: no result from the compile subprocess:\n{_results[arch]['stderr']}"
    assert "error" not in row, f"{arch} {key}: {row['error']}"
    return row


def _spills(row):
    return bool(row["stack_bytes"]) or bool(row["local_bytes"])


def _results_row(arch, key):
    """The row of ``key`` (which may hold an ``error``)."""
    if not _results:
        _compile_all()
    row = _results[arch].get(key)
    assert row is not None, f"{arch} {key}: no result from the compile subprocess:\n{_results[arch]['stderr']}"
    return row


def _check(arch, row, *, attention=False):
    what = f"{arch.name} {row['kernel']} {row['config']}"
    assert row["traps"] == 0, f"{what}: the build contains {row['traps']} trap instruction(s) (the compiler gave up)"
    assert row["shared_bytes"] <= arch.shared_bytes, \
        f"{what}: {row['shared_bytes']} B of shared memory > {arch.name}'s budget of {arch.shared_bytes} B"
    if not (attention and arch.spills):  # a declared spill (Arch.spills) is checked by test_declared_spills
        assert not _spills(row), (f"{what}: spills (stack/scratch {row['stack_bytes']} B, local memory or spilled "
                                  f"registers {row['local_bytes']}, {row['registers']} registers)")


CASES = [(arch, *entry) for arch in ARCHS for entry in matrix_entries(arch)]


@pytest.mark.parametrize("arch_name,hc,cc,fmt,kernel", [
    pytest.param(*c, id=f"{c[0]}-{c[4]}-h{c[1]}-{c[3]}") for c in CASES])
def test_compile_matrix(arch_name, hc, cc, fmt, kernel):
    _check(ARCHS[arch_name], _result(arch_name, (hc, cc, fmt, kernel)), attention=True)


@pytest.mark.parametrize("arch_name", list(ARCHS), ids=[f"{a}-declared-spills" for a in ARCHS])
def test_declared_spills(arch_name):
    """``Arch.spills`` says whether the attention kernels spill registers on a target: declared there, at least one
    table entry spills (so the declaration goes when Triton stops spilling); not declared, none does (the other
    tests)."""
    arch = ARCHS[arch_name]
    rows = [_result(arch_name, entry) for entry in matrix_entries(arch_name)]
    if arch.spills:
        assert any(_spills(r) for r in rows), f"{arch_name}: declared spills ({arch.spills}) but no entry spills"
    else:
        assert not any(_spills(r) for r in rows), f"{arch_name}: spills but Arch.spills does not say so"


@pytest.mark.parametrize("arch_name", list(ARCHS), ids=[f"{a}-fp8-path" for a in ARCHS])
def test_declared_fp8_path_matches_the_assembly(arch_name):
    """``Arch.fp8_hw`` (native e4m3 conversions, else the integer decode) is what Triton's build for the target
    shows: e4m3 conversion instructions in its PTX/AMDGCN (Triton rejects float8e4nv below sm89; on gfx942 and RDNA
    it emulates the conversion)."""
    row = _results_row(arch_name, (0, "", "e4m3", "fp8_cvt"))
    native = bool(row.get("native"))
    assert native is ARCHS[arch_name].fp8_hw, (arch_name, row)


@pytest.mark.parametrize("arch_name", list(ARCHS), ids=[f"{a}-combine" for a in ARCHS])
def test_compile_matrix_combine(arch_name):
    _check(ARCHS[arch_name], _result(arch_name, (0, "", "", "combine")))


@pytest.mark.parametrize("arch_name", [a for a in ARCHS if ARCHS[a].backend == "cuda"])
def test_compile_matrix_pdl_signals_where_configured(arch_name):
    """Programmatic dependent launch is in the builds exactly where the configuration asks for it: a decode build
    whose entry sets ``pdl`` (and not ``merge``) signals its dependent (one griddepcontrol instruction), every other
    build has none,
    and the combine kernel waits (one) from sm90 on (the instruction's first architecture), none before; sm90's
    fp8_ds_mla decode at <= 16 heads is such an entry."""
    arch = ARCHS[arch_name]
    rows = [_result(arch_name, e) for e in matrix_entries(arch_name)]
    for row in rows:
        merged = "merge=True" in row["config"]  # a merging build launches no combine kernel to signal
        want = 1 if "pdl=True" in row["config"] and row["kernel"].startswith("decode") and not merged else 0
        assert row["gdc"] == want, (row["kernel"], row["config"], row["gdc"])
    assert _result(arch_name, (0, "", "", "combine"))["gdc"] == (1 if arch.target >= 90 else 0)
    if arch_name == "sm90":
        assert "pdl=True" in _result(arch_name, (16, "fp8_ds_mla", "fp8_ds_mla", "decode"))["config"]


@pytest.mark.parametrize("arch_name,hi,qf,kf,kernel", [
    pytest.param(arch, *e, id=f"{arch}-{e[3]}" + (f"-h{e[0]}-q{e[1]}-k{e[2]}" if e[0] else ""))
    for arch in ARCHS for e in indexer_aot.matrix_entries(ARCHS[arch]) + topk_aot.matrix_entries()])
def test_compile_matrix_indexer(arch_name, hi, qf, kf, kernel):
    _check(ARCHS[arch_name], _result(arch_name, (hi, qf, kf, kernel)))


@pytest.mark.parametrize("hi", [64, 32])
def test_compile_matrix_indexer_builds_the_wgmma_kernel_on_sm90(hi):
    """sm90's fp8 decode entry is the Gluon wgmma kernel (the configuration the launch picks), with the tl
    kernel's decode configuration beside it (its fallback); prefill stays with the tl kernel."""
    decode = _result("sm90", (hi, "fp8", "fp8", "indexer_logits_decode"))
    assert "family='wgmma'" in decode["config"], decode["config"]
    for kernel in (indexer_aot.FALLBACK_KERNEL, "indexer_logits_prefill"):
        row = _result("sm90", (hi, "fp8", "fp8", kernel))
        assert "family='tl'" in row["config"], (kernel, row["config"])


V4_REFUSED = ("gfx1100", "gfx1101", "gfx1151")  # RDNA3: the fp8_ds_mla_v4 build spills (test below)


def test_compile_matrix_table_covers_every_arch_and_class():
    """Every class on every target, but DeepSeek-V4 pages on RDNA3 (refused there: v4_supported)."""
    for arch in ARCHS:
        classes = [c for c in CACHE_CLASSES if c != "fp8_ds_mla_v4" or arch not in V4_REFUSED]
        assert set(TABLE[arch]) == {(h, c) for h in HEAD_CLASSES for c in classes}, arch


def _report_in_child(arch: str, cfg: str, kv_format: str, split: bool) -> list[str]:
    """``report`` fields (spills, registers, stack, local, traps) of one attention build, compiled in a child process
    (no interpreter): ``cfg`` is the ``AttentionConfig(...)`` keyword list."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("from triton_mla_sparse.capabilities import ARCHS\n"
            "from triton_mla_sparse._common.compile import report\n"
            "from triton_mla_sparse.ops.sparse_mla.aot import compile_attention\n"
            "from triton_mla_sparse.ops.sparse_mla.configs import AttentionConfig\n"
            f"arch = ARCHS[{arch!r}]\n"
            f"cfg = AttentionConfig({cfg})\n"
            f"r = report(arch, compile_attention(arch, cfg, kv_format={kv_format!r}, split={split}))\n"
            "print('REPORT', int(r.spills), r.registers, r.stack_bytes, r.local_bytes, r.traps)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT")]
    assert line, proc.stderr[-2000:]
    return line[0].split()[1:]


def test_compile_matrix_v4_spills_where_refused():
    """Why the API refuses fp8_ds_mla_v4 on RDNA3: the V4 path has no low-register variant, and its build with
    RDNA's tile (16 heads, 16 rows, 16 warps) spills VGPRs on gfx1100 (while RDNA4's, gfx1200, does not: its
    matrix rows). When this stops spilling, RDNA3 can get a table entry."""
    fields = _report_in_child("gfx1100", "kernel='decode', block_h=16, block_n=16, num_splits=8, split_len=256, "
                              "num_warps=16, num_stages=1, sw_fp8=True", "fp8_ds_mla_v4", True)
    assert fields[0] == "1", fields


def test_compile_matrix_sees_a_trap_build():
    """Canary for the trap check: sm100's 64-head attention block (what the table picked before) needs more tensor
    memory than the target has; Triton builds it as a bare trap, which the matrix must count."""
    fields = _report_in_child("sm100", "kernel='prefill', block_h=64, block_n=64, num_splits=1, split_len=2048, "
                              "num_warps=8, num_stages=2", "bf16", False)
    assert int(fields[4]) >= 1, fields


def test_table_entries_respect_max_block_h():
    from triton_mla_sparse.ops.sparse_mla.configs import MAX_BLOCK_H

    for arch, limit in MAX_BLOCK_H.items():
        assert all(launch.block_h <= limit for launch in TABLE[arch].values()), arch

"""The bench as a package: importing it loads nothing heavy, every public name resolves, no module grows big."""

from __future__ import annotations

import os
import subprocess
import sys

import triton_mla_sparse
from triton_mla_sparse import bench

BENCH_DIR = os.path.dirname(bench.__file__)


def test_import_loads_neither_triton_nor_the_kernels():
    code = ("import sys, triton_mla_sparse.bench as b; b.Case; b.report_main; "
            "print('triton' in sys.modules, any(m.endswith('.kernels') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_public_name_resolves():
    for name in bench.__all__:
        assert getattr(bench, name) is not None, name
    assert "run_bench" in dir(bench)


def test_modules_stay_small():
    sizes = {}
    for root, _, files in os.walk(BENCH_DIR):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(root, f)) as fh:
                    sizes[os.path.relpath(os.path.join(root, f), BENCH_DIR)] = sum(1 for _ in fh)
    assert sizes and max(sizes.values()) <= 600, sizes


def test_the_core_does_not_import_the_bench():
    """Nothing but the ``bench`` command (cli/bench.py) imports the bench: not the ops, formats, capabilities,
    integrations, testing, or the other commands."""
    pkg = os.path.dirname(triton_mla_sparse.__file__)
    offenders = []
    for root, dirs, files in os.walk(pkg):
        dirs[:] = [d for d in dirs if d not in ("bench", "__pycache__")]
        for f in files:
            if f.endswith(".py") and os.path.relpath(os.path.join(root, f), pkg) != os.path.join("cli", "bench.py"):
                text = open(os.path.join(root, f)).read()
                if "from .bench" in text or "triton_mla_sparse.bench" in text or "from ..bench" in text:
                    offenders.append(os.path.relpath(os.path.join(root, f), pkg))
    assert offenders == []

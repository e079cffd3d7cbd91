"""The package's layout rules (issue 14): importing the package imports neither triton nor anything on a GPU, and no
operator under ``triton_mla_sparse/ops`` imports another operator's kernels or private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import triton_mla_sparse

OPS = Path(triton_mla_sparse.__file__).parent / "ops"


def test_import_touches_no_triton():
    code = ("import sys, triton_mla_sparse, triton_mla_sparse.reference, triton_mla_sparse.ops.topk\n"
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _cross_op_imports(path: Path, op: str):
    """(line, module, name) of every import in ``path`` (a module of operator ``op``) from another operator."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        parts = (node.module or "").split(".")
        depth = len(path.relative_to(OPS).parts) - 1  # folders below ops/
        if node.level == depth + 1 and parts[0] and parts[0] != op:  # relative: ..other(.module)
            yield from ((node.lineno, node.module, a.name) for a in node.names)
        elif node.level == 0 and node.module and node.module.startswith("triton_mla_sparse.ops."):
            other = parts[2]
            if other != op:
                yield from ((node.lineno, ".".join(parts[2:]), a.name) for a in node.names)


def test_operators_use_only_each_others_public_names():
    bad = []
    for path in sorted(OPS.glob("*/*.py")):
        op = path.parent.name
        for line, module, name in _cross_op_imports(path, op):
            if name.startswith("_") or module.split(".")[-1] == "kernels" or module.split(".")[-1].startswith("_"):
                bad.append(f"{path.relative_to(OPS)}:{line}: from {module} import {name}")
    assert not bad, bad

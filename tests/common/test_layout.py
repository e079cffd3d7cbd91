"""The package's layout rules (issue 14): importing the package imports neither triton nor anything on a GPU; no
operator under ``triton_mla_sparse/ops`` imports anything of another operator but its package's public names; and
``triton_mla_sparse._common`` sits below the operators (it imports none of them)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import triton_mla_sparse

PKG = Path(triton_mla_sparse.__file__).parent
OPS = PKG / "ops"
COMMON = PKG / "_common"


def test_import_touches_no_triton():
    code = ("import sys, triton_mla_sparse, triton_mla_sparse.reference, triton_mla_sparse.ops.topk\n"
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _imports(path: Path):
    """(line, absolute module, imported name or None, local name or None) of every import in ``path``; relative
    imports are resolved against the module's package. ``import a.b.c`` gives (line, "a.b.c", None, None)."""
    pkg = list(path.relative_to(PKG.parent).parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, None, a.asname
        elif isinstance(node, ast.ImportFrom):
            base = pkg[:len(pkg) - (node.level - 1)] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            for a in node.names:
                yield node.lineno, module, a.name, a.asname or a.name


def _is_module(*parts: str) -> bool:
    """Whether ``triton_mla_sparse.<parts>`` is a module or a package."""
    p = PKG.joinpath(*parts)
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _cross_op_violations(path: Path) -> list[str]:
    """What ``path`` (a module of one operator) takes from another operator other than its package's public names:
    a module below another operator's package (``..other.kernels``, ``from ..other import kernels``) or an
    underscore name (imported, or an attribute of an imported operator package)."""
    op = path.relative_to(OPS).parts[0]
    where = str(path.relative_to(OPS))
    bad, bound = [], {}  # bound: local name -> the other operator whose package it names
    for line, module, name, local in _imports(path):
        parts = module.split(".")
        if parts[:2] != ["triton_mla_sparse", "ops"]:
            continue
        target = parts[2:] + ([name] if name and name != "*" else [])
        if not target or target[0] == op:
            continue
        other, rest = target[0], target[1:]
        text = f"{where}:{line}: {module}" + (f" import {name}" if name else "")
        if len(parts) > 3:
            bad.append(f"{text} (a module of operator {other!r}, not its package)")
        elif other.startswith("_") or rest and rest[0].startswith("_"):
            bad.append(f"{text} (a private name)")
        elif rest and _is_module("ops", other, rest[0]):
            bad.append(f"{text} (a module of operator {other!r}, not its package)")
        elif not rest and local:
            bound[local] = other
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            if node.attr.startswith("_") or _is_module("ops", bound[node.value.id], node.attr):
                bad.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr} (not a public name of operator "
                           f"{bound[node.value.id]!r})")
    return bad


def test_operators_use_only_each_others_public_names():
    bad = [b for path in sorted(OPS.rglob("*.py")) if len(path.relative_to(OPS).parts) > 1
           for b in _cross_op_violations(path)]
    assert not bad, "\n".join(bad)


def test_the_layout_check_sees_cross_operator_imports(tmp_path, monkeypatch):
    """The check flags each way of reaching into another operator, and passes its package's public names."""
    fake = OPS / "indexer" / "probe_layout.py"
    cases = {
        "from ..topk.split_select import launch_split_select": 1,
        "from ..topk import split_select": 1,
        "from ..topk import _private": 1,
        "from triton_mla_sparse.ops.topk.reference import torch_select": 1,
        "import triton_mla_sparse.ops.topk.split_select": 1,
        "from ...ops.topk import split_select": 1,
        "from .. import topk\nx = topk._private": 1,
        "from .. import topk\nx = topk.split_select": 1,
        "from ..topk import torch_select": 0,
        "from .. import topk\nx = topk.torch_select": 0,
        "from triton_mla_sparse.ops.topk import torch_select": 0,
        "from .kernels import launch_indexer_logits": 0,
    }
    for src, want in cases.items():
        monkeypatch.setattr(Path, "read_text", lambda self, _src=src: _src)
        got = _cross_op_violations(fake)
        monkeypatch.undo()
        assert len(got) == want, (src, got)


def test_common_sits_below_the_operators():
    """``_common`` holds what the operators share: it imports no operator, nor the cross-operator modules above
    them (the top-level ``aot``)."""
    bad = [f"{path.relative_to(PKG)}:{line}: {module}" + (f" import {name}" if name else "")
           for path in sorted(COMMON.rglob("*.py")) for line, module, name, _ in _imports(path)
           if module.startswith("triton_mla_sparse.ops") or module == "triton_mla_sparse.aot"
           or (module == "triton_mla_sparse" and name in ("ops", "aot"))]
    assert not bad, "\n".join(bad)

"""The public API is typed: every public function and method of the package annotates its arguments and return
value (Triton ``@jit`` functions aside: their arguments are tensors of the kernel language), and the wheel ships
``py.typed`` with every module."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import triton_mla_sparse

PKG = pathlib.Path(triton_mla_sparse.__file__).parent


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def _unannotated(path: pathlib.Path, root: pathlib.Path = PKG) -> list[str]:
    out = []

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for n in ast.iter_child_nodes(node):
            if isinstance(n, ast.ClassDef) and not n.name.startswith("_"):
                visit(n, f"{prefix}{n.name}.", True)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n.name.startswith("_") and n.name != "__init__") or _is_jit(n):
                    continue
                args = n.args.posonlyargs + n.args.args + n.args.kwonlyargs
                if in_class and args and args[0].arg in ("self", "cls"):
                    args = args[1:]
                missing = [a.arg for a in args if a.annotation is None]
                missing += [f"*{v.arg}" for v in (n.args.vararg, n.args.kwarg) if v is not None and v.annotation is None]
                if n.returns is None and n.name != "__init__":
                    missing.append("return")
                if missing:
                    out.append(f"{path.relative_to(root)}:{n.lineno} {prefix}{n.name} {missing}")

    visit(ast.parse(path.read_text()), "", False)
    return out


def test_every_public_function_is_annotated():
    missing = [m for f in sorted(PKG.rglob("*.py")) for m in _unannotated(f)]
    assert missing == []


def test_the_checker_sees_a_missing_annotation(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def public(x, y: int):\n    return x\n\n\ndef _private(z):\n    return z\n\n\n"
                     "class C:\n    def m(self, a: int) -> int:\n        return a\n")
    assert _unannotated(probe, tmp_path) == ["probe.py:1 public ['x', 'return']"]


def test_the_wheel_ships_every_module_and_py_typed(tmp_path):
    """Build the wheel from a copy of the sources (no network: the installed setuptools) and require every module of
    the source tree, and py.typed, in it."""
    pytest.importorskip("setuptools")
    root = PKG.parents[1]
    work = tmp_path / "src-copy"
    shutil.copytree(root / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, work / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(work)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("triton_mla_sparse-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    sources = {f"triton_mla_sparse/{p.relative_to(PKG).as_posix()}" for p in PKG.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert sources - shipped == set()
    assert "triton_mla_sparse/py.typed" in shipped

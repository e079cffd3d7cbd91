"""The public API is typed: every public function and method of the package annotates its arguments and return
value (Triton ``@jit`` functions aside: their arguments are tensors of the kernel language), and ``py.typed`` ships
with the package."""

from __future__ import annotations

import ast
import pathlib

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


def test_py_typed_ships():
    assert (PKG / "py.typed").is_file()

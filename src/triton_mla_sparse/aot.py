"""The ahead-of-time compile matrix: every operator's kernels, for any target, on any machine (no GPU needed).

Each operator builds its own kernels (``triton_mla_sparse.ops.<op>.aot``: its matrix entries and compile
functions, with the specialisation a real launch gets, through :mod:`triton_mla_sparse._common.compile`); this
module gathers their rows for one target. ``python -m triton_mla_sparse.aot ARCH`` prints them as JSON lines, which
``tests/common/test_compile_matrix.py`` checks (compiled, fits the shared memory budget, no spills, no trap).
Importing this module imports triton.
"""

from __future__ import annotations

from .ops.indexer import aot as indexer_aot
from .ops.sparse_mla import aot as sparse_mla_aot
from .ops.topk import aot as topk_aot

__all__ = ["OPERATORS", "compile_matrix", "main"]

OPERATORS = (sparse_mla_aot, indexer_aot, topk_aot)  # each with compile_rows(arch); the matrix's row order


def compile_matrix(arch_name: str) -> list[dict]:
    """Every operator's builds for one target (a name of :data:`~triton_mla_sparse.capabilities.ARCHS`); one dict
    per build: its key (hc, cc, fmt, kernel), the configuration, and the report or an ``error``; last, whether
    Triton lowers e4m3 conversions natively there (key ``(0, "", "e4m3", "fp8_cvt")``)."""
    from .capabilities import ARCHS

    from ._common.compile import fp8_conversion_row

    arch = ARCHS[arch_name]
    return [row for op in OPERATORS for row in op.compile_rows(arch)] + [fp8_conversion_row(arch)]


def main(argv: list[str] | None = None) -> None:
    """``python -m triton_mla_sparse.aot ARCH``: the compile matrix of one target as JSON lines."""
    import argparse
    import json

    from .capabilities import ARCHS

    p = argparse.ArgumentParser(prog="python -m triton_mla_sparse.aot",
                                description="Compile every kernel and launch configuration for one declared GPU.")
    p.add_argument("arch", choices=sorted(ARCHS), help="a declared architecture")
    for row in compile_matrix(p.parse_args(argv).arch):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

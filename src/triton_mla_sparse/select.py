"""Old path of ``triton-mla-sparse select``: a re-export of :mod:`triton_mla_sparse.integrations.vllm.select`.

``python -m triton_mla_sparse.select ARGS`` still runs the command (the same as ``triton-mla-sparse select ARGS``
and ``python -m triton_mla_sparse.integrations.vllm.select ARGS``). Like that module, this one imports vLLM inside
functions only.
"""

from __future__ import annotations

import sys

from .integrations.vllm.select import (
    DTYPES,
    MODELS,
    ModelShape,
    add_arguments,
    evaluate,
    format_report,
    format_table,
    parse_capability,
    run,
    select_main,
)

__all__ = ["MODELS", "ModelShape", "select_main", "evaluate", "parse_capability", "format_report", "format_table",
           "add_arguments", "run", "DTYPES"]

if __name__ == "__main__":  # python -m triton_mla_sparse.select
    sys.exit(select_main())

"""``triton-mla-sparse select``: which sparse MLA backend vLLM selects for a GPU, model, TP size and kv cache dtype,
and why (vLLM's own validation when vLLM is installed, our declarations otherwise)."""

from __future__ import annotations

import argparse


def _run(args: argparse.Namespace) -> int:
    from ..integrations.vllm import select

    return select.run(args)


def register(sub: argparse._SubParsersAction) -> None:
    from ..integrations.vllm import select

    p = sub.add_parser("select", help="which sparse MLA backend vLLM picks for a GPU, model, TP size and kv cache "
                                      "dtype, and why", description=select.DESCRIPTION)
    select.add_arguments(p)
    p.set_defaults(run=_run)

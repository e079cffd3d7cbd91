"""The ``triton-mla-sparse`` command: ``demo``, ``check``, ``info``, ``bench`` and ``select``.

Each command module registers its own subparser (``register(subparsers)``) with a ``run(args) -> int`` handler.
Triton reads ``TRITON_INTERPRET`` once, when it is imported, and the package imports triton only when a kernel
first runs, so a handler settles the device (:func:`prepare_device`) before it imports any kernel code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._device import prepare_device

__all__ = ["build_parser", "main", "prepare_device"]


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every command's subparser."""
    from . import bench, check, demo, info, select

    p = argparse.ArgumentParser(
        prog="triton-mla-sparse",
        description="Portable Triton sparse MLA attention (DeepSeek Sparse Attention): demo, self-test, benchmarks "
                    "and vLLM backend selection.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in (demo, check, info, bench, select):
        module.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the command; returns its exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return args.run(args)

"""The ``triton-mla-sparse`` command: ``demo``, ``bench`` and ``select``.

Triton reads ``TRITON_INTERPRET`` once, when it is imported; the package imports triton only when a kernel first
runs. So :func:`main` settles the device (and sets ``TRITON_INTERPRET=1`` when there is no CUDA GPU) before any
command code can import triton.
"""

from __future__ import annotations

import argparse
import os
import sys


def _prepare_device(want_cpu: bool = False) -> None:
    """Without a CUDA GPU (or when the CPU is asked for), kernels run through the Triton interpreter."""
    import torch

    if want_cpu or not torch.cuda.is_available():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            print("warning: triton was imported before TRITON_INTERPRET could be set; kernels may fail on the CPU",
                  file=sys.stderr)
        os.environ.setdefault("TRITON_INTERPRET", "1")
        try:
            import numpy  # noqa: F401  (Triton's interpreter imports it)
        except ImportError:
            print("triton-mla-sparse: running kernels on the CPU uses Triton's interpreter, which needs numpy: "
                  "pip install numpy  (or: pip install 'triton-mla-sparse[cpu]')", file=sys.stderr)
            raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="triton-mla-sparse",
        description="Portable Triton sparse MLA attention (DeepSeek Sparse Attention): demo, benchmarks and "
                    "vLLM backend selection.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    d = sub.add_parser("demo", help="run one GLM-5-shaped sparse attention step on random data and check it",
                       description="One GLM-5-shaped sparse MLA decode step (8 heads, D_qk 576, top-k 2048 of 8192 "
                                   "tokens, block 64, bf16 cache) on seeded random data, checked against the float32 "
                                   "reference and timed. Without a GPU a reduced size runs through the Triton "
                                   "interpreter in float16. Exits 1 if the error exceeds the tolerance.")
    d.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where to run (default: cuda when available, else the CPU interpreter)")
    d.add_argument("--seed", type=int, default=0, help="random seed of the generated data (default 0)")

    b = sub.add_parser("bench", help="benchmark the kernels on a CUDA GPU (decode and prefill cases)",
                       description="Accuracy vs the float32 reference first, then do_bench medians (and CUDA-graph "
                                   "replay for decode) for every case, against the device copy bandwidth and bf16 "
                                   "matmul rate measured in the same run. Needs a CUDA GPU (exit 2 otherwise).")
    b.add_argument("--quick", action="store_true", help="a subset that runs in about a minute")
    b.add_argument("--out", metavar="PATH.json", help="write all numbers as JSON to this file")
    b.add_argument("--methods", default="ours,torch",
                   help="comma-separated methods to run (default: ours,torch)")
    b.add_argument("--filter", metavar="REGEX", help="only the cases whose name matches this regular expression")
    b.add_argument("--seed", type=int, default=0, help="random seed of the generated inputs (default 0)")
    b.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)  # tiny cases, any device

    sub.add_parser("select", add_help=False,
                   help="which sparse MLA backend vLLM picks for a GPU, model, TP size and kv cache dtype, and why "
                        "(see `triton-mla-sparse select --help`)")
    return p


def _version() -> str:
    try:
        from . import __version__

        return __version__
    except Exception:  # noqa: BLE001
        return "?"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["select"]:
        from .select import select_main

        return select_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        _prepare_device(want_cpu=args.device == "cpu")
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                print("triton-mla-sparse demo: --device cuda, but no CUDA GPU is available", file=sys.stderr)
                return 2
        from .demo import run_demo

        return run_demo(device=args.device, seed=args.seed)
    if args.command == "bench":
        _prepare_device()
        from .bench import run_bench

        methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
        return run_bench(quick=args.quick, out=args.out, methods=methods, case_filter=args.filter, seed=args.seed,
                         cpu_smoke=args.cpu_smoke)
    return 2  # pragma: no cover (argparse requires a command)


if __name__ == "__main__":
    sys.exit(main())

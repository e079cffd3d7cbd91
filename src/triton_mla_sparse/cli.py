"""The ``triton-mla-sparse`` command: ``demo``, ``bench``, ``check``, ``info`` and ``select``.

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

    b = sub.add_parser(
        "bench", help="benchmark the kernels and their peers on a CUDA GPU; plot / compare / check targets of results",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every method on the same inputs in one process (ours, torch, page1_triton, flashmla_bf16,\n"
                    "flashmla_fp8; peers where they apply and load), accuracy vs the float32 reference first, then\n"
                    "do_bench medians (and CUDA-graph replay for decode), against the device copy bandwidth and\n"
                    "bf16 matmul rate measured in the same run. Writes benchmarks/results/<gpu>-<date>.json and a\n"
                    "PNG plot beside it. Needs a CUDA GPU (exit 2 otherwise), except the report modes.\n"
                    "Two kinds of cases (--kinds): attention (sparse MLA decode / prefill) and indexer (the DSA\n"
                    "lightning indexer: ours = logits + top-k, ours_logits, DeepGEMM logits (deepgemm) and\n"
                    "DeepGEMM + torch.topk (deepgemm_topk), torch).",
        epilog="peers are loaded from --peers DIR, else $TMS_PEERS_DIR, else ./.peers when it exists (made by\n"
               "../shared/tools/get-peers.sh), else an installed vLLM; each is reported as loaded (and from where)\n"
               "or not available (and why). DeepGEMM (indexer cases) from --deepgemm-dir DIR, else\n"
               "$TMS_DEEPGEMM_DIR, else <peers folder>-deepgemm / ./.peers-deepgemm (get-peers.sh --deepgemm),\n"
               "else vllm.third_party.deep_gemm; $DG_JIT_CACHE_DIR defaults to a folder in the temp dir.\n"
               "report modes (no GPU):\n"
               "  triton-mla-sparse bench --plot RESULTS.json [--png OUT.png]\n"
               "  triton-mla-sparse bench --targets RESULTS.json\n"
               "  triton-mla-sparse bench --compare OLD.json --against NEW.json\n"
               "the commit recorded is $TMS_COMMIT when set, else `git rev-parse HEAD`.")
    b.add_argument("--quick", action="store_true", help="a subset that runs in about a minute")
    b.add_argument("--out", metavar="PATH.json",
                   help="results JSON (default: OUT_DIR/<gpu>-<YYYY-MM-DD>.json); the PNG goes beside it")
    b.add_argument("--out-dir", metavar="DIR", default=os.path.join("benchmarks", "results"),
                   help="folder of the default results file (default: benchmarks/results)")
    b.add_argument("--methods",
                   default="ours,torch,page1_triton,flashmla_bf16,flashmla_fp8,ours_logits,deepgemm,deepgemm_topk",
                   help="comma-separated methods to run (default: all eight; each only where it applies)")
    b.add_argument("--kinds", metavar="KINDS",
                   help="comma-separated case groups to run: attention, indexer (default: $TMS_BENCH_KINDS, else "
                        "both)")
    b.add_argument("--peers", metavar="DIR",
                   help="folder with the peer modules (default: $TMS_PEERS_DIR, else ./.peers, else installed vLLM)")
    b.add_argument("--deepgemm-dir", metavar="DIR",
                   help="folder holding the deep_gemm package (default: $TMS_DEEPGEMM_DIR, else the peers folder's "
                        "-deepgemm sibling / ./.peers-deepgemm, else installed vLLM)")
    b.add_argument("--filter", metavar="REGEX", help="only the cases whose name matches this regular expression")
    b.add_argument("--seed", type=int, default=0, help="random seed of the generated inputs (default 0)")
    b.add_argument("--budget", type=float, metavar="SECONDS",
                   help="start no case after this many seconds (the rest are recorded as not run)")
    b.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    b.add_argument("--compare", metavar="OLD.json",
                   help="after the run (or with --against, instead of one): per case and method, old ms, new ms "
                        "and new/old, then ours/peer ratios and the targets of the new results")
    b.add_argument("--against", metavar="NEW.json", help="with --compare: the newer results file (no run, no GPU)")
    b.add_argument("--targets", metavar="RESULTS.json",
                   help="print ours/peer ratios and the issue's targets (PASS/FAIL) of a results file (no GPU)")
    b.add_argument("--plot", metavar="RESULTS.json", help="draw the PNG of a results file (no GPU)")
    b.add_argument("--png", metavar="PATH.png", help="with --plot: where to write it (default: beside the JSON)")
    b.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)  # tiny cases, any device

    c = sub.add_parser("check", help="self-test: every format and both kernels against the reference on this GPU",
                       description="Runs every supported kv format (bf16, fp16, fp8_e4m3, fp8_ds_mla with pow2 and "
                                   "fp32 scales) through both kernels at a few sizes against the float32 reference and "
                                   "prints a pass/fail table with errors and the chosen configs. Exits 1 on any "
                                   "failure. Without a GPU it runs reduced sizes through the Triton interpreter.")
    c.add_argument("--seed", type=int, default=0)
    i = sub.add_parser("info", help="device, architecture family, launch configs that apply, and what is unsupported",
                       description="What this library does on the current GPU (or on --arch without one).")
    i.add_argument("--arch", help="show a declared architecture instead of the current device (e.g. sm86, gfx942)")

    sub.add_parser("select", add_help=False,
                   help="which sparse MLA backend vLLM picks for a GPU, model, TP size and kv cache dtype, and why "
                        "(see `triton-mla-sparse select --help`)")
    return p


def _bench(args) -> int:
    if args.against and not args.compare:
        print("triton-mla-sparse bench: --against needs --compare OLD.json", file=sys.stderr)
        return 2
    if args.png and not args.plot:
        print("triton-mla-sparse bench: --png goes with --plot RESULTS.json", file=sys.stderr)
        return 2
    if args.plot or args.targets or args.against:
        # Report modes: read JSON files only; no device, no kernels, no triton import.
        from .bench import report_main

        return report_main(plot=args.plot, png=args.png, targets=args.targets, compare=args.compare,
                           against=args.against)
    _prepare_device()
    from .bench import run_bench

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    kinds = args.kinds or os.environ.get("TMS_BENCH_KINDS") or None
    return run_bench(quick=args.quick, out=args.out, out_dir=args.out_dir, methods=methods, case_filter=args.filter,
                     seed=args.seed, cpu_smoke=args.cpu_smoke, peers_dir=args.peers, budget_s=args.budget,
                     plot=not args.no_plot, compare=args.compare, kinds=kinds, deepgemm_dir=args.deepgemm_dir)


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
        return _bench(args)
    if args.command == "check":
        _prepare_device()
        from .check import run_check

        return run_check(seed=args.seed)
    if args.command == "info":
        from .check import run_info

        return run_info(args.arch)
    return 2  # pragma: no cover (argparse requires a command)


if __name__ == "__main__":
    sys.exit(main())

"""``triton-mla-sparse bench``: every method and peer on the same inputs on a CUDA GPU, and the report modes
(plot, targets, compare) that read results files on any machine."""

from __future__ import annotations

import argparse
import os
import sys

from ._device import prepare_device


def run(args: argparse.Namespace) -> int:
    if args.against and not args.compare:
        print("triton-mla-sparse bench: --against needs --compare OLD.json", file=sys.stderr)
        return 2
    if args.png and not args.plot:
        print("triton-mla-sparse bench: --png goes with --plot RESULTS.json", file=sys.stderr)
        return 2
    if args.plot or args.targets or args.against:
        # Report modes: read JSON files only; no device, no kernels, no triton import.
        from ..bench import report_main

        return report_main(plot=args.plot, png=args.png, targets=args.targets, compare=args.compare,
                           against=args.against, targets_file=args.targets_file)
    prepare_device()
    from ..bench import run_bench

    from ..bench.methods import METHOD_KEYS

    methods = METHOD_KEYS if args.methods is None else tuple(m.strip() for m in args.methods.split(",") if m.strip())
    kinds = args.kinds or os.environ.get("TMS_BENCH_KINDS") or None
    return run_bench(quick=args.quick, out=args.out, out_dir=args.out_dir, methods=methods, case_filter=args.filter,
                     seed=args.seed, cpu_smoke=args.cpu_smoke, peers_dir=args.peers, budget_s=args.budget,
                     plot=not args.no_plot, compare=args.compare, kinds=kinds, deepgemm_dir=args.deepgemm_dir,
                     targets_file=args.targets_file, emulate=args.emulate)


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench", help="benchmark the kernels and their peers on a CUDA GPU; plot / compare / check targets of results",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every method on the same inputs in one process (ours, torch, page1_triton, fa3_page1,\n"
                    "flashmla_bf16, flashmla_fp8; peers where they apply and load), accuracy vs the float32\n"
                    "reference first, then do_bench medians (and CUDA-graph replay for decode), against the device\n"
                    "copy bandwidth and bf16 matmul rate measured in the same run. Writes\n"
                    "benchmarks/results/<gpu>-<date>.json and a PNG plot beside it. Needs a CUDA GPU (exit 2\n"
                    "otherwise), except the report modes.\n"
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
                   help="comma-separated methods to run (default: all of ours, torch, page1_triton, fa3_page1, "
                        "flashmla_bf16, flashmla_fp8, ours_logits, deepgemm, deepgemm_topk; each only where it "
                        "applies)")
    b.add_argument("--emulate", metavar="FAMILY",
                   help="also time ours_portable (FAMILY: sm80, sm86, sm89 or sm120): our attention kernels with "
                        "FAMILY's launch-table entries and its mma.sync path (DISABLE_MMA_V3=1, in a child "
                        "process), on the attention cases")
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
                   help="print ours/peer ratios and the project's performance targets (PASS/FAIL) of a results file (no GPU)")
    b.add_argument("--targets-file", metavar="PATH",
                   help="the performance targets (default: $TMS_TARGETS_FILE, else benchmarks/targets.py under the "
                        "current directory, else the repository checkout's)")
    b.add_argument("--plot", metavar="RESULTS.json", help="draw the PNG of a results file (no GPU)")
    b.add_argument("--png", metavar="PATH.png", help="with --plot: where to write it (default: beside the JSON)")
    b.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)  # tiny cases, any device
    b.set_defaults(run=run)

"""Launch-configuration sweep for the attention kernels (GPU only), with the peers timed in the same process.

    python benchmarks/scripts/sweep.py [--peers DIR] [--cases decode_h16,...] [--graph] [--out sweep.json]

For each case (the bench's inputs) it times a list of configurations of our kernels (block_h, block_n, warps,
stages, splits) and every peer that applies and loads (the bench's peer adapters: FlashMLA, the page_size=1 dense
Triton kernel); every timing is preceded by the bench's accuracy check against the float32 reference. The results
feed benchmarks/NOTES.md and the launch table of the sparse MLA kernels. ``--graph`` times decode cases by CUDA-graph
replay (the bench's decode basis) instead of ``do_bench``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable

import torch
import triton

from triton_mla_sparse.bench import (EXTERNAL_PEERS, Case, DoBenchTimer, PeerUnavailable, build_inputs,
                                     check_output, decode_case, load_peers, method_applies, method_factories,
                                     prefill_case, reference_output)
from triton_mla_sparse.bench.cases import v4_decode_case
from triton_mla_sparse.bench.timing import time_graph
from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config

CASES: dict[str, Callable[[str], Case]] = {
    **{f"decode_h{h}": (lambda fmt, h=h: decode_case(h, 64, fmt)) for h in (8, 16, 32, 64, 128)},
    "decode_h16_b256": lambda fmt: decode_case(16, 256, fmt),
    "decode_h128_b256": lambda fmt: decode_case(128, 256, fmt),
    "decode_h128_b1_64k": lambda fmt: decode_case(128, 1, fmt, ctx=65536),
    **{f"prefill_h{h}": (lambda fmt, h=h: prefill_case(h, fmt)) for h in (8, 16, 64, 128)},
    # DeepSeek-V4 decode (its own format: the --formats entry is ignored)
    **{f"v4_h{h}_b{b}": (lambda fmt, h=h, b=b: v4_decode_case(h, b)) for h in (8, 16, 32, 64) for b in (64, 256)},
}


def case_for(name: str, fmt: str) -> Case:
    """The bench case a sweep case name stands for, in cache format ``fmt``."""
    return CASES[name](fmt)


def configs_for(case: Case) -> list[dict]:
    """A targeted grid (each new combination costs a compile of a few seconds on the device)."""
    h, prefill = case.heads, case.kind == "prefill"
    bhs = [16] if h <= 16 else ([32, 64] if h <= 32 else [64])
    out = [dict()]  # the default choice
    for bh, bn, nw, st in itertools.product(bhs, [32, 64, 128], [4, 8], [2, 3]):
        if (bh == 64 and nw == 4) or (bh == 64 and bn == 128) or (prefill and st == 3):
            continue
        out.append(dict(block_h=bh, block_n=bn, num_warps=nw, num_stages=st))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=None, help="peers folder (default: the bench's: $TMS_PEERS_DIR, ./.peers, vLLM)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--formats", default="bf16,fp8_ds_mla")
    ap.add_argument("--splits", default="", help="comma list of num_splits to try for decode (default: auto)")
    ap.add_argument("--out", default="")
    ap.add_argument("--max-configs", type=int, default=1000)
    ap.add_argument("--configs", default="", help="JSON list of config overrides to time instead of the grid")
    ap.add_argument("--graph", action="store_true", help="decode cases: CUDA-graph replay times")
    args = ap.parse_args()
    peers = load_peers(args.peers, wanted=[m for m in EXTERNAL_PEERS if not m.startswith("deepgemm")])
    for m, s in peers.status.items():
        print(f"# {m}: {s}")
    factories = method_factories(peers)
    peer_timer, ours_timer = DoBenchTimer(1, rep=100), DoBenchTimer(1, rep=40)
    results = []
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    for name in args.cases.split(","):
        for fmt in args.formats.split(","):
            case = case_for(name, fmt)
            inp = build_inputs(case, "cuda")
            ref, sel = reference_output(inp)
            q, kv, idx, scale = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale
            kw = dict(kv_format=case.kv_format, **inp.extras()) if case.extra_topk else {}  # V4: never inferred

            def checked_ms(fn: Callable[[], torch.Tensor], timer: DoBenchTimer) -> tuple[float, float]:
                err, problem = check_output(case, fn(), ref, sel)
                if problem:
                    raise ValueError(problem)
                if args.graph and case.kind == "decode":
                    return time_graph(fn), err
                return timer(fn), err

            line = {"case": name, "fmt": fmt, "ours": []}
            for pname in (m for m in EXTERNAL_PEERS if m in factories and method_applies(m, case)):
                try:
                    ms, err = checked_ms(factories[pname](inp).fn, peer_timer)
                    line[pname] = (ms, err)
                    print(f"{name:22s} {fmt:10s} {pname:40s} {ms:8.4f} ms err {err:.1e}", flush=True)
                except PeerUnavailable as e:
                    print(f"{name:22s} {fmt:10s} {pname:40s} {e}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{name:22s} {fmt:10s} {pname:40s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            prefill = case.kind == "prefill"
            splits = [None] + [int(s) for s in args.splits.split(",") if s] if not prefill else [None]
            grid = json.loads(args.configs) if args.configs else configs_for(case)[: args.max_configs]
            for cfg_over, ns in itertools.product(grid, splits):
                over = dict(cfg_over)
                if ns is not None:
                    over["num_splits"] = ns
                kernel = "prefill" if prefill else "auto"

                def fn(over=over, kernel=kernel):
                    return sparse_mla_attention_with_config(q, kv, idx, scale, kernel=kernel, **kw, **over)

                try:
                    _, cfg = sparse_mla_attention_with_config(q, kv, idx, scale, kernel=kernel, return_config=True,
                                                              **kw, **over)
                    ms, err = checked_ms(fn, ours_timer)
                except Exception as e:  # noqa: BLE001
                    print(f"{name:22s} {fmt:10s} {str(over):40s} FAILED {type(e).__name__}: {str(e)[:150]}")
                    continue
                tag = f"{cfg.family} {cfg.kernel[:3]} h{cfg.block_h} n{cfg.block_n} w{cfg.num_warps} " \
                      f"s{cfg.num_stages} sp{cfg.num_splits} sw{int(cfg.sw_fp8)}" + " f16" * cfg.f16_dot \
                      + " ov" * cfg.overlap \
                      + (f" reg{cfg.max_registers}" if cfg.max_registers is not None else "")
                line["ours"].append((tag, ms, err))
                print(f"{name:22s} {fmt:10s} {tag:40s} {ms:8.4f} ms err {err:.1e}", flush=True)
            best = min(line["ours"], key=lambda r: r[1]) if line["ours"] else None
            print(f"BEST {name:22s} {fmt:10s} {best}", flush=True)
            results.append(line)
            del inp, ref, q, kv, idx
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

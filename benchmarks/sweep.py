"""Launch-configuration sweep for the attention kernels (GPU only), with the peers timed in the same process.

    python benchmarks/sweep.py [--peers .peers] [--cases decode_h16,...] [--out sweep.json]

For each case it times a list of configurations of our kernels (block_h, block_n, warps, stages, splits)
and, where importable from the peers folder (../shared/tools/get-peers.sh), FlashMLA and the page_size=1 dense
Triton kernel; every timing is preceded by an accuracy check against the float32 reference on a subset of rows.
The results feed benchmarks/NOTES.md and the defaults in kernels/configs.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys

import torch
import triton

import triton_mla_sparse as tms
from triton_mla_sparse import reference
from triton_mla_sparse.api import sparse_mla_attention_with_config


def make_case(rows, heads, topk, ctx, fmt, prefill=False, block=64, seed=0):
    """Paged cache for `rows` requests of `ctx` tokens (one shared sequence for prefill), random distinct top-k."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    nreq = 1 if prefill else rows
    nblk_req = ctx // block
    nb = nreq * nblk_req + 8
    kvf = torch.randn(nb, block, 576, device="cuda", generator=g, dtype=torch.bfloat16)
    perm = torch.randperm(nb, device="cuda", generator=g)[: nreq * nblk_req].view(nreq, nblk_req).int()
    if prefill:
        pos = torch.arange(ctx - rows, ctx, device="cuda")
        r = torch.rand(rows, ctx, device="cuda", generator=g)
        r = r.masked_fill(torch.arange(ctx, device="cuda")[None, :] > pos[:, None], -1)
        p = r.topk(topk, dim=1).indices.int()
        req = torch.zeros(rows, dtype=torch.int32, device="cuda")
    else:
        p = torch.rand(rows, ctx, device="cuda", generator=g).topk(topk, dim=1).indices.int()
        req = torch.arange(rows, dtype=torch.int32, device="cuda")
    idx = tms.topk_to_slots(p, req, perm, block)
    q = torch.randn(rows, heads, 576, device="cuda", generator=g, dtype=torch.bfloat16)
    kv = kvf if fmt == "bf16" else tms.quantize_fp8_ds_mla(kvf, scale_format="fp32")
    return q, kv, idx


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check(fn, q, kv, idx, scale, sub=128):
    rows = torch.arange(0, q.shape[0], max(1, q.shape[0] // sub), device="cuda")
    ref = reference.sparse_mla_attention(q[rows], kv, idx[rows], scale, out_dtype=torch.float32)
    return rel_err(fn()[rows], ref)


def load_peers(path):
    peers = {}
    if not path:
        return peers
    sys.path.insert(0, path)
    try:
        import flash_mla_interface as fmi  # noqa

        peers["flashmla"] = fmi
    except Exception as e:  # noqa: BLE001
        print(f"# FlashMLA not loaded: {type(e).__name__}: {e}")
    try:
        import triton_decode_attention as tda  # noqa

        peers["page1"] = tda
    except Exception as e:  # noqa: BLE001
        print(f"# page1 Triton kernel not loaded: {type(e).__name__}: {e}")
    return peers


def peer_fns(peers, q, kv, idx, scale, fmt):
    fns = {}
    T, H, _ = q.shape
    if "flashmla" in peers and fmt == "bf16":
        fmi = peers["flashmla"]
        flat = kv.view(-1, 1, 576)
        hp = H if H in (8, 16, 32) or H % 64 == 0 else 64 * math.ceil(H / 64)
        qp = q if hp == H else torch.cat([q, q.new_zeros(T, hp - H, 576)], 1)
        fns["flashmla_bf16"] = lambda: fmi.flash_mla_sparse_fwd(qp, flat, idx.view(T, 1, -1), scale)[0][:, :H]
    if "flashmla" in peers and fmt == "fp8_ds_mla":
        fmi = peers["flashmla"]
        hp = 64 if H <= 64 else 128
        qp = torch.cat([q, q.new_zeros(T, hp - H, 576)], 1) if hp != H else q
        meta = fmi.get_mla_metadata()[0] if hasattr(fmi, "get_mla_metadata") else None
        k4 = kv.view(kv.shape[0], kv.shape[1], 1, 656)

        def run():
            o = fmi.flash_mla_with_kvcache(qp.view(T, 1, hp, 576), k4, None, None, 512, meta, softmax_scale=scale,
                                           is_fp8_kvcache=True, indices=idx.view(T, 1, -1))[0]
            return o.view(T, hp, 512)[:, :H]

        fns["flashmla_fp8"] = run
    if "page1" in peers and fmt == "bf16":
        tda = peers["page1"]
        flat = kv.view(-1, 1, 576)
        topk = idx.shape[1]
        valid = idx >= 0
        req_to_token = torch.where(valid, idx, 0).contiguous()
        seq = torch.full((T,), topk, dtype=torch.int32, device="cuda")
        o = torch.empty(T, H, 512, dtype=q.dtype, device="cuda")
        lse = torch.empty(T, H, dtype=torch.float32, device="cuda")
        ns = 4
        logits = torch.empty(T, H, ns, 513, dtype=torch.float32, device="cuda")

        def run():
            tda.decode_attention_fwd(q, flat, flat[..., :512], o, lse, req_to_token, seq, logits, ns, scale,
                                     page_size=1, is_mla=True)
            return o

        fns["page1_triton"] = run
    return fns


CASES = {
    "decode_h8": dict(rows=64, heads=8, topk=2048, ctx=8192),
    "decode_h16": dict(rows=64, heads=16, topk=2048, ctx=8192),
    "decode_h32": dict(rows=64, heads=32, topk=2048, ctx=8192),
    "decode_h64": dict(rows=64, heads=64, topk=2048, ctx=8192),
    "decode_h128": dict(rows=64, heads=128, topk=2048, ctx=8192),
    "decode_h16_b256": dict(rows=256, heads=16, topk=2048, ctx=8192),
    "decode_h128_b1_64k": dict(rows=1, heads=128, topk=2048, ctx=65536),
    "prefill_h16": dict(rows=4096, heads=16, topk=2048, ctx=32768, prefill=True),
    "prefill_h64": dict(rows=4096, heads=64, topk=2048, ctx=32768, prefill=True),
    "prefill_h128": dict(rows=4096, heads=128, topk=2048, ctx=32768, prefill=True),
}


def configs_for(case, prefill, fmt):
    """A targeted grid (each new combination costs a compile of a few seconds on the device)."""
    h = case["heads"]
    bhs = [16] if h <= 16 else ([32, 64] if h <= 32 else [64])
    out = [dict()]  # the default choice
    for bh, bn, nw, st in itertools.product(bhs, [32, 64, 128], [4, 8], [2, 3]):
        if (bh == 64 and nw == 4) or (bh == 64 and bn == 128) or (prefill and st == 3):
            continue
        out.append(dict(block_h=bh, block_n=bn, num_warps=nw, num_stages=st))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=".peers")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--formats", default="bf16,fp8_ds_mla")
    ap.add_argument("--splits", default="", help="comma list of num_splits to try for decode (default: auto)")
    ap.add_argument("--out", default="")
    ap.add_argument("--max-configs", type=int, default=1000)
    ap.add_argument("--configs", default="", help="JSON list of config overrides to time instead of the grid")
    args = ap.parse_args()
    peers = load_peers(args.peers)
    results = []
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    for name in args.cases.split(","):
        case = dict(CASES[name])
        prefill = case.pop("prefill", False)
        for fmt in args.formats.split(","):
            q, kv, idx = make_case(**case, fmt=fmt, prefill=prefill)
            scale = 192 ** -0.5
            line = {"case": name, "fmt": fmt, "ours": []}
            for pname, fn in peer_fns(peers, q, kv, idx, scale, fmt).items():
                try:
                    err = check(fn, q, kv, idx, scale)
                    ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                    line[pname] = (ms, err)
                    print(f"{name:22s} {fmt:10s} {pname:40s} {ms:8.4f} ms err {err:.1e}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{name:22s} {fmt:10s} {pname:40s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            splits = [None] + [int(s) for s in args.splits.split(",") if s] if not prefill else [None]
            grid = json.loads(args.configs) if args.configs else configs_for(case, prefill, fmt)[: args.max_configs]
            for cfg_over, ns in itertools.product(grid, splits):
                over = dict(cfg_over)
                if ns is not None:
                    over["num_splits"] = ns
                kernel = "prefill" if prefill else "auto"

                def fn(over=over, kernel=kernel):
                    return sparse_mla_attention_with_config(q, kv, idx, scale, kernel=kernel, **over)

                try:
                    _, cfg = sparse_mla_attention_with_config(q, kv, idx, scale, kernel=kernel, return_config=True,
                                                              **over)
                    err = check(fn, q, kv, idx, scale)
                    ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
                except Exception as e:  # noqa: BLE001
                    print(f"{name:22s} {fmt:10s} {str(over):40s} FAILED {type(e).__name__}: {str(e)[:150]}")
                    continue
                tag = f"{cfg.kernel[:3]} h{cfg.block_h} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} " \
                      f"sp{cfg.num_splits} sw{int(cfg.sw_fp8)}"
                line["ours"].append((tag, ms, err))
                print(f"{name:22s} {fmt:10s} {tag:40s} {ms:8.4f} ms err {err:.1e}", flush=True)
            best = min(line["ours"], key=lambda r: r[1]) if line["ours"] else None
            print(f"BEST {name:22s} {fmt:10s} {best}", flush=True)
            results.append(line)
            del q, kv, idx
            torch.cuda.empty_cache()
    if args.out:
        json.dump(results, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()

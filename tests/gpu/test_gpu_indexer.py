"""GPU tier of the DSA indexer: production sizes (decode: 64 requests of 32K tokens, one row each; prefill: 1024
causal rows over an 8K request), index heads 64 (DeepSeek-V3.2) and 32 (GLM-5), fp8 (vLLM's indexer cache layout,
e4m3 q with its scale folded into the weights) and bf16; logits against the float32 reference on a subset of rows,
top-k compared as sets of selected logit values, CUDA-graph capture and replay. Skipped without a CUDA GPU.
"""

from __future__ import annotations

import pytest
import torch

import triton_mla_sparse as tms
from triton_mla_sparse import reference
from triton_mla_sparse.formats import quantize_indexer_cache
from triton_mla_sparse.testing import assert_close, quantize_indexer_q

HAVE_CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")]

D, BS, TOPK = 128, 64, 2048
CHECK_ROWS = 12


def make(kind: str, Hi: int, fmt: str, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "decode":
        R, ctx = 64, 32768
        lengths = torch.randint(ctx // 2, ctx + 1, (R,), generator=g, device="cuda")
        req = torch.arange(R, dtype=torch.int32, device="cuda")
        pos = (lengths - 1).to(torch.int32)
    elif kind == "prefill":
        R, ctx = 1, 8192
        req = torch.zeros(1024, dtype=torch.int32, device="cuda")
        pos = torch.arange(ctx - 1024, ctx, dtype=torch.int32, device="cuda")
    else:  # "mixed": prefill chunks of several requests with odd row counts (row groups straddle requests), a
        # decode row, and a row with an invalid request id (all -inf, all -1)
        R, ctx = 5, 8192
        counts, reqs, poss = (7, 130, 1, 301, 65), [], []
        for r, n in enumerate(counts):
            reqs += [r] * n
            poss += list(range(ctx - n - 3 * r, ctx - 3 * r))
        reqs.insert(200, R)  # invalid request id
        poss.insert(200, ctx - 1)
        req = torch.tensor(reqs, dtype=torch.int32, device="cuda")
        pos = torch.tensor(poss, dtype=torch.int32, device="cuda")
    T = req.shape[0]
    max_blocks = ctx // BS
    nb = R * max_blocks + 5
    bt = torch.randperm(nb, generator=g, device="cuda")[:R * max_blocks].reshape(R, max_blocks).to(torch.int32)
    values = torch.randn(nb, BS, D, generator=g, device="cuda")
    q = torch.randn(T, Hi, D, generator=g, device="cuda")
    w = torch.randn(T, Hi, generator=g, device="cuda") * Hi ** -0.5
    if fmt == "fp8":
        k_cache = quantize_indexer_cache(values)
        q, qs = quantize_indexer_q(q)
        w = w * qs  # q's scale folded into the weights
    else:
        k_cache = values.to(torch.bfloat16)
        q = q.to(torch.bfloat16)
    return dict(q=q, weights=w.float().contiguous(), k_cache=k_cache, block_table=bt, req_id_per_token=req,
                positions=pos), ctx


def args(c, rows=None):
    keys = ("q", "weights", "k_cache", "block_table", "req_id_per_token", "positions")
    return tuple(c[k][rows] if (rows is not None and k in ("q", "weights", "req_id_per_token", "positions"))
                 else c[k] for k in keys)


def check_topk(sel, ref_logits, topk, atol):
    sel, ref_logits = sel.cpu().long(), ref_logits.cpu().double()
    for t in range(sel.shape[0]):
        row = ref_logits[t]
        n = int((~torch.isneginf(row)).sum())
        k = min(topk, n)
        s = sel[t]
        assert int((s >= 0).sum()) == k and bool((s[s < 0] == -1).all())
        if k == 0:
            continue
        pos = s[s >= 0]
        assert len(set(pos.tolist())) == k
        got = torch.sort(row[pos]).values
        want = torch.sort(torch.topk(row, k).values).values
        assert not torch.isneginf(got).any()
        assert (got - want).abs().max() <= atol * row[~torch.isneginf(row)].abs().max(), t


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("Hi", [64, 32])
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_indexer_real_sizes(kind, Hi, fmt):
    c, ctx = make(kind, Hi, fmt)
    T = c["positions"].shape[0]
    logits = tms.indexer_logits(*args(c), ctx)
    sels = {select: tms.indexer_topk(*args(c), TOPK, select=select) for select in ("torch", "split")}
    torch.cuda.synchronize()
    rows = torch.linspace(0, T - 1, CHECK_ROWS, device="cuda").long()
    if kind == "mixed":  # every row: request boundaries and the invalid row
        rows = torch.arange(T, device="cuda")
    ref = reference.indexer_logits(*args(c, rows), ctx)
    tol = 2e-3 if fmt == "fp8" else 1e-4
    # identical -inf (and NaN/+inf) positions, then the relative L2 error of the finite part
    assert_close(logits[rows], ref, tol=tol, what=f"{kind} Hi={Hi} {fmt} logits")
    for sel in sels.values():
        check_topk(sel[rows], ref, TOPK, atol=4 * tol)


@pytest.mark.parametrize("select", ["torch", "split"])
@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
def test_indexer_cuda_graph(fmt, select):
    c, _ = make("decode", 64, fmt, seed=1)
    c2, _ = make("decode", 64, fmt, seed=2)
    static = {k: v.clone() for k, v in c.items()}
    tms.indexer_topk(*args(static), TOPK, select=select)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = tms.indexer_topk(*args(static), TOPK, select=select)
    for src in (c, c2):
        for k in ("q", "weights", "positions"):
            static[k].copy_(src[k])
        static["k_cache"].copy_(src["k_cache"])
        static["block_table"].copy_(src["block_table"])
        g.replay()
        torch.cuda.synchronize()
        eager = tms.indexer_topk(*args(static), TOPK, select=select)
        assert torch.equal(torch.sort(out, 1).values, torch.sort(eager, 1).values)


def _adversarial_rows(L: int, g: torch.Generator) -> torch.Tensor:
    """Rows of L logits that stress the split select's counting bound and bins: iid, rising, falling, a spike per
    128 positions, -inf gaps and a short row, all-equal, few distinct values, NaN/±inf, huge and tiny magnitudes."""
    dev = "cuda"
    rows = [torch.randn(L, generator=g, device=dev)]
    rows.append(torch.linspace(-3, 3, L, device=dev))
    rows.append(torch.linspace(3, -3, L, device=dev))
    spiky = torch.randn(L, generator=g, device=dev) * 0.01 - 5
    spiky[::128] = torch.randn(spiky[::128].shape, generator=g, device=dev) + 5
    rows.append(spiky)
    gaps = torch.randn(L, generator=g, device=dev)
    gaps[::3] = float("-inf")
    rows.append(gaps)
    short = torch.randn(L, generator=g, device=dev)
    short[L // 3:] = float("-inf")
    rows.append(short)
    rows.append(torch.full((L,), 1.5, device=dev))
    rows.append(torch.randint(0, 4, (L,), generator=g, device=dev).float())
    odd = torch.randn(L, generator=g, device=dev)
    odd[::997] = float("nan")
    odd[5::1009] = float("inf")
    rows.append(odd)
    rows.append(torch.randn(L, generator=g, device=dev) * torch.exp(torch.randn(L, generator=g, device=dev) * 20))
    return torch.stack(rows)


@pytest.mark.parametrize("topk", [1, 7, 2048, 5000])
def test_split_select_long_adversarial_rows(topk):
    """The split select at its sm90 configuration on rows long enough for the bound pass (> 8 chunks of 8192):
    the selected logits equal torch.topk's as sorted value sets (NaN ranks highest), -1 only for missing ones."""
    from triton_mla_sparse.ops.indexer.configs import IndexerConfig
    from triton_mla_sparse.ops.topk.split_select import launch_split_select

    g = torch.Generator(device="cuda").manual_seed(topk)
    L = 131072 + 77  # a partial last chunk
    x = _adversarial_rows(L, g)
    cfg = IndexerConfig(block_h=64, block_k=128, chunk_tiles=16, rows_per_program=1, num_warps=4, num_stages=2,
                        use_fp8_dot=True, dot_bf16=False, sw_fp8=False, select="split")
    out = torch.full((x.shape[0], topk), 777, dtype=torch.int32, device="cuda")
    launch_split_select(x, out, topk, cfg)
    for t in range(x.shape[0]):
        row = x[t]
        n = int((row != float("-inf")).sum())
        k = min(topk, n)
        s = out[t]
        assert int((s >= 0).sum()) == k and int((s == -1).sum()) == topk - k, t
        pos = s[s >= 0].long()
        assert pos.unique().numel() == k, t
        got = row[pos].nan_to_num(nan=float("inf")).sort().values
        want = torch.topk(row, k).values.nan_to_num(nan=float("inf")).sort().values
        assert torch.equal(got, want), t

"""GPU tier of the DSA indexer: production sizes (decode: 64 requests of 32K tokens, one row each; prefill: 1024
causal rows over an 8K request), index heads 64 (DeepSeek-V3.2) and 32 (GLM-5), fp8 (vLLM's indexer cache layout,
e4m3 q with its scale folded into the weights) and bf16; logits against the float32 reference on a subset of rows,
top-k compared as sets of selected logit values, CUDA-graph capture and replay. On sm90 the fp8 decode calls run the
Gluon wgmma logits kernel (counted); its own cases poison every byte it must not read (unused blocks, rows past
each request's length, block padding), garble the block table and the request ids, and sweep chunk lengths, ring
depths and head counts (one of them under compute-sanitizer: ``memcheck``). Skipped without a CUDA GPU.
"""

from __future__ import annotations

import pytest
import torch

import triton_mla_sparse as tms
from triton_mla_sparse import reference
from triton_mla_sparse.formats import quantize_indexer_cache
from triton_mla_sparse.testing import assert_close, quantize_indexer_q

from helpers import poisoned_allocations_probe_select  # tests/ is on sys.path (rootdir-relative imports)

HAVE_CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")]

D, BS, TOPK = 128, 64, 2048
CHECK_ROWS = 12
INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _is_sm90() -> bool:
    from triton_mla_sparse.capabilities import arch_for_device

    arch = arch_for_device(torch.device("cuda")) if HAVE_CUDA else None
    return arch is not None and arch.name == "sm90"


SM90 = _is_sm90()
sm90_only = pytest.mark.skipif(not SM90, reason="the wgmma logits kernel runs on sm90")


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
def test_indexer_real_sizes(kind, Hi, fmt, wgmma_launches):
    c, ctx = make(kind, Hi, fmt)
    T = c["positions"].shape[0]
    logits = tms.indexer_logits(*args(c), ctx)
    sels = {select: tms.indexer_topk(*args(c), TOPK, select=select) for select in ("torch", "split")}
    torch.cuda.synchronize()
    # sm90's fp8 decode rows: the wgmma kernel for the logits call and both top-k calls (the split one zeroing its
    # workspace); every other case: the tl kernel
    assert wgmma_launches["wgmma"] == (3 if SM90 and kind == "decode" and fmt == "fp8" else 0)
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
def test_indexer_cuda_graph(fmt, select, wgmma_launches):
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
    assert (wgmma_launches["wgmma"] > 0) == (SM90 and fmt == "fp8")


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
    from triton_mla_sparse.capabilities import ARCHS
    from triton_mla_sparse.ops.topk import select_config_for
    from triton_mla_sparse.ops.topk.split_select import launch_split_select

    g = torch.Generator(device="cuda").manual_seed(topk)
    L = 131072 + 77  # a partial last chunk
    x = _adversarial_rows(L, g)
    cfg = select_config_for(ARCHS["sm90"])
    assert cfg.select == "split"
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


# ---------------------------------------------------------------------------- the Gluon wgmma logits kernel (sm90)

STRESS_LENGTHS = (1, 63, 64, 65, 130, 1000, 1023, 1025, 2047, 2049, 4100, 5000)  # around block and chunk edges
BLOCK_BYTES = BS * (D + 4)


def _at_end(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in an allocation of its own (a multiple of 512 bytes, 0xFF = NaN before it) whose last byte is
    the copy's last byte: under compute-sanitizer (PYTORCH_NO_CUDA_MEMORY_CACHING=1) a read past it is reported."""
    t = t.contiguous()
    nbytes = t.numel() * t.element_size()
    n = -(-nbytes // 512) * 512
    buf = torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda")
    view = buf[n - nbytes:].view(t.dtype).view(t.shape)
    view.copy_(t)
    return view


def _stress_case(Hi: int, *, seed: int = 0, block_pad: int = 16, extra_rows: bool = True):
    """vLLM's fp8 cache and decode rows laid out to trip the wgmma kernel, every tensor ending its allocation:
    requests of :data:`STRESS_LENGTHS` tokens (positions not multiples of 64, chunks ending mid-row); table entries
    past each request's blocks garbage (negative, >= num_blocks) and one garbage entry inside the longest request;
    a block stride of 8448 + ``block_pad`` bytes. Every byte the kernel must not read is 0xFF (NaN values, NaN
    scales): blocks nobody references, rows past each request's length, block padding. ``extra_rows``: rows with
    invalid request ids, negative and huge positions, and a row ending mid-request besides the R decode rows.
    Returns (arguments dict, max_len: past the table's capacity, not a multiple of 64)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    R = len(STRESS_LENGTHS)
    n_blk = [-(-n // BS) for n in STRESS_LENGTHS]
    max_blocks = max(n_blk) + 3
    nb = sum(n_blk) + 6
    perm = torch.randperm(nb, generator=g, device="cuda").tolist()
    garbage = [INT32_MAX, -1, nb, INT32_MIN, nb + 7]
    bt = torch.tensor([[garbage[(r + c) % 5] for c in range(max_blocks)] for r in range(R)], dtype=torch.int32)
    used = 0
    for r, k in enumerate(n_blk):
        bt[r, :k] = torch.tensor(perm[used:used + k], dtype=torch.int32)
        used += k
    bt[R - 1, 10] = nb + 100  # a hole inside the longest request: its 64 positions are -inf
    packed = quantize_indexer_cache(torch.randn(nb, BS, D, generator=g, device="cuda"))
    rows_ok = torch.zeros(nb, BS, dtype=torch.bool)  # the rows some request may read
    for r, n in enumerate(STRESS_LENGTHS):
        for c in range(n_blk[r]):
            b = int(bt[r, c])
            if 0 <= b < nb:
                rows_ok[b, :min(BS, n - c * BS)] = True
    dead = (~rows_ok).to("cuda")
    vals = packed[:, :BS * D].view(nb, BS, D)
    vals[dead] = 0xFF
    packed[:, BS * D:].view(nb, BS, 4)[dead] = 0xFF
    stride = BLOCK_BYTES + block_pad
    span = (nb - 1) * stride + BLOCK_BYTES
    n = -(-span // 512) * 512
    buf = torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda")
    cache = buf[n - span:].as_strided((nb, BLOCK_BYTES), (stride, 1))
    cache.copy_(packed)
    req = list(range(R))
    pos = [n - 1 for n in STRESS_LENGTHS]
    if extra_rows:  # the huge position on request 2, whose 64 tokens fill its block (no poisoned row to reach)
        req += [-1, R, INT32_MAX, 2, 9, R - 1]
        pos += [100, 100, 5, INT32_MAX, -1, 3000]
    T = len(req)
    q, qs = quantize_indexer_q(torch.randn(T, Hi, D, generator=g, device="cuda"))
    w = torch.randn(T, Hi, generator=g, device="cuda") * Hi ** -0.5 * qs
    c = dict(q=_at_end(q), weights=_at_end(w.float()), k_cache=cache, block_table=_at_end(bt.to("cuda")),
             req_id_per_token=_at_end(torch.tensor(req, dtype=torch.int32, device="cuda")),
             positions=_at_end(torch.tensor(pos, dtype=torch.int32, device="cuda")))
    return c, max_blocks * BS + 77


def _wgmma_logits(c, max_len, ws=None, **over):
    """Logits of ``c`` through the launch with the wgmma kernel forced (and ``over``), into a NaN-filled output
    ending its allocation; returns (logits, the configuration)."""
    from triton_mla_sparse.ops.indexer import api as I

    p = I.check_indexer_inputs(*args(c))
    cfg = I.choose_indexer_config(p, family="wgmma", **over)
    out = _at_end(torch.full((p.T, max_len), float("nan"), device="cuda"))
    I._launch_logits(p, out, cfg, ws)
    torch.cuda.synchronize()
    return out, cfg


STRESS_CONFIGS = [(16, 4), (1, 2), (3, 3), (8, 5), (32, 2), (5, 8)]  # (chunk_tiles, num_stages)


@sm90_only
@pytest.mark.parametrize("chunk_tiles,stages", STRESS_CONFIGS, ids=[f"ct{c}-s{s}" for c, s in STRESS_CONFIGS])
@pytest.mark.parametrize("Hi", [64, 32, 20])
def test_wgmma_logits_poisoned_cache_garbage_table(Hi, chunk_tiles, stages, wgmma_launches):
    """The wgmma kernel at several chunk lengths and ring depths against the reference: no NaN from the poisoned
    bytes, -inf exactly where the reference has it (past positions and the table, invalid request ids and table
    entries), every column written."""
    c, max_len = _stress_case(Hi, seed=Hi + chunk_tiles)
    out, cfg = _wgmma_logits(c, max_len, chunk_tiles=chunk_tiles, num_stages=stages)
    assert (cfg.family, cfg.chunk_tiles, cfg.num_stages, wgmma_launches["wgmma"]) == ("wgmma", chunk_tiles, stages, 1)
    ref = reference.indexer_logits(*args(c), max_len, compute_dtype=torch.float64)
    assert_close(out, ref, tol=2e-3, what=f"wgmma Hi={Hi} ct={chunk_tiles} stages={stages}")
    R = len(STRESS_LENGTHS)
    assert torch.isneginf(out[R:R + 3]).all() and torch.isneginf(out[R + 4]).all()  # invalid ids, position -1
    assert torch.isneginf(out[R - 1, 640:704]).all()  # the hole in the table


@sm90_only
@pytest.mark.parametrize("Hi", [64, 32, 20])
def test_wgmma_is_the_default_for_decode_rows(Hi, wgmma_launches):
    """Decode-shaped calls of the public functions take the wgmma kernel on the stress layout (padded block stride
    included) and match the reference; top-k through both selects."""
    c, max_len = _stress_case(Hi, seed=3, block_pad=48, extra_rows=False)
    logits = tms.indexer_logits(*args(c), max_len)
    sels = [tms.indexer_topk(*args(c), 300, max_len=max_len, select=s) for s in ("split", "torch")]
    torch.cuda.synchronize()
    assert wgmma_launches["wgmma"] == 3
    ref = reference.indexer_logits(*args(c), max_len, compute_dtype=torch.float64)
    assert_close(logits, ref, tol=2e-3, what=f"default Hi={Hi}")
    for sel in sels:
        check_topk(sel, ref, 300, atol=8e-3)


@sm90_only
@pytest.mark.parametrize("chunk_tiles", [1, 16, 64])
def test_wgmma_zeroes_the_split_workspace(chunk_tiles, wgmma_launches):
    """ZERO_WS: the chunk-0 program of each row zeroes that row of the split select's workspace (one row past T
    untouched), with the logits unchanged."""
    from triton_mla_sparse.ops.topk.split_select import WS_WIDTH

    c, max_len = _stress_case(64, seed=5)
    T = c["positions"].shape[0]
    ws = torch.full((T + 1, WS_WIDTH), -7, dtype=torch.int32, device="cuda")
    out, _ = _wgmma_logits(c, max_len, ws[:T], chunk_tiles=chunk_tiles)
    assert wgmma_launches["wgmma"] == 1
    assert bool((ws[:T] == 0).all()) and bool((ws[T] == -7).all())
    ref = reference.indexer_logits(*args(c), max_len, compute_dtype=torch.float64)
    assert_close(out, ref, tol=2e-3, what=f"logits with the workspace zeroing, ct={chunk_tiles}")


@sm90_only
def test_wgmma_topk_gets_a_zeroed_workspace(wgmma_launches):
    """``indexer_topk`` (split select) leaves zeroing its uninitialised workspace to the wgmma launch: with every
    fresh int32 / float32 allocation poisoned the select still receives zeros and the result matches the
    reference."""
    c, _ = make("decode", 64, "fp8", seed=4)
    ctx = c["block_table"].shape[1] * BS
    with poisoned_allocations_probe_select() as seen:
        sel = tms.indexer_topk(*args(c), TOPK, select="split")
        torch.cuda.synchronize()
    assert seen == [True] and wgmma_launches["wgmma"] == 1
    rows = torch.linspace(0, 63, CHECK_ROWS, device="cuda").long()
    check_topk(sel[rows], reference.indexer_logits(*args(c, rows), ctx), TOPK, atol=8e-3)


@sm90_only
@pytest.mark.parametrize("Hi", [64, 20])
def test_wgmma_cuda_graph_of_the_stress_layout(Hi, wgmma_launches):
    """Capture and replay of ``indexer_topk`` (split select) on the stress layout, then new inputs copied in: the
    replay equals an eager call each time."""
    c, max_len = _stress_case(Hi, seed=6, extra_rows=False)
    c2, _ = _stress_case(Hi, seed=7, extra_rows=False)
    static = {k: v.clone() if k != "k_cache" else v for k, v in c.items()}
    tms.indexer_topk(*args(static), 500, max_len=max_len, select="split")  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = tms.indexer_topk(*args(static), 500, max_len=max_len, select="split")
    for src in (c, c2):
        for k in ("q", "weights", "positions", "block_table"):
            static[k].copy_(src[k])
        static["k_cache"].copy_(src["k_cache"])
        g.replay()
        torch.cuda.synchronize()
        eager = tms.indexer_topk(*args(static), 500, max_len=max_len, select="split")
        assert torch.equal(torch.sort(out, 1).values, torch.sort(eager, 1).values)
    assert wgmma_launches["wgmma"] >= 4


@pytest.mark.memcheck
@sm90_only
def test_wgmma_logits_stay_in_bounds(wgmma_launches):
    """Under compute-sanitizer (benchmarks/memcheck.sh): the stress layout, every tensor ending its allocation
    (the cache's last block included), garbage table entries and request ids; two ring depths, the workspace
    zeroing on, and the reference."""
    from triton_mla_sparse.ops.topk.split_select import WS_WIDTH

    c, max_len = _stress_case(64, seed=8)
    T = c["positions"].shape[0]
    ref = reference.indexer_logits(*args(c), max_len, compute_dtype=torch.float64)
    for n, (ct, st) in enumerate(((16, 4), (3, 2))):
        ws = _at_end(torch.full((T, WS_WIDTH), -7, dtype=torch.int32, device="cuda"))
        out, _ = _wgmma_logits(c, max_len, ws, chunk_tiles=ct, num_stages=st)
        assert wgmma_launches["wgmma"] == n + 1 and bool((ws == 0).all())
        assert_close(out, ref, tol=2e-3, what=f"memcheck ct={ct} stages={st}")

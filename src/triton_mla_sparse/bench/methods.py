"""The methods a case is timed with: a *method factory* ``factory(inputs) -> Prepared`` builds the call once;
``Prepared.fn()`` runs it. ``ours`` and ``torch`` are registered here (:func:`register_method`), the third-party
peers in :mod:`triton_mla_sparse.bench.peers`; :func:`method_applies` says which methods run on a case."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..formats import D_INDEX, D_V, dequantize_fp8_ds_mla, unpack_indexer_cache
from .cases import V4_KV_FORMAT, Case
from .inputs import CaseInputs, IndexerInputs, indexer_args
from .util import short_exc

if TYPE_CHECKING:
    from .peers import Peers

METHOD_KEYS = ("ours", "torch", "page1_triton", "fa3_page1", "flashmla_bf16", "flashmla_fp8", "ours_logits",
               "deepgemm", "deepgemm_topk")
PEER_KEYS = tuple(m for m in METHOD_KEYS if not m.startswith("ours"))
EXTERNAL_PEERS = ("page1_triton", "fa3_page1", "flashmla_bf16", "flashmla_fp8", "deepgemm", "deepgemm_topk")
DEEPGEMM_KEYS = ("deepgemm", "deepgemm_topk")
# Indexer cases: ours = indexer_topk (logits + select), ours_logits = indexer_logits alone, deepgemm = DeepGEMM's
# logits alone, deepgemm_topk = DeepGEMM's logits + torch.topk, torch = plain torch logits + torch.topk. Run order:
INDEXER_METHOD_KEYS = ("ours", "ours_logits", "deepgemm", "deepgemm_topk", "torch")
INDEXER_ONLY = ("ours_logits", "deepgemm", "deepgemm_topk")


class Unsupported(Exception):
    """Raised by a method factory for a case the method cannot run (recorded as an ``error``, not timed)."""


class PeerUnavailable(Exception):
    """Raised by the factory of a peer that could not be loaded (recorded as ``error: not available: ...``)."""


@dataclass
class Prepared:
    """A method's call, built once for a case's inputs."""

    fn: Callable[[], torch.Tensor]  # one call; returns out [rows, heads, 512]
    config: str | None = None
    graphable: bool = True  # can be captured in a CUDA graph
    # Other eager call patterns of the same method, each checked and timed like fn and recorded as ms_<key>
    # (e.g. page1_triton without the scale tensors, as the reference anchors were measured).
    variants: dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict)
    warmup_s: float | None = None  # seconds of a first (compiling) call made while building, when there was one


MethodFactory = Callable[["CaseInputs"], Prepared]
METHODS: dict[str, MethodFactory] = {}


def register_method(name: str) -> Callable[[MethodFactory], MethodFactory]:
    """Decorator: ``@register_method("peer") def build(inputs) -> Prepared``."""
    def deco(factory: MethodFactory) -> MethodFactory:
        METHODS[name] = factory
        return factory
    return deco


def method_applies(name: str, case: Case) -> bool:
    """Whether method ``name`` is run on ``case`` at all (a peer that does not apply is absent from the case).

    ``ours``: every case; ``torch``: every case but DeepSeek-V4's (two caches). ``page1_triton`` and ``fa3_page1``
    (vLLM's FLASH_ATTN_MLA_SPARSE, SM90): bf16 (and fp16, the CPU smoke format) caches, decode and prefill.
    ``flashmla_bf16``: bf16 caches, decode and prefill. ``flashmla_fp8``: fp8_ds_mla caches, decode and prefill
    (prefill through the decode kernel with each row as its own batch entry, as vLLM's fp8 path does), and
    DeepSeek-V4's fp8_ds_mla_v4 decode cases.
    ``ours_logits``, ``deepgemm``, ``deepgemm_topk``: indexer cases only (and no attention peer applies to them).
    ``ours_portable`` (``--emulate``): every attention case."""
    if name == "ours":
        return True
    if name == "torch":  # one cache, no sink: not the DeepSeek-V4 cases
        return case.kv_format != V4_KV_FORMAT
    if name in INDEXER_ONLY:
        return case.kind == "indexer"
    if case.kind not in ("decode", "prefill"):
        return False
    if name == "ours_portable":  # --emulate (triton_mla_sparse.bench.portable): every attention case
        return True
    if name in ("page1_triton", "fa3_page1"):
        return case.kv_format in ("bf16", "fp16")
    if name == "flashmla_bf16":
        return case.kv_format == "bf16"
    if name == "flashmla_fp8":
        return case.kv_format in ("fp8_ds_mla", V4_KV_FORMAT)
    return name in METHODS  # a registered extra method: every case


@register_method("ours")
def _build_ours(inp: CaseInputs) -> Prepared:
    if inp.case.kind == "indexer":
        return _build_ours_indexer(inp)
    from ..ops.sparse_mla import sparse_mla_attention, sparse_mla_attention_with_config

    q, kv, idx, scale, fmt = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, inp.kv_format
    kw = inp.extras()
    out = torch.empty(q.shape[0], q.shape[1], D_V, dtype=q.dtype, device=q.device)
    # One call to learn the configuration the API picks for this shape (also compiles the kernel).
    _, cfg = sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt, out=out, return_config=True, **kw)

    def fn():
        return sparse_mla_attention(q, kv, idx, scale, kv_format=fmt, out=out, **kw)

    return Prepared(fn=fn, config=cfg.describe())


@register_method("torch")
def _build_torch(inp: CaseInputs) -> Prepared:
    """Plain PyTorch: gather the rows, (dequantise fp8_ds_mla to bf16), matmul, softmax, matmul in q's dtype.
    Indexer cases: :func:`_build_torch_indexer`."""
    if inp.case.kind == "indexer":
        return _build_torch_indexer(inp)
    q, kv, idx, scale, fmt = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, inp.kv_format
    if not kv.is_contiguous():
        raise Unsupported("torch method needs a contiguous cache")
    flat = kv.reshape(-1, kv.shape[-1])
    num_slots = flat.shape[0]

    def fn():
        i = idx.long()
        valid = (i >= 0) & (i < num_slots)
        rows = flat[torch.where(valid, i, torch.zeros_like(i))]  # [T, k, row]
        if fmt == "fp8_ds_mla":
            k = dequantize_fp8_ds_mla(rows).to(q.dtype)
        else:
            k = rows.to(q.dtype)
        s = torch.matmul(q, k.transpose(1, 2)) * scale  # [T, H, k]
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, k[..., :D_V])

    return Prepared(fn=fn, config="gather+matmul+softmax")


def _indexer_config_str(inp: IndexerInputs, what: str) -> str:
    try:
        from ..ops.indexer.api import check_indexer_inputs
        from ..ops.indexer.configs import choose_indexer_config

        cfg = choose_indexer_config(check_indexer_inputs(*indexer_args(inp)))
    except Exception as e:  # noqa: BLE001 - the call itself reports real problems
        return f"{what} (config: {short_exc(e, 60)})"
    g = lambda k: getattr(cfg, k, "?")  # noqa: E731 - the config's fields move with the kernel's tuning
    chunk = f"x{cfg.chunk_tiles}" if hasattr(cfg, "chunk_tiles") else ""
    family = "" if g("family") in ("tl", "?") else f" {g('family')}"
    return (f"{what}{family} bh{g('block_h')} bk{g('block_k')}{chunk} w{g('num_warps')} st{g('num_stages')}"
            + (" fp8dot" if getattr(cfg, "use_fp8_dot", False) else "")
            + f" sel-{g('select')}")


def _build_ours_indexer(inp: IndexerInputs) -> Prepared:
    """``indexer_topk``: the logits kernel into a float32 workspace, then the radix select, into a preallocated
    int32 ``[rows, topk]`` (the call vLLM would make per layer)."""
    from ..ops.indexer import indexer_topk

    args, topk, L = indexer_args(inp), inp.case.topk, inp.max_len
    out = torch.empty(inp.case.rows, topk, dtype=torch.int32, device=inp.device)

    def fn():
        return indexer_topk(*args, topk, max_len=L, out=out)

    return Prepared(fn=fn, config=_indexer_config_str(inp, "indexer_topk"))


@register_method("ours_logits")
def _build_ours_logits(inp: IndexerInputs) -> Prepared:
    """``indexer_logits`` alone: float32 ``[rows, ctx]`` (allocated per call, as DeepGEMM allocates its output)."""
    from ..ops.indexer import indexer_logits

    if inp.case.kind != "indexer":
        raise Unsupported("ours_logits is the indexer logits kernel (indexer cases only)")
    args, L = indexer_args(inp), inp.max_len

    def fn():
        return indexer_logits(*args, L)

    return Prepared(fn=fn, config=_indexer_config_str(inp, "indexer_logits"))


def invalid_columns(inp: IndexerInputs) -> torch.Tensor | None:
    """bool ``[rows, max_len]``: columns past each row's position (None when every column is a candidate)."""
    cols = torch.arange(inp.max_len, device=inp.device)
    mask = cols[None, :] > inp.positions.long()[:, None]
    return mask if bool(mask.any()) else None


def topk_positions(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """torch.topk of each row, -1 where the value is -inf (not a candidate) or past the row's width. Unsorted: the
    contract leaves the order free, and unsorted is faster (benchmarks/NOTES.md)."""
    k = min(topk, logits.shape[1])
    vals, idx = torch.topk(logits, k, dim=1, sorted=False)
    idx = idx.masked_fill(torch.isneginf(vals), -1)
    if k < topk:
        idx = torch.cat([idx, idx.new_full((idx.shape[0], topk - k), -1)], 1)
    return idx


def _build_torch_indexer(inp: IndexerInputs) -> Prepared:
    """Plain PyTorch indexer: gather the requests' cache blocks through the block table, e4m3 -> bf16 (exact), bf16
    ``q · kᵀ`` (fp32 accumulation) in row chunks of <= 1 GB of scores, × the token scales, relu, the weighted head
    sum as a bf16 matmul, -inf past each row's position, then ``torch.topk``. The variant ``logits`` (recorded as
    ``ms_logits``) stops before the top-k. Rows must either all belong to request 0 (prefill: one K shared by every
    row) or be one row per request in order (decode)."""
    c = inp.case
    T, Hi = inp.q.shape[:2]
    L, topk = inp.max_len, c.topk
    R = inp.block_table.shape[0]
    req = inp.req_id_per_token.tolist()
    if R == 1 and all(r == 0 for r in req):
        shared = True
    elif R == T and req == list(range(T)):
        shared = False
    else:
        raise Unsupported("the torch indexer handles one request shared by all rows, or one row per request")
    vals, scales = unpack_indexer_cache(inp.k_cache)  # e4m3 [nb, bs, 128], float32 [nb, bs]: once, outside the call
    vals_u8 = vals.view(torch.uint8)  # gathered as bytes
    bt = inp.block_table.long()
    invalid = invalid_columns(inp)
    chunk = max(1, (1 << 30) // (Hi * L * 2))
    q, w = inp.q, inp.weights

    def logits():
        kv = vals_u8[bt].reshape(R, L, D_INDEX).view(torch.float8_e4m3fn).to(torch.bfloat16)
        ks = scales[bt].reshape(R, L).to(torch.bfloat16)
        qb, wb = q.to(torch.bfloat16), w.to(torch.bfloat16)
        out = torch.empty(T, L, dtype=torch.float32, device=q.device)
        for t0 in range(0, T, chunk):
            t1 = min(T, t0 + chunk)
            if shared:
                s = torch.matmul(qb[t0:t1], kv[0].t())  # [t, Hi, L]
                s.mul_(ks[0])
            else:
                s = torch.matmul(qb[t0:t1], kv[t0:t1].transpose(1, 2))
                s.mul_(ks[t0:t1, None, :])
            s.relu_()
            out[t0:t1] = torch.matmul(wb[t0:t1, None, :], s)[:, 0]
            del s
        if invalid is not None:
            out.masked_fill_(invalid, float("-inf"))
        return out

    def fn():
        return topk_positions(logits(), topk)

    return Prepared(fn=fn, config="gather+bf16 matmul+relu+w-sum+torch.topk", variants={"logits": logits})


def method_factories(peers: Peers | None) -> dict[str, MethodFactory]:
    """Factories for every method key: the registered ones (``ours``, ``torch``, extras) and the peers; a peer that
    is not loaded gets a factory that raises :class:`PeerUnavailable` with its status."""
    from .peers import PEER_BUILDERS

    facs: dict[str, MethodFactory] = dict(METHODS)
    modules, status = (peers.modules, peers.status) if peers is not None else ({}, {})
    for name, (key, builder) in PEER_BUILDERS.items():
        mod = modules.get(key)
        if mod is not None:
            facs[name] = (lambda inp, _b=builder, _m=mod: _b(_m, inp))
        else:
            reason = status.get(name, "not available: not loaded")

            def unavailable(inp, _r=reason):
                raise PeerUnavailable(_r)

            unavailable.unavailable = True
            facs[name] = unavailable
    return facs

"""Test fixtures shared by the tests, the benchmark, ``check`` and ``demo``: one copy of each.

* paged layouts: :func:`random_block_table`, :func:`place` (the cache tensor layouts the API accepts),
  :func:`place_v4` (DeepSeek-V4 pages in the views vLLM, FlashMLA and vLLM's writer use);
* slot lists: :func:`random_topk_positions` (distinct, optionally causal), turned into slots by
  :func:`triton_mla_sparse.topk_to_slots`;
* cache encoders: :func:`encode_cache` for every attention format (:func:`v4_values` gives DeepSeek-V4 rows whose
  scale groups differ), :func:`triton_mla_sparse.formats.
  quantize_indexer_cache` for vLLM's fp8 indexer cache and :func:`quantize_indexer_q` for its e4m3 queries;
* whole problems: :func:`sparse_mla_inputs` (paged decode or prefill attention), :func:`v4_decode_inputs`
  (DeepSeek-V4 decode over its two caches) and :func:`indexer_inputs`;
* comparisons: :func:`rel_err` and :func:`assert_close` (identical inf/NaN positions first), :func:`nan_filled`
  for outputs that must be overwritten.

Everything here is plain torch (no triton import, no CUDA until a tensor is made on a GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .formats import (ALL_KV_FORMATS, D_INDEX, D_QK, D_ROPE, D_V, D_V4, FP8_DS_MLA_ROPE_OFFSET, FP8_DS_MLA_TILE,
                      FP8_DS_MLA_V4, FP8_E4M3_MAX, INDEXER_ROW_BYTES, KV_FORMAT_DTYPES, V4_NOPE, V4_QUANT_BLOCK,
                      V4_TOKEN_BYTES, kv_row_width, quantize_fp8_ds_mla, quantize_fp8_ds_mla_v4, quantize_indexer_cache,
                      v4_token_view)

__all__ = [
    "OUTPUT_TOLERANCE",
    "DSV32_SOFTMAX_SCALE",
    "DSV4_SOFTMAX_SCALE",
    "GLM5_SOFTMAX_SCALE",
    "LAYOUTS",
    "V4_LAYOUTS",
    "IndexerInputs",
    "SparseMLAInputs",
    "V4DecodeInputs",
    "assert_close",
    "encode_cache",
    "indexer_inputs",
    "kv_values",
    "nan_filled",
    "place",
    "place_v4",
    "quantize_indexer_q",
    "random_block_table",
    "random_topk_positions",
    "rel_err",
    "sparse_mla_inputs",
    "sparse_mla_unique_bytes",
    "take_rows",
    "v4_decode_inputs",
    "v4_values",
]

# Relative L2 error an attention output in q's dtype may have against the float32 reference (check, demo).
OUTPUT_TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 3e-3}
GLM5_SOFTMAX_SCALE = 256 ** -0.5  # GLM-5: softmax scale of its 256-wide qk heads before absorption
DSV32_SOFTMAX_SCALE = 192 ** -0.5  # DeepSeek-V3.2: 192-wide qk heads
DSV4_SOFTMAX_SCALE = 512 ** -0.5  # DeepSeek-V4: its 512-wide qk heads (vLLM's deepseek_v4 attention scale)
TILE_GAIN = (1.0, 0.25, 2.0, 0.5)  # magnitude of each 128-wide latent tile: a wrong fp8_ds_mla tile scale shows
V4_GROUP_GAIN = (1.0, 0.25, 4.0, 0.5, 2.0, 0.125, 8.0)  # each 64-value NoPE group of a V4 row: a wrong scale shows


# ----------------------------------------------------------------------------------------------- paged layouts

def random_block_table(num_requests: int, blocks_per_request: int, device: torch.device | str, *,
                       pool_blocks: int | None = None) -> torch.Tensor:
    """int32 ``[num_requests, blocks_per_request]``: each request's blocks taken in turn from a random permutation of
    a pool of ``pool_blocks`` (default: exactly enough) blocks, so a request's pages are scattered over the pool."""
    need = num_requests * blocks_per_request
    pool = need if pool_blocks is None else pool_blocks
    if pool < need:
        raise ValueError(f"pool_blocks: expected at least {need}, got {pool}")
    perm = torch.randperm(pool, device=device)[:need]
    return perm.view(num_requests, blocks_per_request).to(torch.int32)


def nan_filled(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A tensor whose every element is NaN: all bytes 0xFF (for uint8 caches that makes NaN scales, e4m3 and bf16
    values too), so a kernel that leaves an element unwritten, or reads a byte it should not, shows."""
    esize = torch.empty((), dtype=dtype).element_size()
    *lead, last = shape
    return torch.full((*lead, last * esize), 0xFF, dtype=torch.uint8, device=device).view(dtype)


LAYOUTS = ("3d", "4d", "flat", "padded", "flat_padded")


def place(stored: torch.Tensor, layout: str) -> torch.Tensor:
    """Put stored rows ``[nb, bs, row]`` into a cache tensor of the given layout, on stored's device.

    "3d" ``[nb, bs, row]`` contiguous; "4d" ``[nb, bs, 1, row]``; "flat" ``[nb·bs, row]``; "padded": a ``[nb, bs,
    row]`` view of a NaN-filled buffer with 3 spare rows per block, 16 spare elements per row and one spare leading
    block (block stride > block_size · row, row stride > row, non-zero storage offset); "flat_padded": a ``[nb·bs,
    row]`` view with spare elements per row and a spare leading row. Slot ids are the same in every layout.
    """
    nb, bs, row = stored.shape
    if layout == "3d":
        return stored.contiguous()
    if layout == "4d":
        return stored.contiguous().unsqueeze(2)
    if layout == "flat":
        return stored.reshape(nb * bs, row).contiguous()
    if layout == "padded":
        view = nan_filled((nb + 1, bs + 3, row + 16), stored.dtype, stored.device)[1:, :bs, :row]
        view.copy_(stored)
        return view
    if layout == "flat_padded":
        view = nan_filled((nb * bs + 1, row + 16), stored.dtype, stored.device)[1:, :row]
        view.copy_(stored.reshape(nb * bs, row))
        return view
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


V4_LAYOUTS = ("vllm", "flashmla", "writer", "padded")


def place_v4(pages: torch.Tensor, block_size: int, layout: str) -> torch.Tensor:
    """DeepSeek-V4 pages (uint8 ``[nb, v4_page_bytes(block_size)]``, :func:`~triton_mla_sparse.formats.
    quantize_fp8_ds_mla_v4`) as a cache tensor of the given layout, on pages' device; slot ids are the same in all.

    "writer" ``[nb, block_size · 584]`` (vLLM's writer's view, the page stride apart); "vllm" ``[nb, block_size,
    584]`` (the view vLLM holds, :func:`~triton_mla_sparse.formats.v4_token_view`); "flashmla" ``[nb, block_size, 1,
    584]`` (what vLLM hands FlashMLA); "padded": the vLLM view over a buffer of all-0xFF bytes (NaN in e4m3 and bfloat16, an infinite
    scale in a footer) with a spare leading page and two spare rows' worth of bytes after each page, the page's own
    padding 0xFF too: only each page's first ``block_size · 584`` bytes hold data, so a read of anything else shows.
    """
    nb, width = pages.shape
    if layout == "writer":
        return pages.contiguous()[:, :block_size * V4_TOKEN_BYTES]
    if layout == "vllm":
        return v4_token_view(pages.contiguous(), block_size)
    if layout == "flashmla":
        return v4_token_view(pages.contiguous(), block_size).unsqueeze(2)
    if layout == "padded":
        used = block_size * V4_TOKEN_BYTES
        buf = torch.full((nb + 1, width + 2 * 576), 0xFF, dtype=torch.uint8, device=pages.device)[1:]
        buf[:, :used] = pages[:, :used]
        return v4_token_view(buf, block_size)
    raise ValueError(f"layout: expected one of {V4_LAYOUTS}, got {layout!r}")


# ----------------------------------------------------------------------------------------------- slot lists

def random_topk_positions(rows: int, ctx: int, topk: int, device: torch.device | str, *,
                          row_positions: torch.Tensor | None = None, chunk: int = 1024) -> torch.Tensor:
    """int32 ``[rows, topk]`` distinct request-local positions per row, in random order. With ``row_positions``
    (the position of each query row) a row only picks positions ``<= row_positions[t]`` (causal; a row must see at
    least ``topk`` tokens)."""
    if topk > ctx:
        raise ValueError(f"topk: expected at most ctx = {ctx}, got {topk}")
    if row_positions is not None and rows and int(row_positions[:rows].min()) + 1 < topk:
        raise ValueError(f"row_positions: every row must see at least topk = {topk} tokens, got a row at position "
                         f"{int(row_positions[:rows].min())}")
    out = torch.empty(rows, topk, dtype=torch.int32, device=device)
    cols = torch.arange(ctx, device=device)
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        key = torch.rand(r1 - r0, ctx, device=device)
        if row_positions is not None:
            key = key.masked_fill(cols[None, :] > row_positions[r0:r1, None], -1.0)
        out[r0:r1] = key.topk(topk, dim=1).indices.to(torch.int32)
    return out


# ----------------------------------------------------------------------------------------------- cache encoders

def kv_values(n: int, d_qk: int = D_QK, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Realistic cache row values float32 ``[n, d_qk]``: tile-wise magnitudes (:data:`TILE_GAIN`) and a random
    per-row gain, so per-tile fp8 scales differ within a row."""
    x = torch.randn(n, d_qk, generator=generator)
    for c, g in enumerate(TILE_GAIN):
        x[:, FP8_DS_MLA_TILE * c:FP8_DS_MLA_TILE * (c + 1)] *= g
    x *= torch.empty(n, 1).uniform_(-0.5, 0.5, generator=generator).exp()
    return x


def v4_values(num_blocks: int, block_size: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Realistic DeepSeek-V4 cache rows float32 ``[num_blocks, block_size, 512]``: each 64-value NoPE group its own
    magnitude (:data:`V4_GROUP_GAIN`, so the seven UE8M0 scales of a row differ), RoPE values ~ N(0, 1), and a random
    per-row gain."""
    x = torch.randn(num_blocks * block_size, D_V4, generator=generator)
    for g, gain in enumerate(V4_GROUP_GAIN):
        x[:, V4_QUANT_BLOCK * g:V4_QUANT_BLOCK * (g + 1)] *= gain
    x[:, :V4_NOPE] *= torch.empty(x.shape[0], 1).uniform_(-0.5, 0.5, generator=generator).exp()
    return x.reshape(num_blocks, block_size, D_V4)


def encode_cache(values: torch.Tensor, kv_format: str, *, scale_format: str = "pow2",
                 k_scale: float | None = None) -> tuple[torch.Tensor, float | None]:
    """Store real ``values [..., d_qk]`` (d_qk 576, or 512 for NoPE) in ``kv_format``: returns ``(stored, k_scale)``,
    ``k_scale`` the per-tensor scale of ``fp8_e4m3`` and None for the other formats.

    ``fp8_e4m3`` stores ``values / k_scale`` clamped to ±448; ``k_scale`` defaults to ``amax / 400`` (not a power of
    two; 1.0 for empty values), or is the given one (only ``fp8_e4m3`` takes one). ``fp8_ds_mla`` with 512-wide
    values stores NaN bytes as the 64 rope values: a NoPE kernel must never read them. Empty values give an empty
    cache of the format's row width. ``fp8_ds_mla_v4`` takes ``values [num_blocks, block_size, 512]`` (DeepSeek-V4
    rows, the RoPE values their last 64) and returns vLLM's ``[num_blocks, block_size, 584]`` view of the pages
    (:func:`~triton_mla_sparse.formats.quantize_fp8_ds_mla_v4`; other views: :func:`place_v4`).
    """
    if k_scale is not None and kv_format != "fp8_e4m3":
        raise ValueError(f"k_scale: only the 'fp8_e4m3' format has a per-tensor scale, got kv_format {kv_format!r}")
    if kv_format == "bf16":
        return values.to(torch.bfloat16), None
    if kv_format == "fp16":
        return values.to(torch.float16), None
    if kv_format == "fp8_e4m3":
        if k_scale is None:
            k_scale = float(values.abs().max()) / 400.0 + 1e-6 if values.numel() else 1.0
        return (values.float() / k_scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn), k_scale
    if kv_format == "fp8_ds_mla":
        if values.shape[-1] == D_V:
            full = torch.cat([values, values.new_zeros(*values.shape[:-1], D_ROPE)], dim=-1)
            packed = quantize_fp8_ds_mla(full, scale_format=scale_format)
            packed[..., FP8_DS_MLA_ROPE_OFFSET:] = 0xFF
            return packed, None
        return quantize_fp8_ds_mla(values, scale_format=scale_format), None
    if kv_format == FP8_DS_MLA_V4:
        if values.dim() != 3 or values.shape[-1] != D_V4:
            raise ValueError(f"values: expected [num_blocks, block_size, {D_V4}] for kv_format {kv_format!r}, got "
                             f"shape {tuple(values.shape)}")
        return v4_token_view(quantize_fp8_ds_mla_v4(values), values.shape[1]), None
    raise ValueError(f"kv_format: expected one of {ALL_KV_FORMATS}, got {kv_format!r}")


def quantize_indexer_q(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexer queries ``[T, Hi, 128]`` -> (float8_e4m3fn ``[T, Hi, 128]``, float32 scales ``[T, Hi]``), one scale
    ``amax / 448`` per (row, head); vLLM folds the scales into the indexer weights."""
    scale = (q.float().abs().amax(-1) / FP8_E4M3_MAX).clamp_min(1e-8)
    q8 = (q.float() / scale[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q8, scale


# ----------------------------------------------------------------------------------------------- whole problems

@dataclass
class SparseMLAInputs:
    """The arguments of one paged sparse-MLA problem."""

    q: torch.Tensor  # [rows, heads, 576] (512 for fp8_ds_mla_v4)
    kv_cache: torch.Tensor  # [num_blocks, block_size, row] in kv_format (fp8_ds_mla_v4: vLLM's view of the pages)
    indices: torch.Tensor  # int32 [rows, topk] global slots
    block_table: torch.Tensor  # int32 [requests, ctx / block_size]
    kv_format: str
    k_scale: float | None

    @property
    def unique_rows(self) -> int:
        """Distinct cache rows referenced by all slot lists together."""
        return int(torch.unique(self.indices[self.indices >= 0]).numel())

    @property
    def unique_bytes(self) -> int:
        """:func:`sparse_mla_unique_bytes` of this problem."""
        return sparse_mla_unique_bytes(self.kv_format, self.unique_rows, self.q)


def sparse_mla_unique_bytes(kv_format: str, unique_rows: int, q: torch.Tensor) -> int:
    """Bytes a perfect sparse-MLA kernel moves: each referenced cache row once, q ``[T, H, d]`` read once and the
    ``[T, H, 512]`` output (q's dtype) written once: the numerator of a GB/s figure."""
    row_bytes = kv_row_width(kv_format) * KV_FORMAT_DTYPES[kv_format].itemsize
    return unique_rows * row_bytes + q.numel() * q.element_size() + q.shape[0] * q.shape[1] * D_V * q.element_size()


def _seeded_block_table(requests: int, ctx: int, block_size: int, device: torch.device | str,
                        seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    if ctx % block_size:
        raise ValueError(f"ctx {ctx} must be a multiple of block_size {block_size}")
    return random_block_table(requests, ctx // block_size, device)


def sparse_mla_inputs(kind: str, *, rows: int, heads: int, ctx: int, topk: int, requests: int, block_size: int = 64,
                      kv_format: str = "bf16", q_dtype: torch.dtype = torch.bfloat16, scale_format: str = "pow2",
                      device: torch.device | str = "cpu", seed: int = 0) -> SparseMLAInputs:
    """Random paged sparse-MLA inputs (seeds torch's generator with ``seed``): every request owns ``ctx / block_size``
    blocks scattered over the pool, cache values ~ N(0, 1), q ~ N(0, 1).

    ``kind="decode"``: one row per request (``rows == requests``), each picking ``topk`` distinct positions of its
    request. ``kind="prefill"``: one request, rows at its last ``rows`` positions, each picking ``topk`` distinct
    positions at or before its own (causal; every row must see at least ``topk`` tokens). ``fp8_ds_mla_v4``:
    DeepSeek-V4's shapes, q and cache rows 512 wide (the cache in vLLM's view, :func:`encode_cache`).
    """
    device = torch.device(device)
    block_table = _seeded_block_table(requests, ctx, block_size, device, seed)
    d_qk = D_V4 if kv_format == FP8_DS_MLA_V4 else D_QK
    values = torch.randn(requests * (ctx // block_size), block_size, d_qk, dtype=torch.bfloat16, device=device)
    kv_cache, k_scale = encode_cache(values, kv_format, scale_format=scale_format)
    del values
    if kind == "decode":
        if rows != requests:
            raise ValueError(f"rows: decode has one row per request ({requests}), got {rows}")
        req = torch.arange(rows, dtype=torch.int32, device=device)
        positions = random_topk_positions(rows, ctx, topk, device)
    elif kind == "prefill":
        if requests != 1 or rows > ctx or ctx - rows + 1 < topk:
            raise ValueError("prefill: one request; rows at its last positions must each see >= topk tokens")
        req = torch.zeros(rows, dtype=torch.int32, device=device)
        row_pos = torch.arange(ctx - rows, ctx, device=device)
        positions = random_topk_positions(rows, ctx, topk, device, row_positions=row_pos)
    else:
        raise ValueError(f"kind: expected 'decode' or 'prefill', got {kind!r}")
    from . import topk_to_slots

    indices = topk_to_slots(positions, req, block_table, block_size)
    del positions
    q = torch.randn(rows, heads, d_qk, dtype=q_dtype, device=device)
    return SparseMLAInputs(q=q, kv_cache=kv_cache, indices=indices, block_table=block_table, kv_format=kv_format,
                           k_scale=k_scale)


@dataclass
class V4DecodeInputs:
    """The arguments of one DeepSeek-V4 decode problem over its two caches (both ``fp8_ds_mla_v4``, vLLM's view)."""

    q: torch.Tensor  # [rows, heads, 512]
    kv_cache: torch.Tensor  # the sliding-window cache
    indices: torch.Tensor  # int32 [rows, window]: each row's window slots (the main list)
    block_table: torch.Tensor  # int32 [requests, blocks]: the compressed cache's block table
    unique_rows: int  # distinct cache rows referenced (both caches)
    topk_length: torch.Tensor  # int32 [rows]
    attn_sink: torch.Tensor  # float32 [heads]
    extra_kv_cache: torch.Tensor  # the compressed cache
    extra_indices: torch.Tensor  # int32 [rows, extra_topk]
    extra_topk_length: torch.Tensor  # int32 [rows]


def v4_decode_inputs(*, rows: int, heads: int, ctx: int, window: int, extra_topk: int, block_size: int = 64,
                     q_dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
                     seed: int = 0) -> V4DecodeInputs:
    """Random DeepSeek-V4 decode inputs, a compressed-attention layer as vLLM's FlashMLA path sees it (seeds
    torch's generator with ``seed``): one row per request; request r's last ``window`` tokens in the sliding-window
    cache (``ceil(window / block_size)`` blocks of its own) and its ``ctx // 4`` compressed entries in the
    compressed cache (blocks scattered over the pool), rows :func:`v4_values`; the main list is the window in token
    order, the extra list ``extra_topk`` distinct random compressed entries; full lengths; q ~ N(0, 1), a sink ~ N(0,
    1) per head."""
    device = torch.device(device)
    n_comp = ctx // 4
    if window < 1 or extra_topk < 1 or n_comp < extra_topk:
        raise ValueError(f"window ({window}) and extra_topk ({extra_topk}) must be >= 1, extra_topk <= ctx // 4 "
                         f"({n_comp})")
    g = torch.Generator().manual_seed(seed)
    swa_blocks = -(-window // block_size)
    swa_table = torch.randperm(rows * swa_blocks, generator=g).view(rows, swa_blocks).to(torch.int32)
    swa = v4_values(rows * swa_blocks, block_size, generator=g)
    comp_table = _seeded_block_table(rows, -(-n_comp // block_size) * block_size, block_size, "cpu", seed)
    comp = v4_values(rows * comp_table.shape[1], block_size, generator=g)
    from . import topk_to_slots

    req = torch.arange(rows, dtype=torch.int32)
    win = torch.arange(window, dtype=torch.int32).expand(rows, window).contiguous()
    indices = topk_to_slots(win, req, swa_table, block_size)
    extra = topk_to_slots(random_topk_positions(rows, n_comp, extra_topk, "cpu"), req, comp_table, block_size)
    q = torch.randn(rows, heads, D_V4, generator=g)
    sink = torch.randn(heads, generator=g)
    enc = lambda v: encode_cache(v.to(device), FP8_DS_MLA_V4)[0]  # noqa: E731
    lens = lambda n: torch.full((rows,), n, dtype=torch.int32, device=device)  # noqa: E731
    return V4DecodeInputs(q=q.to(device=device, dtype=q_dtype), kv_cache=enc(swa), indices=indices.to(device),
                          block_table=comp_table.to(device), unique_rows=rows * (window + extra_topk),
                          topk_length=lens(window), attn_sink=sink.to(device), extra_kv_cache=enc(comp),
                          extra_indices=extra.to(device), extra_topk_length=lens(extra_topk))


@dataclass
class IndexerInputs:
    """The arguments of one DSA-indexer problem, in the layout vLLM hands to its indexer."""

    q: torch.Tensor  # float8_e4m3fn [rows, Hi, 128] (per-(row, head) scales folded into weights, as vLLM does)
    weights: torch.Tensor  # float32 [rows, Hi]
    k_cache: torch.Tensor  # uint8 [num_blocks, block_size · 132]: vLLM's fp8 indexer layout
    block_table: torch.Tensor  # int32 [requests, ctx / block_size]
    req_id_per_token: torch.Tensor  # int32 [rows]
    positions: torch.Tensor  # int32 [rows]: row t scores request-local tokens 0 .. positions[t]


def indexer_inputs(phase: str, *, rows: int, heads: int, ctx: int, requests: int, block_size: int = 64,
                   device: torch.device | str = "cpu", seed: int = 0) -> IndexerInputs:
    """Random indexer inputs (seeds torch's generator with ``seed``): cache tokens of varied magnitude in blocks
    handed to the requests from a random permutation of the pool; q quantised to e4m3 per (row, head) with the scale
    folded into the weights (vLLM's convention); weights ~ N(0, 1/Hi). ``phase="decode"``: request r's only row sits
    at position ctx - 1; ``"prefill"``: rows at positions ctx - rows .. ctx - 1 of request 0."""
    device = torch.device(device)
    block_table = _seeded_block_table(requests, ctx, block_size, device, seed)
    nb = requests * (ctx // block_size)
    k_cache = torch.empty(nb, block_size * INDEXER_ROW_BYTES, dtype=torch.uint8, device=device)
    step = max(1, (1 << 25) // (block_size * D_INDEX))  # in pieces: a float32 copy of a 1 GB cache is 4 GB
    for b0 in range(0, nb, step):
        b1 = min(nb, b0 + step)
        vals = torch.randn(b1 - b0, block_size, D_INDEX, device=device)
        vals *= torch.empty(b1 - b0, block_size, 1, device=device).uniform_(0.25, 2.0)
        k_cache[b0:b1] = quantize_indexer_cache(vals)
    if phase == "decode":
        if rows != requests:
            raise ValueError(f"rows: indexer decode has one row per request ({requests}), got {rows}")
        req = torch.arange(rows, dtype=torch.int32, device=device)
        positions = torch.full((rows,), ctx - 1, dtype=torch.int32, device=device)
    elif phase == "prefill":
        if requests != 1 or rows > ctx:
            raise ValueError("indexer prefill: one request, rows <= ctx")
        req = torch.zeros(rows, dtype=torch.int32, device=device)
        positions = torch.arange(ctx - rows, ctx, dtype=torch.int32, device=device)
    else:
        raise ValueError(f"phase: expected 'decode' or 'prefill', got {phase!r}")
    q, q_scale = quantize_indexer_q(torch.randn(rows, heads, D_INDEX, device=device))
    weights = (torch.randn(rows, heads, device=device) * heads ** -0.5 * q_scale).float().contiguous()
    return IndexerInputs(q=q, weights=weights, k_cache=k_cache, block_table=block_table, req_id_per_token=req,
                         positions=positions)


# ----------------------------------------------------------------------------------------------- comparisons

def take_rows(x: torch.Tensor | tuple | None, rows: torch.Tensor | None) -> torch.Tensor | tuple | None:
    """``x[rows]`` for a tensor, element-wise for a tuple (a split q), ``x`` itself when x or rows is None: the
    same subset of rows of every argument, to check a large problem on a sample."""
    if x is None or rows is None:
        return x
    if isinstance(x, tuple):
        return tuple(take_rows(y, rows) for y in x)
    return x[rows]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖x − ref‖ / ‖ref‖`` in float64 over tensors of one shape: inf when either holds a non-finite value (compare
    finite parts with :func:`assert_close`), 0 when both are 0, inf when only ref is 0."""
    if x.shape != ref.shape:
        raise ValueError(f"x: expected the shape of ref {tuple(ref.shape)}, got {tuple(x.shape)}")
    x, ref = x.double(), ref.double()
    if not (torch.isfinite(x).all() and torch.isfinite(ref).all()):
        return math.inf
    num, den = (x - ref).norm().item(), ref.norm().item()
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den


def _where(mask: torch.Tensor) -> list:
    return mask.nonzero()[:5].tolist()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, tol: float | None = None,
                 atol: float | None = None, what: str = "") -> float:
    """``actual`` against ``expected``: same shape; NaN, +inf and -inf at exactly the same positions; then over the
    finite positions the relative L2 error (:func:`rel_err`) at most ``tol`` and the largest absolute difference at
    most ``atol`` (at least one of the two must be given). Returns the relative error of the finite part."""
    if tol is None and atol is None:
        raise ValueError("tol, atol: expected at least one tolerance, got neither")
    a, e = actual.detach().cpu(), expected.detach().cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != expected {tuple(e.shape)}"
    if a.is_floating_point() or e.is_floating_point():
        a, e = a.double(), e.double()
        for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
            ma, me = test(a), test(e)
            assert torch.equal(ma, me), \
                f"{what}: {name} positions differ: actual {_where(ma & ~me)} not expected, expected {_where(me & ~ma)}"
        fin = torch.isfinite(e)
        a, e = a[fin], e[fin]
    err = rel_err(a, e)
    if tol is not None:
        assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"
    if atol is not None and a.numel():
        d = (a - e).abs().max().item()
        assert d <= atol, f"{what}: max abs error {d:.3e} > {atol:.1e}"
    return err

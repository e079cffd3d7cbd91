"""KV-cache row formats for absorbed MLA.

Every cache row holds one token's latent (``D_V = 512`` values, also used as V) followed by its RoPE key part
(``D_ROPE = 64`` values, or none for NoPE models):

========== ====================== ==============================================================================
format      torch dtype / row      layout of one row
========== ====================== ==============================================================================
``bf16``    bfloat16 × D_qk        ``[latent 512 | rope 64]``
``fp16``    float16 × D_qk         ``[latent 512 | rope 64]``
``fp8_e4m3`` float8_e4m3fn × D_qk  ``[latent 512 | rope 64]``; real value = stored · ``k_scale`` (one per layer)
``fp8_ds_mla`` uint8 × 656         bytes 0–511: 512 e4m3 latent values; 512–527: four float32 scales, scale i
                                   covers latent values [128·i, 128·i + 128); 528–655: 64 bfloat16 rope values
========== ====================== ==============================================================================

DeepSeek-V4 (one 512-wide row per token: 448 NoPE values, then 64 RoPE values, all of it also V) stores its fp8
cache in pages (vLLM's ``fp8_ds_mla`` for V4, FlashMLA's "MODEL1", 584 bytes per token): per page of ``block_size``
tokens, ``block_size`` rows of 576 bytes (448 e4m3 values, then the 64 RoPE values as bfloat16), then a footer of
``block_size`` × 8 bytes (7 UE8M0 exponents, one per 64 NoPE values, scale = 2^(byte − 127), and a zero byte), the
page padded with zeros to a multiple of 576 bytes (:func:`quantize_fp8_ds_mla_v4`, :func:`v4_page_bytes`). The
attention kernels read it in place as kv_format ``"fp8_ds_mla_v4"`` (:data:`PAGED_KV_FORMATS`: a token is not a row
of its own, so the format is never inferred from the dtype and must be named). vLLM holds such a cache as the uint8
view ``[num_blocks, block_size, 584]`` (strides ``(block stride, 584, 1)``: the page's bytes, not its rows;
:func:`v4_token_view`), hands FlashMLA ``[num_blocks, block_size, 1, 584]`` and its writer ``[num_blocks,
block_size · 584]`` (the same bytes; the page's padding is in none of them). The e4m3 bytes are OCP e4m3 (vLLM's
window cache on gfx942 is FNUZ e4m3 instead: another encoding, which the kernels do not read).

The DSA indexer reads its own cache, vLLM's fp8 indexer layout: per block of ``block_size`` tokens, the
``block_size · 128`` e4m3 key values (token-major) followed by ``block_size`` float32 scales (``amax / 448`` per
token), ``INDEXER_ROW_BYTES = 132`` bytes per token in all (:func:`quantize_indexer_cache`).
"""

from __future__ import annotations

import torch

D_V = 512
D_ROPE = 64
D_QK = D_V + D_ROPE
FP8_DS_MLA_TILE = 128
FP8_DS_MLA_TILES = D_V // FP8_DS_MLA_TILE
FP8_DS_MLA_ROPE_OFFSET = D_V + 4 * FP8_DS_MLA_TILES  # 528: the first byte of the bf16 rope part
FP8_DS_MLA_BYTES = FP8_DS_MLA_ROPE_OFFSET + 2 * D_ROPE  # 656
FP8_E4M3_MAX = 448.0
D_V4 = 512  # DeepSeek-V4: q / k width, and V is the whole row
V4_NOPE = 448  # e4m3 part of a V4 cache row
V4_ROPE = D_V4 - V4_NOPE  # 64 bfloat16 values
V4_QUANT_BLOCK = 64  # NoPE values per UE8M0 scale
V4_SCALES = V4_NOPE // V4_QUANT_BLOCK  # 7
V4_ROW_BYTES = V4_NOPE + 2 * V4_ROPE  # 576
V4_FOOTER_BYTES = 8  # per token: 7 exponents and a zero byte
V4_TOKEN_BYTES = V4_ROW_BYTES + V4_FOOTER_BYTES  # 584: the last dimension of vLLM's / FlashMLA's view
D_INDEX = 128  # indexer key/query width
INDEXER_ROW_BYTES = D_INDEX + 4  # e4m3 values + one float32 scale per token

KV_FORMATS = ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla")  # row formats: each token one row of the cache
FP8_DS_MLA_V4 = "fp8_ds_mla_v4"
PAGED_KV_FORMATS = (FP8_DS_MLA_V4,)  # a page holds rows, then a footer of their scales (DeepSeek-V4)
ALL_KV_FORMATS = KV_FORMATS + PAGED_KV_FORMATS  # every format the attention kernels read
KV_FORMAT_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_ds_mla": torch.uint8,
    FP8_DS_MLA_V4: torch.uint8,
}
_SCALE_FORMATS = ("pow2", "fp32")


def infer_kv_format(kv_cache: torch.Tensor) -> str | None:
    """The row format implied by a cache tensor's dtype (None when no format matches): uint8 is ``fp8_ds_mla``;
    ``fp8_ds_mla_v4`` (also uint8) is never inferred and must be named."""
    for name in KV_FORMATS:
        if kv_cache.dtype == KV_FORMAT_DTYPES[name]:
            return name
    return None


def kv_row_width(kv_format: str, d_rope: int = D_ROPE) -> int:
    """Elements per cache row (bytes for ``fp8_ds_mla``; for ``fp8_ds_mla_v4`` the 584 bytes per token, the last
    dimension of vLLM's view)."""
    if kv_format == "fp8_ds_mla":
        return FP8_DS_MLA_BYTES
    if kv_format == FP8_DS_MLA_V4:
        return V4_TOKEN_BYTES
    return D_V + d_rope


def quantize_fp8_ds_mla(kv: torch.Tensor, *, scale_format: str = "pow2") -> torch.Tensor:
    """Pack ``kv [..., 576]`` (any float dtype) into the 656-byte ``fp8_ds_mla`` row format.

    Each 128-wide tile of the latent gets one float32 scale ``amax / 448``; ``scale_format="pow2"`` rounds it up to
    a power of two (DeepSeek's writers), ``"fp32"`` keeps it as is (GLM's writers). A tile whose amax is 0 (or whose
    scale would underflow) gets scale 1.0, so all-zero rows stay exactly zero and never produce NaN/inf. The RoPE
    part is stored as bfloat16. Returns uint8 ``[..., 656]`` on kv's device.
    """
    if not isinstance(kv, torch.Tensor) or not kv.is_floating_point():
        raise ValueError(f"kv: expected a floating-point tensor [..., {D_QK}], got {_describe(kv)}")
    if kv.dim() < 1 or kv.shape[-1] != D_QK:
        raise ValueError(f"kv: expected last dimension {D_QK} (latent 512 + rope 64), got shape {tuple(kv.shape)}")
    if scale_format not in _SCALE_FORMATS:
        raise ValueError(f"scale_format: expected one of {_SCALE_FORMATS}, got {scale_format!r}")
    lead = kv.shape[:-1]
    x = kv.reshape(-1, D_QK).float()
    latent = x[:, :D_V].reshape(-1, FP8_DS_MLA_TILES, FP8_DS_MLA_TILE)
    amax = latent.abs().amax(dim=-1)
    scale = amax / FP8_E4M3_MAX
    if scale_format == "pow2":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    scale = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
    q = (latent / scale[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    packed = torch.empty(x.shape[0], FP8_DS_MLA_BYTES, dtype=torch.uint8, device=kv.device)
    packed[:, :D_V] = q.reshape(-1, D_V).view(torch.uint8)
    packed[:, D_V:FP8_DS_MLA_ROPE_OFFSET] = scale.contiguous().view(torch.uint8)
    packed[:, FP8_DS_MLA_ROPE_OFFSET:] = x[:, D_V:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return packed.reshape(*lead, FP8_DS_MLA_BYTES)


def unpack_fp8_ds_mla(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split packed rows into (e4m3 latent [..., 512], float32 scales [..., 4], bf16 rope [..., 64])."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.shape[-1:] != (FP8_DS_MLA_BYTES,):
        raise ValueError(f"packed: expected uint8 [..., {FP8_DS_MLA_BYTES}], got {_describe(packed)}")
    rows = packed.reshape(-1, FP8_DS_MLA_BYTES)
    lead = packed.shape[:-1]
    latent = rows[:, :D_V].contiguous().view(torch.float8_e4m3fn).reshape(*lead, D_V)
    scales = rows[:, D_V:FP8_DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32).reshape(*lead, FP8_DS_MLA_TILES)
    rope = rows[:, FP8_DS_MLA_ROPE_OFFSET:].contiguous().view(torch.bfloat16).reshape(*lead, D_ROPE)
    return latent, scales, rope


def dequantize_fp8_ds_mla_float(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Unpack to ``dtype [..., 576]`` with the latent computed as e4m3 · scale in float32 (no bf16 rounding)."""
    latent, scales, rope = unpack_fp8_ds_mla(packed)
    lat = latent.float().reshape(*latent.shape[:-1], FP8_DS_MLA_TILES, FP8_DS_MLA_TILE) * scales.float()[..., None]
    return torch.cat([lat.reshape(*latent.shape[:-1], D_V), rope.float()], dim=-1).to(dtype)


def dequantize_fp8_ds_mla(packed: torch.Tensor) -> torch.Tensor:
    """Unpack ``fp8_ds_mla`` rows to bfloat16 ``[..., 576]``: latent = e4m3 · scale (rounded once to bf16), rope as
    stored."""
    return dequantize_fp8_ds_mla_float(packed, torch.float32).to(torch.bfloat16)


def quantize_indexer_cache(values: torch.Tensor, *, scale_format: str = "fp32") -> torch.Tensor:
    """Pack indexer keys ``values [num_blocks, block_size, 128]`` (any float dtype) into vLLM's fp8 indexer cache,
    uint8 ``[num_blocks, block_size · 132]``: per block the ``block_size · 128`` e4m3 values (token-major), then
    ``block_size`` float32 scales, ``scale = amax / 448`` per token (at least 1e-8, so an all-zero token stays
    exactly zero); ``scale_format="pow2"`` rounds each scale up to a power of two, as vLLM's UE8M0 writer does.
    Returns the cache on values' device."""
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        raise ValueError(f"values: expected a floating-point tensor [num_blocks, block_size, {D_INDEX}], "
                         f"got {_describe(values)}")
    if values.dim() != 3 or values.shape[-1] != D_INDEX:
        raise ValueError(f"values: expected shape [num_blocks, block_size, {D_INDEX}], got {tuple(values.shape)}")
    if scale_format not in _SCALE_FORMATS:
        raise ValueError(f"scale_format: expected one of {_SCALE_FORMATS}, got {scale_format!r}")
    nb, bs, _ = values.shape
    scale = (values.float().abs().amax(-1) / FP8_E4M3_MAX).clamp_min(1e-8)  # [nb, bs]
    if scale_format == "pow2":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q8 = (values.float() / scale[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    buf = torch.empty(nb, bs * INDEXER_ROW_BYTES, dtype=torch.uint8, device=values.device)
    buf[:, :bs * D_INDEX] = q8.view(torch.uint8).reshape(nb, bs * D_INDEX)
    buf[:, bs * D_INDEX:] = scale.contiguous().view(torch.uint8).reshape(nb, bs * 4)
    return buf


def unpack_indexer_cache(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split vLLM's fp8 indexer cache (uint8 ``[num_blocks, block_size · 132]``, or its ``[num_blocks,
    block_size, 1, 132]`` view of the same bytes) into (e4m3 values ``[num_blocks, block_size, 128]``, float32
    scales ``[num_blocks, block_size]``). Blocks may lie any distance apart that does not overlap them; each block's
    ``block_size · 132`` bytes are contiguous."""
    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.uint8 or cache.dim() not in (2, 4):
        raise ValueError(f"cache: expected uint8 [num_blocks, block_size * {INDEXER_ROW_BYTES}] or [num_blocks, "
                         f"block_size, 1, {INDEXER_ROW_BYTES}], got {_describe(cache)}")
    if cache.dim() == 4:
        if cache.shape[2] != 1 or cache.shape[3] != INDEXER_ROW_BYTES:
            raise ValueError(f"cache: expected a [num_blocks, block_size, 1, {INDEXER_ROW_BYTES}] view, got shape "
                             f"{tuple(cache.shape)}")
        nb, bs = cache.shape[0], cache.shape[1]
        if (bs > 1 and cache.stride(1) != INDEXER_ROW_BYTES) or cache.stride(3) != 1:
            raise ValueError(f"cache: expected each block's {bs} x {INDEXER_ROW_BYTES} bytes contiguous (strides "
                             f"(block, {INDEXER_ROW_BYTES}, any, 1)), got stride {tuple(cache.stride())}")
        blocks = torch.as_strided(cache, (nb, bs * INDEXER_ROW_BYTES), (cache.stride(0), 1), cache.storage_offset())
    else:
        nb, width = cache.shape
        if width == 0 or width % INDEXER_ROW_BYTES or cache.stride(1) != 1:
            raise ValueError(f"cache: expected a unit-stride last dimension that is a positive multiple of "
                             f"{INDEXER_ROW_BYTES}, got shape {tuple(cache.shape)} stride {tuple(cache.stride())}")
        bs, blocks = width // INDEXER_ROW_BYTES, cache
    if nb > 1 and blocks.stride(0) < bs * INDEXER_ROW_BYTES:
        raise ValueError(f"cache: expected a block stride of at least {bs * INDEXER_ROW_BYTES} bytes (blocks must not "
                         f"overlap), got {blocks.stride(0)}")
    vals = blocks[:, :bs * D_INDEX].contiguous().view(torch.float8_e4m3fn).reshape(nb, bs, D_INDEX)
    scales = blocks[:, bs * D_INDEX:].contiguous().view(torch.float32).reshape(nb, bs)
    return vals, scales


def dequantize_indexer_cache(cache: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_indexer_cache`: float32 ``[num_blocks, block_size, 128]`` = e4m3 · scale."""
    vals, scales = unpack_indexer_cache(cache)
    return vals.float() * scales[..., None]


def v4_page_bytes(block_size: int) -> int:
    """Bytes of one DeepSeek-V4 fp8 page of ``block_size`` tokens: rows and footer, padded to a multiple of 576."""
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    used = block_size * (V4_ROW_BYTES + V4_FOOTER_BYTES)
    return -(-used // V4_ROW_BYTES) * V4_ROW_BYTES


def v4_block_size(page_bytes: int) -> int | None:
    """The block size whose page is exactly ``page_bytes`` (:func:`v4_page_bytes` is strictly increasing), None when
    no block size has that page."""
    bs = page_bytes // V4_TOKEN_BYTES
    return bs if bs >= 1 and v4_page_bytes(bs) == page_bytes else None


def v4_token_view(pages: torch.Tensor, block_size: int) -> torch.Tensor:
    """vLLM's view of DeepSeek-V4 pages (uint8 ``[num_blocks, page_bytes]``, each page's bytes contiguous, any
    page stride): uint8 ``[num_blocks, block_size, 584]`` with strides ``(page stride, 584, 1)``, the same memory.
    It spans the first ``block_size · 584`` bytes of each page (rows and footer); a token's "row" in it is not its
    data (that is at ``576 · offset``, its scales at ``576 · block_size + 8 · offset``)."""
    need = block_size * V4_TOKEN_BYTES
    if not isinstance(pages, torch.Tensor) or pages.dtype != torch.uint8 or pages.dim() != 2:
        raise ValueError(f"pages: expected uint8 [num_blocks, page_bytes], got {_describe(pages)}")
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    if pages.shape[1] < need or pages.stride(1) != 1:
        raise ValueError(f"pages: expected at least {need} contiguous bytes per page for block_size {block_size}, "
                         f"got shape {tuple(pages.shape)} stride {tuple(pages.stride())}")
    return pages.as_strided((pages.shape[0], block_size, V4_TOKEN_BYTES), (pages.stride(0), V4_TOKEN_BYTES, 1),
                            pages.storage_offset())


def quantize_fp8_ds_mla_v4(k: torch.Tensor) -> torch.Tensor:
    """Pack DeepSeek-V4 cache rows ``k [num_blocks, block_size, 512]`` (any float dtype; rounded to bfloat16 first,
    the writer's input) into uint8 pages ``[num_blocks, v4_page_bytes(block_size)]``, byte for byte as vLLM's
    ``quantize_and_insert_k_cache`` writes them: per 64 NoPE values, ``scale = 2^ceil(log2(max(amax, 1e-4) / 448))``,
    values ``clamp(x / scale, ±448)`` as e4m3, the exponent + 127 (clamped to [0, 255]) as the footer byte; the RoPE
    part as bfloat16; the pad byte and the page's padding zero."""
    if not isinstance(k, torch.Tensor) or not k.is_floating_point():
        raise ValueError(f"k: expected a floating-point tensor [num_blocks, block_size, {D_V4}], got {_describe(k)}")
    if k.dim() != 3 or k.shape[-1] != D_V4 or k.shape[1] < 1:
        raise ValueError(f"k: expected shape [num_blocks, block_size >= 1, {D_V4}], got {tuple(k.shape)}")
    nb, bs, _ = k.shape
    x = k.to(torch.bfloat16).float()
    nope = x[..., :V4_NOPE].reshape(nb, bs, V4_SCALES, V4_QUANT_BLOCK)
    exponent = torch.ceil(torch.log2(nope.abs().amax(-1).clamp_min(1e-4) / FP8_E4M3_MAX))
    q8 = (nope / torch.exp2(exponent)[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    pages = torch.zeros(nb, v4_page_bytes(bs), dtype=torch.uint8, device=k.device)
    rows = pages[:, :bs * V4_ROW_BYTES].view(nb, bs, V4_ROW_BYTES)
    rows[..., :V4_NOPE] = q8.view(torch.uint8).reshape(nb, bs, V4_NOPE)
    rows[..., V4_NOPE:] = x[..., V4_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    footer = pages[:, bs * V4_ROW_BYTES:bs * (V4_ROW_BYTES + V4_FOOTER_BYTES)].view(nb, bs, V4_FOOTER_BYTES)
    footer[..., :V4_SCALES] = (exponent + 127).clamp(0, 255).to(torch.uint8)
    return pages


def unpack_fp8_ds_mla_v4(pages: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split DeepSeek-V4 fp8 pages (uint8 ``[num_blocks, page_bytes]``, each page's bytes contiguous; only the first
    ``block_size · 584`` bytes of a page are read, its padding never) into (e4m3 NoPE values ``[num_blocks,
    block_size, 448]``, float32 scales ``[num_blocks, block_size, 7]``, bfloat16 RoPE values ``[num_blocks,
    block_size, 64]``)."""
    v4_page_bytes(block_size)  # checks block_size
    need = block_size * V4_TOKEN_BYTES
    if not isinstance(pages, torch.Tensor) or pages.dtype != torch.uint8 or pages.dim() != 2:
        raise ValueError(f"pages: expected uint8 [num_blocks, page_bytes], got {_describe(pages)}")
    if pages.shape[1] < need or pages.stride(1) != 1:
        raise ValueError(f"pages: expected at least {need} contiguous bytes per page for block_size {block_size}, "
                         f"got shape {tuple(pages.shape)} stride {tuple(pages.stride())}")
    nb, bs = pages.shape[0], block_size
    rows = pages[:, :bs * V4_ROW_BYTES].contiguous().view(nb, bs, V4_ROW_BYTES)
    footer = pages[:, bs * V4_ROW_BYTES:bs * (V4_ROW_BYTES + V4_FOOTER_BYTES)].contiguous()
    footer = footer.view(nb, bs, V4_FOOTER_BYTES)
    nope = rows[..., :V4_NOPE].contiguous().view(torch.float8_e4m3fn)
    rope = rows[..., V4_NOPE:].contiguous().view(torch.bfloat16)
    scales = torch.exp2(footer[..., :V4_SCALES].float() - 127)
    return nope, scales, rope


def dequantize_fp8_ds_mla_v4(pages: torch.Tensor, block_size: int, dtype: torch.dtype = torch.float32
                             ) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8_ds_mla_v4`: ``dtype [num_blocks, block_size, 512]``, the NoPE part e4m3 ·
    scale computed in float32, the RoPE part as stored."""
    nope, scales, rope = unpack_fp8_ds_mla_v4(pages, block_size)
    nb, bs = nope.shape[:2]
    vals = nope.float().reshape(nb, bs, V4_SCALES, V4_QUANT_BLOCK) * scales[..., None]
    return torch.cat([vals.reshape(nb, bs, V4_NOPE), rope.float()], dim=-1).to(dtype)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__

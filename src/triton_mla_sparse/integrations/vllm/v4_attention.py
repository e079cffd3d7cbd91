"""DeepSeek-V4's attention layer on this package's kernels, for vLLM 0.33's ``vllm.models.deepseek_v4`` model.

vLLM builds each V4 attention layer from the class ``_select_dsv4_attn_cls`` returns (FlashMLA's on SM 9.x/10.x,
FlashInfer's SM120 class on SM 12.x); where :mod:`.v4` routes a layer here, it returns
:func:`triton_attention_cls`: a ``DeepseekV4Attention`` whose ``forward_mqa`` reads V4's two caches — the
sliding-window cache (the main list) and, on compressed layers, the compressed cache (the extra list: C4A entries
chosen by the indexer, C128A every compressed entry) — with one softmax and the per-head sink through
:func:`triton_mla_sparse.sparse_mla_attention` (:func:`run_v4_attention`). Its caches are V4's 584-byte fp8 pages
(``use_fp8_ds_mla_layout``: vLLM makes ``--kv-cache-dtype auto|fp8`` the ``fp8_ds_mla`` layout and refuses
``bfloat16`` for such a layer), read in place as ``fp8_ds_mla_v4``; any head count runs unpadded. The metadata it
reads is the FlashInfer path's (the same backend classes: decode and prefill window indices in the window cache's slots, global
compressed slots from ``compute_global_topk_indices_and_lens``); the output projection is vLLM's
(``deep_gemm_fp8_o_proj``, as both of vLLM's classes call it), with an e4m3 ``wo_a`` dequantized to bf16 after
loading where DeepGEMM's einsum cannot run (:func:`.v4_portable.route_wo_a`).

Importing this module imports neither vLLM nor CUDA; :func:`triton_attention_cls` imports vLLM.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["forward_v4", "forward_v41", "run_v4_attention", "triton_attention_cls", "triton_attention_cls_v41"]


def _flat(indices: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """vLLM's index tensors ``[T, W]`` or FlashMLA-shaped ``[T, 1, W]`` as ``[T, W]`` int32."""
    if indices is None:
        return None
    flat = indices.reshape(rows, -1)
    return flat if flat.dtype == torch.int32 else flat.to(torch.int32)


def run_v4_attention(q: torch.Tensor, output: torch.Tensor, *, scale: float, sink: torch.Tensor,
                     swa_cache: torch.Tensor, swa_indices: torch.Tensor, swa_lens: torch.Tensor | None,
                     extra_cache: torch.Tensor | None = None, extra_indices: torch.Tensor | None = None,
                     extra_lens: torch.Tensor | None = None) -> None:
    """One V4 attention call for ``T`` query rows into ``output`` ``[T, H, 512]``: q ``[T, H, 512]``, the window
    cache's slot ids ``swa_indices`` (``[T, W]`` or ``[T, 1, W]``) and lengths, and on a compressed layer the
    compressed cache with its slot ids and lengths, both caches vLLM's uint8 fp8_ds_mla pages; ``sink`` has at least
    H entries. Anything else raises the API's ``ValueError`` before a kernel runs."""
    from ...api import sparse_mla_attention

    T, H = q.shape[0], q.shape[1]
    if T == 0:
        return
    extra: dict[str, Any] = {}
    if extra_cache is not None:
        if extra_indices is None:
            raise ValueError("extra_indices: expected the compressed cache's slot ids with extra_cache, got None")
        extra = dict(extra_kv_cache=extra_cache, extra_indices=_flat(extra_indices, T), extra_topk_length=extra_lens)
    sparse_mla_attention(q, swa_cache, _flat(swa_indices, T), scale, kv_format="fp8_ds_mla_v4", topk_length=swa_lens,
                         attn_sink=sink[:H], out=output, **extra)


def _forward_mqa(forward: Any, layer: Any, q: torch.Tensor, output: torch.Tensor, attn_metadata: Any,
                 global_topk: Any) -> None:
    """A layer's ``forward_mqa``: ``forward`` (:func:`forward_v4` / :func:`forward_v41`), or zeros in a warm-up run
    without metadata."""
    if attn_metadata is None:
        output.zero_()
        return
    forward(layer, q, output, attn_metadata, global_topk)


def _window_metadata(layer: Any, attn_metadata: dict) -> Any:
    """The window cache's metadata of ``layer`` (every V4 / V4.1 layer has one)."""
    swa = attn_metadata.get(layer.swa_cache_layer.prefix)
    if swa is None:
        raise ValueError(f"attn_metadata: expected the window cache's metadata ({layer.swa_cache_layer.prefix})")
    return swa


def _global_list(layer: Any, swa: Any, meta: Any, compressed: torch.Tensor, local: torch.Tensor, rows: slice,
                 decode: bool, global_topk: Any) -> dict:
    """The compressed list of ``rows``: request-local compressed positions ``local`` as global slots of
    ``compressed`` through the compressed metadata's block table (its decode requests' rows for decode rows) and
    their counts, by vLLM's ``compute_global_topk_indices_and_lens`` (``global_topk``)."""
    block_table = meta.block_table[:swa.num_decodes] if decode else meta.block_table
    idx, lens = global_topk(local, swa.token_to_req_indices[rows], block_table, meta.block_size // layer.compress_ratio,
                            swa.is_valid_token[rows])
    return dict(extra_cache=compressed, extra_indices=idx, extra_lens=lens)


def _run_phases(layer: Any, q: torch.Tensor, output: torch.Tensor, swa: Any, extra_for: Any) -> None:
    """The decode rows, then the prefill rows (vLLM's batch order), each one :func:`run_v4_attention` call with the
    window metadata's indices and ``extra_for(rows, decode)``'s compressed list."""
    common = dict(scale=layer.scale, sink=layer.attn_sink, swa_cache=layer.swa_cache_layer.kv_cache)
    nd, npf = swa.num_decode_tokens, swa.num_prefill_tokens
    if swa.num_decodes > 0:
        rows = slice(0, nd)
        run_v4_attention(q[rows], output[rows], swa_indices=swa.decode_swa_indices, swa_lens=swa.decode_swa_lens,
                         **common, **extra_for(rows, True))
    if swa.num_prefills > 0:
        rows = slice(nd, nd + npf)
        run_v4_attention(q[rows], output[rows], swa_indices=swa.prefill_swa_indices, swa_lens=swa.prefill_swa_lens,
                         **common, **extra_for(rows, False))


@functools.cache
def triton_attention_cls() -> type:
    """The ``DeepseekV4Attention`` subclass on this package's kernels (built once; imports vLLM)."""
    from vllm.forward_context import get_forward_context
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention
    from vllm.models.deepseek_v4.common.ops import compute_global_topk_indices_and_lens
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse as fi
    from vllm.models.deepseek_v4.nvidia.ops.o_proj import compute_fp8_einsum_recipe, deep_gemm_fp8_o_proj

    from .v4_portable import route_wo_a

    class DeepseekV4TritonMLAAttention(DeepseekV4Attention):
        """DeepSeek-V4 sparse MLA attention on triton-mla-sparse's kernels (every GPU they support; no head
        padding)."""

        backend_cls = fi.DeepseekV4FlashInferMLASparseBackend
        swa_backend_cls = fi.DeepseekSparseSWAFlashInferBackend
        use_fp8_ds_mla_layout = True

        @classmethod
        def get_padded_num_q_heads(cls, num_heads: int) -> int:
            return num_heads

        def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(vllm_config, *args, **kwargs)
            self._einsum_recipe, self._tma_aligned_scales = compute_fp8_einsum_recipe()
            route_wo_a(self.wo_a)  # e4m3 wo_a as bf16 where DeepGEMM's einsum cannot run

        def _o_proj(self, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return deep_gemm_fp8_o_proj(
                o, positions, self.rotary_emb.cos_sin_cache, self.wo_a, self.wo_b, n_groups=self.n_local_groups,
                heads_per_group=self.n_local_heads // self.n_local_groups, nope_dim=self.nope_head_dim,
                rope_dim=self.rope_head_dim, o_lora_rank=self.o_lora_rank, einsum_recipe=self._einsum_recipe,
                tma_aligned_scales=self._tma_aligned_scales)

        def forward_mqa(self, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor,
                        output: torch.Tensor) -> None:
            _forward_mqa(forward_v4, self, q, output, get_forward_context().attn_metadata,
                         compute_global_topk_indices_and_lens)

    return DeepseekV4TritonMLAAttention


def forward_v4(layer: Any, q: torch.Tensor, output: torch.Tensor, attn_metadata: dict,
               global_topk: Any) -> None:
    """The forward of :func:`triton_attention_cls`'s layer from vLLM's per-layer metadata (decode rows first, then
    prefill rows, as vLLM orders the batch). ``global_topk``: vLLM's ``compute_global_topk_indices_and_lens``."""
    swa = _window_metadata(layer, attn_metadata)
    meta = attn_metadata.get(layer.prefix)
    swa_only = layer.compress_ratio <= 1
    compressed = None if swa_only else layer.kv_cache

    def extra_for(rows: slice, decode: bool) -> dict:
        if swa_only:
            return {}
        if meta is None or swa.is_valid_token is None or swa.token_to_req_indices is None:
            raise ValueError("attn_metadata: a compressed layer needs its metadata, token validity and request map")
        if layer.compress_ratio == 4:  # C4A: the indexer's top-k, request-local -> global compressed slots
            if layer.topk_indices_buffer is None:
                raise ValueError("topk_indices_buffer: a C4A layer needs the indexer's top-k")
            local = layer.topk_indices_buffer[rows]
        elif decode:  # C128A decode: vLLM precomputes the global slots and lengths
            return dict(extra_cache=compressed, extra_indices=meta.c128a_global_decode_topk_indices,
                        extra_lens=meta.c128a_decode_topk_lens)
        else:
            local = meta.c128a_prefill_topk_indices
        return _global_list(layer, swa, meta, compressed, local, rows, decode, global_topk)

    _run_phases(layer, q, output, swa, extra_for)


@functools.cache
def triton_attention_cls_v41() -> type:
    """DeepSeek-V4.1's ``DeepseekV4Attention`` (``vllm.models.deepseek_v41``) on this package's kernels (built once;
    imports vLLM). Off SM 10.x vLLM writes V4.1's caches in V4's 584-byte fp8_ds_mla record, so the kernels and
    :func:`run_v4_attention` are V4's; the layer differs in its metadata (:func:`forward_v41`), its o_proj
    (``dsv41_o_proj``: off SM 10.x ``deep_gemm_fp8_o_proj``, with an e4m3 ``wo_a`` — 128 x 128 blocks or MXFP8 —
    dequantized to bf16 after loading where DeepGEMM's einsum cannot run, as in V4's layer) and its backend classes
    (V4.1's FlashInfer ones, whose builders know its compress ratios 0 / 1 / 2, with the base backend's kernel
    block sizes). Prefill context parallelism and any record but V4's (SM 10.x's MXFP8 one, ``nvfp4_ds_mla``) are
    refused at construction."""
    from vllm.forward_context import get_forward_context
    from vllm.models.deepseek_v4.nvidia.ops.o_proj import compute_fp8_einsum_recipe
    from vllm.models.deepseek_v41.attention import DeepseekV4Attention
    from vllm.models.deepseek_v41.common.ops import compute_global_topk_indices_and_lens
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as fi
    from vllm.models.deepseek_v41.nvidia.ops.o_proj import dsv41_o_proj
    from vllm.models.deepseek_v41.sparse_mla import DeepseekV4SparseMLABackend

    from .v4_portable import route_wo_a

    class DeepseekV41TritonMLABackend(fi.DeepseekV4FlashInferMLASparseBackend):
        """FlashInfer's V4.1 backend (the generic metadata builder, the cache layout) with the kernel block sizes of
        V4.1's base backend: FlashInfer's kernel needs 128-token pages, ours read any, and on SM 9.0 V4.1's indexer
        cache takes 64-token pages, which vLLM cannot cut out of packed 128-token blocks."""

        get_supported_kernel_block_sizes = staticmethod(DeepseekV4SparseMLABackend.get_supported_kernel_block_sizes)

    class DeepseekV41TritonMLAAttention(DeepseekV4Attention):
        """DeepSeek-V4.1 sparse MLA attention on triton-mla-sparse's kernels (no head padding)."""

        backend_cls = DeepseekV41TritonMLABackend
        swa_backend_cls = fi.DeepseekSparseSWAFlashInferBackend
        use_fp8_ds_mla_layout = True

        @classmethod
        def get_padded_num_q_heads(cls, num_heads: int) -> int:
            return num_heads

        def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(vllm_config, *args, **kwargs)
            if self.use_pcp:
                raise ValueError("prefill_context_parallel_size: triton-mla-sparse's DeepSeek-V4.1 layer runs without "
                                 "prefill context parallelism (vLLM's FlashMLA layer only has it); expected 1")
            if getattr(self, "kv_mxfp8", False) or self.kv_cache_dtype != "fp8_ds_mla":
                raise ValueError(f"kv_cache_dtype: triton-mla-sparse's DeepSeek-V4.1 layer reads V4's 584-byte "
                                 f"fp8_ds_mla record, got {self.kv_cache_dtype!r}"
                                 f"{' in the MXFP8 record of SM 10.x' if getattr(self, 'kv_mxfp8', False) else ''}")
            self._einsum_recipe, self._tma_aligned_scales = compute_fp8_einsum_recipe(self._o_proj_block_size)
            route_wo_a(self.wo_a)  # e4m3 wo_a as bf16 where DeepGEMM's einsum cannot run

        def _o_proj(self, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return dsv41_o_proj(self, o, positions)

        def forward_mqa(self, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor,
                        output: torch.Tensor) -> None:
            _forward_mqa(forward_v41, self, q, output, get_forward_context().attn_metadata,
                         compute_global_topk_indices_and_lens)

    return DeepseekV41TritonMLAAttention


def forward_v41(layer: Any, q: torch.Tensor, output: torch.Tensor, attn_metadata: dict,
                global_topk: Any) -> None:
    """The forward of :func:`triton_attention_cls_v41`'s layer (decode rows first, then prefill rows). V4.1's layers
    share caches: a compressed layer (compress ratio 1 or 2) reads the kv-source layer's cache
    (``_compressed_kv_cache()``) with the metadata under ``compressed_cache_prefix``, and every one of them takes the
    index-source layer's top-k (request-local compressed positions) as its extra list; ratio 0 is window only."""
    swa = _window_metadata(layer, attn_metadata)
    swa_only = layer.compress_ratio == 0
    meta = None
    compressed = None
    if not swa_only:
        prefix = layer.compressed_cache_prefix
        meta = attn_metadata.get(prefix) if prefix is not None else None
        compressed = layer._compressed_kv_cache()

    def extra_for(rows: slice, decode: bool) -> dict:
        if swa_only:
            return {}
        if meta is None or swa.is_valid_token is None or swa.token_to_req_indices is None:
            raise ValueError("attn_metadata: a compressed layer needs its metadata, token validity and request map")
        if layer.topk_indices_buffer is None:
            raise ValueError("topk_indices_buffer: a compressed V4.1 layer needs the indexer's top-k")
        return _global_list(layer, swa, meta, compressed, layer.topk_indices_buffer[rows], rows, decode, global_topk)

    _run_phases(layer, q, output, swa, extra_for)

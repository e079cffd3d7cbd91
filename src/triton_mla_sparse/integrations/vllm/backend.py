"""The ``TRITON_MLA_SPARSE`` attention backend for vLLM 0.33 (sparse MLA / DeepSeek Sparse Attention).

Built on vLLM's sparse-MLA base classes (``vllm.model_executor.layers.attention.sparse_mla_attention``): the base
impl's ``forward_mqa`` converts the indexer's request-local top-k positions into flat cache-row indices (honouring
the block stride of the layer's cache view) and calls :meth:`TritonMLASparseImpl._forward_mqa_kernel`, which runs
this package's Triton kernels.

Kernels and data
  * q arrives as vLLM's tuple ``(ql_nope [T, H, 512], q_pe [T, H, 64])`` (``ql_nope`` is a non-contiguous view) and
    is passed to the kernel as it is: no concatenation copy. A fused ``[T, H, 576]`` tensor (vLLM concatenates
    under decode context parallelism) is split into two views.
  * The cache is read through vLLM's flat-row view (``flat_kv_row_view``): row ``i`` of the view is what vLLM's
    converted index ``i = block · block_stride_rows + offset`` names, so pages of other layers between two blocks
    are skipped exactly as vLLM addresses them.
  * KV cache dtypes: ``auto``/``bfloat16``/``float16`` (576 values per token), ``fp8``/``fp8_e4m3`` (per-tensor
    float8_e4m3fn, scaled by the layer's ``k_scale``) and ``fp8_ds_mla`` (656-byte DeepSeek rows; vLLM only
    picks this format for a backend of this name when asked: ``--kv-cache-dtype fp8_ds_mla``). Head size 576
    (DeepSeek-V3.2, GLM-5) or 512 (NoPE models).
  * ``valid_counts`` from vLLM's conversion (valid indices compacted to the front of each row) becomes the kernel's
    ``topk_length``; the kernel skips -1 entries either way.
  * The softmax lse (natural log, ``-inf`` for rows with no valid index, vLLM's merge convention) is returned when
    vLLM asks for it (``need_to_return_lse_for_decode``, i.e. under decode context parallelism).
  * The kernel variant (split-top-k "decode" or one-program-per-row "prefill") is chosen from the batch shape by
    :func:`triton_mla_sparse.ops.sparse_mla.sparse_mla_attention_with_config` (``kernel="auto"``); its
    configurations are pinned per shape (no autotuning), so decode batches can be captured in CUDA graphs
    (``UNIFORM_BATCH``).

Prefill routing
  The impl keeps vLLM's default ``supports_dense_mha_prefill = True``. vLLM then routes a batch's prefill requests
  as follows:
  * longest prefill sequence (context + new tokens) <= ``index_topk`` (2048): vLLM's dense-MHA prefill path (the
    MLA prefill backend vLLM selects, FlashAttention on SM80+). With at most top-k tokens in a sequence the
    indexer keeps all of them, so dense causal attention computes exactly the sparse result, faster;
  * longer prefills: every token of the batch, decodes included, goes through ``forward_mqa`` and therefore our
    Triton kernels (``is_decode=False``);
  * when the platform has no MLA prefill backend for the model, vLLM itself falls back to the sparse path for all
    prefills (it logs "sparse MLA will use the top-k MQA path only").
  ``--attention-config '{"sparse_mla_force_mqa": true}'`` (vLLM's option) sends all prefills through our kernels.
  Decode requests (query length <= the reorder threshold, 1 + speculative tokens) always use our kernels.

Batch invariance (``VLLM_BATCH_INVARIANT=1``)
  The backend declares ``supports_batch_invariance``: vLLM's mode then asks that every token's output be the same
  whatever else is in its batch (other requests, chunk boundaries, preemption and recomputation). Three sources of
  batch dependence are removed in that mode:
  * the kernel variant and its split count follow the batch shape, so the one-program-per-row ``"prefill"`` kernel
    (no split of a row's list) serves every batch;
  * the summation order follows the order of the indexer's positions (any order by contract; the split select's
    order comes from atomic slot claims), so each row's request-local positions are sorted ascending (-1 last)
    before vLLM converts them to cache rows (physical rows change when a preempted request is recomputed). vLLM
    converts on a side stream once the impl records "top-k ready" (``record_logical_topk_ready``, called right
    after the indexer), so in this mode that event is recorded after the sort, not before it;
  * vLLM chooses dense-MHA prefill per batch (by the batch's longest prefill), so a token would take a different
    arithmetic path in a different batch: the impl declares no dense-MHA prefill and every token runs here.
  The Triton indexer (chosen in this mode, see :mod:`~triton_mla_sparse.integrations.vllm.indexer`) computes each
  row alone (``indexer_topk(deterministic=True)``).

Capabilities and limits come from :mod:`triton_mla_sparse.capabilities` through
:mod:`triton_mla_sparse.integrations.vllm.policy`: vLLM accepts this backend exactly where ``sparse_mla_attention``
would run. Nothing here touches CUDA at construction: the classes import and construct on a CPU (tests run the impl
through Triton's interpreter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.config.cache import CacheDType
from vllm.model_executor.layers.attention.sparse_mla_attention import (
    SparseMLACommonImpl,
    SparseMLACommonMetadata,
    SparseMLACommonMetadataBuilder,
)
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionLayer,
    AttentionType,
    MultipleOf,
)
from vllm.v1.attention.backends.mla.sparse_utils import align_blocks_to_rows, flat_kv_row_view
from vllm.v1.kv_cache_interface import AttentionSpec

from ...capabilities import Q_DTYPES, supports_capability
from ...formats import D_ROPE
from .policy import (
    BACKEND_NAME,
    KV_CACHE_FORMATS,
    KV_LORA_RANK,
    SUPPORTED_HEAD_SIZES,
    batch_invariant,
    model_reasons,
    platform_reasons,
)

__all__ = [
    "TritonMLASparseBackend",
    "TritonMLASparseMetadata",
    "TritonMLASparseMetadataBuilder",
    "TritonMLASparseImpl",
    "KV_CACHE_FORMATS",
    "sort_positions_",
]


def _rocm_arch() -> str | None:
    """The gfx name vLLM's ROCm platform read (without initialising the GPU) when it is vLLM's platform, else None."""
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        return None
    import vllm.platforms.rocm as rocm

    return rocm._GCN_ARCH  # vLLM 0.33's name for it; the capability it derives is coarser (gfx940..942: 9.4)


class TritonMLASparseBackend(AttentionBackend):
    """Sparse MLA with the portable Triton kernels of triton-mla-sparse (the declared architectures)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = list(Q_DTYPES)
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = list(KV_CACHE_FORMATS)  # type: ignore[assignment]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[TritonMLASparseImpl]:
        return TritonMLASparseImpl

    @staticmethod
    def get_builder_cls() -> type[TritonMLASparseMetadataBuilder]:
        return TritonMLASparseMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: AttentionSpec | None = None) -> list[int | MultipleOf]:
        # The kernels read single rows through the flat-row view: any block size. (vLLM's DSA indexer on CUDA
        # fixes the model's block size to 64 anyway.)
        return [MultipleOf(1)]

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        # Blocks a whole number of rows apart, so the flat-row view (and vLLM's index conversion) addresses rows.
        return align_blocks_to_rows(spec)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        # 512 latent + 64 RoPE (DeepSeek-V3.2, GLM-5), or 512 for NoPE models.
        return list(SUPPORTED_HEAD_SIZES)

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        # Row-independent kernels, sorted positions and no dense-MHA prefill under VLLM_BATCH_INVARIANT=1 (above).
        return True

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return supports_capability((capability.major, capability.minor), _rocm_arch())

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: CacheDType | None,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        use_mm_prefix: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        from vllm.config import get_current_vllm_config_or_none

        platform = platform_reasons(kv_cache_dtype or "auto", _rocm_arch())
        vllm_config = get_current_vllm_config_or_none()
        if vllm_config is None or vllm_config.model_config is None:
            return "; ".join(platform) if platform else None
        model_config = vllm_config.model_config
        hf = model_config.hf_text_config
        reasons = model_reasons(kv_lora_rank=getattr(hf, "kv_lora_rank", KV_LORA_RANK),
                                qk_rope_head_dim=getattr(hf, "qk_rope_head_dim", D_ROPE),
                                index_topk=getattr(hf, "index_topk", None),
                                heads=model_config.get_num_attention_heads(vllm_config.parallel_config))
        reasons = platform + reasons
        return "; ".join(reasons) if reasons else None


_NO_POSITION = torch.iinfo(torch.int32).max


def sort_positions_(topk: torch.Tensor) -> None:
    """Sort each row of int32 request-local positions ascending, -1 entries last, in place (no host sync)."""
    keyed = torch.where(topk < 0, _NO_POSITION, topk).sort(dim=-1).values
    topk.copy_(torch.where(keyed == _NO_POSITION, -1, keyed))


@dataclass
class TritonMLASparseMetadata(SparseMLACommonMetadata):
    pass


class TritonMLASparseMetadataBuilder(SparseMLACommonMetadataBuilder[TritonMLASparseMetadata]):
    metadata_cls = TritonMLASparseMetadata
    # The kernels take any number of rows and per-row top-k lists, with configurations fixed per shape:
    # uniform decode batches (1 + speculative tokens per request) are captured in full CUDA graphs.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: Any,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # Decodes are requests of one token (1 + num_speculative_tokens with speculative decoding); causality is in
        # the top-k lists, so varlen decodes are safe under decode context parallelism too.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True, supports_dcp_with_varlen=True)


class TritonMLASparseImpl(SparseMLACommonImpl[TritonMLASparseMetadata]):
    """Runs vLLM's sparse MQA hook with :func:`triton_mla_sparse.ops.sparse_mla.sparse_mla_attention_with_config`."""

    can_return_lse_for_decode: bool = True
    supports_dcp: bool = True
    supports_pcp: bool = False
    lse_base_on_e: bool = True

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        topk_indices_buffer: torch.Tensor | None = None,
        indexer: Any | None = None,
        **mla_args: Any,
    ) -> None:
        if any((alibi_slopes, sliding_window, logits_soft_cap)):
            raise NotImplementedError(
                f"{BACKEND_NAME} does not support alibi slopes, sliding window or logits soft cap")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"{BACKEND_NAME} only supports decoder self-attention, got {attn_type}")
        if kv_cache_dtype not in KV_CACHE_FORMATS:
            raise NotImplementedError(
                f"{BACKEND_NAME} supports kv_cache_dtype {tuple(KV_CACHE_FORMATS)}, got {kv_cache_dtype!r}")
        # Also here: a model that names this backend itself skips vLLM's validation (supports_combination).
        platform = platform_reasons(kv_cache_dtype, _rocm_arch())
        if platform:
            raise NotImplementedError("; ".join(platform))
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            indexer=indexer,
            topk_indices_buffer=topk_indices_buffer,
            **mla_args,
        )
        # The model's top-k was checked when vLLM validated the backend (supports_combination).
        reasons = model_reasons(kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim,
                                heads=num_heads)
        if reasons:
            raise NotImplementedError("; ".join(reasons))
        self.kv_format = KV_CACHE_FORMATS[kv_cache_dtype]
        # q stays in the model dtype (bf16/fp16); the kernels dequantize fp8 caches themselves.
        self.supports_quant_query_input = False
        self.batch_invariant = batch_invariant()
        if self.batch_invariant:
            # vLLM picks dense-MHA prefill per batch: a token's arithmetic path would depend on its batch.
            self.supports_dense_mha_prefill = False

    def record_logical_topk_ready(self) -> None:
        # vLLM's side stream converts the buffer once this event fires; a sort after it would race with that read.
        if not (self.batch_invariant and self.topk_indices_buffer is not None):
            super().record_logical_topk_ready()

    def forward_mqa(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_c_and_k_pe_cache: torch.Tensor,
                    attn_metadata: TritonMLASparseMetadata, layer: AttentionLayer
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.batch_invariant and self.topk_indices_buffer is not None:
            num_tokens = q[0].shape[0] if isinstance(q, tuple) else q.shape[0]
            sort_positions_(self.topk_indices_buffer[:num_tokens])
            super().record_logical_topk_ready()
        return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)

    def _kv_rows(self, kv_cache: torch.Tensor, block_size: int) -> torch.Tensor:
        """The cache as vLLM's flat rows ``[num_rows, row]``: row ``block · block_stride_rows + offset``."""
        if kv_cache.dim() == 4 and kv_cache.shape[2] == 1:  # [num_blocks, block_size, 1, row]
            kv_cache = kv_cache[:, :, 0]
        if kv_cache.dim() == 3:
            kv_cache, _ = flat_kv_row_view(kv_cache, block_size)
        if self.kv_format == "fp8_e4m3" and kv_cache.dtype == torch.uint8:
            kv_cache = kv_cache.view(torch.float8_e4m3fn)
        return kv_cache

    def _k_scale(self, layer: AttentionLayer, device: torch.device):
        if self.kv_format != "fp8_e4m3":
            return None
        k_scale = getattr(layer, "_k_scale", None)
        if isinstance(k_scale, torch.Tensor) and k_scale.dtype == torch.float32 and k_scale.numel() == 1 \
                and k_scale.device == device:
            return k_scale  # read on the device: stays valid in CUDA graphs and after scale updates
        return float(getattr(layer, "_k_scale_float", 1.0))

    def _forward_mqa_kernel(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        topk_indices: torch.Tensor,
        valid_counts: torch.Tensor,
        *,
        layer: AttentionLayer,
        block_size: int,
        is_decode: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        from ...ops.sparse_mla import sparse_mla_attention_with_config

        if isinstance(q, tuple):
            q_nope, q_pe = q
        else:  # fused [T, H, 512 + rope] (decode context parallelism concatenates): two views, no copy
            q_nope, q_pe = q[..., : self.kv_lora_rank], q[..., self.kv_lora_rank:]
        if q_pe is not None and q_pe.shape[-1] == 0:
            q_pe = None
        rows = self._kv_rows(kv_cache, block_size)
        if valid_counts is not None and valid_counts.dtype != torch.int32:
            valid_counts = valid_counts.to(torch.int32)
        out, lse = sparse_mla_attention_with_config(
            (q_nope, q_pe),
            rows,
            topk_indices,
            self.scale,
            kv_format=self.kv_format,
            k_scale=self._k_scale(layer, q_nope.device),
            topk_length=valid_counts,
            return_lse=True,
            kernel="prefill" if self.batch_invariant else "auto",
        )
        return out, (lse if self.need_to_return_lse_for_decode else None)

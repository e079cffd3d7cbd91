"""The DSA lightning indexer on :func:`triton_mla_sparse.indexer_topk` without DeepGEMM.

vLLM 0.33 computes the indexer of DSA models (DeepSeek-V3.2, GLM-5) only with DeepGEMM's ``fp8_fp4_mqa_logits`` /
``fp8_fp4_paged_mqa_logits``, which run on SM90/SM100/SM120. On SM80/86/89 (or wherever DeepGEMM is unusable) this
module takes the indexer over; :func:`install` (called by :func:`triton_mla_sparse.integrations.vllm.register`)
registers :class:`TritonSparseAttnIndexer` with ``CustomOp.register_oot(name="SparseAttnIndexer")``, so every
``SparseAttnIndexer(...)`` vLLM builds is one of ours. Each instance decides at construction (in the worker, where
the GPU is known) whether it is the Triton indexer or a pass-through to vLLM's own class:

``TRITON_MLA_SPARSE_INDEXER`` (read by :func:`~triton_mla_sparse.integrations.vllm.policy.indexer_mode`; another
value is a ``ValueError``):
    ``auto`` (default)  the Triton indexer on the CUDA platform when DeepGEMM is not usable — ``has_deep_gemm()`` is
                        False (no package) or the GPU is not one DeepGEMM supports (``support_deep_gemm()``: SM90,
                        SM10x, SM12x). vLLM's wheel vendors DeepGEMM, so ``has_deep_gemm()`` alone is True on
                        every GPU; on SM8x its kernels then fail at run time. On the ROCm platform, on a declared
                        gfx target where vLLM's indexer does not run on aiter's kernels (see below). Also under
                        vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``), where each row is then scored and
                        selected alone.
    ``always``          the Triton indexer on every platform (e.g. to compare against DeepGEMM on SM90).
    ``off``             vLLM's indexer unchanged (nothing is registered).

On ROCm vLLM 0.33 computes the indexer in ``SparseAttnIndexer.forward_hip`` (the DeepSeek-V3.2 / GLM-5 model of
``vllm.models.deepseek_v32.amd`` calls it directly). It runs with aiter enabled (``VLLM_ROCM_USE_AITER=1``, the
package installed, CDNA 3/4 or RDNA4), and without aiter on gfx11xx and gfx950 only, where the logits come from its
PyTorch reference (``fp8_mqa_logits_torch``, ``fp8_paged_mqa_logits_torch``: a per-request Python loop for
decodes); elsewhere (gfx942, gfx12xx without aiter) it raises. :func:`vllm_hip_route` says which, from vLLM's own
flags. ``auto`` takes the Triton indexer wherever aiter does not serve. There, the instance also makes its cache
layer report the unshuffled cache layout (:func:`declare_unshuffled_cache`), which the model's fused cache write
follows, and it reads vLLM's e4m3fnuz queries (gfx942) as e4m3fn bytes (see :func:`sparse_attn_indexer`).

When the Triton indexer is chosen, the instance also routes the two places of vLLM 0.33 that reach DeepGEMM
outside the op's ``forward`` (the policy is per process, so this happens once, idempotently):

* ``vllm.models.deepseek_v32.attention.sparse_attn_indexer``: DeepSeek-V3.2 and GLM-5 on CUDA
  (``DeepseekV32Attention._sparse_indexer_and_attn``) call vLLM's module-level function directly, not the op's
  ``forward``; the name is re-pointed to :func:`sparse_attn_indexer` (same signature).
* ``vllm.v1.attention.backends.mla.indexer.get_paged_mqa_logits_metadata``: the indexer's metadata builder
  (``DeepseekV32IndexerMetadataBuilder.build`` and ``update_draft_decode_metadata``) asks DeepGEMM for a decode
  schedule whenever ``has_deep_gemm()``; the name is re-pointed to a stand-in that returns an empty schedule, which
  only DeepGEMM's decode kernel would read.

:func:`sparse_attn_indexer` computes what vLLM's DeepGEMM path writes: request-local top-k positions (0 … context
length - 1, any order, -1 padded) into ``topk_indices_buffer[row, :topk_tokens]`` for every prefill chunk row and
every decode row, with vLLM's metadata (``DeepseekV32IndexerMetadata``), its dense-MHA early return, its buffer
clearing and its decode packing for ragged speculative batches. Not supported, rejected at construction with one
``ValueError``: the MXFP4 indexer cache, the SM10x MX-scaled (UE8M0) fp8 cache, the shuffled cache layout, decode /
prefill context parallelism.

DeepSeek-V4.1's two-level candidate blocks (``candidate_blocks``: the candidate source layer writes each row's best
blocks of ``candidate_block_size`` compressed positions, later index sources mask their logits to them) run between
the logits (materialised with :func:`triton_mla_sparse.indexer_logits`) and the select
(:func:`triton_mla_sparse.ops.topk.topk_select`), by :mod:`.candidates` (vLLM's semantics in torch); prefill rows are
then not sharded, as in vLLM. One difference: after the mask vLLM's top-k kernels fill a row with masked positions
when fewer than ``topk`` entries remain; ours leaves them -1 (possible only where ``(candidate_topk_blocks - 1) ·
candidate_block_size + 1 < topk``, which the constructor logs once).

Compressed indexer caches (``compress_ratio`` C > 1: DeepSeek-V4's C4A layers, ``DeepseekV4Indexer``, C = 4; V4.1's
ratio-2 index sources) are served with the FP8 cache, whose pages have V3.2's layout (per page of ``block_size / C``
compressed entries: their 128 e4m3 bytes each, then one float32 scale each; vLLM pads the page and packs it beside the
layer group's other pages, so blocks lie further apart than a page — any block stride is read). The cache is written
outside the op (``skip_k_cache_insert=True``: V4's compressor, V4.1's ``indexer_k_norm_rope_store`` on the kv-source
layer): compressed entry j of a request holds tokens ``j·C … j·C + C - 1`` and is written by the last of them, at row
``j % (block_size / C)`` of page ``block_table[j // (block_size / C)]``. Everything else comes in compressed units from
vLLM's builder (``DeepseekV32IndexerMetadataBuilder`` with ``compress_ratio = tokens_per_state``): each prefill row's
range ``[cu_seqlen_ks, cu_seqlen_ke)`` and each decode row's context length hold ``(p + 1) // C`` entries for the token
at position p — the entries complete at p — and the CUDA-graph width is the op's ``max_model_len`` (V4 passes
``max_model_len // C``). The positions written are request-local compressed positions ``0 … (p + 1) // C - 1``; a token
with no complete entry yet (p < C - 1) gets an all -1 row, as vLLM's DeepGEMM path writes.

(No ``from __future__ import annotations`` here: torch infers the custom op's schema from the annotations.)
"""

import inspect
import logging
import sys
from typing import Any

import torch
import vllm.model_executor.layers.sparse_attn_indexer as _vllm_sai
from vllm.config import CUDAGraphMode, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.sparse_attn_indexer import PrefillRowShard, SparseAttnIndexer
from vllm.platforms import current_platform
from vllm.utils.torch_utils import LayerNameType, _encode_layer_name, _resolve_layer_name, direct_register_custom_op

from ... import indexer_logits, indexer_topk
from ...capabilities import supports_capability
from ...formats import D_INDEX
from ...ops.topk import topk_select
from ...ops.topk.configs import choose_select_config
from .candidates import apply_candidate_mask, select_candidate_blocks
from .policy import INDEXER_ENV, INDEXER_MODES, batch_invariant, indexer_mode, logger

__all__ = [
    "INDEXER_ENV",
    "INDEXER_MODES",
    "indexer_mode",
    "decide",
    "deep_gemm_usable",
    "aiter_indexer_enabled",
    "vllm_hip_route",
    "use_triton_indexer",
    "unsupported_reasons",
    "TritonSparseAttnIndexer",
    "sparse_attn_indexer",
    "install",
    "route_vllm_call_sites",
    "declare_invariant_cache",
    "declare_unshuffled_cache",
]

OP_NAME = "SparseAttnIndexer"  # the key of vLLM's out-of-tree registry (the in-tree class's __name__)
#: vLLM modules whose global names are re-pointed in Triton mode: (module, name, replacement attribute here).
CALL_SITES = (
    ("vllm.models.deepseek_v32.attention", "sparse_attn_indexer", "sparse_attn_indexer"),
    ("vllm.v1.attention.backends.mla.indexer", "get_paged_mqa_logits_metadata", "_no_deep_gemm_schedule"),
)
_ROUTED_MARK = "_triton_mla_sparse_routed"

_logged: set[str] = set()
# indexer_topk(deterministic=...) for this process: set when a Triton indexer is built under VLLM_BATCH_INVARIANT=1.
_DETERMINISTIC = [False]


def _log_once(level: int, key: str, msg: str, *args) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.log(level, msg, *args)


def decide(mode: str, *, is_cuda: bool, deep_gemm: bool, batch_invariant: bool = False, hip_arch: str | None = None,
           aiter: bool = False) -> tuple[bool, str]:
    """(use the Triton indexer?, why) for a mode, a platform — CUDA (``is_cuda``, with ``deep_gemm``: whether
    DeepGEMM is usable), ROCm (``hip_arch``: the gfx name, with ``aiter``: whether vLLM's indexer runs on aiter's
    kernels there) or another (neither) — and whether vLLM runs batch-invariant. Pure."""
    if mode not in INDEXER_MODES:
        raise ValueError(f"{INDEXER_ENV}: expected one of {INDEXER_MODES}, got {mode!r}")
    if mode == "off":
        return False, f"{INDEXER_ENV}=off"
    if mode == "always":
        return True, f"{INDEXER_ENV}=always"
    if not is_cuda and hip_arch is None:
        return False, "neither the CUDA nor the ROCm platform (vLLM has its own indexer there)"
    gfx = None if is_cuda else hip_arch.split(":")[0]
    if gfx is not None and not supports_capability(None, hip_arch):
        return False, f"{gfx} is not a declared architecture of the Triton kernels"
    if batch_invariant:
        # DeepGEMM (and vLLM's ROCm path) scores prefill and decode rows with two different kernels, and vLLM claims
        # no batch invariance for them; ours computes each row alone (indexer_topk(deterministic=True)).
        return True, "VLLM_BATCH_INVARIANT=1"
    if gfx is not None:
        if aiter:
            return False, f"vLLM's ROCm indexer runs on aiter's kernels on {gfx}"
        return True, f"vLLM's ROCm indexer has no aiter kernels enabled on {gfx}"
    if deep_gemm:
        return False, "DeepGEMM is usable on this GPU"
    return True, "DeepGEMM is not usable on this GPU"


def deep_gemm_usable() -> bool:
    """Whether vLLM's DeepGEMM indexer can run here: the package imports (vendored or not) *and* the GPU is one
    DeepGEMM supports (vLLM's ``support_deep_gemm``: SM90, SM10x, SM12x). ``VLLM_USE_DEEP_GEMM`` plays no part:
    vLLM's indexer ignores it."""
    from vllm.utils.deep_gemm import has_deep_gemm

    return bool(current_platform.support_deep_gemm()) and has_deep_gemm()


def aiter_indexer_enabled() -> bool:
    """Whether vLLM's ROCm indexer runs on aiter's kernels here: the first two terms of vLLM 0.33's condition in
    ``SparseAttnIndexer.forward_hip`` (``rocm_aiter_ops.is_enabled()``: aiter installed, CDNA 3/4,
    ``VLLM_ROCM_USE_AITER=1``; ``is_rdna_aiter_enabled()``: the same on RDNA4), queried from vLLM."""
    from vllm._aiter_ops import rocm_aiter_ops

    return bool(rocm_aiter_ops.is_enabled()) or bool(rocm_aiter_ops.is_rdna_aiter_enabled())


def vllm_hip_route() -> str | None:
    """What vLLM 0.33's ``SparseAttnIndexer.forward_hip`` computes with on this ROCm GPU, in words, or None where it
    raises ("requires AITER or a supported native architecture"): vLLM's condition, term by term, from its flags."""
    import vllm.platforms.rocm as rocm

    if aiter_indexer_enabled():
        return "aiter's kernels"
    if rocm.on_gfx11():
        return "its gfx11 path: PyTorch reference logits, vLLM's top-k"
    if rocm.on_gfx950():
        return "its gfx950 path: PyTorch reference logits, vLLM's top-k"
    return None


def use_triton_indexer() -> tuple[bool, str]:
    """:func:`decide` for this process (reads ``TRITON_MLA_SPARSE_INDEXER`` and queries vLLM's platform)."""
    mode = indexer_mode()
    if mode != "auto":
        return decide(mode, is_cuda=False, deep_gemm=False)
    if current_platform.is_rocm():
        import vllm.platforms.rocm as rocm

        return decide(mode, is_cuda=False, deep_gemm=False, batch_invariant=batch_invariant(),
                      hip_arch=rocm._GCN_ARCH, aiter=aiter_indexer_enabled())
    is_cuda = current_platform.is_cuda()
    invariant = is_cuda and batch_invariant()
    return decide(mode, is_cuda=is_cuda, deep_gemm=is_cuda and not invariant and deep_gemm_usable(),
                  batch_invariant=invariant)


def unsupported_reasons(*, k_cache: Any, head_dim: int, use_fp4_cache: bool, compress_ratio: int,
                        candidate_blocks: torch.Tensor | None, dcp_world_size: int, use_pcp: bool,
                        candidate_block_size: int = 0) -> list[str]:
    """What of an indexer's configuration the Triton indexer cannot serve (empty: everything)."""
    from vllm.utils.deep_gemm import mqa_logits_use_mx_scales

    reasons = []
    if head_dim != D_INDEX:
        reasons.append(f"index head dim {head_dim} (only {D_INDEX})")
    if use_fp4_cache:
        reasons.append("the MXFP4 indexer cache (indexer_kv_dtype=mxfp4)")
    if mqa_logits_use_mx_scales():
        reasons.append("SM10x's MX-scaled fp8 indexer cache (UE8M0 scales instead of float32)")
    if getattr(k_cache, "uses_shuffled_layout", False):
        reasons.append("the shuffled indexer cache layout")
    if not isinstance(compress_ratio, int) or compress_ratio < 1:
        reasons.append(f"compress_ratio {compress_ratio!r} (a positive int: 1, or DeepSeek-V4's 4)")
    if candidate_blocks is not None and (not isinstance(candidate_block_size, int) or candidate_block_size < 1):
        reasons.append(f"two-level candidate blocks of candidate_block_size {candidate_block_size!r} (a positive "
                       f"int)")
    if dcp_world_size > 1:
        reasons.append("decode context parallelism")
    if use_pcp:
        reasons.append("prefill context parallelism")
    return reasons


def _platform_forward(name: str):
    """vLLM's ``name`` (forward_native, forward_hip, ...) when the Triton indexer is off, else forward_cuda's path
    (the op is Triton's on every platform)."""

    def forward(self, hidden_states, q_quant, k, weights):
        if not self.triton:
            return getattr(super(TritonSparseAttnIndexer, self), name)(hidden_states, q_quant, k, weights)
        return self.forward_cuda(hidden_states, q_quant, k, weights)

    forward.__name__, forward.__qualname__ = name, f"TritonSparseAttnIndexer.{name}"
    return forward


class TritonSparseAttnIndexer(SparseAttnIndexer):
    """vLLM's ``SparseAttnIndexer`` whose forward runs :func:`sparse_attn_indexer` when :func:`use_triton_indexer`
    says so at construction (``self.triton``); otherwise exactly vLLM's class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.triton, why = use_triton_indexer()
        if not self.triton:
            super().__init__(*args, **kwargs)
            return
        # vLLM's __init__ stores its arguments and parallel settings, then raises without DeepGEMM on CUDA: the
        # same attributes, set here (the model and the MLA layer read some of them, e.g. topk_backend).
        bound = inspect.signature(SparseAttnIndexer.__init__).bind(self, *args, **kwargs)
        bound.apply_defaults()
        CustomOp.__init__(self)
        for name, value in bound.arguments.items():
            if name != "self":
                setattr(self, name, value)
        self.dense_mha_metadata_layer_name = ""
        vllm_config = get_current_vllm_config()
        parallel_config = vllm_config.parallel_config
        self.topk_backend = vllm_config.kernel_config.sparse_indexer_topk_backend
        self._parallel_config = parallel_config
        self.dcp_world_size = parallel_config.decode_context_parallel_size
        self.dcp_rank = 0
        self.use_pcp = parallel_config.prefill_context_parallel_size > 1
        self.pcp_shard_decode_requests = parallel_config.pcp_shard_decode_requests
        if current_platform.is_rocm():
            declare_unshuffled_cache(self.k_cache)
        reasons = unsupported_reasons(
            k_cache=self.k_cache, head_dim=self.head_dim, use_fp4_cache=self.use_fp4_cache,
            compress_ratio=self.compress_ratio, candidate_blocks=self.candidate_blocks,
            dcp_world_size=self.dcp_world_size, use_pcp=self.use_pcp, candidate_block_size=self.candidate_block_size)
        if reasons:
            raise ValueError(
                f"triton-mla-sparse: the Triton DSA indexer was chosen ({why}) but does not support "
                f"{'; '.join(reasons)}. Use a GPU with DeepGEMM (SM90/SM100) for this configuration, or set "
                f"{INDEXER_ENV}=off.")
        _DETERMINISTIC[0] = batch_invariant()
        if _DETERMINISTIC[0]:
            declare_invariant_cache(self.k_cache)
        _log_once(logging.INFO, "using", "triton-mla-sparse: the DSA indexer runs on Triton (%s%s).", why,
                  "; rows computed alone for batch invariance" if _DETERMINISTIC[0] else "")
        if self.candidate_blocks is not None and not self.candidate_write:
            covered = (self.candidate_blocks.shape[1] - 1) * self.candidate_block_size + 1
            if covered < self.topk_tokens:
                _log_once(logging.WARNING, "candidates-short", "triton-mla-sparse: V4.1's candidate blocks may cover "
                          "only %d of the %d positions an index source selects; there the Triton indexer returns "
                          "only candidate positions (-1 padded) where vLLM's top-k adds masked ones.", covered,
                          self.topk_tokens)
        route_vllm_call_sites()

    def forward_cuda(self, hidden_states: torch.Tensor, q_quant: Any, k: torch.Tensor,
                     weights: torch.Tensor) -> torch.Tensor:
        if not self.triton:
            return super().forward_cuda(hidden_states, q_quant, k, weights)
        return torch.ops.triton_mla_sparse.sparse_attn_indexer(
            hidden_states, _encode_layer_name(self.k_cache.prefix), self.k_cache.kv_cache, q_quant, None, k,
            weights, self.quant_block_size, self.scale_fmt, self.topk_tokens, self.head_dim, self.max_model_len,
            self.max_total_seq_len, self.topk_indices_buffer, self.skip_k_cache_insert, self.use_pcp,
            self.pcp_shard_decode_requests, _encode_layer_name(self.dense_mha_metadata_layer_name),
            self.use_fp4_cache, self.dcp_rank, self.dcp_world_size,
            self._parallel_config.cp_kv_cache_interleave_size, False, candidate_blocks=self.candidate_blocks,
            candidate_block_size=self.candidate_block_size, candidate_write=self.candidate_write,
            topk_backend=self.topk_backend, compress_ratio=self.compress_ratio)

    forward_native = _platform_forward("forward_native")
    forward_hip = _platform_forward("forward_hip")
    forward_xpu = _platform_forward("forward_xpu")
    forward_cpu = _platform_forward("forward_cpu")


_INVARIANT_BACKENDS: dict[type, type] = {}


def declare_invariant_cache(k_cache: Any) -> None:
    """Make the indexer's cache layer report a backend that declares batch invariance.

    vLLM refuses ``VLLM_BATCH_INVARIANT=1`` unless every attention layer's backend declares it, the indexer's
    cache layer (``DEEPSEEK_V32_INDEXER``) included. That backend only lays out the cache and builds metadata; the
    computation is this module's, row by row (``indexer_topk(deterministic=True)``). So this layer — not vLLM's
    class — gets a subclass of its backend (same name and builder) that says so."""
    get = getattr(k_cache, "get_attn_backend", None)
    if get is None:
        return
    backend = get()
    if backend.supports_batch_invariance():
        return
    sub = _INVARIANT_BACKENDS.get(backend)
    if sub is None:
        sub = _INVARIANT_BACKENDS[backend] = type(backend.__name__, (backend,), {
            "__doc__": f"{backend.__name__}, with the triton-mla-sparse indexer computing each row alone.",
            "supports_batch_invariance": classmethod(lambda cls: True)})
    k_cache.get_attn_backend = lambda: sub


_UNSHUFFLED_CACHES: dict[type, type] = {}


def declare_unshuffled_cache(k_cache: Any) -> None:
    """Make the indexer's cache layer report the unshuffled layout ``[blocks, block_size, 128 + 4]``, the one this
    module reads.

    vLLM's ROCm cache layer (``DeepseekV32ROCmIndexerCache``) reports the shuffled layout aiter's reader expects
    above block size 1, and the model's fused cache write (``fused_norm_rope``) follows what the layer reports
    ("whether this cache's reader expects the shuffled value layout"). With this indexer as the reader, this layer —
    not vLLM's class — gets a subclass (same name) whose ``uses_shuffled_layout`` is False."""
    cls = type(k_cache)
    if not isinstance(getattr(cls, "uses_shuffled_layout", None), property):
        return
    sub = _UNSHUFFLED_CACHES.get(cls)
    if sub is None:
        sub = _UNSHUFFLED_CACHES[cls] = type(cls.__name__, (cls,), {
            "__doc__": f"{cls.__name__}, written unshuffled for the triton-mla-sparse indexer.",
            "__module__": cls.__module__,
            "uses_shuffled_layout": property(lambda self: False)})
    k_cache.__class__ = sub


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _indexer_topk_into(out, q, weights, kv_cache, block_table, req, positions, max_len, candidates=None):
    """``indexer_topk`` into ``out`` (a view of the top-k buffer); float32 weights as the kernels want them.

    ``candidates`` (DeepSeek-V4.1: these rows of the candidate-block buffer, the block size, whether this layer
    writes them): the logits are materialised, then the candidate step runs between them and the select — the
    candidate source publishes its rows' best blocks, a later index source masks its logits to them — over each
    row's ``positions + 1`` request-local entries, as vLLM's function does between DeepGEMM's logits and its top-k."""
    if weights.dtype != torch.float32:
        weights = weights.float()
    if candidates is None:
        indexer_topk(q, weights, kv_cache, block_table, req, positions, out.shape[1], max_len=max_len, out=out,
                     deterministic=_DETERMINISTIC[0])
        return
    blocks, block_size, write = candidates
    logits = indexer_logits(q, weights, kv_cache, block_table, req, positions, max_len,
                            deterministic=_DETERMINISTIC[0])
    visible = (positions + 1).clamp_(min=0)  # positions -1: no entry yet
    if write:
        select_candidate_blocks(logits, visible, block_size, blocks)
    else:
        apply_candidate_mask(logits, visible, blocks, block_size)
    # prefill rows (several per request) take the prefill choice, as indexer_topk does: torch.topk where the split
    # select's [T, L] workspace would not pay
    shared = q.shape[0] > block_table.shape[0]
    select = "torch" if _DETERMINISTIC[0] else choose_select_config(logits.device, shared_rows=shared).select
    topk_select(logits, out.shape[1], out=out, select=select)


def _prefill(md, kv4, q_quant, weights, topk_indices_buffer, topk_tokens, candidates=None):
    prefill = md.prefill
    # candidate rows are absolute token rows, so prefill rows are not sharded then (as in vLLM)
    row_shard = None if candidates is not None else PrefillRowShard.from_metadata(prefill, md.num_decode_tokens)
    for chunk in prefill.chunks:
        start, end = chunk.token_start, chunk.token_end
        ks, ke = chunk.cu_seqlen_ks, chunk.cu_seqlen_ke
        if row_shard is not None:
            narrowed = row_shard.narrow(chunk)
            if narrowed is None:
                continue
            start, end, ks, ke = narrowed
        out = topk_indices_buffer[start:end, :topk_tokens]
        rows = None if candidates is None else (candidates[0][start:end], *candidates[1:])
        if chunk.local_total_seq_lens == 0 or end == start:
            out.fill_(-1)
            if rows is not None and rows[2]:  # vLLM leaves these rows as they were; -1: no candidate, not garbage
                rows[0].fill_(-1)
            continue
        # Row i scores K rows [ks[i], ke[i]) of the chunk's gathered K: request-local positions 0 … ke-ks-1 of the
        # request whose gathered range starts at ks[i] (right=True skips empty requests sharing that start). With a
        # compressed cache these are entries, (p + 1) // C of them for the token at p; a token with none yet
        # (ke == ks) gets position -1, which indexer_topk answers with an all -1 row (its request id may then be
        # num_reqs, past the table: never read).
        cu = chunk.local_cu_seq_lens if chunk.local_cu_seq_lens is not None else chunk.cu_seq_lens
        req = (torch.searchsorted(cu, ks, right=True) - 1).to(torch.int32)
        positions = (ke - ks - 1).to(torch.int32)
        _indexer_topk_into(out, q_quant[start:end], weights[start:end], kv4, chunk.block_table, req, positions,
                           chunk.max_seqlen_k, rows)
    if row_shard is not None:
        row_shard.exchange_topk(topk_indices_buffer, topk_tokens)


def _decode(md, kv4, q_quant, weights, topk_indices_buffer, topk_tokens, max_model_len, compress_ratio,
            candidates=None):
    from vllm.v1.attention.ops.common import pack_seq_triton, unpack_seq_triton

    decode = md.decode
    num_decode_tokens = md.num_decode_tokens
    decode_lens = decode.decode_lens
    # vLLM's packing of the decode rows into [batch, next_n] (sparse_attn_indexer, DeepGEMM path), kept as is.
    needs_padded_path = decode.requires_padding or (num_decode_tokens % decode_lens.shape[0] != 0)
    if num_decode_tokens == 0:
        padded_q = q_quant[:1].reshape(1, 1, *q_quant.shape[1:])
    elif needs_padded_path:
        padded_q = pack_seq_triton(q_quant[:num_decode_tokens], decode_lens)
    else:
        padded_q = q_quant[:num_decode_tokens].reshape(decode_lens.shape[0], -1, *q_quant.shape[1:])
    batch_size, next_n = padded_q.shape[:2]
    rows = batch_size * next_n
    # (B, next_n): each row's context length, in cache entries (compressed: (p + 1) // C for the token at p; 0 for a
    # token with no complete entry yet, and for padding rows, whose positions -1 then give all -1 rows)
    seq_lens = decode.seq_lens[:batch_size]
    if seq_lens.numel() != rows:
        raise RuntimeError(f"triton-mla-sparse indexer: decode seq_lens {tuple(seq_lens.shape)} do not give one "
                           f"context length per row of the packed [{batch_size}, {next_n}] decode queries")
    dev = q_quant.device
    positions = (seq_lens.reshape(-1) - 1).to(torch.int32)
    req = torch.div(torch.arange(rows, device=dev, dtype=torch.int32), next_n, rounding_mode="floor")
    w = weights[:rows]  # as vLLM hands DeepGEMM: the flat rows, also on the packed path
    if w.shape[0] < rows:
        w = torch.nn.functional.pad(w, (0, 0, 0, rows - w.shape[0]))
    block_table = decode.block_table
    # Eager: the longest context of the batch (md.max_seq_len counts tokens; a row sees at most max_seq_len // C
    # entries). Under CUDA-graph capture the launch must serve every replay, so the width is the model's maximum
    # (what vLLM's DeepGEMM call uses; the compressed indexer of DeepSeek-V4 passes max_model_len // C).
    # With candidate blocks the width is always the model's (vLLM's DeepGEMM logits width): a consumer whose compress
    # ratio differs from its candidate source's then clamps the same candidates past the width as vLLM does.
    wide = candidates is not None or _capturing(q_quant.device)
    max_len = max_model_len if wide else md.max_seq_len // compress_ratio
    max_len = min(max_len, block_table.shape[1] * kv4.shape[1])
    out = topk_indices_buffer[:rows, :topk_tokens]
    # candidate rows follow the packed decode rows, as in vLLM (the source and its consumers pack alike)
    _indexer_topk_into(out, padded_q.reshape(rows, *q_quant.shape[1:]), w, kv4, block_table, req, positions,
                       max_len, None if candidates is None else (candidates[0][:rows], *candidates[1:]))
    if needs_padded_path:
        topk = unpack_seq_triton(out.reshape(batch_size, -1, out.shape[-1]), decode_lens)
        topk_indices_buffer[: topk.shape[0], : topk.shape[-1]] = topk


def sparse_attn_indexer(
    hidden_states: torch.Tensor,
    k_cache_prefix: LayerNameType,
    kv_cache: torch.Tensor,
    q_quant: torch.Tensor,
    q_scale: torch.Tensor | None,
    k: torch.Tensor | None,
    weights: torch.Tensor,
    quant_block_size: int,
    scale_fmt: str | None,
    topk_tokens: int,
    head_dim: int,
    max_model_len: int,
    total_seq_lens: int,
    topk_indices_buffer: torch.Tensor,
    skip_k_cache_insert: bool,
    use_pcp: bool,
    pcp_shard_decode_requests: bool,
    dense_mha_metadata_layer_name: LayerNameType,
    use_fp4_cache: bool = False,
    dcp_rank: int = 0,
    dcp_world_size: int = 1,
    cp_kv_cache_interleave_size: int = 1,
    skip_topk_buffer_clear: bool = False,
    candidate_blocks: torch.Tensor | None = None,
    candidate_block_size: int = 0,
    candidate_write: bool = False,
    topk_backend: str = "auto",
) -> torch.Tensor:
    """vLLM's ``sparse_attn_indexer`` (same signature and effects) with the logits and top-k of
    :func:`triton_mla_sparse.indexer_topk` instead of DeepGEMM's kernels, for an uncompressed indexer cache
    (the function DeepSeek-V3.2 / GLM-5 call directly). Returns ``topk_indices_buffer``."""
    return _sparse_attn_indexer_op(
        hidden_states, k_cache_prefix, kv_cache, q_quant, q_scale, k, weights, quant_block_size, scale_fmt,
        topk_tokens, head_dim, max_model_len, total_seq_lens, topk_indices_buffer, skip_k_cache_insert, use_pcp,
        pcp_shard_decode_requests, dense_mha_metadata_layer_name, use_fp4_cache, dcp_rank, dcp_world_size,
        cp_kv_cache_interleave_size, skip_topk_buffer_clear, candidate_blocks, candidate_block_size,
        candidate_write, topk_backend, compress_ratio=1)


def _sparse_attn_indexer_op(
    hidden_states: torch.Tensor,
    k_cache_prefix: LayerNameType,
    kv_cache: torch.Tensor,
    q_quant: torch.Tensor,
    q_scale: torch.Tensor | None,
    k: torch.Tensor | None,
    weights: torch.Tensor,
    quant_block_size: int,
    scale_fmt: str | None,
    topk_tokens: int,
    head_dim: int,
    max_model_len: int,
    total_seq_lens: int,
    topk_indices_buffer: torch.Tensor,
    skip_k_cache_insert: bool,
    use_pcp: bool,
    pcp_shard_decode_requests: bool,
    dense_mha_metadata_layer_name: LayerNameType,
    use_fp4_cache: bool = False,
    dcp_rank: int = 0,
    dcp_world_size: int = 1,
    cp_kv_cache_interleave_size: int = 1,
    skip_topk_buffer_clear: bool = False,
    candidate_blocks: torch.Tensor | None = None,
    candidate_block_size: int = 0,
    candidate_write: bool = False,
    topk_backend: str = "auto",
    compress_ratio: int = 1,
) -> torch.Tensor:
    """The op behind :meth:`TritonSparseAttnIndexer.forward_cuda`: :func:`sparse_attn_indexer` plus the layer's
    ``compress_ratio`` (tokens per cache entry: 1, or 4 on DeepSeek-V4's C4A layers), for which vLLM's function has
    no argument. vLLM's metadata already counts entries; the ratio only narrows the eager decode width to
    ``md.max_seq_len // compress_ratio`` (``md.max_seq_len`` counts tokens)."""
    forward_context = get_forward_context()
    attn_metadata = forward_context.attn_metadata
    if not isinstance(attn_metadata, dict):
        # Profiling / dummy run: vLLM's function only reserves its workspaces here (no DeepGEMM). Ours need less.
        return _vllm_sai.sparse_attn_indexer(
            hidden_states, k_cache_prefix, kv_cache, q_quant, q_scale, k, weights, quant_block_size, scale_fmt,
            topk_tokens, head_dim, max_model_len, total_seq_lens, topk_indices_buffer, skip_k_cache_insert,
            use_pcp, pcp_shard_decode_requests, dense_mha_metadata_layer_name, use_fp4_cache, dcp_rank,
            dcp_world_size, cp_kv_cache_interleave_size, skip_topk_buffer_clear, candidate_blocks,
            candidate_block_size, candidate_write, topk_backend)
    if use_fp4_cache or q_scale is not None or dcp_world_size > 1 or use_pcp:
        raise RuntimeError("triton-mla-sparse indexer: MXFP4 caches and context parallelism are not supported (the "
                           "op's constructor rejects them)")
    candidates = None if candidate_blocks is None else (candidate_blocks, candidate_block_size, candidate_write)
    md = attn_metadata[_resolve_layer_name(k_cache_prefix)]
    if q_quant.dtype == torch.float8_e4m3fnuz:
        # vLLM's fp8 on gfx942 (its indexer cache too): the same bytes read as e4m3fn are exactly twice each value
        # (bias 7 instead of 8; vLLM quantizes to at most 224, so no byte is NaN in either format), so every logit
        # of a row is four times its value and the top-k positions are the same.
        q_quant = q_quant.view(torch.float8_e4m3fn)

    if not skip_k_cache_insert:
        from vllm import _custom_ops as ops
        from vllm.v1.attention.ops.pcp import maybe_gather_indexer_k

        num_tokens = md.slot_mapping.shape[0]
        k, slot_mapping = maybe_gather_indexer_k(k[:num_tokens], md.slot_mapping, md.num_decode_tokens, False,
                                                 pcp_shard_decode_requests=pcp_shard_decode_requests)
        ops.indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)

    # vLLM's early return: dense MHA serves this prefill-only batch, nobody reads the top-k.
    if forward_context.cudagraph_runtime_mode != CUDAGraphMode.FULL:
        dense_layer = _resolve_layer_name(dense_mha_metadata_layer_name)
        if dense_layer:
            mla_metadata = attn_metadata.get(dense_layer)
            if (getattr(getattr(mla_metadata, "prefill", None), "use_dense_mha", False)
                    and getattr(mla_metadata, "num_decode_tokens", -1) == 0
                    and not _capturing(hidden_states.device)):
                return topk_indices_buffer

    if not skip_topk_buffer_clear:
        topk_indices_buffer[: hidden_states.shape[0]] = -1
    kv4 = kv_cache.unsqueeze(-2) if kv_cache.dim() == 3 else kv_cache  # [num_blocks, block_size, 1, 132] bytes
    if md.num_prefills > 0:
        _prefill(md, kv4, q_quant, weights, topk_indices_buffer, topk_tokens, candidates)
    if md.num_decodes > 0:
        _decode(md, kv4, q_quant, weights, topk_indices_buffer, topk_tokens, max_model_len, compress_ratio,
                candidates)
    return topk_indices_buffer


def _sparse_attn_indexer_fake(*args, **kwargs) -> torch.Tensor:
    return inspect.signature(_sparse_attn_indexer_op).bind(*args, **kwargs).arguments["topk_indices_buffer"]


def _no_deep_gemm_schedule(context_lens, block_size, num_sms, indices=None) -> torch.Tensor:
    """Stand-in for DeepGEMM's paged-MQA schedule in the indexer's metadata builder: an empty [1, 2] schedule (the
    builder copies it into its buffer; only DeepGEMM's decode kernel reads it)."""
    return torch.zeros(1, 2, dtype=torch.int32, device=context_lens.device)


_library = None


def _register_torch_op() -> None:
    """``torch.ops.triton_mla_sparse.sparse_attn_indexer``: opaque to torch.compile, like vLLM's op."""
    global _library
    if _library is None:
        _library = torch.library.Library("triton_mla_sparse", "FRAGMENT")
        direct_register_custom_op("sparse_attn_indexer", _sparse_attn_indexer_op,
                                  mutates_args=["topk_indices_buffer", "candidate_blocks"],
                                  fake_impl=_sparse_attn_indexer_fake, target_lib=_library)


def route_vllm_call_sites() -> list[str]:
    """Re-point the vLLM names of :data:`CALL_SITES` (those whose modules are loaded) to ours; idempotent. A name
    whose signature differs from ours is left alone with one warning. Returns the ``module.name`` now routed."""
    routed = []
    for mod_name, attr, ours_name in CALL_SITES:
        mod = sys.modules.get(mod_name)
        current = getattr(mod, attr, None) if mod is not None else None
        if current is None:
            continue
        ours = globals()[ours_name]
        if current is ours or getattr(current, _ROUTED_MARK, False):
            routed.append(f"{mod_name}.{attr}")
            continue
        try:
            same = list(inspect.signature(current).parameters) == list(inspect.signature(ours).parameters)
        except (TypeError, ValueError):
            same = False
        if not same:
            _log_once(logging.WARNING, f"sig:{mod_name}.{attr}",
                      "triton-mla-sparse: %s.%s differs from the vLLM 0.33 signature; not routed to the Triton "
                      "indexer (DSA models may fail without DeepGEMM).", mod_name, attr)
            continue
        setattr(mod, attr, ours)
        routed.append(f"{mod_name}.{attr}")
    return routed


def install() -> bool:
    """Register :class:`TritonSparseAttnIndexer` as vLLM's out-of-tree ``SparseAttnIndexer`` (idempotent). Returns
    whether it is registered after the call; ``TRITON_MLA_SPARSE_INDEXER=off`` registers nothing."""
    if indexer_mode() == "off":
        return op_registry_oot.get(OP_NAME) is TritonSparseAttnIndexer
    current = op_registry_oot.get(OP_NAME)
    if current is TritonSparseAttnIndexer:
        return True
    if current is not None:
        _log_once(logging.WARNING, "oot-taken", "triton-mla-sparse: %s is already replaced by %s; the Triton DSA "
                  "indexer is not registered.", OP_NAME, current.__qualname__)
        return False
    _register_torch_op()
    CustomOp.register_oot(TritonSparseAttnIndexer, name=OP_NAME)
    # register_oot names the class after the registry key; keep vLLM's op name so that
    # --compilation-config custom_ops '+sparse_attn_indexer' / '-sparse_attn_indexer' mean the same.
    TritonSparseAttnIndexer.name = SparseAttnIndexer.name
    return True


for _site in (sparse_attn_indexer, _no_deep_gemm_schedule):
    setattr(_site, _ROUTED_MARK, True)

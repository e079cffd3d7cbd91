"""One vLLM engine, one JSON spec in, one JSON result out:  ``python -m e2e.worker SPEC.json OUT.json``.

Runs in its own process (vLLM's engine core in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the counters and
the indexer shadow below see the model's calls). The spec's ``env`` is applied before vLLM is imported. Tasks:

``generate``  greedy generation of the spec's prompts; per prompt the tokens and the first token's top logprobs;
              with ``count_calls`` the calls of our backend's kernel hook (decode / prefill, rows, and in eager
              steps the largest number of valid top-k entries, which shows that a prompt longer than the top-k ran
              sparse); with ``shadow_indexer`` (vLLM's own indexer active) our indexer recomputes every eager step's
              top-k from the same cache and the two sets are compared.
``trace``     where batching changes a request's numbers (:mod:`.trace`).
``serving``   time to first token, time per output token and batched decode tokens/s (see :func:`serving`).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .schema import validate_spec

HERE = Path(__file__).resolve().parent


def backend_env(spec: dict[str, Any]) -> dict[str, str]:
    """The environment a spec's backend needs: on a DeepSeek-V4 or V4.1 variant, ours is the plugin's layer
    (``TRITON_MLA_SPARSE_DSV4=triton``), the peer vLLM's own layer with the plugin's routing off."""
    from .schema import OURS_LAYERS, PEER_V4, PEER_V41

    if spec["backend"] in OURS_LAYERS:
        return {"TRITON_MLA_SPARSE_DSV4": "triton"}
    return {"TRITON_MLA_SPARSE_DSV4": "off"} if spec["backend"] in (PEER_V4, PEER_V41) else {}


def engine_kwargs(spec: dict[str, Any], model_dir: str) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``spec``'s engine on the model folder ``model_dir``."""
    from .models import is_v41, uses_v4_layer
    from .schema import OURS_LAYERS

    kwargs: dict[str, Any] = dict(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        kv_cache_dtype=spec["kv_cache_dtype"],
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec["max_num_seqs"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        kv_cache_memory_bytes=spec["kv_cache_memory_bytes"],
        enforce_eager=spec["mode"] == "eager",
        seed=spec["seed"],
        enable_prefix_caching=False,
        disable_log_stats=not spec.get("speculative"),  # the speculator's acceptance counts are stats
    )
    if not uses_v4_layer(spec["variant"]):  # V4's and V4.1's layers pick their own page sizes
        kwargs["block_size"] = 64
    if spec["backend"] not in OURS_LAYERS:  # ours on V4 / V4.1 is a layer class chosen by the plugin, not a name
        kwargs["attention_config"] = {"backend": spec["backend"]}
    if is_v41(spec["variant"]):  # V4.1's architecture is multimodal: no vision tower, no image inputs to profile
        kwargs["language_model_only"] = True
    if spec["mode"] == "graphs":
        kwargs["cudagraph_capture_sizes"] = spec["capture_sizes"]
    if spec.get("speculative"):
        kwargs["speculative_config"] = spec["speculative"]
    par = spec.get("parallel")
    if par is not None:  # every worker process loads the plugin itself (vLLM's general plugins)
        kwargs.update(tensor_parallel_size=par["tensor_parallel_size"],
                      enable_expert_parallel=par["enable_expert_parallel"])
        if par["executor"] == "mp":
            kwargs["distributed_executor_backend"] = "mp"
    return kwargs


def _engine(spec: dict[str, Any]):
    from vllm import LLM
    from vllm.plugins import load_general_plugins

    from .models import write_model
    from .weights import probe_model, reinit

    load_general_plugins()  # so that attention_config can name TRITON_MLA_SPARSE
    tp = (spec.get("parallel") or {}).get("tensor_parallel_size", 1)
    model_dir = write_model(spec["variant"], spec["model_root"], max_position_embeddings=spec["max_model_len"],
                            tensor_parallel_size=tp)
    kwargs = engine_kwargs(spec, str(model_dir))
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    info = llm.apply_model(functools.partial(reinit, seed=spec["weights_seed"], std=spec["weights_std"]))[0]
    probes = llm.apply_model(probe_model)  # per worker: the attention layers, indexers and plugin state it holds
    probe = probes[0]
    return llm, {"start_s": start_s, "weights": info, "layers": probe["attention_layers"],
                 "indexers": probe["indexers"],
                 "workers": [{**p["process"], "layers": p["attention_layers"], "indexers": p["indexers"]}
                             for p in probes]}


class CallCounter:
    """Wraps ``TritonMLASparseImpl._forward_mqa_kernel``: counts calls and the largest valid top-k per eager step."""

    def __init__(self) -> None:
        self.stats = {"decode_calls": 0, "prefill_calls": 0, "rows": 0, "max_valid_prefill": 0,
                      "max_valid_decode": 0, "captured_calls": 0, "prefill_log": []}

    def install(self) -> None:
        import torch

        from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseImpl

        original = TritonMLASparseImpl._forward_mqa_kernel
        stats = self.stats

        def counted(impl, q, kv_cache, topk_indices, valid_counts, **kw):
            kind = "decode" if kw.get("is_decode") else "prefill"
            stats[f"{kind}_calls"] += 1
            stats["rows"] += int(topk_indices.shape[0])
            if torch.cuda.is_current_stream_capturing():
                stats["captured_calls"] += 1
            elif valid_counts is not None and valid_counts.numel():
                most = int(valid_counts.max())
                stats[f"max_valid_{kind}"] = max(stats[f"max_valid_{kind}"], most)
                if kind == "prefill" and len(stats["prefill_log"]) < 64:  # per call: rows, full rows, most valid
                    full = int((valid_counts >= topk_indices.shape[-1]).sum())
                    stats["prefill_log"].append([int(topk_indices.shape[0]), full, most])
            return original(impl, q, kv_cache, topk_indices, valid_counts, **kw)

        TritonMLASparseImpl._forward_mqa_kernel = counted


class V4CallCounter:
    """Wraps the plugin's ``run_v4_attention`` (one call per decode or prefill part of a V4 layer): the calls
    recorded into CUDA graphs, and in the measured generate call's eager steps the calls, rows, calls with the
    compressed cache and the largest number of valid entries in a row of either list (a compressed row with all
    512 entries valid: the C4A top-k is full)."""

    def __init__(self) -> None:
        self.stats = {"calls": 0, "rows": 0, "extra_calls": 0, "captured_calls": 0, "max_valid_extra": 0,
                      "max_valid_window": 0}
        self.active = False  # set around the measured generate call: vLLM's warm-up and capture runs are not counted

    def install(self) -> None:
        import torch

        from triton_mla_sparse.integrations.vllm import v4_attention

        original = v4_attention.run_v4_attention
        stats = self.stats
        counter = self

        def counted(q, output, **kw):
            if q.is_cuda and torch.cuda.is_current_stream_capturing():  # recorded into a CUDA graph (engine start)
                stats["captured_calls"] += 1
            elif counter.active:
                stats["calls"] += 1
                stats["rows"] += int(q.shape[0])
                stats["extra_calls"] += kw.get("extra_cache") is not None
                for key, idx, lens in (("window", "swa_indices", "swa_lens"),
                                       ("extra", "extra_indices", "extra_lens")):
                    valid = kw.get(lens)
                    if valid is None and kw.get(idx) is not None:
                        valid = (kw[idx].reshape(q.shape[0], -1) >= 0).sum(dim=1)
                    if valid is not None and valid.numel():
                        stats[f"max_valid_{key}"] = max(stats[f"max_valid_{key}"], int(valid.max()))
            return original(q, output, **kw)

        v4_attention.run_v4_attention = counted


class PortableCounter:
    """Wraps the plugin's portable stand-ins: the mHC prenorm (``v4_portable.prenorm_outputs``, DeepSeek-V4's first
    layer where DeepGEMM is not used), the compressor (``v4_portable.portable_compress``, vLLM's Triton compressor
    for its CuTeDSL one) and vLLM's Triton indexer-q kernel (run where the routes answer ``has_cutedsl()`` False):
    their calls, eager and recorded into CUDA graphs, over the whole engine life. With ``shadow`` (an eager engine
    on a GPU where vLLM's own kernels run), each eager call is also made with vLLM's kernel (DeepGEMM's prenorm,
    the CuTeDSL compressor on the cache pages the call touches, restored before the portable call, the CuTeDSL
    indexer q into fresh outputs) and the worst differences kept per component."""

    def __init__(self, shadow: bool = False) -> None:
        self.stats = {f"{what}_{when}": 0 for what in ("prenorm", "compress", "indexer_q")
                      for when in ("calls", "captured")}
        self.shadow = shadow
        self.diffs: dict[str, dict[str, float]] = {}
        self.errors: list[str] = []

    def _count(self, what: str, original, shadow=None):
        import torch

        stats = self.stats

        def counted(*args, **kwargs):
            capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
            stats[f"{what}_{'captured' if capturing else 'calls'}"] += 1
            if shadow is None or capturing:
                return original(*args, **kwargs)
            try:
                return shadow(original, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 (recorded; the engine goes on with the portable result)
                self.errors.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")
                return original(*args, **kwargs)

        return counted

    def _keep(self, what: str, mine, theirs) -> None:
        import torch

        a, b = mine.float(), theirs.float()
        scale = float(torch.nan_to_num(b.abs(), nan=0.0, posinf=0.0).max()) if b.numel() else 0.0
        d = self.diffs.setdefault(what, {"calls": 0, "max_abs": 0.0, "max_rel": 0.0, "nonfinite": 0})
        d["calls"] += 1
        if a.numel():
            diff = torch.nan_to_num((a - b).abs(), nan=float("inf"))
            d["max_abs"] = max(d["max_abs"], float(diff.max()))
            d["max_rel"] = max(d["max_rel"], float(diff.max()) / max(scale, 1e-30))
            d["nonfinite"] += int((~torch.isfinite(a)).sum())

    def _prenorm_shadow(self, original, x, fn):
        from vllm.utils.deep_gemm import tf32_hc_prenorm_gemm

        out, sqrsum = original(x, fn)
        ref_out = out.new_empty(out.shape)
        ref_sq = sqrsum.new_empty(sqrsum.shape)
        tf32_hc_prenorm_gemm(x, fn, ref_out, ref_sq, 1)
        self._keep("prenorm_out", out, ref_out)
        self._keep("prenorm_sqrsum", sqrsum, ref_sq)
        return out, sqrsum

    def _compress_shadow(self, original, **kw):
        """vLLM's CuTeDSL compressor, then the portable one, on the same cache pages: the pages the call's slots
        touch are saved, written by CuTeDSL, kept, restored, written by the portable call; the tokens whose bytes
        differ are compared after dequantization (untouched and equal tokens never count)."""
        import importlib

        import torch

        from triton_mla_sparse import formats
        from triton_mla_sparse.integrations.vllm import v4_portable

        module = importlib.import_module(v4_portable.COMPRESSOR_MODULE)
        cutedsl = getattr(getattr(module, v4_portable.COMPRESSOR_KERNEL), "_triton_mla_sparse_cutedsl_route")
        kv = kw["kv_cache"]
        if kv.dim() != 3 or kv.shape[-1] != formats.V4_TOKEN_BYTES:  # [blocks, block_size, 584], pages strided
            raise ValueError(f"kv_cache: expected V4's [blocks, block_size, 584] view, got {tuple(kv.shape)}")
        bs = kv.shape[1]
        pages = kv.as_strided((kv.shape[0], bs * formats.V4_TOKEN_BYTES), (kv.stride(0), 1))
        slots = kw["k_cache_metadata"].slot_mapping
        touched = torch.unique(slots[slots >= 0] // bs)
        before = pages[touched].clone()
        cutedsl(**kw)
        theirs = pages[touched].clone()
        pages[touched] = before
        result = original(**kw)
        mine = pages[touched].clone()
        torch.cuda.synchronize()

        def tokens(p):  # per token: its 576 row bytes and its 8 footer bytes
            rows = p[:, :bs * formats.V4_ROW_BYTES].reshape(p.shape[0], bs, formats.V4_ROW_BYTES)
            foot = p[:, bs * formats.V4_ROW_BYTES:].reshape(p.shape[0], bs, formats.V4_FOOTER_BYTES)
            return torch.cat([rows, foot], dim=-1)

        changed = (tokens(mine) != tokens(theirs)).any(dim=-1)  # [pages, bs]
        d = self.diffs.setdefault("compress_bytes", {"calls": 0, "tokens_written": 0, "tokens_differing": 0})
        d["calls"] += 1
        d["tokens_written"] += int((slots >= 0).sum())
        d["tokens_differing"] += int(changed.sum())
        if bool(changed.any()):
            a = formats.dequantize_fp8_ds_mla_v4(mine.contiguous(), bs)[changed]
            b = formats.dequantize_fp8_ds_mla_v4(theirs.contiguous(), bs)[changed]
            self._keep("compress_values", a, b)
        return result

    def _indexer_q_shadow(self, original, positions, q, cos_sin, weights, softmax_scale, head_scale, q_fp8,
                          weights_out, **kw):
        import importlib

        import torch

        from triton_mla_sparse.integrations.vllm import v4_portable

        result = original(positions, q, cos_sin, weights, softmax_scale, head_scale, q_fp8, weights_out, **kw)
        cutedsl = importlib.import_module(v4_portable.INDEXER_Q_CUTEDSL_MODULE)._INDEXER_Q_FP8_KERNEL
        ref_q, ref_w = q_fp8.clone(), weights_out.clone()
        cutedsl(positions=positions, q=q, cos_sin_cache=cos_sin, weights=weights, weights_softmax_scale=softmax_scale,
                weights_head_scale=head_scale, q_fp8=ref_q.view(torch.uint8), weights_out=ref_w)
        self._keep("indexer_q_values", q_fp8, ref_q)
        self._keep("indexer_q_weights", weights_out, ref_w)
        return result

    def install(self) -> None:
        import importlib

        from triton_mla_sparse.integrations.vllm import v4_portable

        v4_portable.prenorm_outputs = self._count("prenorm", v4_portable.prenorm_outputs,
                                                  self._prenorm_shadow if self.shadow else None)
        v4_portable.portable_compress = self._count("compress", v4_portable.portable_compress,
                                                    self._compress_shadow if self.shadow else None)
        indexer_q = importlib.import_module(v4_portable.INDEXER_Q_MODULE)
        name = "_FUSED_INDEXER_Q_ROPE_QUANT_TRITON_KERNEL"  # what fused_indexer_q_rope_quant calls without CuTeDSL
        setattr(indexer_q, name, self._count("indexer_q", getattr(indexer_q, name),
                                             self._indexer_q_shadow if self.shadow else None))

    def summary(self) -> dict[str, Any]:
        from triton_mla_sparse.integrations.vllm import v4_portable

        out = {**self.stats, "installed": v4_portable.installed(),
               "cutedsl_routes": v4_portable.cutedsl_routes_installed()}
        if self.shadow:
            out.update(shadow=self.diffs, shadow_errors=self.errors[:10], shadow_error_count=len(self.errors))
        return out


def shadow_errors(mine, theirs, heads: int, rows: slice) -> dict[str, float]:
    """Our output against vLLM's for ``rows`` and the first ``heads`` heads: the largest relative error of a
    (row, head) vector (2-norm), the largest absolute difference, and how many of our values are not finite."""
    import torch

    a, b = mine[rows, :heads].float(), theirs[rows, :heads].float()
    if a.numel() == 0:
        return {"max_rel": 0.0, "max_abs": 0.0, "nonfinite": 0}
    rel = (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)
    return {"max_rel": float(torch.nan_to_num(rel, nan=float("inf")).max()),
            "max_abs": float(torch.nan_to_num((a - b).abs(), nan=float("inf")).max()),
            "nonfinite": int((~torch.isfinite(a)).sum())}


class AttentionShadow:
    """In an engine of vLLM's FlashMLA V4 (or, with ``v41``, V4.1) layer: after each eager ``forward_mqa`` of the
    measured generate call, the plugin's ``forward_v4`` (``forward_v41``) recomputes the same call (same q, caches,
    sink, indexer top-k and metadata) into a NaN-filled buffer; per layer kind (window / C4A / C128A; V4.1: window /
    C1A / C2A, by compress ratio) and phase (decode / prefill) the calls and the worst differences are kept.
    FlashMLA's layer hands ``forward_mqa`` q padded to 64 heads; the recomputation takes the layer's real heads only,
    so our kernels run the configuration an engine of ours runs. Decode steps replayed from a CUDA graph call no
    Python and are not shadowed."""

    def __init__(self, v41: bool = False) -> None:
        self.v41 = v41
        self.by: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.calls = 0
        self.active = False

    def install(self) -> None:
        import importlib

        import torch
        from vllm.forward_context import get_forward_context

        from triton_mla_sparse.integrations.vllm import v4_attention

        model = "deepseek_v41" if self.v41 else "deepseek_v4"  # the same names in both of vLLM's model packages
        compute_global_topk_indices_and_lens = importlib.import_module(
            f"vllm.models.{model}.common.ops").compute_global_topk_indices_and_lens
        DeepseekV4FlashMLAAttention = importlib.import_module(
            f"vllm.models.{model}.nvidia.flashmla").DeepseekV4FlashMLAAttention
        forward = v4_attention.forward_v41 if self.v41 else v4_attention.forward_v4
        window_ratio = 0 if self.v41 else 1  # V4.1's window-only layers have ratio 0, V4's ratio 1

        original = DeepseekV4FlashMLAAttention.forward_mqa
        shadow = self

        def wrapped(layer, q, kv, positions, output):
            result = original(layer, q, kv, positions, output)
            md = get_forward_context().attn_metadata
            if not shadow.active or torch.cuda.is_current_stream_capturing() or not isinstance(md, dict):
                return result
            try:
                swa = md[layer.swa_cache_layer.prefix]
                heads = layer.n_local_heads
                mine = torch.full((q.shape[0], heads, q.shape[2]), float("nan"), dtype=output.dtype, device=q.device)
                forward(layer, q[:, :heads], mine, md, compute_global_topk_indices_and_lens)
                nd, npf = swa.num_decode_tokens, swa.num_prefill_tokens
                kind = "window" if layer.compress_ratio <= window_ratio else f"c{layer.compress_ratio}a"
                for phase, rows in (("decode", slice(0, nd)), ("prefill", slice(nd, nd + npf))):
                    if rows.stop <= rows.start:
                        continue
                    got = shadow_errors(mine, output, heads, rows)
                    entry = shadow.by.setdefault(f"{kind}-{phase}", {"calls": 0, "rows": 0, "max_rel": 0.0,
                                                                      "max_abs": 0.0, "nonfinite": 0})
                    entry["calls"] += 1
                    entry["rows"] += rows.stop - rows.start
                    entry["max_rel"] = max(entry["max_rel"], got["max_rel"])
                    entry["max_abs"] = max(entry["max_abs"], got["max_abs"])
                    entry["nonfinite"] += got["nonfinite"]
                shadow.calls += 1
            except Exception as e:  # recorded: the shadow must never stop the engine it watches
                shadow.errors.append(f"{type(e).__name__}: {e}"[:300])
            return result

        DeepseekV4FlashMLAAttention.forward_mqa = wrapped

    def summary(self) -> dict[str, Any]:
        return {"calls": self.calls, "by": self.by, "errors": self.errors[:3], "error_count": len(self.errors)}


class IndexerShadow:
    """Wraps vLLM's ``sparse_attn_indexer`` as the DSA attention calls it: after vLLM's own (DeepGEMM) top-k, our
    indexer computes the same step's top-k into a copy of the buffer, and the two sets are compared per row."""

    def __init__(self) -> None:
        self.rows: list[tuple[list[int], list[int]]] = []
        self.steps = 0
        self.max_rows = 8192
        self.rows_per_step = 128  # spread over steps (every prefill chunk and decode step), not the first chunk only
        self.errors: list[str] = []

    def keep(self, rows: Any, theirs: Any, mine: Any, into: list) -> None:
        """Append to ``into`` (theirs, mine) of the step's ``rows`` (row indices): at most ``rows_per_step`` evenly
        spaced ones, spread over steps (every prefill chunk and decode step), up to ``max_rows`` in all."""
        import torch

        if rows.numel() > self.rows_per_step:
            rows = rows[torch.linspace(0, rows.numel() - 1, self.rows_per_step).long().to(rows.device)]
        for r in rows.tolist()[: self.max_rows - len(into)]:
            into.append((theirs[r].tolist(), mine[r].tolist()))

    def install(self) -> None:
        import torch
        import vllm.models.deepseek_v32.attention as dsa

        from triton_mla_sparse.integrations.vllm.indexer import sparse_attn_indexer as ours

        original = dsa.sparse_attn_indexer
        sig = inspect.signature(original)
        shadow = self

        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            if torch.cuda.is_current_stream_capturing() or len(shadow.rows) >= shadow.max_rows:
                return result
            from vllm.forward_context import get_forward_context

            if not isinstance(get_forward_context().attn_metadata, dict):
                return result
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            n = a["hidden_states"].shape[0]
            theirs = a["topk_indices_buffer"][:n].clone()
            mine_buf = a["topk_indices_buffer"].clone()
            mine_buf[:n] = -1
            a["topk_indices_buffer"] = mine_buf
            a["skip_k_cache_insert"] = True
            try:
                ours(**a)
            except Exception as e:  # recorded: the shadow must never stop the engine it watches
                shadow.errors.append(f"{type(e).__name__}: {e}"[:300])
                return result
            mine = mine_buf[:n]
            topk = int(a["topk_tokens"])
            full = ((theirs >= 0).sum(dim=1) >= topk).nonzero().flatten()  # rows where the top-k selects
            shadow.keep(full, theirs, mine, shadow.rows)
            shadow.steps += 1
            return result

        dsa.sparse_attn_indexer = wrapped

    def summary(self) -> dict[str, Any]:
        from .compare import set_agreement

        head = {"steps": self.steps, "errors": self.errors[:3], "error_count": len(self.errors)}
        if not self.rows:
            return {**head, "rows": 0}
        return {**head, **set_agreement([a for a, _ in self.rows], [b for _, b in self.rows])}


class IndexerOpShadow(IndexerShadow):
    """For DeepSeek-V4.1 (its indexers call the op, ``SparseAttnIndexer.forward_cuda``): after vLLM's own
    (DeepGEMM) step, the plugin's op (``_sparse_attn_indexer_op``) computes the same step into copies of the top-k
    buffer and of the candidate-block buffer — a candidate source writes its own candidates, a later index source
    reads the ones vLLM published — and both the top-k sets and the published candidate-block sets are compared per
    row."""

    def __init__(self) -> None:
        super().__init__()
        self.candidate_rows: list[tuple[list[int], list[int]]] = []

    def install(self) -> None:
        import torch
        from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
        from vllm.utils.torch_utils import _encode_layer_name

        from triton_mla_sparse.integrations.vllm.indexer import _sparse_attn_indexer_op as ours

        original = SparseAttnIndexer.forward_cuda
        shadow = self

        def wrapped(op, hidden_states, q_quant, k, weights):
            result = original(op, hidden_states, q_quant, k, weights)
            if torch.cuda.is_current_stream_capturing() or len(shadow.rows) >= shadow.max_rows:
                return result
            from vllm.forward_context import get_forward_context

            if not isinstance(get_forward_context().attn_metadata, dict) or isinstance(q_quant, tuple):
                return result
            n = hidden_states.shape[0]
            theirs = op.topk_indices_buffer[:n].clone()
            mine_buf = op.topk_indices_buffer.clone()
            mine_buf[:n] = -1  # whatever ours leaves untouched then differs from vLLM's rows
            cand = op.candidate_blocks
            mine_cand = None if cand is None else cand.clone()
            if cand is not None and op.candidate_write:
                mine_cand[:n] = -1
            try:
                ours(hidden_states, _encode_layer_name(op.k_cache.prefix), op.k_cache.kv_cache, q_quant, None, k,
                     weights, op.quant_block_size, op.scale_fmt, op.topk_tokens, op.head_dim, op.max_model_len,
                     op.max_total_seq_len, mine_buf, True, op.use_pcp, op.pcp_shard_decode_requests,
                     _encode_layer_name(op.dense_mha_metadata_layer_name), op.use_fp4_cache, op.dcp_rank,
                     op.dcp_world_size, op._parallel_config.cp_kv_cache_interleave_size, False,
                     candidate_blocks=mine_cand, candidate_block_size=op.candidate_block_size,
                     candidate_write=op.candidate_write, topk_backend=op.topk_backend,
                     compress_ratio=op.compress_ratio)
            except Exception as e:  # recorded: the shadow must never stop the engine it watches
                shadow.errors.append(f"{type(e).__name__}: {e}"[:300])
                return result
            mine = mine_buf[:n]
            topk = int(op.topk_tokens)
            full = ((theirs >= 0).sum(dim=1) >= topk).nonzero().flatten()  # rows where the top-k selects
            shadow.keep(full, theirs, mine, shadow.rows)
            if cand is not None and op.candidate_write:  # rows where vLLM published candidates
                shadow.keep((cand[:n] >= 0).any(dim=1).nonzero().flatten(), cand, mine_cand, shadow.candidate_rows)
            shadow.steps += 1
            return result

        SparseAttnIndexer.forward_cuda = wrapped

    def summary(self) -> dict[str, Any]:
        from .compare import set_agreement

        out = super().summary()
        if self.candidate_rows:
            out["candidates"] = set_agreement([a for a, _ in self.candidate_rows], [b for _, b in self.candidate_rows])
        else:
            out["candidates"] = {"rows": 0}
        return out


def generate(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from .compare import margin_at
    from .models import is_v41, uses_v4_layer
    from .prompts import prompt_set

    counter = shadow = None
    if spec.get("count_calls"):  # V4.1's layer calls run_v4_attention as V4's does
        counter = V4CallCounter() if uses_v4_layer(spec["variant"]) else CallCounter()
        counter.install()
    if spec.get("shadow_indexer"):  # V4.1's indexers call the op; V3.2 / GLM-5 call vLLM's function
        shadow = IndexerOpShadow() if is_v41(spec["variant"]) else IndexerShadow()
        shadow.install()
    portable = None
    if spec.get("env", {}).get("TRITON_MLA_SPARSE_DSV4_PORTABLE"):
        portable = PortableCounter(shadow=bool(spec.get("shadow_portable")))
        portable.install()
    attention_shadow = None
    if spec.get("shadow_attention"):
        attention_shadow = AttentionShadow(v41=is_v41(spec["variant"]))
        attention_shadow.install()
    llm, meta = _engine(spec)
    prompts = prompt_set(tuple(spec["prompts"]), seed=spec["prompt_seed"], kind=spec.get("prompt_kind", "random"))
    sp = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True, logprobs=spec["logprobs"],
                        detokenize=False)
    watched = [w for w in (counter, attention_shadow) if w is not None and hasattr(w, "active")]
    for w in watched:
        w.active = True
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    gen_s = time.perf_counter() - t0
    for w in watched:
        w.active = False
    rows = []
    for p, o in zip(prompts, outs):
        c = o.outputs[0]
        steps = [{t: float(lp.logprob) for t, lp in step.items()} for step in (c.logprobs or [])]
        first = {str(t): v for t, v in (steps[0].items() if steps else [])}
        rows.append({"length": len(p), "tokens": list(c.token_ids), "first_logprobs": first,
                     "top2_margins": [margin_at(steps, i) for i in range(len(steps))]})
    result = {**meta, "generate_s": gen_s, "prompts": rows, "soft_fp8": _soft_fp8_state()}
    if counter:
        result["calls"] = counter.stats
    if portable:
        result["portable"] = portable.summary()
    if shadow:
        result["indexer_shadow"] = shadow.summary()
    if attention_shadow:
        result["attention_shadow"] = attention_shadow.summary()
    spec_stats = _spec_decode_stats(llm)
    if spec_stats:
        result["speculative"] = spec_stats
    return result


def _soft_fp8_state() -> dict[str, Any]:
    """Whether this process routed vLLM's DSA fp8 casts through the software encode (SM80/86 path)."""
    from triton_mla_sparse.integrations.vllm import fp8_compat

    return {"installed": fp8_compat.installed(), "mode": fp8_compat.state.mode}


def _spec_decode_stats(llm) -> dict[str, Any] | None:
    try:
        metrics = llm.get_metrics()
    except Exception:  # metrics are off or unavailable in this mode
        return None
    out = {}
    for m in metrics:
        if "spec_decode" in getattr(m, "name", ""):
            value = getattr(m, "value", None)
            if isinstance(value, (int, float)):
                out[m.name] = value
    return out or None


def serving(spec: dict[str, Any]) -> dict[str, Any]:
    """Per context C in the spec: TTFT = latency of one C-token request producing 1 token; TPOT = (latency of one
    request producing ``new_tokens + 1`` tokens - TTFT) / new_tokens; decode tokens/s = B · new_tokens /
    (time of B concurrent C-token requests producing new_tokens + 1 tokens - their time for 1 token). Medians of
    ``repeats`` timed runs; one untimed warm-up per shape."""
    import statistics

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from .prompts import random_prompt

    llm, meta = _engine(spec)
    cfg = spec["serving"]
    new = cfg["new_tokens"]

    def run(prompts, max_tokens):
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        t0 = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        return time.perf_counter() - t0

    def median(prompts, max_tokens):
        run(prompts, max_tokens)
        return statistics.median(run(prompts, max_tokens) for _ in range(cfg["repeats"]))

    rows = []
    for ctx in cfg["contexts"]:
        one = [random_prompt(ctx, seed=ctx)]
        ttft = median(one, 1)
        lat = median(one, new + 1)
        batch = cfg["batch"][str(ctx)]
        many = [random_prompt(ctx, seed=ctx + 1 + i) for i in range(batch)]
        b_first = median(many, 1)
        b_all = median(many, new + 1)
        if not (lat > ttft and b_all > b_first):
            raise RuntimeError(f"context {ctx}: a longer generation did not take longer; timings are noise")
        rows.append({"context": ctx, "ttft_ms": ttft * 1e3, "tpot_ms": (lat - ttft) / new * 1e3,
                     "batch": batch, "decode_tok_s": batch * new / (b_all - b_first),
                     "batch_latency_s": b_all})
    return {**meta, "serving": rows}


def trace(spec: dict[str, Any]) -> dict[str, Any]:
    from .trace import run

    return run(spec)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m e2e.worker SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    validate_spec(spec)
    os.environ.update(backend_env(spec))
    os.environ.update({k: str(v) for k, v in spec.get("env", {}).items()})
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    t0 = time.time()
    try:
        result = {"generate": generate, "serving": serving, "trace": trace}[spec["task"]](spec)
        result["ok"] = True
    except Exception as e:  # recorded, so that one failing engine does not hide the others' results
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    result["spec"] = spec
    result["wall_s"] = time.time() - t0
    Path(argv[1]).write_text(json.dumps(result, indent=1) + "\n")
    print(f"[worker] {spec['name']}: {'ok' if result['ok'] else result['error']} ({result['wall_s']:.0f} s)",
          flush=True)
    os._exit(0 if result["ok"] else 1)  # skip vLLM's slow interpreter-exit teardown


if __name__ == "__main__":
    sys.exit(main())

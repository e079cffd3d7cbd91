"""The Triton DSA indexer as vLLM's out-of-tree ``SparseAttnIndexer`` (``integrations.vllm.indexer``).

Against the real vLLM 0.33.0 on a CPU host, where vLLM's platform is not CUDA: the CUDA/DeepGEMM probes are
monkeypatched where a test needs a GPU without DeepGEMM. The forward tests build the indexer's metadata with vLLM's
own ``DeepseekV32IndexerMetadataBuilder.build`` (its prefill-metadata Triton kernel is launched through Triton's
interpreter: vLLM's launcher cannot inspect an interpreted kernel), fill a paged fp8 indexer cache in vLLM's layout
(per 64-token block: 64·128 e4m3 bytes, then 64 float32 power-of-two scales; blocks apart by more than a block,
the gaps poisoned), run the op (``forward`` → ``torch.ops.triton_mla_sparse.sparse_attn_indexer``) and the function
the DeepSeek-V3.2 / GLM-5 model calls, and compare each row's top-k set with ``reference.indexer_topk``.

DeepSeek-V4's compressed indexer (``compress_ratio`` 4, its C4A layers) is run the same way: the builder is given
the page geometry of vLLM's ``DeepseekV4IndexerCache`` (its kv-cache spec: 256-token blocks of 64 compressed
entries, the page padded to a multiple of 576 bytes) and builds compressed metadata (its compressed slot mapping
kernel launched through Triton's interpreter too); the reference scores the compressed entries each token may see,
stated from the batch alone: entry j of a request holds tokens j·4 … j·4 + 3 and exists once its last token does,
so the token at position p sees entries 0 … (p + 1) // 4 - 1 (none while p < 3: an all -1 row).
"""

import importlib
import math
import types

import pytest
import torch

from triton_mla_sparse import reference
from triton_mla_sparse.formats import quantize_indexer_cache

PREFIX = "model.layers.0.self_attn.indexer.k_cache"
BLOCK = 64
HI = 8  # index heads (GLM-5 has 32, DeepSeek-V3.2 64; fewer keep the interpreter fast)
TOPK = 16

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


@pytest.fixture
def no_deep_gemm_gpu(monkeypatch):
    """vLLM's platform answering like an SM89 GPU: CUDA, DeepGEMM not supported (the vendored package imports)."""
    from vllm.platforms import current_platform

    from triton_mla_sparse.integrations.vllm.indexer import CALL_SITES

    for mod_name, attr, _ in CALL_SITES:  # the names the Triton mode re-points: restored after the test
        mod = importlib.import_module(mod_name)
        monkeypatch.setattr(mod, attr, getattr(mod, attr))
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(current_platform, "support_deep_gemm", lambda: False)
    monkeypatch.delenv("TRITON_MLA_SPARSE_INDEXER", raising=False)


def make_op(*, buffer_rows=64, **kwargs):
    """vLLM's ``SparseAttnIndexer(...)`` (ours once registered) as DeepSeek-V3.2 / GLM-5 build it; DeepSeek-V4's
    indexer passes ``compress_ratio=4`` and ``max_model_len // 4``."""
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    k_cache = types.SimpleNamespace(prefix=PREFIX, kv_cache=torch.empty(0, dtype=torch.uint8))
    args = dict(k_cache=k_cache, quant_block_size=128, scale_fmt="ue8m0", topk_tokens=TOPK, head_dim=128,
                max_model_len=4096, max_total_seq_len=100_000,
                topk_indices_buffer=torch.empty(buffer_rows, TOPK, dtype=torch.int32),
                # the cache is written outside the op, as DeepSeek-V3.2 / GLM-5 do on CUDA (vLLM's cache-insert
                # kernel, vllm._C, is not in a CPU install)
                skip_k_cache_insert=True)
    args.update(kwargs)
    return SparseAttnIndexer(**args)


# ---------------------------------------------------------------------------------------------------- policy


@pytest.mark.parametrize("mode,is_cuda,deep_gemm,want", [
    ("auto", True, False, True),
    ("auto", True, True, False),
    ("auto", False, False, False),
    ("always", False, True, True),
    ("off", True, False, False),
])
def test_decide(vi, mode, is_cuda, deep_gemm, want):
    use, why = vi.decide(mode, is_cuda=is_cuda, deep_gemm=deep_gemm)
    assert use is want and why


@pytest.mark.parametrize("mode,is_cuda,want", [("auto", True, True), ("auto", False, False), ("off", True, False)])
def test_decide_batch_invariant(vi, mode, is_cuda, want):
    """Under VLLM_BATCH_INVARIANT=1 ``auto`` takes the Triton indexer on CUDA even where DeepGEMM runs."""
    use, why = vi.decide(mode, is_cuda=is_cuda, deep_gemm=True, batch_invariant=True)
    assert use is want and why


def test_mode_env(vi, monkeypatch):
    monkeypatch.delenv("TRITON_MLA_SPARSE_INDEXER", raising=False)
    assert vi.indexer_mode() == "auto"
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", " Always ")
    assert vi.indexer_mode() == "always"
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "sometimes")
    with pytest.raises(ValueError, match="TRITON_MLA_SPARSE_INDEXER.*'sometimes'"):
        vi.indexer_mode()
    with pytest.raises(ValueError, match="TRITON_MLA_SPARSE_INDEXER"):
        vi.decide("sometimes", is_cuda=True, deep_gemm=False)


def test_deep_gemm_usable_needs_a_supported_gpu(vi, monkeypatch):
    """vLLM's wheel vendors DeepGEMM, so has_deep_gemm() is True everywhere; the GPU decides."""
    from vllm.platforms import current_platform
    from vllm.utils.deep_gemm import has_deep_gemm

    assert has_deep_gemm()
    monkeypatch.setattr(current_platform, "support_deep_gemm", lambda: False)
    assert not vi.deep_gemm_usable()
    monkeypatch.setattr(current_platform, "support_deep_gemm", lambda: True)
    assert vi.deep_gemm_usable()
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.delenv("TRITON_MLA_SPARSE_INDEXER", raising=False)
    assert vi.use_triton_indexer()[0] is False  # SM90-like: vLLM's DeepGEMM indexer stays
    monkeypatch.setattr(current_platform, "support_deep_gemm", lambda: False)
    assert vi.use_triton_indexer()[0] is True  # SM89-like


# ---------------------------------------------------------------------------------------------- registration


def test_register_installs_the_oot_op_idempotently(cuda_platform_module, vi, monkeypatch):
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    from triton_mla_sparse.integrations.vllm import install_indexer, register

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    register()
    register()
    assert op_registry_oot["SparseAttnIndexer"] is vi.TritonSparseAttnIndexer
    assert issubclass(vi.TritonSparseAttnIndexer, SparseAttnIndexer)
    assert vi.TritonSparseAttnIndexer.name == SparseAttnIndexer.name == "sparse_attn_indexer"
    assert hasattr(torch.ops.triton_mla_sparse, "sparse_attn_indexer")
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "auto")
    assert install_indexer() is False  # this host's vLLM platform is not CUDA: nothing to do
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "off")
    assert install_indexer() is False


def test_register_with_a_bad_mode_raises_before_registering(cuda_platform_module, monkeypatch):
    from vllm.model_executor.custom_op import op_registry_oot

    from triton_mla_sparse.integrations.vllm import install_indexer, register

    before = op_registry_oot.get("SparseAttnIndexer")
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "maybe")
    for call in (register, install_indexer):
        with pytest.raises(ValueError, match="TRITON_MLA_SPARSE_INDEXER: expected one of .*'maybe'"):
            call()
    assert op_registry_oot.get("SparseAttnIndexer") is before


def test_constructs_without_deep_gemm_where_vllm_raises(vi, vc, no_deep_gemm_gpu, monkeypatch):
    import vllm.model_executor.layers.sparse_attn_indexer as sai

    monkeypatch.setattr(sai, "has_deep_gemm", lambda: False)  # a vLLM without its vendored DeepGEMM
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "off")
    with pytest.raises(RuntimeError, match="requires DeepGEMM"):
        make_op()  # vLLM's own constructor (pass-through)
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "auto")
    op = make_op()
    assert isinstance(op, vi.TritonSparseAttnIndexer) and op.triton
    # what the model and the MLA layer read
    assert op.topk_tokens == TOPK and op.topk_backend == vc.kernel_config.sparse_indexer_topk_backend
    assert op.dense_mha_metadata_layer_name == "" and op.dcp_world_size == 1 and not op.use_pcp
    # the call sites outside the op
    import vllm.models.deepseek_v32.attention as dsv32
    import vllm.v1.attention.backends.mla.indexer as idx

    assert dsv32.sparse_attn_indexer is vi.sparse_attn_indexer
    assert idx.get_paged_mqa_logits_metadata is vi._no_deep_gemm_schedule
    assert vi.route_vllm_call_sites() == [f"{m}.{a}" for m, a, _ in vi.CALL_SITES]  # idempotent


def test_passes_through_where_deep_gemm_is_usable(vi, vc, monkeypatch):
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    monkeypatch.delenv("TRITON_MLA_SPARSE_INDEXER", raising=False)  # auto, and this host is not CUDA
    op = make_op()
    assert isinstance(op, vi.TritonSparseAttnIndexer) and not op.triton
    for name in ("forward_cuda", "forward_native", "forward_hip", "forward_xpu", "forward_cpu"):
        monkeypatch.setattr(SparseAttnIndexer, name, lambda self, *a, _n=name: f"vllm.{_n}")
        assert getattr(op, name)(None, None, None, None) == f"vllm.{name}"


def test_same_signature_as_vllms_function(vi):
    import inspect

    import vllm.model_executor.layers.sparse_attn_indexer as sai
    from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata

    assert inspect.signature(vi.sparse_attn_indexer) == inspect.signature(sai.sparse_attn_indexer)
    assert list(inspect.signature(vi._no_deep_gemm_schedule).parameters) == list(
        inspect.signature(get_paged_mqa_logits_metadata).parameters)


@pytest.mark.parametrize("kwargs,match", [
    (dict(use_fp4_cache=True), "MXFP4"),
    (dict(candidate_blocks=torch.zeros(4, 2, dtype=torch.int32), candidate_block_size=0), "candidate blocks"),
    (dict(compress_ratio=0), "compress_ratio 0"),
    (dict(compress_ratio=4, use_fp4_cache=True), "MXFP4"),  # DeepSeek-V4 with indexer_kv_dtype=mxfp4
    (dict(head_dim=64), "head dim"),
])
def test_rejects_what_it_cannot_serve(vi, vc, monkeypatch, kwargs, match):
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    with pytest.raises(ValueError, match=f"{match}.*TRITON_MLA_SPARSE_INDEXER=off"):
        make_op(**kwargs)


def test_takes_deepseek_v4_compressed_fp8_cache(vi, vc, monkeypatch):
    """DeepSeek-V4's indexer op (compress_ratio 4, FP8 cache written by its compressor) is the Triton indexer."""
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    assert vi.unsupported_reasons(k_cache=None, head_dim=128, use_fp4_cache=False, compress_ratio=4,
                                  candidate_blocks=None, dcp_world_size=1, use_pcp=False) == []
    op = make_op(compress_ratio=4, max_model_len=4096 // 4)
    assert isinstance(op, vi.TritonSparseAttnIndexer) and op.triton and op.compress_ratio == 4


# ---------------------------------------------------------------------------------------------------- forward


def make_cache(num_blocks: int, gap_bytes: int, g: torch.Generator):
    """The layer's indexer cache as vLLM binds it ([num_blocks, 64, 132] uint8, blocks gap_bytes apart) and the
    same bytes as a contiguous [num_blocks, 64·132] tensor for the reference. Gaps hold 0xFF (NaN)."""
    page = BLOCK * 132
    buf = torch.full((num_blocks, page + gap_bytes), 0xFF, dtype=torch.uint8)
    for b in range(num_blocks):  # vLLM's power-of-two (UE8M0) scales
        keys = torch.randn(1, BLOCK, 128, generator=g) * (0.5 + b % 3)
        buf[b, :page] = quantize_indexer_cache(keys, scale_format="pow2")[0]
    kv_cache = buf[:, :page].view(num_blocks, BLOCK, 132)
    assert kv_cache.stride(0) == page + gap_bytes
    return kv_cache, buf[:, :page].contiguous()


def _interpreted(kernel_cls):
    """A vLLM Triton kernel (a static method of ``kernel_cls``) recompiled for Triton's interpreter."""
    import triton
    import triton.language as tl

    raw = kernel_cls.kernel
    raw = getattr(raw, "fn", raw)  # a plain function where vLLM sees no Triton (its platform is not a GPU here)
    return triton.jit(types.FunctionType(raw.__code__, {**raw.__globals__, "tl": tl, "triton": triton},
                                         raw.__name__))


def v4_indexer_spec(compress_ratio=4, *, v41=False):
    """The kv-cache spec of vLLM's ``DeepseekV4IndexerCache`` (its own ``get_kv_cache_spec``) for the FP8 indexer
    cache (128 e4m3 + a float32 scale = 132 bytes per entry), with the block size its backend supports and the
    cache dtype FlashMLA's V4 layers use; ``v41``: DeepSeek-V4.1's cache class and backend (128-token blocks off
    SM 9.0)."""
    if v41:
        from vllm.models.deepseek_v41.attention import DeepseekV4IndexerCache
        from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend as backend
    else:
        from vllm.models.deepseek_v4.attention import DeepseekV4IndexerCache
        from vllm.v1.attention.backends.mla.indexer import DeepseekV4IndexerBackend as backend

    (block_size,) = backend.get_supported_kernel_block_sizes()
    layer = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=block_size), head_dim=132,
                                  dtype=torch.uint8, compress_ratio=compress_ratio, sparse_logits=False,
                                  rocm_mxfp4=False)  # V4.1's cache: no MXFP4 sparse-logits path
    config = types.SimpleNamespace(cache_config=types.SimpleNamespace(cache_dtype="fp8_ds_mla"))
    return DeepseekV4IndexerCache.get_kv_cache_spec(layer, config)


def build_metadata(vc, monkeypatch, query_lens, seq_lens, block_table, *, max_prefill_buffer=None, compress_ratio=1,
                   slot_mapping=None, v41=False):
    """vLLM's DeepseekV32IndexerMetadataBuilder.build for one batch (decodes first, as vLLM orders them); with
    ``compress_ratio`` > 1 for DeepSeek-V4's indexer cache (:func:`v4_indexer_spec`), ``v41``: V4.1's."""
    import vllm.v1.attention.backends.mla.compressor_utils as cu
    import vllm.v1.attention.backends.mla.indexer as idx
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    kernel = _interpreted(idx.BuildPrefillChunkMetadataKernel)

    def launch(*args, num_reqs, COMPRESS_RATIO):
        kernel[(num_reqs,)](*args, BLOCK_SIZE=idx.BuildPrefillChunkMetadataKernel.BLOCK_SIZE,
                            COMPRESS_RATIO=COMPRESS_RATIO)

    slots_kernel = _interpreted(cu.CompressedSlotMappingKernel)

    def launch_slots(out, slots, qsl, seq_lens, table, block_size, compress_ratio, dcp_world_size, cp_interleave):
        slots_kernel[(table.shape[0],)](out, slots, qsl, seq_lens, table, table.stride(0), block_size,
                                        dcp_world_size, cp_interleave, COMPRESS_RATIO=compress_ratio, PAD_ID=-1,
                                        TRITON_BLOCK_SIZE=cu.CompressedSlotMappingKernel.TRITON_BLOCK_SIZE)

    monkeypatch.setattr(idx, "_BUILD_PREFILL_CHUNK_METADATA_KERNEL", launch)
    monkeypatch.setattr(cu, "_COMPRESSED_SLOT_MAPPING_KERNEL", launch_slots)
    monkeypatch.setattr(idx, "num_compute_units", lambda index: 8)
    if compress_ratio == 1:
        spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=132, dtype=torch.uint8)
    else:
        spec = v4_indexer_spec(compress_ratio, v41=v41)
        assert spec.tokens_per_state == compress_ratio and spec.num_states == BLOCK
    builder = idx.DeepseekV32IndexerMetadataBuilder(spec, [PREFIX], vc, torch.device("cpu"),
                                                    block_table_width=block_table.shape[1])
    if max_prefill_buffer is not None:
        builder.max_prefill_buffer_size = max_prefill_buffer
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    T = int(qsl[-1])
    if slot_mapping is None:
        slot_mapping = torch.zeros(T, dtype=torch.int64)
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=sl, num_reqs=len(query_lens),
        num_actual_tokens=T, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        block_table_tensor=block_table, slot_mapping=slot_mapping, seq_lens_cpu_upper_bound=sl.clone())
    return builder.build(0, common)


def make_batch(query_lens, seq_lens, *, seed=0, num_blocks=20, gap_bytes=1000, width=4, compress_ratio=1):
    """A batch and its cache; with ``compress_ratio`` C > 1 each block-table entry is a block of ``BLOCK·C`` tokens,
    whose page holds the ``BLOCK`` compressed entries of those tokens (entry j at row j % BLOCK of the page of
    column j // BLOCK)."""
    g = torch.Generator().manual_seed(seed)
    kv_cache, dense = make_cache(num_blocks, gap_bytes, g)
    perm = torch.randperm(num_blocks, generator=g)
    block_table = torch.full((len(query_lens), width), -7, dtype=torch.int32)  # unused columns: garbage
    used = 0
    for r, L in enumerate(seq_lens):
        n = -(-L // (BLOCK * compress_ratio))
        block_table[r, :n] = perm[used:used + n].to(torch.int32)
        used += n
    T = sum(query_lens)
    q = (torch.randn(T, HI, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    weights = torch.randn(T, HI, generator=g) * 0.1
    # Each token's request and causal position, from the batch itself (not from vLLM's metadata).
    req = torch.repeat_interleave(torch.arange(len(query_lens)), torch.tensor(query_lens)).to(torch.int32)
    pos = torch.cat([torch.arange(L - n, L) for n, L in zip(query_lens, seq_lens)]).to(torch.int32)
    # The last cache entry each token may see: its own position, or with compression the last entry all of whose
    # C tokens are at or before it — entry j ends with token j·C + C - 1 <= p, i.e. j <= (p + 1) // C - 1 (-1: none).
    kpos = torch.div(pos + 1, compress_ratio, rounding_mode="floor") - 1
    return dict(kv_cache=kv_cache, dense=dense, block_table=block_table, q=q, weights=weights, req=req, pos=pos,
                kpos=kpos.to(torch.int32), query_lens=query_lens, seq_lens=seq_lens, T=T, C=compress_ratio)


def assert_matches_reference(batch, got):
    """Row t of ``got`` holds the reference's top-k set over the cache entries it may see (ties at the threshold:
    either side), then -1; a row that sees none is all -1."""
    args = (batch["q"], batch["weights"], batch["dense"], batch["block_table"], batch["req"], batch["kpos"])
    ref = reference.indexer_topk(*args, TOPK, compute_dtype=torch.float64)
    logits = reference.indexer_logits(*args, batch["block_table"].shape[1] * BLOCK, compute_dtype=torch.float64)
    for t in range(batch["T"]):
        mine, want = got[t], ref[t]
        assert int((mine < 0).sum()) == int((want < 0).sum()), f"row {t}: {mine.tolist()} vs {want.tolist()}"
        assert ((mine == -1) | (mine >= 0)).all()
        m, w = set(mine[mine >= 0].tolist()), set(want[want >= 0].tolist())
        assert len(m) == int((mine >= 0).sum()), f"row {t}: duplicates"
        assert all(p <= int(batch["kpos"][t]) for p in m), f"row {t}: a position after the token"
        if batch["kpos"][t] < 0:
            assert (mine == -1).all(), f"row {t} sees no entry: {mine.tolist()}"
        if m != w:  # only near-ties at the k-th value may differ
            kth = min(logits[t, p].item() for p in w)
            for p in m ^ w:
                assert math.isclose(logits[t, p].item(), kth, rel_tol=1e-5, abs_tol=1e-6), f"row {t}: {m ^ w}"


CASES = {
    # (query_lens, seq_lens): two decodes (one shorter than top-k), then prefills (one chunked, one fresh)
    "mixed": ([1, 1, 5, 40], [70, 3, 130, 40]),
    "decode_only": ([1, 1, 1], [200, 9, 64]),
    "prefill_only": ([7, 12], [71, 12]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_op_forward_matches_reference(vi, vc, monkeypatch, case):
    from vllm.forward_context import set_forward_context

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    batch = make_batch(*CASES[case], seed=len(case))
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"])
    op = make_op()
    op.k_cache.kv_cache = batch["kv_cache"]
    op.topk_indices_buffer.fill_(12345)
    hidden = torch.zeros(batch["T"] + 3, 16)  # 3 padding rows (cleared to -1, like vLLM)
    q = torch.cat([batch["q"], batch["q"][:3]])
    w = torch.cat([batch["weights"], batch["weights"][:3]])
    with set_forward_context({PREFIX: md}, vc):
        out = op(hidden, q, None, w)
    assert out is op.topk_indices_buffer
    assert_matches_reference(batch, out)
    assert (out[batch["T"]:batch["T"] + 3] == -1).all()
    assert (out[batch["T"] + 3:] == 12345).all()  # rows past the batch are not touched


@pytest.mark.parametrize("chunking", ["per_request", "per_row"])
def test_model_call_site_with_chunked_prefill(vi, vc, no_deep_gemm_gpu, monkeypatch, chunking):
    """What DeepSeek-V3.2 / GLM-5 call on CUDA (the module function re-pointed from vLLM's), with the buffer left
    uncleared (skip_topk_buffer_clear=True, as the fused kernel cleared it) and the prefill split into chunks
    (workspace budget: one request per chunk; logits budget 0: one query row per chunk)."""
    from vllm.forward_context import set_forward_context

    if chunking == "per_row":
        monkeypatch.setenv("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", "0")
    op = make_op()  # routes the call sites (no DeepGEMM on this "GPU"), the builder's schedule call included
    batch = make_batch([1, 6, 9], [33, 70, 9], seed=5)
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"],
                        max_prefill_buffer=75)
    assert len(md.prefill.chunks) == (2 if chunking == "per_request" else 15)
    import vllm.models.deepseek_v32.attention as dsv32

    assert dsv32.sparse_attn_indexer is vi.sparse_attn_indexer
    buf = torch.full((32, TOPK), 999, dtype=torch.int32)
    with set_forward_context({PREFIX: md}, vc):
        dsv32.sparse_attn_indexer(
            torch.zeros(batch["T"], 16), PREFIX, batch["kv_cache"], batch["q"], None, None, batch["weights"],
            op.quant_block_size, op.scale_fmt, TOPK, 128, op.max_model_len, op.max_total_seq_len, buf,
            skip_k_cache_insert=True, use_pcp=False, pcp_shard_decode_requests=False,
            dense_mha_metadata_layer_name="", skip_topk_buffer_clear=True, topk_backend=op.topk_backend)
    assert_matches_reference(batch, buf)
    assert (buf[batch["T"]:] == 999).all()


def test_speculative_decode_rows(vi, vc, monkeypatch):
    """Native spec-decode metadata (2 query tokens per request, 2-D per-token context lengths, as the builder
    makes them for next_n = 2): each row sees its own causal prefix."""
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.backends.mla.indexer import DeepSeekV32IndexerDecodeMetadata, DeepseekV32IndexerMetadata

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    batch = make_batch([2, 2], [90, 20], seed=7)
    sl = torch.tensor(batch["seq_lens"], dtype=torch.int32)
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=batch["block_table"], seq_lens=torch.stack([sl - 1, sl], dim=1),
        decode_lens=torch.tensor([2, 2], dtype=torch.int32), requires_padding=False,
        schedule_metadata=torch.zeros(1, 2, dtype=torch.int32))
    md = DeepseekV32IndexerMetadata(seq_lens=sl, max_seq_len=90, slot_mapping=torch.zeros(4, dtype=torch.int64),
                                    num_decodes=2, num_decode_tokens=4, num_prefills=0, num_prefill_tokens=0,
                                    decode=decode, block_table=batch["block_table"])
    op = make_op()
    op.k_cache.kv_cache = batch["kv_cache"]
    with set_forward_context({PREFIX: md}, vc):
        out = op(torch.zeros(4, 16), batch["q"], None, batch["weights"])
    assert_matches_reference(batch, out)


def test_dense_mha_prefill_leaves_the_buffer_alone(vi, vc, monkeypatch):
    """vLLM's early return: a prefill-only batch that the main MLA layer serves with dense MHA needs no top-k."""
    from vllm.forward_context import set_forward_context

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    batch = make_batch([7, 12], [71, 12], seed=3)
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"])
    op = make_op()
    op.k_cache.kv_cache = batch["kv_cache"]
    op.dense_mha_metadata_layer_name = "model.layers.0.self_attn.attn"
    mla = types.SimpleNamespace(prefill=types.SimpleNamespace(use_dense_mha=True), num_decode_tokens=0)
    op.topk_indices_buffer.fill_(7)
    with set_forward_context({PREFIX: md, op.dense_mha_metadata_layer_name: mla}, vc):
        op(torch.zeros(batch["T"], 16), batch["q"], None, batch["weights"])
    assert (op.topk_indices_buffer == 7).all()
    mla.prefill.use_dense_mha = False
    with set_forward_context({PREFIX: md, op.dense_mha_metadata_layer_name: mla}, vc):
        out = op(torch.zeros(batch["T"], 16), batch["q"], None, batch["weights"])
    assert_matches_reference(batch, out)


def test_batch_invariant_rows_alone_equal_rows_in_a_prefill(vi, vc, monkeypatch):
    """VLLM_BATCH_INVARIANT=1: indexer_topk runs with deterministic=True, and a prefill chunk's rows select what
    the same tokens select as one-token decodes (how a preempted request's tokens come back)."""
    from vllm.forward_context import set_forward_context

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    flags = []
    real = vi.indexer_topk

    def spy(*args, **kwargs):
        flags.append(kwargs.get("deterministic"))
        return real(*args, **kwargs)

    monkeypatch.setattr(vi, "indexer_topk", spy)
    batch = make_batch([12], [70], seed=9)
    op = make_op()
    op.k_cache.kv_cache = batch["kv_cache"]
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"])
    with set_forward_context({PREFIX: md}, vc):
        prefill = op(torch.zeros(12, 16), batch["q"], None, batch["weights"])[:12].clone()
    assert_matches_reference(batch, prefill)
    for t in range(12):
        md = build_metadata(vc, monkeypatch, [1], [59 + t], batch["block_table"])
        with set_forward_context({PREFIX: md}, vc):
            alone = op(torch.zeros(1, 16), batch["q"][t:t + 1], None, batch["weights"][t:t + 1])[0]
        assert sorted(alone.tolist()) == sorted(prefill[t].tolist()), t
    assert flags and all(f is True for f in flags)


def test_batch_invariant_indexer_cache_declares_it(vi, vc, monkeypatch):
    """vLLM refuses VLLM_BATCH_INVARIANT=1 unless every layer's backend declares it, the indexer's cache layer
    included: with the Triton indexer under the mode, that layer (not vLLM's class) reports a backend that does."""
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerBackend

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    for invariant in (False, True):
        if invariant:
            monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        op = make_op(k_cache=types.SimpleNamespace(prefix=PREFIX, kv_cache=torch.empty(0, dtype=torch.uint8),
                                                   get_attn_backend=lambda: DeepseekV32IndexerBackend))
        backend = op.k_cache.get_attn_backend()
        assert backend.supports_batch_invariance() is invariant
        assert issubclass(backend, DeepseekV32IndexerBackend) and backend.get_name() == "DEEPSEEK_V32_INDEXER"
        assert backend.get_builder_cls() is DeepseekV32IndexerBackend.get_builder_cls()
    assert DeepseekV32IndexerBackend.supports_batch_invariance() is False  # vLLM's class is left alone


# ------------------------------------------------------------------------- DeepSeek-V4: compressed indexer cache

C4 = 4  # DeepSeek-V4's indexer compress ratio (C4A layers)

V4_CASES = {
    # (query_lens, seq_lens) in tokens; compressed entries per request: seq_len // 4
    # decodes with 75, 0 (a token with no complete entry) and 1 entries; a chunked prefill whose rows cross entry
    # boundaries (positions 125 … 129: 31 or 32 entries); a fresh prefill whose first 3 tokens see nothing
    "mixed": ([1, 1, 1, 5, 40], [300, 3, 7, 130, 40]),
    "decode_only": ([1, 1, 1, 1], [203, 9, 64, 2]),
    "prefill_only": ([7, 12], [71, 12]),
    # no token sees an entry: the decode's width is 0, the prefill has no chunk (all rows stay -1)
    "no_entries": ([1, 3], [2, 3]),
}


def v4_batch(query_lens, seq_lens, *, seed, width=4):
    """A batch on a DeepSeek-V4 indexer cache: pages of 64 compressed entries, blocks as far apart as vLLM's padded
    page (8640 bytes) plus 4096 bytes standing for the layer group's other pages (the padding and those poisoned)."""
    spec = v4_indexer_spec(C4)
    gap = spec.page_size_bytes - BLOCK * 132 + 4096
    return make_batch(query_lens, seq_lens, seed=seed, gap_bytes=gap, width=width, compress_ratio=C4)


def v4_op(**kwargs):
    return make_op(compress_ratio=C4, max_model_len=4096 // C4, **kwargs)


def run_op(op, md, batch, vc, q=None, weights=None):
    from vllm.forward_context import set_forward_context

    op.k_cache.kv_cache = batch["kv_cache"]
    with set_forward_context({PREFIX: md}, vc):
        return op(torch.zeros(batch["T"], 16), batch["q"] if q is None else q, None,
                  batch["weights"] if weights is None else weights)


@pytest.mark.parametrize("case", list(V4_CASES))
def test_v4_op_forward_matches_reference(vi, vc, monkeypatch, case):
    """DeepSeek-V4's call (``indexer_op(hidden, q, None, weights)``: the cache written by the compressor) on
    vLLM's compressed metadata: each row's top-k over the entries its token may see; rows that see none all -1."""
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    batch = v4_batch(*V4_CASES[case], seed=len(case))
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"],
                        compress_ratio=C4)
    op = v4_op()
    op.topk_indices_buffer.fill_(12345)
    out = run_op(op, md, batch, vc)
    assert_matches_reference(batch, out)
    assert (out[batch["T"]:] == 12345).all()
    assert (batch["kpos"] < 0).any()  # every case has tokens that see no entry


def test_v4_metadata_is_in_compressed_units(vi, vc, monkeypatch):
    """What the op relies on from vLLM's builder for a compressed cache, against the batch: the compressed slot
    mapping (where the compressor writes entry j: page block_table[j // 64], row j % 64), each prefill row's range
    and each decode row's context length ((p + 1) // 4 entries), and prefill chunks sized in entries."""
    query_lens, seq_lens = V4_CASES["mixed"]
    batch = v4_batch(query_lens, seq_lens, seed=1)
    T = batch["T"]
    md = build_metadata(vc, monkeypatch, query_lens, seq_lens, batch["block_table"], compress_ratio=C4,
                        slot_mapping=torch.arange(T, dtype=torch.int64))
    table, pos, req = batch["block_table"].long(), batch["pos"].long(), batch["req"].long()
    j = (pos + 1) // C4 - 1
    want_slots = torch.where((pos + 1) % C4 == 0, table[req, j.clamp(min=0) // BLOCK] * BLOCK + j % BLOCK, -1)
    assert md.slot_mapping[:T].tolist() == want_slots.tolist()
    n_dec = md.num_decode_tokens
    assert (md.num_decodes, n_dec) == (3, 3)
    assert md.decode.seq_lens.reshape(-1).tolist() == (batch["kpos"][:n_dec] + 1).tolist()
    (chunk,) = md.prefill.chunks
    rows = slice(chunk.token_start, chunk.token_end)
    assert (rows.start, rows.stop) == (n_dec, T)
    assert (chunk.cu_seqlen_ke - chunk.cu_seqlen_ks).tolist() == (batch["kpos"][rows] + 1).tolist()
    assert chunk.cu_seq_lens.tolist() == [0, 130 // C4, 130 // C4 + 40 // C4]
    assert chunk.max_seqlen_k == 130 // C4


@pytest.mark.parametrize("chunking", ["per_request", "per_row"])
def test_v4_chunked_prefill(vi, vc, monkeypatch, chunking):
    """Prefill chunks in compressed units (workspace budget 71 entries: one request per chunk, the last two
    together — the last one with no entry, its rows' request id past the chunk's table; logits budget 0: one row
    per chunk, and the request with no entry gets no chunk at all), the buffer cleared by the op."""
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    if chunking == "per_row":
        monkeypatch.setenv("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", "0")
    batch = v4_batch([1, 6, 9, 2], [130, 280, 9, 2], seed=5, width=2)
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"],
                        max_prefill_buffer=71, compress_ratio=C4)
    assert len(md.prefill.chunks) == (2 if chunking == "per_request" else 15)
    op = v4_op()
    op.topk_indices_buffer.fill_(999)
    assert_matches_reference(batch, run_op(op, md, batch, vc))


def test_v4_decode_width_eager_and_under_capture(vi, vc, monkeypatch):
    """The decode launch's width: eager, the batch's longest context in entries (max_seq_len // 4); under CUDA-graph
    capture, the op's max_model_len (DeepSeek-V4 passes max_model_len // 4), at most the block table's capacity."""
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    widths = []
    real = vi.indexer_topk

    def spy(*args, **kwargs):
        widths.append(kwargs["max_len"])
        return real(*args, **kwargs)

    monkeypatch.setattr(vi, "indexer_topk", spy)
    batch = v4_batch(*V4_CASES["decode_only"], seed=2)
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"],
                        compress_ratio=C4)
    op = make_op(compress_ratio=C4, max_model_len=720 // C4)
    assert_matches_reference(batch, run_op(op, md, batch, vc))
    monkeypatch.setattr(vi, "_capturing", lambda device: True)
    assert_matches_reference(batch, run_op(op, md, batch, vc))
    op.max_model_len = 8192 // C4
    assert_matches_reference(batch, run_op(op, md, batch, vc))
    assert widths == [203 // C4, 720 // C4, 4 * BLOCK]


def test_v4_speculative_decode_rows(vi, vc, monkeypatch):
    """Native spec-decode metadata on the compressed cache (2 query tokens per request; per-token context lengths
    (L - 2 + j + 1) // 4, as the builder divides them): a row's second token may see one entry more."""
    from vllm.v1.attention.backends.mla.indexer import DeepSeekV32IndexerDecodeMetadata, DeepseekV32IndexerMetadata

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    batch = v4_batch([2, 2, 2], [92, 20, 4], seed=7)
    sl = torch.tensor(batch["seq_lens"], dtype=torch.int32)
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=batch["block_table"], seq_lens=torch.stack([sl - 1, sl], dim=1) // C4,
        decode_lens=torch.tensor([2, 2, 2], dtype=torch.int32), requires_padding=False,
        schedule_metadata=torch.zeros(1, 2, dtype=torch.int32))
    md = DeepseekV32IndexerMetadata(seq_lens=sl, max_seq_len=92, slot_mapping=torch.zeros(6, dtype=torch.int64),
                                    num_decodes=3, num_decode_tokens=6, num_prefills=0, num_prefill_tokens=0,
                                    decode=decode, block_table=batch["block_table"])
    assert decode.seq_lens.reshape(-1).tolist() == (batch["kpos"] + 1).tolist()
    assert_matches_reference(batch, run_op(v4_op(), md, batch, vc))


# ------------------------------------------------------------ DeepSeek-V4.1: two-level candidate blocks

C2 = 2  # a V4.1 ratio-2 indexer cache
CAND_BS = 4  # candidate_block_size (compressed entries per block)
CAND_K = 5  # candidate_topk_blocks: 20 entries, more than TOPK, far fewer than the longest rows' 150


def assert_topk_sets(got, logits, kpos, k, what):
    """Row t of ``got``: the positions of the k largest of ``logits[t]`` above -inf (near-ties at the k-th value may
    differ), then -1."""
    for t in range(got.shape[0]):
        row = logits[t]
        cand = [p for p in range(row.shape[0]) if row[p] != -math.inf]
        want = set(sorted(cand, key=lambda p: -row[p].item())[:k])
        mine = got[t]
        m = set(mine[mine >= 0].tolist())
        assert len(m) == int((mine >= 0).sum()) == len(want), f"{what} row {t}: {mine.tolist()} vs {sorted(want)}"
        assert (mine[len(m):] == -1).all() and all(p <= int(kpos[t]) for p in m), f"{what} row {t}"
        if m != want:
            kth = min(row[p].item() for p in want)
            for p in m ^ want:
                assert math.isclose(row[p].item(), kth, rel_tol=1e-5, abs_tol=1e-6), f"{what} row {t}: {m ^ want}"


def test_v41_candidate_source_and_consumer(vi, vc, monkeypatch):
    """DeepSeek-V4.1's two-level selection through the op, on vLLM's compressed metadata (ratio 2, decodes and a
    chunked and a fresh prefill): the candidate source (``candidate_write``) publishes each row's best blocks of
    its logits (the newest block always among them) and its own top-k is the plain one; a later index source
    (same buffer, other queries) returns the top-k of its logits masked to those blocks."""
    from triton_mla_sparse.integrations.vllm.candidates import select_candidate_blocks

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    spec = v4_indexer_spec(C2, v41=True)  # 128-token blocks: pages of 64 entries
    batch = make_batch([1, 1, 1, 5, 40], [300, 3, 9, 130, 40], seed=21,
                       gap_bytes=spec.page_size_bytes - BLOCK * 132 + 512, compress_ratio=C2)
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"],
                        compress_ratio=C2, v41=True)
    buffer = torch.full((64, CAND_K), 777, dtype=torch.int32)
    common = dict(compress_ratio=C2, max_model_len=4096 // C2, candidate_blocks=buffer, candidate_block_size=CAND_BS)
    source, consumer = make_op(candidate_write=True, **common), make_op(candidate_write=False, **common)
    T, kpos = batch["T"], batch["kpos"]
    visible = (kpos + 1).clamp(min=0)
    width = int(visible.max())

    got = run_op(source, md, batch, vc)
    args = (batch["q"], batch["weights"], batch["dense"], batch["block_table"], batch["req"], kpos)
    logits = reference.indexer_logits(*args, width, compute_dtype=torch.float64)
    assert_topk_sets(got[:T], logits, kpos, TOPK, "source top-k")
    want = torch.empty(T, CAND_K, dtype=torch.int32)
    select_candidate_blocks(logits.float(), visible, CAND_BS, want)  # the step's own semantics: test_vllm_candidates
    for t in range(T):
        mine, ref = set(buffer[t].tolist()), set(want[t].tolist())
        assert mine == ref, f"candidates row {t}: {sorted(mine)} vs {sorted(ref)}"
        if visible[t] > 0:
            assert (int(visible[t]) - 1) // CAND_BS in mine, t
    assert (buffer[T:] == 777).all()
    assert (visible > CAND_K * CAND_BS).any() and (buffer[:T] == -1).any()  # masking bites; short rows are padded

    g = torch.Generator().manual_seed(5)
    q2 = (torch.randn(T, HI, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    w2 = torch.randn(T, HI, generator=g) * 0.1
    published = buffer.clone()
    got2 = run_op(consumer, md, batch, vc, q=q2, weights=w2)
    assert torch.equal(buffer, published)  # a consumer only reads the candidates
    logits2 = reference.indexer_logits(q2, w2, *args[2:], width, compute_dtype=torch.float64)
    cols = torch.arange(width)
    kept = torch.zeros(T, width, dtype=torch.bool)
    for t in range(T):
        for b in published[t].tolist():
            if b >= 0:
                kept[t] |= (cols // CAND_BS) == b
    assert_topk_sets(got2[:T], logits2.masked_fill(~kept, -math.inf), kpos, TOPK, "consumer top-k")
    unmasked = set()
    for t in range(T):
        unmasked |= {int(p) for p in got2[t] if p >= 0 and not kept[t, int(p)]}
    assert not unmasked


def test_v41_candidate_decode_width_is_the_models(vi, vc, monkeypatch):
    """With candidate blocks the eager decode logits are as wide as vLLM's (the op's max_model_len, at most the
    block table's capacity), not the batch's longest context: a consumer clamps candidates past the width as vLLM
    does."""
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    widths = []
    real = vi.indexer_logits

    def spy(*args, **kwargs):
        widths.append(args[6])
        return real(*args, **kwargs)

    monkeypatch.setattr(vi, "indexer_logits", spy)
    spec = v4_indexer_spec(C2, v41=True)
    batch = make_batch([1, 1], [300, 40], seed=3, gap_bytes=spec.page_size_bytes - BLOCK * 132, compress_ratio=C2)
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"],
                        compress_ratio=C2, v41=True)
    buffer = torch.full((64, CAND_K), 777, dtype=torch.int32)
    for max_model_len, want in ((4096, 4 * BLOCK), (400, 400 // C2)):
        op = make_op(compress_ratio=C2, max_model_len=max_model_len // C2, candidate_blocks=buffer,
                     candidate_block_size=CAND_BS, candidate_write=True)
        assert_topk_sets(run_op(op, md, batch, vc)[:2],
                         reference.indexer_logits(batch["q"], batch["weights"], batch["dense"], batch["block_table"],
                                                  batch["req"], batch["kpos"], 150, compute_dtype=torch.float64),
                         batch["kpos"], TOPK, "source top-k")
        assert widths[-1] == want


def test_v41_short_candidates_are_logged(vi, vc, monkeypatch, plugin_log):
    """A consumer whose candidate blocks may cover fewer positions than its top-k is logged once (vLLM's top-k
    then adds masked positions, ours does not)."""
    import logging

    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "always")
    monkeypatch.setattr(vi, "_logged", set())
    make_op(compress_ratio=C2, candidate_blocks=torch.empty(8, 8, dtype=torch.int32), candidate_block_size=4,
            candidate_write=False)  # (8 - 1) * 4 + 1 = 29 >= 16 positions: enough
    assert not [r for r in plugin_log if r.levelno == logging.WARNING]
    make_op(compress_ratio=C2, candidate_blocks=torch.empty(8, 2, dtype=torch.int32), candidate_block_size=4,
            candidate_write=False)  # (2 - 1) * 4 + 1 = 5 < 16
    make_op(compress_ratio=C2, candidate_blocks=torch.empty(8, 2, dtype=torch.int32), candidate_block_size=4,
            candidate_write=True)  # a source writes, it does not mask
    warned = [r.getMessage() for r in plugin_log if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "cover only 5 of the 16 positions" in warned[0]

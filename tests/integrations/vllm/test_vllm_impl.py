"""TritonMLASparseImpl._forward_mqa_kernel (vLLM's sparse-MLA hook) against the reference, on CPU tensors.

The impl is constructed by vLLM's real base classes (SparseMLACommonImpl, AttentionImplBase.__new__) inside vLLM's
single-process distributed state. Inputs look like what vLLM's ``SparseMLACommonImpl.forward_mqa`` hands the hook:
q as the tuple ``(ql_nope, q_pe)`` with a non-contiguous ``ql_nope`` and a ``q_pe`` that is a view into the
projected query; a paged cache whose blocks sit ``block_stride_rows > block_size`` rows apart (other layers' pages
in between, filled with NaN here so that reading one fails the test); indices in vLLM's flat-row addressing
(``block · block_stride_rows + offset``, valid entries compacted to the front, -1 after) with ``valid_counts``.
(vLLM's own index conversion is a Triton kernel that does not run on this CPU host; the indices are built the way
it documents.) The kernels run through Triton's interpreter, in float16 (the interpreter's bf16 dots are garbage).
"""

from __future__ import annotations

import math
import tempfile
import types

import pytest
import torch

from triton_mla_sparse import reference
from triton_mla_sparse.testing import assert_close, encode_cache, kv_values

# The interpreter evaluates log2(0) / x/0 on masked lanes of empty rows (results discarded).
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


@pytest.fixture(scope="module")
def dist_env():
    """vLLM's distributed state for one CPU process (gloo), as a worker has it before building layers."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    vc = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(vc), tempfile.TemporaryDirectory() as tmp:
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"file://{tmp}/init",
                                     local_rank=0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)
        try:
            yield vc
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


MODEL_DIMS = {  # (heads per GPU at TP 8, qk_nope, qk_rope, v_head)
    "glm5": (8, 192, 64, 256),
    "dsv32": (16, 128, 64, 128),
    "nope": (8, 256, 0, 256),  # GLM-5.3-Flash-like NoPE layer: head_size 512
}


def make_impl(model: str, kv_cache_dtype: str):
    from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseImpl

    heads, nope, rope, v = MODEL_DIMS[model]
    return TritonMLASparseImpl(
        num_heads=heads, head_size=512 + rope, scale=(nope + rope) ** -0.5, num_kv_heads=1, alibi_slopes=None,
        sliding_window=None, kv_cache_dtype=kv_cache_dtype, logits_soft_cap=None, attn_type="decoder",
        kv_sharing_target_layer_name=None, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=nope,
        qk_rope_head_dim=rope, qk_head_dim=nope + rope, v_head_dim=v, kv_b_proj=None)


def _poison(dtype: torch.dtype):
    if dtype == torch.uint8:
        return 0xFF  # e4m3 NaN latents and NaN float32 scales
    return float("nan")


def make_case(kv_cache_dtype: str, model: str, *, T=5, topk=64, block_size=16, num_blocks=6, gap_rows=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    heads, nope, rope, _ = MODEL_DIMS[model]
    d_qk = 512 + rope
    n_slots = num_blocks * block_size
    vals = kv_values(n_slots, d_qk, generator=g)  # tile-wise magnitudes: a wrong fp8_ds_mla tile scale shows
    if kv_cache_dtype == "fp8_ds_mla":
        kv_format = "fp8_ds_mla"
    elif kv_cache_dtype in ("fp8", "fp8_e4m3"):
        kv_format = "fp8_e4m3"
    else:
        kv_format = "fp16"
    # fp8_ds_mla with GLM writers' arbitrary float32 tile scales; fp8_e4m3 with a per-tensor k_scale
    stored, k_scale = encode_cache(vals, kv_format, scale_format="fp32")
    row = stored.shape[-1]
    # Blocks gap_rows rows apart beyond block_size: other layers' pages, poisoned.
    bsr = block_size + gap_rows
    buf = torch.empty(num_blocks, bsr, row, dtype=stored.dtype)
    buf.view(torch.uint8 if stored.dtype == torch.float8_e4m3fn else stored.dtype).fill_(
        _poison(torch.uint8 if stored.dtype == torch.float8_e4m3fn else stored.dtype))
    kv_cache = buf[:, :block_size]
    kv_cache.copy_(stored.view(num_blocks, block_size, row))
    assert kv_cache.stride(0) == bsr * row

    # Per-row slot lists: random distinct logical slots, compacted to the front; row 1 has none, row 2 one.
    counts = torch.randint(topk // 2, topk + 1, (T,), generator=g)
    counts[1], counts[2] = 0, 1  # T >= 3
    logical = torch.full((T, topk), -1, dtype=torch.int32)
    physical = torch.full((T, topk), -1, dtype=torch.int32)
    for t in range(T):
        n = int(counts[t])
        s = torch.randperm(n_slots, generator=g)[:n].to(torch.int32)
        logical[t, :n] = s
        physical[t, :n] = (s // block_size) * bsr + s % block_size
    valid_counts = counts.to(torch.int32)

    # q as vLLM builds it: ql_nope from a (N, B, L) bmm output viewed (B, N, L); q_pe a view into q [B, N, nope+rope].
    ql_nope = torch.randn(heads, T, 512, generator=g).to(torch.float16).transpose(0, 1)
    q_full = torch.randn(T, heads, nope + rope, generator=g).to(torch.float16)
    q_pe = q_full[..., nope:]
    return dict(q=(ql_nope, q_pe), kv_cache=kv_cache, dense_cache=kv_cache.contiguous(), logical=logical,
                physical=physical, valid_counts=valid_counts, kv_format=kv_format, k_scale=k_scale,
                block_size=block_size, layer=types.SimpleNamespace(
                    _k_scale=torch.tensor(k_scale if k_scale else 1.0, dtype=torch.float32),
                    _k_scale_float=k_scale if k_scale else 1.0))


def check(impl, case, out, lse):
    q_nope, q_pe = case["q"]
    ref_out, ref_lse = reference.sparse_mla_attention(
        (q_nope, q_pe if q_pe.shape[-1] else None), case["dense_cache"], case["logical"], impl.scale,
        kv_format=case["kv_format"], k_scale=case["k_scale"], topk_length=case["valid_counts"], return_lse=True,
        out_dtype=torch.float32)
    assert out.shape == ref_out.shape and out.dtype == torch.float16
    assert torch.isfinite(out).all(), "read a poisoned row between blocks"
    assert_close(out.float(), ref_out, tol=2.5e-3, what="out")
    empty = case["valid_counts"] == 0
    assert (out[empty] == 0).all()
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
        assert torch.isneginf(lse[empty]).all()
        assert_close(lse, ref_lse, atol=5e-3, what="lse")  # identical -inf positions, |lse - ref| <= 5e-3


@pytest.mark.parametrize("model,kv_cache_dtype", [
    ("glm5", "auto"),
    ("glm5", "fp8_ds_mla"),
    ("dsv32", "fp8"),
    ("dsv32", "fp8_ds_mla"),
    ("nope", "auto"),
])
def test_forward_mqa_kernel_matches_reference(dist_env, model, kv_cache_dtype):
    impl = make_impl(model, kv_cache_dtype)
    case = make_case(kv_cache_dtype, model)
    out, lse = impl._forward_mqa_kernel(case["q"], case["kv_cache"], case["physical"], case["valid_counts"],
                                        layer=case["layer"], block_size=case["block_size"], is_decode=True)
    assert lse is None  # vLLM did not ask (no decode context parallelism)
    check(impl, case, out, None)


def test_forward_mqa_kernel_vllm_sized_lists(dist_env):
    """vLLM's shapes: block size 64, top-k 2048 (DeepSeek-V3.2 at TP 8, fp8_ds_mla)."""
    impl = make_impl("dsv32", "fp8_ds_mla")
    case = make_case("fp8_ds_mla", "dsv32", T=3, topk=2048, block_size=64, num_blocks=40, gap_rows=64, seed=3)
    out, _ = impl._forward_mqa_kernel(case["q"], case["kv_cache"], case["physical"], case["valid_counts"],
                                      layer=case["layer"], block_size=case["block_size"], is_decode=True)
    check(impl, case, out, None)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_ds_mla"])
def test_forward_mqa_kernel_returns_lse_when_asked(dist_env, kv_cache_dtype):
    impl = make_impl("glm5", kv_cache_dtype)
    impl.need_to_return_lse_for_decode = True  # what AttentionImplBase.__new__ sets under DCP
    case = make_case(kv_cache_dtype, "glm5", seed=1)
    out, lse = impl._forward_mqa_kernel(case["q"], case["kv_cache"], case["physical"], case["valid_counts"],
                                        layer=case["layer"], block_size=case["block_size"], is_decode=False)
    assert lse is not None
    check(impl, case, out, lse)


def test_forward_mqa_kernel_fused_q_and_uint8_fp8_view(dist_env):
    """A fused [T, H, 576] q (vLLM concatenates under DCP) and a per-tensor fp8 cache still viewed as uint8."""
    impl = make_impl("dsv32", "fp8")
    case = make_case("fp8", "dsv32", seed=2)
    q_fused = torch.cat(case["q"], dim=-1)
    out, _ = impl._forward_mqa_kernel(q_fused, case["kv_cache"].view(torch.uint8), case["physical"],
                                      case["valid_counts"], layer=case["layer"], block_size=case["block_size"],
                                      is_decode=True)
    check(impl, case, out, None)


def test_impl_constructs_on_cpu_and_declares(dist_env):
    from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseImpl

    impl = make_impl("glm5", "fp8_ds_mla")
    assert impl.is_sparse and impl.supports_dense_mha_prefill and impl.lse_base_on_e
    assert impl.can_return_lse_for_decode and not impl.supports_quant_query_input
    assert impl.dcp_world_size == 1 and impl.need_to_return_lse_for_decode is False
    assert impl.kv_format == "fp8_ds_mla" and math.isclose(impl.scale, 256 ** -0.5)
    assert hasattr(impl, "record_logical_topk_ready")  # the model calls it unconditionally
    assert issubclass(TritonMLASparseImpl, __import__(
        "vllm.model_executor.layers.attention.sparse_mla_attention", fromlist=["x"]).SparseMLACommonImpl)


@pytest.mark.parametrize("kwargs,match", [
    (dict(kv_cache_dtype="nvfp4_ds_mla"), "kv_cache_dtype"),
    (dict(sliding_window=128), "sliding window"),
    (dict(attn_type="encoder"), "decoder"),
])
def test_impl_rejects_unsupported(dist_env, kwargs, match):
    from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseImpl

    args = dict(num_heads=8, head_size=576, scale=0.0625, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
                q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, qk_head_dim=256,
                v_head_dim=256, kv_b_proj=None)
    args.update(kwargs)
    with pytest.raises(NotImplementedError, match=match):
        TritonMLASparseImpl(**args)


@pytest.mark.parametrize("kv_cache_dtype,row_bytes", [("fp8_ds_mla", 656), ("auto", 1152)])
def test_backend_spec_and_metadata_builder(cuda_platform_module, vllm_configs, monkeypatch, kv_cache_dtype,
                                           row_bytes):
    """The builder constructs under a GLM-5 config (TP 8): decode threshold 1 and CUDA graphs for uniform decode
    batches; the spec puts blocks a whole number of cache rows apart (flat-row addressing)."""
    import vllm.model_executor.layers.attention.sparse_mla_attention as sparse_mla
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseBackend, TritonMLASparseMetadataBuilder

    monkeypatch.setattr(sparse_mla, "PIN_MEMORY", False)  # pinned host buffers need the NVIDIA driver
    vc = vllm_configs["glm5"]
    layer = f"model.layers.0.self_attn.attn.{kv_cache_dtype}"
    vc.compilation_config.static_forward_context[layer] = types.SimpleNamespace(prefill_backend=None)
    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576,
                            dtype=torch.uint8 if kv_cache_dtype == "fp8_ds_mla" else torch.bfloat16,
                            cache_dtype_str=kv_cache_dtype,
                            state_content_bytes=656 if kv_cache_dtype == "fp8_ds_mla" else None)
    spec = TritonMLASparseBackend.customize_spec(spec)
    assert spec.block_stride_alignment == row_bytes
    assert TritonMLASparseBackend.get_builder_cls() is TritonMLASparseMetadataBuilder
    with set_current_vllm_config(vc):
        builder = TritonMLASparseMetadataBuilder(spec, [layer], vc, torch.device("cpu"))
    assert builder.reorder_batch_threshold == 1
    assert builder.topk_tokens == 2048
    assert TritonMLASparseMetadataBuilder.get_cudagraph_support(vc, spec) == AttentionCGSupport.UNIFORM_BATCH


# ------------------------------------------------------------------------------------- batch-invariant mode


@pytest.fixture
def batch_invariant_env(monkeypatch):
    import vllm.envs as envs

    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert envs.VLLM_BATCH_INVARIANT  # read through vLLM's own parser
    return monkeypatch


def test_impl_batch_invariant_declarations(dist_env, batch_invariant_env):
    """Under VLLM_BATCH_INVARIANT=1: no dense-MHA prefill (vLLM picks it per batch); otherwise it stays."""
    impl = make_impl("glm5", "auto")
    assert impl.batch_invariant and impl.supports_dense_mha_prefill is False
    batch_invariant_env.delenv("VLLM_BATCH_INVARIANT")
    impl = make_impl("glm5", "auto")
    assert not impl.batch_invariant and impl.supports_dense_mha_prefill


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_ds_mla"])
def test_batch_invariant_rows_do_not_depend_on_the_batch(dist_env, batch_invariant_env, monkeypatch,
                                                         kv_cache_dtype):
    """Each row's output and lse, computed with the whole batch, equal (bitwise) the row computed alone; the
    one-program-per-row kernel is the one launched, whatever the batch size."""
    import triton_mla_sparse.ops.sparse_mla as sm

    kernels = []
    real = sm.sparse_mla_attention_with_config

    def spy(*args, **kwargs):
        kernels.append(kwargs.get("kernel"))
        return real(*args, **kwargs)

    monkeypatch.setattr(sm, "sparse_mla_attention_with_config", spy)
    impl = make_impl("glm5", kv_cache_dtype)
    impl.need_to_return_lse_for_decode = True
    case = make_case(kv_cache_dtype, "glm5", T=6, seed=4)
    kw = dict(layer=case["layer"], block_size=case["block_size"])
    out, lse = impl._forward_mqa_kernel(case["q"], case["kv_cache"], case["physical"], case["valid_counts"],
                                        is_decode=True, **kw)
    check(impl, case, out, lse)
    q_nope, q_pe = case["q"]
    for t in range(6):
        one, one_lse = impl._forward_mqa_kernel((q_nope[t:t + 1], q_pe[t:t + 1]), case["kv_cache"],
                                                case["physical"][t:t + 1], case["valid_counts"][t:t + 1],
                                                is_decode=False, **kw)
        assert torch.equal(one, out[t:t + 1]) and torch.equal(one_lse, lse[t:t + 1]), t
    assert set(kernels) == {"prefill"}


def test_sort_positions_puts_invalid_last():
    from triton_mla_sparse.integrations.vllm.backend import sort_positions_

    g = torch.Generator().manual_seed(0)
    buf = torch.full((4, 2048), -1, dtype=torch.int32)
    for t, n in enumerate((0, 1, 700, 2048)):
        buf[t, torch.randperm(2048, generator=g)[:n]] = torch.randperm(5000, generator=g)[:n].to(torch.int32)
    want = [sorted(row[row >= 0].tolist()) for row in buf]
    view = buf[:, :2048]
    sort_positions_(view)
    for t, n in enumerate((0, 1, 700, 2048)):
        assert buf[t, :n].tolist() == want[t] and (buf[t, n:] == -1).all()


def test_forward_mqa_sorts_the_positions_only_when_batch_invariant(dist_env, monkeypatch):
    """vLLM's forward_mqa reads the shared top-k buffer; in batch-invariant mode ours sorts its rows first."""
    from vllm.model_executor.layers.attention.sparse_mla_attention import SparseMLACommonImpl

    seen = []
    monkeypatch.setattr(SparseMLACommonImpl, "forward_mqa",
                        lambda self, q, kv, md, layer: seen.append(self.topk_indices_buffer.clone()))
    rows = torch.tensor([[5, -1, 3, 9], [-1, -1, 2, 1], [7, 7, 0, -1]], dtype=torch.int32)
    q = (torch.zeros(2, 8, 512), torch.zeros(2, 8, 64))
    for invariant in (False, True):
        if invariant:
            monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        impl = make_impl("glm5", "auto")
        impl.topk_indices_buffer = rows.clone()
        impl.forward_mqa(q, None, None, None)
    assert torch.equal(seen[0], rows)  # untouched outside the mode
    assert seen[1].tolist() == [[-1 if v is None else v for v in r] for r in
                                ([3, 5, 9, None], [1, 2, None, None], rows[2].tolist())]



def test_topk_ready_is_recorded_after_the_sort_in_batch_invariant_mode(dist_env, monkeypatch):
    """vLLM's layer calls ``record_logical_topk_ready`` right after the indexer, and vLLM converts the top-k buffer
    on a side stream once that event fires. Ours sorts the buffer in ``forward_mqa`` under the mode, so there the
    event must be recorded after the sort (before, the side stream read a half-sorted buffer: on the H200 the same
    request alone twice gathered its rows in different orders)."""
    from vllm.model_executor.layers.attention.sparse_mla_attention import SparseMLACommonImpl

    events = []
    monkeypatch.setattr(SparseMLACommonImpl, "record_logical_topk_ready",
                        lambda self: events.append(("ready", self.topk_indices_buffer.tolist())))
    monkeypatch.setattr(SparseMLACommonImpl, "forward_mqa", lambda self, q, kv, md, layer: events.append("convert"))
    rows = torch.tensor([[5, -1, 3, 9], [-1, -1, 2, 1]], dtype=torch.int32)
    q = (torch.zeros(2, 8, 512), torch.zeros(2, 8, 64))
    for invariant in (False, True):
        if invariant:
            monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        impl = make_impl("glm5", "auto")
        impl.topk_indices_buffer = rows.clone()
        impl.record_logical_topk_ready()  # what vLLM's layer calls after the indexer
        impl.forward_mqa(q, None, None, None)
    assert events == [("ready", rows.tolist()), "convert",
                      ("ready", [[3, 5, 9, -1], [1, 2, -1, -1]]), "convert"]

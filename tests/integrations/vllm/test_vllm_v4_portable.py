"""DeepSeek-V4's portable o_proj and first-layer mHC prenorm (:mod:`triton_mla_sparse.integrations.vllm.v4_portable`)
against the real vLLM 0.33.0: the block dequantization against a block-by-block statement, the plugin's V4 layer
built by vLLM from an fp8 checkpoint config (capability 8.9 simulated) taking ``wo_a`` over after loading, and the
prenorm wrapper on vLLM's own module."""

from __future__ import annotations

import os

import pytest
import torch

from triton_mla_sparse.integrations.vllm import policy, v4_portable


def _blockwise(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The 128 x 128 block dequantization, one block at a time."""
    out = torch.empty(weight.shape, dtype=torch.float32)
    for i in range(0, weight.shape[0], 128):
        for j in range(0, weight.shape[1], 128):
            out[i:i + 128, j:j + 128] = weight[i:i + 128, j:j + 128].float() * scale[i // 128, j // 128].float()
    return out.to(torch.bfloat16)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float8_e8m0fnu])
@pytest.mark.parametrize("shape", [(256, 512), (300, 200)])
def test_block_dequantization(shape, scale_dtype):
    g = torch.Generator().manual_seed(shape[0])
    weight = (torch.randn(shape, generator=g) * 100).to(torch.float8_e4m3fn)
    blocks = (-(-shape[0] // 128), -(-shape[1] // 128))
    scale = torch.exp2(torch.randint(-12, 4, blocks, generator=g).float())
    if scale_dtype == torch.float32:
        scale = scale * (1 + torch.rand(blocks, generator=g))  # any float32 scale
    scale = scale.to(scale_dtype)
    got = v4_portable.dequantize_block_fp8(weight, scale)
    assert got.dtype == torch.bfloat16 and torch.equal(got, _blockwise(weight, scale))
    for bad in (scale[:1], torch.ones(blocks[0] + 1, blocks[1])):  # too few, too many
        with pytest.raises(ValueError, match="scale: expected the block scales"):
            v4_portable.dequantize_block_fp8(weight, bad)
    for bad in (weight.float(), weight[None]):
        with pytest.raises(ValueError, match="weight: expected a float8_e4m3fn tensor"):
            v4_portable.dequantize_block_fp8(bad, scale)


def test_dequantize_wo_a_replaces_the_weight_and_drops_the_scales():
    layer = torch.nn.Module()
    weight = torch.randn(256, 128).to(torch.float8_e4m3fn)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(torch.tensor([[0.5], [4.0]]), requires_grad=False)
    v4_portable.dequantize_wo_a(layer)
    assert layer.weight.dtype == torch.bfloat16 and not hasattr(layer, "weight_scale_inv")
    assert torch.equal(layer.weight, _blockwise(weight, torch.tensor([[0.5], [4.0]])))
    before = layer.weight
    v4_portable.dequantize_wo_a(layer)  # bf16 already: left alone
    assert layer.weight is before
    bare = torch.nn.Module()
    bare.weight = torch.nn.Parameter(weight, requires_grad=False)
    with pytest.raises(ValueError, match="without block scales"):
        v4_portable.dequantize_wo_a(bare)


# After building: what vLLM's loader does once the weights are in (the layer's quant method processes them).
_AFTER_LOADING = """
wo_a, wo_b = layer.wo_a, layer.wo_b
out = dict(quant=type(vc.quant_config).__name__, dtype=str(wo_a.weight.dtype), shape=list(wo_a.weight.shape),
           routed=wo_a.quant_method.process_weights_after_loading is v4_portable.dequantize_wo_a,
           wo_b_routed="process_weights_after_loading" in vars(wo_b.quant_method))
if out["routed"]:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(wo_a.weight.shape, generator=g) * 50).to(torch.float8_e4m3fn)
    s = torch.exp2(torch.randint(-10, 2, wo_a.weight_scale_inv.shape, generator=g).float())
    wo_a.weight.data.copy_(w)
    wo_a.weight_scale_inv.data.copy_(s.to(wo_a.weight_scale_inv.dtype))
    wo_a.quant_method.process_weights_after_loading(wo_a)
    want = (w.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.bfloat16)
    out.update(after=str(wo_a.weight.dtype), equal=bool(torch.equal(wo_a.weight, want)),
               scales_left=hasattr(wo_a, "weight_scale_inv"),
               # vLLM's deep_gemm_fp8_o_proj takes its bf16 branch on this weight: groups x rank x width
               grouped=list(wo_a.weight.view(layer.n_local_groups, layer.o_lora_rank, -1).shape))
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_an_fp8_v4_layer_takes_wo_a_over_after_loading(cuda_platform_module, tmp_path, mode):
    """vLLM builds the plugin's V4 layer from an fp8 (128 x 128 block) checkpoint config at capability 8.9 (in a
    child process): ``wo_a`` is created e4m3 with UE8M0 block scales and, with ``TRITON_MLA_SPARSE_DSV4_PORTABLE``
    ``auto`` (no DeepGEMM there), its quant method's post-load step is the dequantization — the weight becomes the
    bf16 product, the scales go, vLLM's bf16 branch can group it; ``wo_b`` stays vLLM's; ``off`` leaves wo_a to
    vLLM."""
    from v4_layer_build import FP8_BLOCK, build_v4_layer

    env = {**os.environ, "TRITON_MLA_SPARSE_DSV4": "triton", policy.DSV4_PORTABLE_ENV: mode}
    got = build_v4_layer(tmp_path, _AFTER_LOADING, capability=(8, 9), quantization=FP8_BLOCK, env=env)
    assert (got["quant"], got["dtype"], got["shape"]) == ("DeepseekV4FP8Config", "torch.float8_e4m3fn", [2048, 512])
    assert got["routed"] == (mode == "auto") and not got["wo_b_routed"]
    if mode == "auto":
        assert (got["after"], got["equal"], got["scales_left"]) == ("torch.bfloat16", True, False)
        assert got["grouped"] == [8, 256, 512]


@pytest.fixture
def prenorm(monkeypatch):
    """vLLM's mHC module with a stand-in for its DeepGEMM / TileLang prenorm (recording its calls), wrapped."""
    import importlib

    module = importlib.import_module(v4_portable.PRENORM_MODULE)
    v4_portable.uninstall()
    calls = []

    def vllms(x, fn, *, hidden_size, hc_mult, use_tilelang_fallback=True):
        calls.append(use_tilelang_fallback)
        return "vllm"

    monkeypatch.setattr(module, v4_portable.PRENORM_HOOK, vllms)
    assert v4_portable.install() and v4_portable.install() and v4_portable.installed()
    yield getattr(module, v4_portable.PRENORM_HOOK), calls
    v4_portable.uninstall()
    assert getattr(module, v4_portable.PRENORM_HOOK) is vllms


@pytest.mark.parametrize("mode", ["always", "auto", "off"])
def test_the_prenorm_wrapper_takes_only_the_forced_deepgemm_call(prenorm, monkeypatch, mode):
    """``use_tilelang_fallback=False`` (V4's first layer) gets float32 x·fnᵀ and Σx² in one split where the
    stand-ins run (``always``; ``auto`` here: no DeepGEMM on this machine); every other call, and every call with
    ``off``, is vLLM's."""
    wrapped, calls = prenorm
    monkeypatch.setenv(policy.DSV4_PORTABLE_ENV, mode)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 256, generator=g).to(torch.bfloat16)
    fn = torch.randn(24, 256, generator=g)
    assert wrapped(x, fn, hidden_size=256, hc_mult=4) == "vllm"
    got = wrapped(x, fn, hidden_size=256, hc_mult=4, use_tilelang_fallback=False)
    if mode == "off":
        assert got == "vllm" and calls == [True, False]
        return
    out, sqrsum = got
    assert calls == [True]
    assert out.shape == (1, 5, 24) and sqrsum.shape == (1, 5) and out.dtype == sqrsum.dtype == torch.float32
    xd = x.double()
    torch.testing.assert_close(out[0].double(), xd @ fn.double().T, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(sqrsum[0].double(), xd.square().sum(-1), rtol=1e-6, atol=1e-5)


@pytest.fixture
def cutedsl_modules(monkeypatch):
    """vLLM's three modules of V4's CuTeDSL path with a recorder in place of the compressor object (the real one
    compiles for the GPU), routed; the routes removed afterwards."""
    import importlib

    compressor = importlib.import_module(v4_portable.COMPRESSOR_MODULE)
    indexer_q = importlib.import_module(v4_portable.INDEXER_Q_MODULE)
    indexer_q_cutedsl = importlib.import_module(v4_portable.INDEXER_Q_CUTEDSL_MODULE)
    v4_portable.uninstall_cutedsl_routes()
    cutedsl_calls = []
    monkeypatch.setattr(compressor, v4_portable.COMPRESSOR_KERNEL, lambda **kw: cutedsl_calls.append(kw))
    original_has_cutedsl = indexer_q.has_cutedsl
    assert v4_portable.install_cutedsl_routes() and v4_portable.install_cutedsl_routes()
    assert v4_portable.cutedsl_routes_installed()
    yield compressor, indexer_q, indexer_q_cutedsl, cutedsl_calls
    v4_portable.uninstall_cutedsl_routes()
    assert not v4_portable.cutedsl_routes_installed() and indexer_q.has_cutedsl is original_has_cutedsl
    for module, names in ((compressor, v4_portable.COMPRESSOR_WARMUPS),
                          (indexer_q_cutedsl, v4_portable.INDEXER_Q_WARMUPS)):
        assert all("register_warmup" not in vars(getattr(module, n)) for n in names)


def _compressor_kwargs(positions: int = 3, **extra) -> dict:
    """The keyword arguments vLLM's ``DeepseekCompressor`` hands the CuTeDSL compressor (stand-in values)."""
    import inspect

    from vllm.models.deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl import SparseAttnCompressorCuteDSL

    kw = {name: object() for name in inspect.signature(SparseAttnCompressorCuteDSL.__call__).parameters
          if name != "self"}
    kw.update(positions=torch.arange(positions), store_full_kv=False, store_full_fp8=False, fp8_scale=None)
    kw.update(extra)
    return kw


@pytest.mark.parametrize("mode,capability,routed", [("always", (9, 0), True), ("auto", (8, 0), True),
                                                     ("auto", (8, 6), True), ("auto", (8, 9), False),
                                                     ("off", (8, 0), False)])
def test_the_compressor_route_sends_vllms_call_to_its_triton_compressor(cutedsl_modules, cuda_platform_module,
                                                                        monkeypatch, mode, capability, routed):
    """The CuTeDSL compressor's call, where the route holds (``always``; ``auto`` below SM 8.9, vLLM's capability
    simulated), reaches vLLM's ``compress_norm_rope_store_triton`` with exactly that function's parameters (the
    full-row flags dropped); otherwise vLLM's object gets it unchanged."""
    import inspect

    import vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache as fcq

    from triton_mla_sparse.integrations.vllm.simulated_platform import cuda_platform_for

    compressor, _, _, cutedsl_calls = cutedsl_modules
    monkeypatch.setenv(policy.DSV4_PORTABLE_ENV, mode)
    real = inspect.signature(fcq.compress_norm_rope_store_triton).parameters
    triton_calls = []
    monkeypatch.setattr(fcq, "compress_norm_rope_store_triton", lambda **kw: triton_calls.append(kw))
    kw = _compressor_kwargs()
    with cuda_platform_for(cuda_platform_module, *capability, True):
        assert v4_portable.cutedsl_route_wanted() == routed
        getattr(compressor, v4_portable.COMPRESSOR_KERNEL)(**dict(kw))
        if not routed:
            assert cutedsl_calls == [kw] and triton_calls == []
            return
        assert cutedsl_calls == [] and len(triton_calls) == 1
        assert set(triton_calls[0]) == set(real) == set(kw) - {"store_full_kv", "store_full_fp8", "fp8_scale"}
        assert all(triton_calls[0][k] is kw[k] for k in real)
        # nothing to store: no launch (as vLLM's CuTeDSL object returns early)
        getattr(compressor, v4_portable.COMPRESSOR_KERNEL)(**_compressor_kwargs(positions=0))
        assert len(triton_calls) == 1


def test_the_portable_compressor_refuses_full_rows():
    for flag in ("store_full_kv", "store_full_fp8"):
        with pytest.raises(ValueError, match="store_full_kv: the portable V4 compressor writes the fp8_ds_mla"):
            v4_portable.portable_compress(**_compressor_kwargs(**{flag: True}))


@pytest.mark.parametrize("mode", ["always", "off"])
def test_the_indexer_q_route_answers_has_cutedsl_false(cutedsl_modules, monkeypatch, mode):
    """``fused_indexer_q_rope_quant`` asks its module's ``has_cutedsl()`` before taking the CuTeDSL kernel: False
    where the route holds, vLLM's answer otherwise."""
    from vllm.utils.import_utils import has_cutedsl

    _, indexer_q, _, _ = cutedsl_modules
    monkeypatch.setenv(policy.DSV4_PORTABLE_ENV, mode)
    assert indexer_q.has_cutedsl() is (False if mode == "always" else has_cutedsl())
    assert has_cutedsl() is True  # vLLM ships cutlass's DSL: without the route its kernel would run


@pytest.mark.parametrize("mode", ["always", "off"])
def test_routed_cutedsl_kernels_stay_out_of_the_jit_warmup(cutedsl_modules, monkeypatch, mode):
    """vLLM's warm-up registry (which compiles every registered kernel at start-up) gets none of the compressor's
    and indexer q's CuTeDSL kernels where the route holds; each registers as vLLM's otherwise."""
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    compressor, _, indexer_q_cutedsl, _ = cutedsl_modules
    monkeypatch.setenv(policy.DSV4_PORTABLE_ENV, mode)
    kernels = [getattr(compressor, n) for n in v4_portable.COMPRESSOR_WARMUPS[:3]]
    kernels += [getattr(indexer_q_cutedsl, n) for n in v4_portable.INDEXER_Q_WARMUPS]
    registry = JitWarmupRegistry(None)  # the config is read when the warm-up runs, not when kernels register
    with registry.activate():
        for kernel in kernels:
            kernel.register_warmup()
    assert len(registry) == (0 if mode == "always" else len(kernels))


def test_route_wo_a_refuses_e4m3_weights_without_known_scales(monkeypatch):
    """An e4m3 ``wo_a`` whose scales are neither 128 x 128 blocks nor MXFP8's (uint8, one per 32 values of a row)
    cannot be dequantized by the portable o_proj: refused when the layer is built, not left to fail inside
    DeepGEMM; a 128-block one and an MXFP8 one are routed."""
    monkeypatch.setenv(policy.DSV4_PORTABLE_ENV, "always")
    wo_a = torch.nn.Module()
    wo_a.quant_method = type("Method", (), {"process_weights_after_loading": lambda self, layer: None})()
    wo_a.weight = torch.nn.Parameter(torch.zeros(256, 512).to(torch.float8_e4m3fn), requires_grad=False)
    for bad in (torch.ones(256, 16), torch.ones(256, 8, dtype=torch.uint8)):  # float32 32-wide; uint8 64-wide
        wo_a.weight_scale = torch.nn.Parameter(bad, requires_grad=False)
        with pytest.raises(ValueError, match="wo_a: the portable o_proj dequantizes e4m3 weights with 128 x 128"):
            v4_portable.route_wo_a(wo_a)
    for good in (torch.ones(2, 4), torch.full((256, 16), 127, dtype=torch.uint8)):
        wo_a.weight_scale = torch.nn.Parameter(good, requires_grad=False)
        wo_a.quant_method.process_weights_after_loading = None
        assert v4_portable.route_wo_a(wo_a)
        assert wo_a.quant_method.process_weights_after_loading is v4_portable.dequantize_wo_a


def test_dequantize_wo_a_mxfp8():
    """An MXFP8 ``wo_a`` (uint8 UE8M0 scales, one per 32 values of a row): value times 2^(scale - 127), in bf16."""
    g = torch.Generator().manual_seed(3)
    weight = (torch.randn(64, 96, generator=g) * 100).to(torch.float8_e4m3fn)
    scale = torch.randint(115, 131, (64, 3), generator=g).to(torch.uint8)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)
    v4_portable.dequantize_wo_a(layer)
    want = (weight.float() * torch.exp2(scale.float() - 127).repeat_interleave(32, 1)).to(torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16 and not hasattr(layer, "weight_scale")
    assert torch.equal(layer.weight, want)

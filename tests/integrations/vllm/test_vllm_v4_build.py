"""The DeepSeek-V4 / V4.1 build check (:mod:`triton_mla_sparse.integrations.vllm.v4`) against the real vLLM 0.33.0
model modules: only the device capability is simulated (vLLM's CUDA platform class answering for it, as in
``triton-mla-sparse select``)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

import pytest

from triton_mla_sparse.integrations.vllm import plugin, policy, v4, v4_portable
from triton_mla_sparse.integrations.vllm.simulated_platform import cuda_platform_for

MODULES = {"DeepSeek-V4": "vllm.models.deepseek_v4.nvidia.model",
           "DeepSeek-V4.1": "vllm.models.deepseek_v41.nvidia.model"}
# A fragment of each component's line in the error, and the models (and capabilities below which) it blocks.
FLASHMLA, INDEXER, EINSUM, MHC, COMPRESSOR, INDEXQ, CASTS = (
    "FlashMLA", "fp8_fp4_paged_mqa_logits", "fp8_einsum", "tf32_hc_prenorm_gemm", "sparse_attn_compress_cutedsl",
    "fused_indexer_q_cutedsl", "float8e4nv")
# DeepSeek-V4's and V4.1's attention is routed to the plugin's layer below SM 9.0: FlashMLA no longer blocks them;
# with the default switches neither do the indexer (V4.1's with its candidate blocks), the o_proj einsum, the mHC
# prenorm, the CuTeDSL compressor and indexer-q kernels and the e4m3 casts (the plugin's indexer, v4_portable, the
# software casts), so nothing stops either model from SM 8.0 on. With those three switches off (OFF_ENV) every
# component of the model's path blocks again (V4.1 has no forced-DeepGEMM prenorm and no CuTeDSL compressor). The
# CuTeDSL kernels are sm_89+ PTX.
V41_ROWS = {FLASHMLA, INDEXER, EINSUM, INDEXQ, CASTS}
EXPECTED_OFF = {
    ("DeepSeek-V4", (8, 0)): {INDEXER, EINSUM, MHC, COMPRESSOR, INDEXQ, CASTS},
    ("DeepSeek-V4", (8, 6)): {INDEXER, EINSUM, MHC, COMPRESSOR, INDEXQ, CASTS},
    ("DeepSeek-V4", (8, 9)): {INDEXER, EINSUM, MHC},
    ("DeepSeek-V4.1", (8, 0)): {INDEXER, EINSUM, INDEXQ, CASTS},
    ("DeepSeek-V4.1", (8, 6)): {INDEXER, EINSUM, INDEXQ, CASTS},
    ("DeepSeek-V4.1", (8, 9)): {INDEXER, EINSUM},
}
# each switch alone and the rows it gives back (on V4.1: those of its path, V41_ROWS)
SWITCH_ROWS = {policy.INDEXER_ENV: {INDEXER}, policy.DSV4_PORTABLE_ENV: {EINSUM, MHC, COMPRESSOR, INDEXQ},
               policy.SOFT_FP8_ENV: {CASTS}}
BELOW_SM89 = {COMPRESSOR, INDEXQ, CASTS}  # the rows that run natively on SM 8.9
OFF_ENV = tuple(SWITCH_ROWS)
ALL = {FLASHMLA, INDEXER, EINSUM, MHC, COMPRESSOR, INDEXQ, CASTS}
#: The plugin's attention layer class per model.
OURS = {"DeepSeek-V4": "DeepseekV4TritonMLAAttention", "DeepSeek-V4.1": "DeepseekV41TritonMLAAttention"}


@pytest.fixture(scope="module")
def models(cuda_platform_module):
    """vLLM's two CUDA model modules (imported, not wrapped)."""
    v4.uninstall()
    mods = {model: importlib.import_module(name) for model, name in MODULES.items()}
    yield mods
    v4.uninstall()


@pytest.fixture
def checked(models, cuda_platform_module, monkeypatch):
    """The check installed as ``register()`` installs it in a CUDA process (default switches); removed
    afterwards."""
    for name in (policy.DSV4_ENV, *OFF_ENV):
        monkeypatch.delenv(name, raising=False)
    with cuda_platform_for(cuda_platform_module, 9, 0, True):
        assert plugin.install_dsv4_check()
    yield models
    v4.uninstall()
    v4_portable.uninstall()
    v4_portable.uninstall_cutedsl_routes()


def _select(cuda_mod, module, capability):
    from vllm.config import VllmConfig

    with cuda_platform_for(cuda_mod, *capability, True):
        return module._select_dsv4_attn_cls(VllmConfig())


_CASES = ([(m, c, OFF_ENV) for m, c in sorted(EXPECTED_OFF)]
          + [(m, c, (var,)) for m in MODULES for var in OFF_ENV for c in ((8, 6), (8, 9))
             if (var, c) != (policy.SOFT_FP8_ENV, (8, 9))])  # the casts run natively on SM 8.9


@pytest.mark.parametrize("model,capability,off", _CASES)
def test_the_build_stops_with_one_error_naming_each_component(checked, cuda_platform_module, monkeypatch, model,
                                                               capability, off):
    """Below SM 9.0 one ValueError names each component that cannot run when switches are set to ``off`` (all of
    the plugin's indexer, portable o_proj / prenorm and software casts, or each alone: exactly its rows of the
    model's path come back)."""
    expected = set()
    for name in off:
        monkeypatch.setenv(name, "off")
        expected |= {row for row in SWITCH_ROWS[name] if row not in BELOW_SM89 or capability < (8, 9)}
    if model == "DeepSeek-V4.1":
        expected &= V41_ROWS
    if off == OFF_ENV:
        assert expected == EXPECTED_OFF[model, capability]
    with pytest.raises(ValueError) as info:
        _select(cuda_platform_module, checked[model], capability)
    msg = str(info.value)
    assert msg.startswith(f"triton-mla-sparse: {model} cannot run on this GPU (compute capability "
                          f"{capability[0]}.{capability[1]})")
    for fragment in expected:
        assert fragment in msg
    for fragment in ALL - expected:
        assert fragment not in msg
    assert msg.count("\n  - ") == len(expected)
    assert f"runs the attention of {model} on its own kernels" in msg  # both models' layers are routed
    assert f"{policy.DSV4_ENV}=off" in msg


def test_a_missing_prenorm_hook_keeps_the_prenorm_blocking(checked, cuda_platform_module, monkeypatch):
    """Where vLLM's prenorm hook cannot be wrapped, the build check does not count the prenorm as taken."""
    from triton_mla_sparse.integrations.vllm import v4_portable

    monkeypatch.setattr(v4_portable, "install", lambda: False)
    with pytest.raises(ValueError) as info:
        _select(cuda_platform_module, checked["DeepSeek-V4"], (8, 9))
    assert MHC in str(info.value) and str(info.value).count("\n  - ") == 1


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (8, 9)])
def test_sm8x_builds_v4_on_the_plugins_components(checked, cuda_platform_module, capability):
    """On SM 8.x with the default switches nothing blocks DeepSeek-V4: the layer is ours, the first layer's mHC
    prenorm is wrapped, and below SM 8.9 the CuTeDSL compressor and indexer-q calls are routed to vLLM's Triton
    kernels (v4_portable); nor DeepSeek-V4.1 (its layer is ours)."""
    v4_portable.uninstall()
    v4_portable.uninstall_cutedsl_routes()
    try:
        got = _select(cuda_platform_module, checked["DeepSeek-V4"], capability)
        assert got.__name__ == "DeepseekV4TritonMLAAttention"
        assert v4_portable.installed()
        assert v4_portable.cutedsl_routes_installed() == (capability < (8, 9))
    finally:
        v4_portable.uninstall()
        v4_portable.uninstall_cutedsl_routes()
    assert not v4_portable.installed() and not v4_portable.cutedsl_routes_installed()
    try:
        got = _select(cuda_platform_module, checked["DeepSeek-V4.1"], capability)
        assert got.__name__ == "DeepseekV41TritonMLAAttention"
        assert v4_portable.cutedsl_routes_installed() == (capability < (8, 9))  # the indexer-q route
    finally:
        v4_portable.uninstall()
        v4_portable.uninstall_cutedsl_routes()


def test_missing_cutedsl_routes_keep_their_rows_blocking(checked, cuda_platform_module, monkeypatch):
    """Where vLLM's CuTeDSL modules cannot be routed, the build check counts the compressor and indexer q as
    blocking below SM 8.9."""
    import vllm.utils.import_utils as iu

    monkeypatch.setattr(v4_portable, "install_cutedsl_routes", lambda: False)
    monkeypatch.setattr(iu, "has_cutedsl", lambda: True)
    with pytest.raises(ValueError) as info:
        _select(cuda_platform_module, checked["DeepSeek-V4"], (8, 6))
    msg = str(info.value)
    assert COMPRESSOR in msg and INDEXQ in msg and msg.count("\n  - ") == 2
    # without cutlass at all vLLM's indexer q runs its Triton kernel: only the compressor (V4's) stays blocking
    monkeypatch.setattr(iu, "has_cutedsl", lambda: False)
    with pytest.raises(ValueError) as info:
        _select(cuda_platform_module, checked["DeepSeek-V4"], (8, 6))
    assert COMPRESSOR in str(info.value) and INDEXQ not in str(info.value)
    assert _select(cuda_platform_module, checked["DeepSeek-V4.1"], (8, 6)).__name__ == OURS["DeepSeek-V4.1"]


def _v4_config(heads=64, window=128, tp=1):
    """The parts of a VllmConfig that the SM 12.x question reads (FlashInfer's kernels for the padded heads and
    the window)."""
    from types import SimpleNamespace

    return SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(num_attention_heads=heads,
                                                                                  sliding_window=window)),
                           parallel_config=SimpleNamespace(tensor_parallel_size=tp),
                           attention_config=SimpleNamespace(use_non_causal=False), speculative_config=None)


@pytest.mark.parametrize("ready", [True, False])
def test_sm12x_routes_v4_where_flashinfer_has_no_kernel(checked, cuda_platform_module, monkeypatch, ready):
    asked = []
    monkeypatch.setattr(v4, "flashinfer_sm120_ready", lambda cfg, model: asked.append(model) or ready)
    for model, module in checked.items():
        got = _select(cuda_platform_module, module, (12, 0))
        assert (got.__name__ == OURS[model]) == (not ready), (model, got)
        if ready:
            assert got.__name__ == "DeepseekV4FlashInferSM120Attention"
    assert asked == list(checked)  # each model asked about its own FlashInfer layer


def test_flashinfer_sm120_ready_asks_vllms_own_functions(cuda_platform_module, monkeypatch):
    """The question is vLLM's own (FlashInfer's SM120 API, then its specialisation for the padded heads per GPU and
    the window), on stand-ins that record what they were asked."""
    import vllm.utils.flashinfer as fi

    asked = []
    have = {(8, 128), (64, 128)}

    def config(heads, top_k):
        asked.append((heads, top_k))
        return (heads, top_k) in have

    monkeypatch.setattr(fi, "has_flashinfer_sparse_mla_sm120", lambda: True)
    monkeypatch.setattr(fi, "has_flashinfer_sparse_mla_sm120_config", config)
    assert v4.flashinfer_sm120_ready(_v4_config(64, 128, 8))  # 8 heads per GPU
    assert v4.flashinfer_sm120_ready(_v4_config(64, 128, 1))
    assert not v4.flashinfer_sm120_ready(_v4_config(64, 96, 1))  # no kernel for that window
    assert not v4.flashinfer_sm120_ready(_v4_config(96, 128, 8))  # 12 heads -> padded to 16: none
    assert asked == [(8, 128), (64, 128), (64, 96), (16, 128)]
    assert not v4.flashinfer_sm120_ready(object())  # cannot be asked: missing (vLLM would refuse the layer)
    assert v4.flashinfer_sm120_ready(_v4_config(64, 128, 8), "DeepSeek-V4.1")  # V4.1's own module's functions
    assert not v4.flashinfer_sm120_ready(_v4_config(96, 128, 8), "DeepSeek-V4.1")
    assert asked[-2:] == [(8, 128), (16, 128)]
    del asked[-2:]
    monkeypatch.setattr(fi, "has_flashinfer_sparse_mla_sm120", lambda: False)
    assert not v4.flashinfer_sm120_ready(_v4_config(64, 128, 8))  # no SM120 API at all
    assert len(asked) == 4


def test_a_named_backend_is_vllms_choice(checked, cuda_platform_module, monkeypatch):
    """``--attention-backend`` named: ``auto`` leaves the layer to vLLM (even where it would route), ``triton``
    refuses the combination."""
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    monkeypatch.setattr(v4, "flashinfer_sm120_ready", lambda cfg, model: False)
    module = checked["DeepSeek-V4"]
    with cuda_platform_for(cuda_platform_module, 12, 0, True):
        cfg = VllmConfig()
        cfg.attention_config.backend = AttentionBackendEnum.FLASHINFER_MLA_SPARSE_DSV4
        assert module._select_dsv4_attn_cls(cfg).__name__ == "DeepseekV4FlashInferSM120Attention"
        assert module._select_dsv4_attn_cls(VllmConfig()).__name__ == "DeepseekV4TritonMLAAttention"
        monkeypatch.setenv(policy.DSV4_ENV, "triton")
        with pytest.raises(ValueError, match="FLASHINFER_MLA_SPARSE_DSV4"):
            module._select_dsv4_attn_cls(cfg)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (12, 0)])
def test_triton_mode_routes_v4_everywhere(checked, cuda_platform_module, monkeypatch, capability):
    monkeypatch.setenv(policy.DSV4_ENV, "triton")
    for model, module in checked.items():
        if capability[0] == 10 and model == "DeepSeek-V4.1":  # its MXFP8 record there: refused, not routed
            with pytest.raises(ValueError, match="528-byte MXFP8 record"):
                _select(cuda_platform_module, module, capability)
            monkeypatch.delenv(policy.DSV4_ENV)
            assert _select(cuda_platform_module, module, capability).__name__ != OURS[model]  # auto: vLLM's
            monkeypatch.setenv(policy.DSV4_ENV, "triton")
            continue
        assert _select(cuda_platform_module, module, capability).__name__ == OURS[model]


@pytest.mark.parametrize("model", sorted(MODULES))
@pytest.mark.parametrize("capability", [(9, 0), (10, 0), (12, 0)])
def test_no_change_where_vllms_path_runs(checked, cuda_platform_module, monkeypatch, model, capability):
    monkeypatch.setattr(v4, "flashinfer_sm120_ready", lambda cfg, model: True)  # SM 12.x with FlashInfer's kernels
    module = checked[model]
    got = _select(cuda_platform_module, module, capability)
    from vllm.config import VllmConfig

    with cuda_platform_for(cuda_platform_module, *capability, True):
        assert got is module._select_dsv4_attn_cls.__wrapped__(VllmConfig())
    assert got.__name__ == ("DeepseekV4FlashInferSM120Attention" if capability[0] == 12
                            else "DeepseekV4FlashMLAAttention")


def test_the_check_sits_on_the_decoder_layers_build_path(models):
    # Each model's decoder layer (also the MTP / DSpark drafters' block) calls the module global at construction.
    for model, module in models.items():
        layer = module.DeepseekV4DecoderLayer
        assert layer.__module__ == MODULES[model]
        assert v4.HOOK_NAME in layer.__init__.__code__.co_names


def _exists(path: str) -> bool:
    """Whether ``path`` is a module (found, not imported) or an attribute of an importable module."""
    try:
        if importlib.util.find_spec(path) is not None:
            return True
    except ModuleNotFoundError:  # the parent is a module, not a package
        pass
    parent, attr = path.rsplit(".", 1)
    return hasattr(importlib.import_module(parent), attr)


def test_every_component_names_code_in_vllm(cuda_platform_module):
    for c in v4.COMPONENTS:
        for path in c.vllm_function.split(", "):
            assert _exists(path), (c.name, path)


def test_unknown_or_newer_capabilities_pass():
    v4.check_capability(None, "DeepSeek-V4")
    for cap in [(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]:
        assert v4.blocking_components(cap, "DeepSeek-V4") == []
        assert v4.blocking_components(cap, "DeepSeek-V4.1") == []


def test_off_leaves_vllms_function_untouched(models, cuda_platform_module, monkeypatch):
    v4.uninstall()
    originals = {model: module._select_dsv4_attn_cls for model, module in models.items()}
    monkeypatch.setenv(policy.DSV4_ENV, " OFF ")
    with cuda_platform_for(cuda_platform_module, 8, 6, True):
        assert plugin.install_dsv4_check() is False
        assert v4.install() is False
    assert v4.installed_modules() == {}
    for model, module in models.items():
        assert module._select_dsv4_attn_cls is originals[model]
        assert not hasattr(module._select_dsv4_attn_cls, "__wrapped__")


def test_not_installed_off_cuda(models, monkeypatch):
    v4.uninstall()
    monkeypatch.delenv(policy.DSV4_ENV, raising=False)
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda", lambda: False)
    assert plugin.install_dsv4_check() is False
    assert not hasattr(models["DeepSeek-V4"]._select_dsv4_attn_cls, "__wrapped__")


@pytest.mark.parametrize("var", [policy.DSV4_ENV, policy.DSV4_PORTABLE_ENV])
def test_a_bad_value_stops_register(monkeypatch, var):
    monkeypatch.setenv(var, "yes")
    with pytest.raises(ValueError, match=var):
        plugin.register()


def test_install_is_idempotent(checked, cuda_platform_module):
    wrapped = {model: module._select_dsv4_attn_cls for model, module in checked.items()}
    with cuda_platform_for(cuda_platform_module, 9, 0, True):
        assert plugin.install_dsv4_check()
    for model, module in checked.items():
        assert module._select_dsv4_attn_cls is wrapped[model]
        assert not hasattr(module._select_dsv4_attn_cls.__wrapped__, "__wrapped__")


@pytest.fixture
def fake_model(tmp_path, monkeypatch, cuda_platform_module):
    """A module shaped like vLLM's model module, importable by name, watched by the check (not yet imported)."""
    name = "tms_fake_dsv4_model"
    (tmp_path / f"{name}.py").write_text(
        "from vllm.platforms import current_platform\n\n\n"
        "def _select_dsv4_attn_cls(vllm_config):\n"
        "    return ('picked', vllm_config)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with cuda_platform_for(cuda_platform_module, 9, 0, True):
        assert v4.install(mode="auto", modules={name: "DeepSeek-V4.1"})
    assert name not in sys.modules and v4.installed_modules() == {name: "DeepSeek-V4.1"}
    yield name
    v4.uninstall({name: "DeepSeek-V4.1"})
    sys.modules.pop(name, None)
    assert v4.installed_modules() == {}


def test_a_module_imported_later_is_wrapped_on_import(fake_model, cuda_platform_module, monkeypatch):
    module = importlib.import_module(fake_model)
    assert module._select_dsv4_attn_cls.__wrapped__.__module__ == fake_model
    monkeypatch.setenv(policy.INDEXER_ENV, "off")  # V4.1's indexer then stops the build on SM 8.6
    with cuda_platform_for(cuda_platform_module, 8, 6, True):
        with pytest.raises(ValueError, match="compute capability 8.6"):
            module._select_dsv4_attn_cls("cfg")
    with cuda_platform_for(cuda_platform_module, 10, 0, True):
        assert module._select_dsv4_attn_cls("cfg") == ("picked", "cfg")


def test_a_missing_function_is_logged_once_and_skipped(plugin_log):
    import types

    module = types.ModuleType("tms_fake_missing")
    assert v4.wrap_module(module, "DeepSeek-V4") is False
    assert v4.wrap_module(module, "DeepSeek-V4") is False
    assert not hasattr(module, v4.HOOK_NAME)
    warned = [r for r in plugin_log if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "is missing" in warned[0].getMessage()


def test_another_signature_is_logged_once_and_skipped(plugin_log):
    import types

    def _select_dsv4_attn_cls(vllm_config, device_capability):
        return None

    module = types.ModuleType("tms_fake_other_signature")
    module._select_dsv4_attn_cls = _select_dsv4_attn_cls
    assert v4.wrap_module(module, "DeepSeek-V4") is False
    assert v4.wrap_module(module, "DeepSeek-V4") is False
    assert module._select_dsv4_attn_cls is _select_dsv4_attn_cls
    warned = [r for r in plugin_log if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "differs from the vLLM 0.33 signature" in warned[0].getMessage()


def test_register_installs_the_check(cuda_platform_module, monkeypatch):
    calls = []
    monkeypatch.setattr(plugin, "install_dsv4_check", lambda: calls.append(True) or False)
    plugin.register()
    assert calls == [True]

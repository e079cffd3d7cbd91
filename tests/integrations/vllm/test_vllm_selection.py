"""vLLM 0.33.0's own validation and automatic selection with TRITON_MLA_SPARSE, and the `select` command.

GLM-5 (64 heads, TP 8 -> 8 per GPU, qk_nope 192) and DeepSeek-V3.2 (128 heads, TP 8 -> 16 per GPU) as real vLLM
ModelConfigs (config.json from transformers' config classes, read by vLLM's own config loader).
"""

from __future__ import annotations

import json

import pytest
import torch

from triton_mla_sparse.integrations.vllm import policy
from triton_mla_sparse.integrations.vllm.select import MODELS, evaluate, select_main

CAPABILITIES = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (11, 0), (12, 0)]
ACCEPTED_KV = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla"]


def validate(vllm_config, **overrides):
    """TritonMLASparseBackend.validate_configuration — vLLM's aggregate of the backend's declarations — under the
    model's VllmConfig, for a sparse MLA decoder layer unless overridden."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    args = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None, use_mla=True,
                has_sink=False, use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False,
                device_capability=DeviceCapability(8, 9), attn_type="decoder")
    args.update(overrides)
    if isinstance(args["device_capability"], tuple):
        args["device_capability"] = DeviceCapability(*args["device_capability"])
    backend = AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class()
    with set_current_vllm_config(vllm_config):
        return backend.validate_configuration(**args)


@pytest.mark.parametrize("model", ["glm5", "dsv32"])
@pytest.mark.parametrize("cap", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_vllm_validation_accepts(cuda_platform_module, vllm_configs, model, cap):
    vc = vllm_configs[model]
    assert vc.model_config.get_num_attention_heads(vc.parallel_config) == MODELS[model].num_heads // 8
    assert vc.model_config.get_head_size() == 576
    for kv in ACCEPTED_KV:
        for block_size in (None, 64, 16):
            for dtype in (torch.bfloat16, torch.float16):
                assert validate(vc, device_capability=cap, kv_cache_dtype=kv, block_size=block_size,
                                dtype=dtype) == [], (kv, block_size, dtype)
    assert validate(vc, device_capability=cap, head_size=512) == []  # NoPE layers


@pytest.mark.parametrize("overrides,reason", [
    (dict(device_capability=(7, 5)), "compute capability not supported"),
    (dict(device_capability=(7, 0)), "compute capability not supported"),
    (dict(device_capability=(10, 1)), "compute capability not supported"),
    (dict(device_capability=(13, 0)), "compute capability not supported"),
    (dict(kv_cache_dtype="nvfp4_ds_mla"), "kv_cache_dtype not supported"),
    (dict(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype not supported"),
    (dict(dtype=torch.float32), "dtype not supported"),
    (dict(head_size=128), "head_size not supported"),
    (dict(use_sparse=False), "non-sparse not supported"),
    (dict(use_mla=False), "non-MLA not supported"),
    (dict(has_sink=True), "attention sinks not supported"),
    (dict(attn_type="encoder_only"), "attention type encoder_only not supported"),
    (dict(use_pcp=True), "PCP not supported"),
])
def test_vllm_validation_rejects_with_reason(cuda_platform_module, vllm_configs, overrides, reason):
    reasons = validate(vllm_configs["glm5"], **overrides)
    assert reason in reasons


def test_vllm_validation_rejects_other_model_shapes(cuda_platform_module, tmp_path):
    from dataclasses import replace

    from vllm.config import DeviceConfig, VllmConfig

    from triton_mla_sparse.integrations.vllm.select import _model_config

    for dims, reason in [(dict(kv_lora_rank=256), "TRITON_MLA_SPARSE: D_v = 256 is not supported (only 512)"),
                         (dict(qk_rope_head_dim=32), "TRITON_MLA_SPARSE: D_rope = 32 is not supported (only 64, or 0 "
                                                     "for NoPE)"),
                         (dict(index_topk=32768), "TRITON_MLA_SPARSE: top-k 32768 is not supported (1 to 16384)"),
                         (dict(num_heads=256), "TRITON_MLA_SPARSE: 256 heads are not supported (1 to 128 per call)")]:
        shape = replace(MODELS["dsv32"], **dims)
        vc = VllmConfig(model_config=_model_config(shape, "bfloat16", str(tmp_path)),
                        device_config=DeviceConfig(device="cpu"))
        reasons = validate(vc, head_size=shape.head_size)
        assert any(reason in r for r in reasons), reasons


@pytest.mark.parametrize("model", ["glm5", "dsv32"])
def test_vllm_selects_per_policy(cuda_platform_module, model):
    """vLLM's CUDA priority list + every candidate's validate_configuration (vLLM's get_valid_backends), with
    vLLM's device probes answering for each capability."""
    for cap in CAPABILITIES:
        for kv in ("bfloat16", "fp8_ds_mla", "auto", "fp8"):
            r = evaluate(capability=cap, shape=MODELS[model], tp=8, kv_cache_dtype=kv)
            assert r["validation"] == "vllm"
            names = [c["name"] for c in r["candidates"]]
            ours = r["candidates"][names.index("TRITON_MLA_SPARSE")]
            assert ours["accepted"], (cap, kv, ours["reasons"])
            first_accepted = next(c["name"] for c in r["candidates"] if c["accepted"])
            assert r["selected"] == first_accepted
            where = (cap, kv, r["selected"])
            if cap[0] in (8, 11):  # first: no vLLM sparse MLA backend runs on SM 8.x or 11.x
                assert ours["position"] == 1 and r["selected"] == "TRITON_MLA_SPARSE", where
            elif cap[0] == 12:
                assert names[names.index("TRITON_MLA_SPARSE") - 1] == "FLASHINFER_MLA_SPARSE_SM120"
                if kv == "bfloat16":  # FlashInfer's SM120 kernel only takes fp8_ds_mla
                    assert r["selected"] == "TRITON_MLA_SPARSE", where
            elif cap[0] == 9 and kv == "fp8_ds_mla":  # measured fastest there: 8 (GLM-5) / 16 (V3.2) heads per GPU
                assert ours["position"] == 1 and r["selected"] == "TRITON_MLA_SPARSE", where
            else:
                assert names[-1] == "TRITON_MLA_SPARSE"
                others = [c for c in r["candidates"] if c["accepted"] and c["name"] != "TRITON_MLA_SPARSE"]
                assert (r["selected"] == "TRITON_MLA_SPARSE") == (not others), where


@pytest.mark.parametrize("tp,first", [(8, True), (4, False), (2, False)])
def test_vllm_sm90_fp8_ds_mla_first_up_to_16_heads(cuda_platform_module, tp, first):
    """On SM 9.0 with an fp8_ds_mla cache vLLM selects ours up to 16 heads per GPU (DeepSeek-V3.2 at TP 8) and
    FLASHMLA_SPARSE above (32 / 64 heads at TP 4 / 2), through vLLM's own priority call with its num_heads."""
    r = evaluate(capability=(9, 0), shape=MODELS["dsv32"], tp=tp, kv_cache_dtype="fp8_ds_mla")
    assert r["validation"] == "vllm" and r["heads_per_gpu"] == 128 // tp
    assert r["selected"] == ("TRITON_MLA_SPARSE" if first else "FLASHMLA_SPARSE"), r["candidates"]
    names = [c["name"] for c in r["candidates"]]
    assert names.index("TRITON_MLA_SPARSE") == (0 if first else len(names) - 1)
    r = evaluate(capability=(9, 0), shape=MODELS["dsv32"], tp=tp, kv_cache_dtype="bfloat16")
    assert r["selected"] == "FLASH_ATTN_MLA_SPARSE"


@pytest.mark.parametrize("dcp,first", [(1, True), (2, False), (8, False)])
def test_vllm_sm90_fp8_ds_mla_counts_the_dcp_group(cuda_platform_module, dcp, first):
    """Under decode context parallelism vLLM gathers q over the DCP group, so the kernels see dcp x the 16 heads
    per GPU of DeepSeek-V3.2 at TP 8: ours first only without it (the priority hook reads vLLM's current config)."""
    r = evaluate(capability=(9, 0), shape=MODELS["dsv32"], tp=8, dcp=dcp, kv_cache_dtype="fp8_ds_mla")
    assert r["validation"] == "vllm" and r["dcp"] == dcp
    names = [c["name"] for c in r["candidates"]]
    assert (names[0] == "TRITON_MLA_SPARSE") is first and (names[-1] == "TRITON_MLA_SPARSE") is not first
    r = evaluate(capability=(9, 0), shape=MODELS["dsv32"], tp=8, dcp=dcp, kv_cache_dtype="fp8_ds_mla",
                 use_vllm=False)
    assert r["validation"] == "declarations"


def test_evaluate_rejects_a_dcp_that_does_not_divide_tp():
    with pytest.raises(ValueError, match="--dcp"):
        evaluate(capability=(9, 0), shape=MODELS["dsv32"], tp=8, dcp=3)


def test_vllm_selection_kv_dtype_canonicalisation(cuda_platform_module):
    """vLLM turns fp8 into fp8_ds_mla only for FLASHMLA_SPARSE / FLASHINFER_MLA_SPARSE_SM120; ours keeps per-tensor
    fp8 (the kv-cache-dtype note of the README)."""
    r = evaluate(capability=(8, 9), shape=MODELS["glm5"], tp=8, kv_cache_dtype="fp8")
    assert r["selected"] == "TRITON_MLA_SPARSE" and r["kv_cache_dtype_used"] == "fp8"
    r = evaluate(capability=(9, 0), shape=MODELS["dsv32"], tp=8, kv_cache_dtype="fp8")
    assert r["selected"] == "FLASHMLA_SPARSE" and r["kv_cache_dtype_used"] == "fp8_ds_mla"


def test_vllm_no_backend_below_sm80(cuda_platform_module):
    r = evaluate(capability=(7, 5), shape=MODELS["glm5"], tp=8)
    assert r["selected"] is None and "TRITON_MLA_SPARSE" not in [c["name"] for c in r["candidates"]]


def test_select_main_text(cuda_platform_module, capsys):
    assert select_main(["--capability", "8.9", "--model", "glm5", "--tp", "8", "--kv-cache-dtype", "fp8_ds_mla"]) == 0
    out = capsys.readouterr().out
    assert "=> vLLM uses TRITON_MLA_SPARSE" in out
    assert "1. TRITON_MLA_SPARSE" in out and "accepted  <- selected" in out
    assert "FLASHMLA_SPARSE              rejected: compute capability not supported" in out
    assert "GLM-5: 64 heads / TP 8 = 8 per GPU" in out


def test_select_main_json_and_table(cuda_platform_module, capsys):
    assert select_main(["-c", "sm120", "-m", "dsv32", "--tp", "8", "--kv-cache-dtype", "bfloat16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["selected"] == "TRITON_MLA_SPARSE" and report["heads_per_gpu"] == 16
    assert report["capability"] == "12.0" and report["validation"] == "vllm"
    sm120 = next(c for c in report["candidates"] if c["name"] == "FLASHINFER_MLA_SPARSE_SM120")
    assert not sm120["accepted"] and "kv_cache_dtype not supported" in sm120["reasons"]

    assert select_main(["-c", "8.0,9.0", "-m", "glm5", "--tp", "8", "--kv-cache-dtype", "bfloat16,fp8_ds_mla"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:3] == ["8.0", "fp8_ds_mla", "TRITON_MLA_SPARSE"] for line in lines)
    assert any(line.split()[:2] == ["9.0", "bfloat16"] and line.endswith("#8/8 accepted") for line in lines)


def test_select_main_errors(cuda_platform_module, capsys):
    assert select_main(["-c", "7.5", "-m", "glm5", "--tp", "8"]) == 1  # no valid sparse backend
    assert select_main(["-c", "8.9"]) == 2
    assert select_main(["-c", "nonsense", "-m", "glm5"]) == 2
    assert select_main(["-c", "8.9", "-m", "glm5", "--tp", "3"]) == 2
    assert select_main(["-c", "8.9", "-m", "glm5", "--kv-cache-dtype", "fp9"]) == 2
    capsys.readouterr()


def test_select_declarations_only(capsys):
    assert select_main(["-c", "8.9", "-m", "glm5", "--tp", "8", "--no-vllm"]) == 0
    out = capsys.readouterr().out
    assert "declarations only" in out and "TRITON_MLA_SPARSE: accepted" in out
    assert select_main(["-c", "7.5", "-m", "glm5", "--no-vllm"]) == 1
    assert "compute capability not supported" in capsys.readouterr().out
    assert policy.static_reasons(capability=(8, 9), head_size=576, dtype="bfloat16", kv_cache_dtype="fp8_ds_mla") == []
    assert select_main(["-c", "13.0", "-m", "glm5", "--no-vllm"]) == 1  # not a declared architecture
    assert "compute capability not supported" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["glm5", "dsv32"])
def test_static_reasons_equal_vllm_validation(cuda_platform_module, vllm_configs, model):
    """static_reasons (select --no-vllm) says what vLLM's validate_configuration says, for every combination."""
    vc = vllm_configs[model]
    shape = MODELS[model]
    heads = vc.model_config.get_num_attention_heads(vc.parallel_config)
    for cap in [(7, 5), (8, 0), (8, 9), (9, 0), (11, 0), (12, 1), (13, 0)]:
        for head_size in (576, 512, 128):
            for dtype in ("bfloat16", "float16", "float32"):
                for kv in ("auto", "bfloat16", "fp8", "fp8_ds_mla", "fp8_e5m2", "nvfp4_ds_mla"):
                    want = validate(vc, device_capability=cap, head_size=head_size, dtype=getattr(torch, dtype),
                                    kv_cache_dtype=kv)
                    got = policy.static_reasons(capability=cap, head_size=head_size, dtype=dtype, kv_cache_dtype=kv,
                                                kv_lora_rank=shape.kv_lora_rank,
                                                qk_rope_head_dim=shape.qk_rope_head_dim,
                                                index_topk=shape.index_topk, heads=heads)
                    assert got == want, (cap, head_size, dtype, kv)


def test_vllm_validation_under_batch_invariance(cuda_platform_module, vllm_configs):
    """VLLM_BATCH_INVARIANT=1: vLLM passes use_batch_invariant=True; ours is valid, vLLM 0.33's sparse peers are not
    (none declares batch invariance)."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert validate(vllm_configs["dsv32"], device_capability=(9, 0), use_batch_invariant=True) == []
    args = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64, use_mla=True,
                has_sink=False, use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False,
                device_capability=DeviceCapability(9, 0), attn_type="decoder", use_batch_invariant=True)
    for peer in ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"):
        with set_current_vllm_config(vllm_configs["dsv32"]):
            reasons = AttentionBackendEnum[peer].get_class().validate_configuration(**args)
        assert "batch invariance not supported" in reasons, (peer, reasons)

"""capabilities.py is the one source of "does this run here?": the API's device check, the vLLM policy (without
vLLM) and ``select --no-vllm`` give the same answer for every GPU. The vLLM tier (tests/integrations/vllm) holds
vLLM's own validation to the same answers."""

from __future__ import annotations

import re
import types

import pytest
import torch

from triton_mla_sparse import capabilities
from triton_mla_sparse.integrations.vllm import policy
from triton_mla_sparse.integrations.vllm.select import select_main

CUDA_CAPABILITIES = [(major, minor) for major in range(7, 14) for minor in range(10)]
DECLARED_CUDA = {(8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)}
HIP_TARGETS = [name for name, arch in capabilities.ARCHS.items() if arch.backend == "hip"]


@pytest.fixture
def fake_gpu(monkeypatch):
    """Make torch's device queries answer for one GPU; returns a setter (capability or gfx name)."""

    def set_gpu(*, capability=None, hip_arch=None) -> torch.device:
        monkeypatch.setattr(torch.version, "hip", "6.4" if hip_arch else None, raising=False)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device=None: types.SimpleNamespace(gcnArchName=f"{hip_arch}:sramecc+:xnack-"))
        capabilities.arch_for_device.cache_clear()
        capabilities.describe_device.cache_clear()
        return torch.device("cuda", 0)

    yield set_gpu
    capabilities.arch_for_device.cache_clear()
    capabilities.describe_device.cache_clear()


def api_device_reasons(dev: torch.device) -> list[str]:
    """The API's device check before launching (ops/sparse_mla/api.py): arch_for_device, then
    unsupported_reasons with the device's description, here for a supported problem."""
    return capabilities.unsupported_reasons(capabilities.arch_for_device(dev), heads=8, topk=2048,
                                            device_desc=capabilities.describe_device(dev))


def test_the_api_checks_with_these_functions():
    from triton_mla_sparse.ops.sparse_mla import api

    assert api.arch_for_device is capabilities.arch_for_device
    assert api.unsupported_reasons is capabilities.unsupported_reasons
    assert api.describe_device is capabilities.describe_device


@pytest.mark.parametrize("cap", CUDA_CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_cuda_capability_answers_agree(fake_gpu, cap):
    dev = fake_gpu(capability=cap)
    ours = api_device_reasons(dev)
    declared = cap in DECLARED_CUDA
    assert (ours == []) is declared
    assert capabilities.supports_capability(cap) is declared
    assert ours == capabilities.capability_reasons(cap)
    assert (policy.policy_index([], cap) is not None) is declared
    static = policy.static_reasons(capability=cap, head_size=576, dtype="bfloat16", kv_cache_dtype="auto", heads=8)
    assert static == ([] if declared else ["compute capability not supported"])
    if not declared:
        assert ours == [f"compute capability {cap[0]}.{cap[1]} is not a declared architecture (declared: sm80 (8.0), "
                        "sm86 (8.6, 8.7), sm89 (8.9), sm90 (9.0), sm100 (10.0, 10.3), sm110 (11.0), sm120 (12.0, "
                        "12.1), gfx942 (gfx942), gfx950 (gfx950), gfx1100 (gfx1100), gfx1101 (gfx1101), gfx1151 "
                        "(gfx1151), gfx1200 (gfx1200), gfx1201 (gfx1201))"]


@pytest.mark.parametrize("gfx", HIP_TARGETS + ["gfx90a", "gfx940", "gfx1030", "gfx1102", "gfx1150", "gfx1250"])
def test_rocm_target_answers_agree(fake_gpu, gfx):
    dev = fake_gpu(hip_arch=gfx)
    ours = api_device_reasons(dev)
    assert (ours == []) is (gfx in HIP_TARGETS)
    assert ours == capabilities.capability_reasons(hip_arch=gfx)
    assert capabilities.describe_device(dev) == gfx
    cap = (9, 4)  # what HIP reports for gfx940..gfx942: the gfx name decides, not this
    assert (policy.static_reasons(capability=cap, hip_arch=gfx, head_size=576, dtype="bfloat16",
                                  kv_cache_dtype="auto") == []) is (gfx in HIP_TARGETS)


def test_arch_for_target():
    assert capabilities.arch_for_target((8, 7)).name == "sm86"
    assert capabilities.arch_for_target(hip_arch="gfx950").name == "gfx950"
    assert capabilities.arch_for_target(hip_arch="sm90") is None  # a CUDA family is no gfx name
    assert capabilities.arch_for_target((9, 4)) is None
    with pytest.raises(ValueError, match="capability or a hip_arch"):
        capabilities.arch_for_target()


def test_problem_reasons_are_the_api_reasons_without_the_device():
    bad = dict(q_dtype=torch.float32, kv_format="int8", d_v=256, d_rope=32, heads=129, topk=0, block_size=0)
    reasons = capabilities.problem_reasons(**bad)
    assert len(reasons) == 7
    assert capabilities.unsupported_reasons(capabilities.ARCHS["sm90"], **bad) == reasons
    assert capabilities.unsupported_reasons(None, device_desc="X", **bad)[1:] == reasons


def test_backend_declarations_derive_from_capabilities():
    assert set(policy.SUPPORTED_DTYPES) == {"float16", "bfloat16"}
    assert policy.SUPPORTED_HEAD_SIZES == (512, 576)
    assert policy.KV_LORA_RANK == 512 and policy.ROPE_DIMS == (0, 64)
    assert policy.model_reasons(kv_lora_rank=512, qk_rope_head_dim=64, index_topk=2048, heads=128) == []
    assert policy.model_reasons(kv_lora_rank=512, qk_rope_head_dim=0, index_topk=capabilities.MAX_TOPK) == []
    assert policy.model_reasons(kv_lora_rank=512, qk_rope_head_dim=64, index_topk=None) == [
        "TRITON_MLA_SPARSE requires a DSA model (index_topk in the model config)"]
    assert policy.model_reasons(kv_lora_rank=512, qk_rope_head_dim=64, index_topk=2048,
                                heads=capabilities.MAX_HEADS + 1) == [
        "TRITON_MLA_SPARSE: 129 heads are not supported (1 to 128 per call)"]


@pytest.mark.parametrize("var,modes,default", [
    (policy.PRIORITY_ENV, policy.PRIORITY_MODES, "default"),
    (policy.INDEXER_ENV, policy.INDEXER_MODES, "auto"),
])
def test_env_mode_one_parser(monkeypatch, var, modes, default):
    monkeypatch.delenv(var, raising=False)
    assert policy.env_mode(var) == default
    monkeypatch.setenv(var, "  ")
    assert policy.env_mode(var) == default
    for mode in modes:
        monkeypatch.setenv(var, f" {mode.upper()} ")
        assert policy.env_mode(var) == mode
    monkeypatch.setenv(var, "Bogus")
    with pytest.raises(ValueError, match=rf"^{var}: expected one of .* \(or unset\), got 'Bogus'$"):
        policy.env_mode(var)


def test_priority_accepts_auto_for_default(monkeypatch):
    monkeypatch.setenv(policy.PRIORITY_ENV, "auto")
    assert policy.priority_mode() == "default"
    monkeypatch.setenv(policy.INDEXER_ENV, "default")
    with pytest.raises(ValueError, match=policy.INDEXER_ENV):
        policy.indexer_mode()


def test_select_declarations_agree(capsys, monkeypatch):
    monkeypatch.delenv(policy.PRIORITY_ENV, raising=False)
    assert select_main(["-c", "8.7", "-m", "glm5", "--tp", "8", "--no-vllm"]) == 0
    assert "TRITON_MLA_SPARSE: accepted" in capsys.readouterr().out
    assert select_main(["-c", "13.0", "-m", "glm5", "--tp", "8", "--no-vllm"]) == 1
    out = capsys.readouterr().out
    assert "compute capability not supported" in out and "compute capability 13.0 is not a declared" in out
    assert select_main(["-c", "8.9", "-m", "dsv32", "--no-vllm"]) == 0  # 128 heads on one GPU: MAX_HEADS
    capsys.readouterr()
    monkeypatch.setenv(policy.PRIORITY_ENV, "bogus")
    assert select_main(["-c", "8.9", "-m", "glm5", "--no-vllm"]) == 2
    assert "TRITON_MLA_SPARSE_PRIORITY: expected one of" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [9, 8, (8,), (8, 9, 0), ("8", "9"), (8.0, 9), (True, 0), None, "8.9"],
                         ids=repr)
def test_capability_argument_is_a_pair_of_ints(bad):
    """policy_index, place_backend, static_reasons and policy_sentence take (major, minor); the old int form (a
    major alone) and anything else that is not a pair of ints is one ValueError naming the argument."""
    message = "^" + re.escape(f"capability: expected a (major, minor) pair of ints, got {bad!r}") + "$"
    with pytest.raises(ValueError, match=message):
        policy.policy_index([], bad)
    with pytest.raises(ValueError, match=message):
        policy.place_backend(["A"], bad, "default", "TRITON_MLA_SPARSE")
    with pytest.raises(ValueError, match=message):
        policy.static_reasons(capability=bad, head_size=576, dtype="bfloat16", kv_cache_dtype="auto")
    with pytest.raises(ValueError, match=message):
        policy.policy_sentence(bad, "default")


def test_capability_pairs_in_any_sequence_form():
    assert policy.check_capability((8, 9)) == policy.check_capability([8, 9]) == (8, 9)
    assert policy.policy_index(["A"], [12, 0]) == policy.policy_index(["A"], (12, 0)) == 1
    assert policy.place_backend(["A"], [8, 0], "default", "T") == ["T", "A"]
    assert policy.static_reasons(capability=[8, 9], head_size=576, dtype="bfloat16", kv_cache_dtype="auto") == []
    with pytest.raises(TypeError, match="major"):  # the old keyword is gone (see the docstring)
        policy.static_reasons(major=8, head_size=576, dtype="bfloat16", kv_cache_dtype="auto")

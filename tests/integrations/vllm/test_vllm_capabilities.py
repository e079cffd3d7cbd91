"""One capability source: vLLM 0.33's validation of TRITON_MLA_SPARSE and the check ``sparse_mla_attention`` runs
before launching give the same answer for every GPU.

CUDA: every compute capability 7.0 … 13.9 through vLLM's ``validate_configuration`` (which asks the backend's
``supports_compute_capability``) under a real GLM-5 configuration, against :func:`capabilities.arch_for_device`
(with torch's device query answering for that capability) + :func:`capabilities.unsupported_reasons` for a
supported problem, the two calls of the API's device check.

ROCm: vLLM's ROCm platform never auto-selects our backend (its sparse MLA list is ROCM_AITER_MLA_SPARSE alone and
the priority hook only wraps the CUDA list), but ``--attention-backend TRITON_MLA_SPARSE`` goes through
``RocmPlatform.get_attn_backend_cls``, which calls ``validate_configuration`` with the capability it derives from
the gfx name (gfx942 -> 9.4). That path runs in a subprocess (importing vLLM's ROCm module on this host needs a
stand-in gfx name and leaves ROCm state behind) for the declared gfx targets and a few undeclared ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import torch

from triton_mla_sparse import capabilities
from triton_mla_sparse.integrations.vllm import policy

CUDA_CAPABILITIES = [(major, minor) for major in range(7, 14) for minor in range(10)]
DECLARED_CUDA = {(8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)}
HIP_TARGETS = [name for name, arch in capabilities.ARCHS.items() if arch.backend == "hip"]
UNDECLARED_HIP = ["gfx90a", "gfx940", "gfx1030", "gfx1250"]


def api_reasons(monkeypatch, *, capability=None, hip_arch=None) -> list[str]:
    """What the API's device check (arch_for_device, then unsupported_reasons) says for a GPU of this kind, with a
    problem the kernels support (GLM-5 at TP 8: 8 heads, top-k 2048, bf16 cache)."""
    if hip_arch is not None:
        monkeypatch.setattr(torch.version, "hip", "6.4", raising=False)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device=None: types.SimpleNamespace(gcnArchName=f"{hip_arch}:sramecc+:xnack-"))
    else:
        monkeypatch.setattr(torch.version, "hip", None, raising=False)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    capabilities.arch_for_device.cache_clear()
    capabilities.describe_device.cache_clear()
    try:
        dev = torch.device("cuda", 0)
        arch = capabilities.arch_for_device(dev)
        return capabilities.unsupported_reasons(arch, heads=8, topk=2048, kv_format="bf16",
                                                device_desc=capabilities.describe_device(dev))
    finally:
        capabilities.arch_for_device.cache_clear()
        capabilities.describe_device.cache_clear()


def test_cuda_capabilities_agree(cuda_platform_module, vllm_configs, monkeypatch):
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class()
    supported = set()
    for cap in CUDA_CAPABILITIES:
        dc = DeviceCapability(*cap)
        with set_current_vllm_config(vllm_configs["glm5"]):
            vllm_reasons = backend.validate_configuration(
                head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None, use_mla=True,
                has_sink=False, use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False,
                device_capability=dc, attn_type="decoder")
        vllm_ok = backend.supports_compute_capability(dc)
        assert (vllm_reasons == []) is vllm_ok, (cap, vllm_reasons)
        ours = api_reasons(monkeypatch, capability=cap)
        assert (ours == []) is vllm_ok, (cap, ours)
        assert capabilities.supports_capability(cap) is vllm_ok
        assert (policy.policy_index([], cap) is not None) is vllm_ok  # auto-selection only where it runs
        if not vllm_ok:
            assert vllm_reasons == ["compute capability not supported"], cap
            assert ours == capabilities.capability_reasons(cap), cap
        else:
            supported.add(cap)
    assert supported == DECLARED_CUDA


_ROCM_PROBE = r"""
import json, sys, tempfile, types
import torch
# vLLM's ROCm module reads the gfx name once at import (amdsmi, else torch): a stand-in, replaced per target below.
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(gcnArchName="gfx942")
import vllm.platforms as platforms
import vllm.platforms.rocm as rocm
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig
from triton_mla_sparse.integrations.vllm import register
from triton_mla_sparse.integrations.vllm.select import MODELS, _model_config

platforms._current_platform = rocm.RocmPlatform()
register()
vc = VllmConfig(model_config=_model_config(MODELS["glm5"], "bfloat16", tempfile.mkdtemp()),
                device_config=DeviceConfig(device="cpu"))
vc.parallel_config.tensor_parallel_size = 8
out = {"priorities": [b.name for b in rocm._get_backend_priorities(True, True)], "targets": {}}
for gfx in sys.argv[1:]:
    rocm._GCN_ARCH = gfx
    rocm.RocmPlatform.get_device_capability.cache_clear()
    cap = rocm.RocmPlatform.get_device_capability()
    sel = AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None,
                                  use_mla=True, use_sparse=True)
    with set_current_vllm_config(vc):
        try:
            path = rocm.RocmPlatform.get_attn_backend_cls(AttentionBackendEnum.TRITON_MLA_SPARSE, sel)
            entry = {"accepted": path.endswith(".TritonMLASparseBackend")}
        except ValueError as e:
            entry = {"accepted": False, "error": str(e)}
    out["targets"][gfx] = dict(entry, capability=[cap.major, cap.minor])
print("ROCM_PROBE " + json.dumps(out))
"""


def test_rocm_targets_agree(cuda_platform_module, monkeypatch):
    targets = HIP_TARGETS + UNDECLARED_HIP
    proc = subprocess.run([sys.executable, "-c", _ROCM_PROBE, *targets], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ROCM_PROBE ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(line.removeprefix("ROCM_PROBE "))
    # ROCm's automatic sparse-MLA list, probed on gfx942: ours right after vLLM's aiter backend (the plugin's hook).
    assert report["priorities"] == ["ROCM_AITER_MLA_SPARSE", "TRITON_MLA_SPARSE"]
    for gfx in targets:
        got = report["targets"][gfx]
        ours = api_reasons(monkeypatch, hip_arch=gfx)
        assert got["accepted"] is (ours == []), (gfx, got, ours)
        assert got["accepted"] is (gfx in HIP_TARGETS), (gfx, got)
        if not got["accepted"]:
            assert "compute capability not supported" in got["error"], got
    # The capability vLLM derives does not identify the target: gfx940 and gfx942 are both 9.4.
    assert report["targets"]["gfx940"]["capability"] == report["targets"]["gfx942"]["capability"] == [9, 4]
    assert report["targets"]["gfx950"]["capability"] == [9, 5]


def test_rocm_capabilities_are_not_cuda_ones(cuda_platform_module):
    """On vLLM's CUDA platform 9.4 and 9.5 (what ROCm derives for gfx942 and gfx950) are no declared GPU."""
    from vllm.platforms.interface import DeviceCapability

    from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseBackend

    for minor in (4, 5):
        assert not TritonMLASparseBackend.supports_compute_capability(DeviceCapability(9, minor))

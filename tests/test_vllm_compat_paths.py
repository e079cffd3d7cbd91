"""The paths of the vLLM integration before it became the package ``triton_mla_sparse.integrations.vllm``, in the
CPU tier (no vLLM): ``triton_mla_sparse.select`` and the old module's constants. The two old paths that import
vLLM (``integrations.vllm_backend``, ``integrations.vllm_indexer``) are checked in the vLLM tier
(tests/integrations/vllm/test_vllm_plugin.py)."""

from __future__ import annotations

import subprocess
import sys

import triton_mla_sparse.integrations.vllm as vllm_integration
import triton_mla_sparse.select as old_select
from triton_mla_sparse import capabilities, formats
from triton_mla_sparse.integrations.vllm import plugin, policy
from triton_mla_sparse.integrations.vllm import select as new_select


def test_old_select_path_is_the_new_module():
    assert old_select.__doc__.startswith("Old path of ") and "triton_mla_sparse.integrations.vllm.select" in \
        old_select.__doc__
    assert set(new_select.__all__) <= set(old_select.__all__)
    for name in old_select.__all__:
        assert getattr(old_select, name) is getattr(new_select, name), name


def test_old_select_path_runs_as_a_module():
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "triton_mla_sparse.select", *args], capture_output=True,
                              text=True, timeout=300)

    out = run("--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: triton-mla-sparse select") and "--capability" in out.stdout
    out = run("-c", "8.9", "-m", "glm5", "--tp", "8", "--no-vllm")
    assert out.returncode == 0, out.stderr
    assert "TRITON_MLA_SPARSE: accepted" in out.stdout
    assert run("-c", "7.5", "-m", "glm5", "--no-vllm").returncode == 1
    assert run("-c", "x", "-m", "glm5", "--no-vllm").returncode == 2


def test_importing_the_policy_paths_imports_neither_vllm_nor_triton():
    code = ("import sys, triton_mla_sparse, triton_mla_sparse.integrations.vllm, triton_mla_sparse.select; "
            "print('triton' in sys.modules, 'vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


# The names of the old single module integrations/vllm.py that still exist, each from one source.
OLD_MODULE_NAMES = ["BACKEND_NAME", "BACKEND_CLASS_PATH", "PRIORITY_ENV", "PRIORITY_MODES", "INDEXER_ENV",
                    "INDEXER_MODES", "SM120_PEER", "SUPPORTED_DTYPES", "SUPPORTED_KV_CACHE_DTYPES",
                    "SUPPORTED_HEAD_SIZES", "KV_LORA_RANK", "ROPE_DIMS", "EXPECTED_PRIORITY_PARAMS", "priority_mode",
                    "policy_index", "place_backend", "static_reasons", "register", "install_priority_hook",
                    "install_indexer"]


def test_old_module_names_are_reexported_from_one_source():
    for name in OLD_MODULE_NAMES:
        assert name in vllm_integration.__all__, name
        source = plugin if name in plugin.__all__ or name == "EXPECTED_PRIORITY_PARAMS" else policy
        assert getattr(vllm_integration, name) is getattr(source, name), name
    # MIN_CAPABILITY_MAJOR is gone: capabilities are declared per (major, minor), not from a lowest major.
    assert not hasattr(vllm_integration, "MIN_CAPABILITY_MAJOR")
    # Same values as the old module (which hard-coded them); the order now follows capabilities/formats.
    assert vllm_integration.SM120_PEER == "FLASHINFER_MLA_SPARSE_SM120"
    assert set(vllm_integration.SUPPORTED_DTYPES) == {"bfloat16", "float16"}
    assert set(vllm_integration.SUPPORTED_KV_CACHE_DTYPES) == {"auto", "bfloat16", "float16", "fp8", "fp8_e4m3",
                                                               "fp8_ds_mla"}
    assert set(vllm_integration.SUPPORTED_HEAD_SIZES) == {576, 512}
    assert vllm_integration.KV_LORA_RANK == formats.D_V == 512
    assert set(vllm_integration.ROPE_DIMS) == set(capabilities.D_ROPES) == {64, 0}
    assert vllm_integration.SUPPORTED_HEAD_SIZES == tuple(formats.D_V + r for r in capabilities.D_ROPES)
    assert vllm_integration.SUPPORTED_DTYPES == tuple(str(d).removeprefix("torch.") for d in capabilities.Q_DTYPES)

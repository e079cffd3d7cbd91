"""Tests of the vLLM plugin against the real vLLM 0.33.0 package (run them with ``bash ci/vllm-env.sh``).

Without vLLM installed (the main test run) nothing in this folder is collected. vLLM is detected from its
installed metadata, not by importing ``vllm`` (an import would start vLLM's platform detection).

vLLM's CUDA platform module needs ``libcuda.so.1``; on GPU-less machines ``ci/vllm-env.sh`` builds a stand-in
(``libcuda_stub.c`` here) and puts it on LD_LIBRARY_PATH. Run by hand without it, the tests are skipped with the
reason; with ``TMS_VLLM_REQUIRED=1`` (set by the script) they fail instead.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import PackageNotFoundError, version

import pytest

try:
    VLLM_VERSION: str | None = version("vllm")
except PackageNotFoundError:
    VLLM_VERSION = None

CUDA_MODULE_ERROR: str | None = None

if VLLM_VERSION is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # The impl tests run the Triton kernels on CPU tensors; vLLM imports triton, so switch the interpreter on first.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import vllm.platforms.cuda  # noqa: F401  (needs libcuda.so.1)
    except (ImportError, OSError) as e:
        CUDA_MODULE_ERROR = f"{type(e).__name__}: {e}"
        if os.environ.get("TMS_VLLM_REQUIRED") == "1":
            raise RuntimeError(
                f"vllm.platforms.cuda did not import ({CUDA_MODULE_ERROR}); ci/vllm-env.sh puts a libcuda.so.1 "
                "stand-in on LD_LIBRARY_PATH") from e


def pytest_collection_modifyitems(config, items):
    if CUDA_MODULE_ERROR is None:
        return
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason=f"vllm.platforms.cuda did not import ({CUDA_MODULE_ERROR}); run "
                                   "`bash ci/vllm-env.sh`, which provides a libcuda.so.1 stand-in")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cuda_platform_module():
    """``vllm.platforms.cuda`` with the plugin registered (its priority wrapper installed)."""
    import vllm.platforms.cuda as cuda_mod

    from triton_mla_sparse.integrations.vllm import register

    register()
    return cuda_mod


@pytest.fixture(scope="session")
def model_configs(tmp_path_factory):
    """Real vLLM ModelConfigs of GLM-5 and DeepSeek-V3.2 (config.json from transformers' config classes)."""
    from triton_mla_sparse.integrations.vllm.select import MODELS, _model_config

    tmp = str(tmp_path_factory.mktemp("models"))
    return {name: _model_config(shape, "bfloat16", tmp) for name, shape in MODELS.items()}


@pytest.fixture(scope="session")
def vllm_configs(model_configs):
    """VllmConfig per model at TP 8 (GLM-5: 64 heads / 8 = 8 per GPU; DeepSeek-V3.2: 128 / 8 = 16)."""
    from vllm.config import DeviceConfig, VllmConfig

    out = {}
    for name, mc in model_configs.items():
        vc = VllmConfig(model_config=mc, device_config=DeviceConfig(device="cpu"))
        # After construction: ParallelConfig checks TP against this host's GPU count.
        vc.parallel_config.tensor_parallel_size = 8
        out[name] = vc
    return out


@pytest.fixture(scope="module")
def vi():
    """The vLLM indexer integration, installed (the Triton indexer registered with vLLM's out-of-tree op registry)."""
    from triton_mla_sparse.integrations.vllm import indexer as vllm_indexer

    assert vllm_indexer.install()
    return vllm_indexer


@pytest.fixture
def plugin_log(monkeypatch):
    """The plugin's log records during the test (every level), its warn-once memory emptied first."""
    from triton_mla_sparse.integrations.vllm import policy

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    policy.logger.addHandler(handler)
    monkeypatch.setattr(policy, "_warned", set())
    yield records
    policy.logger.removeHandler(handler)


@pytest.fixture
def vc(model_configs):
    """A GLM-5 VllmConfig on the CPU, current for the test."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    config = VllmConfig(model_config=model_configs["glm5"], device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        yield config


@pytest.fixture
def rocm_platform(cuda_platform_module):
    """``rocm_platform("gfx1201")`` -> (vLLM's current platform, ``vllm.platforms.rocm``) with vLLM's ROCm platform
    simulated for that gfx name until the test ends (what is simulated: ``simulated_platform.rocm_platform_for``)."""
    from contextlib import ExitStack

    from triton_mla_sparse.integrations.vllm import indexer
    from triton_mla_sparse.integrations.vllm.simulated_platform import rocm_platform_for

    # The Triton indexer's torch op, registered under this host's platform first: registered under the simulated one
    # (by register() there) it would take vLLM's ROCm dispatch key, CUDA, and refuse the tests' CPU tensors.
    indexer._register_torch_op()
    with ExitStack() as stack:
        yield lambda gfx: stack.enter_context(rocm_platform_for(gfx))

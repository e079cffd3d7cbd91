"""The plugin against the real vLLM 0.33.0: entry point, vLLM's plugin loader, registry, CUDA priority lists."""

from __future__ import annotations

import functools
import importlib
import logging
import re
import subprocess
import sys
import types
from importlib.metadata import entry_points

import pytest

import triton_mla_sparse.integrations.vllm as vllm_integration
from triton_mla_sparse.integrations.vllm import plugin, policy

CAPABILITIES = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]
KV_DTYPES = [None, "auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla"]


@pytest.fixture
def fresh_priorities(cuda_platform_module, monkeypatch):
    """Empty the priority caches around a test (the wrapper reads TRITON_MLA_SPARSE_PRIORITY when it computes)."""
    monkeypatch.delenv(policy.PRIORITY_ENV, raising=False)
    cuda_platform_module._get_backend_priorities.cache_clear()
    yield cuda_platform_module
    cuda_platform_module._get_backend_priorities.cache_clear()


def test_entry_point_is_installed():
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "triton_mla_sparse"]
    assert ep.value == "triton_mla_sparse.integrations.vllm:register"
    assert ep.load() is plugin.register is vllm_integration.register


def test_vllm_plugin_loader_finds_and_runs_register_twice(cuda_platform_module):
    import vllm.plugins as vllm_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    found = vllm_plugins.load_plugins_by_group(vllm_plugins.DEFAULT_PLUGINS_GROUP)
    assert found["triton_mla_sparse"] is plugin.register
    for _ in range(2):  # as in two processes / two plugin loads: vLLM's real loader, from scratch each time
        vllm_plugins.plugins_loaded = False
        vllm_plugins.load_general_plugins()

    from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseBackend

    member = AttentionBackendEnum["TRITON_MLA_SPARSE"]
    assert member.get_class() is TritonMLASparseBackend
    assert member.get_path() == policy.BACKEND_CLASS_PATH
    assert list(AttentionBackendEnum.__members__).count("TRITON_MLA_SPARSE") == 1
    wrapped = cuda_platform_module._get_backend_priorities
    assert getattr(wrapped, plugin._WRAPPED_MARK)
    assert not getattr(wrapped.__wrapped__, plugin._WRAPPED_MARK, False), "wrapped twice"


def test_attention_backend_cli_name_resolves(cuda_platform_module):
    """`--attention-backend TRITON_MLA_SPARSE` through vLLM's own argument parser and AttentionConfig."""
    from vllm.config import AttentionConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from triton_mla_sparse.integrations.vllm.simulated_platform import cuda_platform_for

    with cuda_platform_for(cuda_platform_module, 8, 9, simulate=True):  # vLLM's CLI defaults need a device
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        args = parser.parse_args(["--model", "some/model", "--attention-backend", "TRITON_MLA_SPARSE"])
        engine_args = EngineArgs.from_cli_args(args)
    for name in (engine_args.attention_backend, "triton_mla_sparse"):
        backend = AttentionConfig(backend=name).backend
        assert backend is AttentionBackendEnum.TRITON_MLA_SPARSE
        assert backend.get_class().get_name() == "TRITON_MLA_SPARSE"


def _expected_index(names: list[str], major: int, heads: int, kv: str) -> int:
    if major == 8 or (major == 9 and kv == "fp8_ds_mla" and heads <= 16):  # the latter: measured fastest
        return 0
    if major == 12:
        return names.index("FLASHINFER_MLA_SPARSE_SM120") + 1
    return len(names)


@pytest.mark.parametrize("cap", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("heads,head_size", [(8, 576), (16, 576), (32, 576), (8, 512)])
def test_cuda_priorities_place_backend_per_policy(fresh_priorities, cap, kv, heads, head_size):
    from vllm.platforms.interface import DeviceCapability

    cuda_mod = fresh_priorities
    kwargs = dict(use_mla=True, device_capability=DeviceCapability(*cap), num_heads=heads, kv_cache_dtype=kv,
                  use_non_causal=False, head_size=head_size, use_mm_prefix=False)
    original = [b.name for b in cuda_mod._get_backend_priorities.__wrapped__(**kwargs)]
    got = [b.name for b in cuda_mod._get_backend_priorities(**kwargs)]
    assert "TRITON_MLA_SPARSE" not in original
    assert got.count("TRITON_MLA_SPARSE") == 1
    assert got.index("TRITON_MLA_SPARSE") == _expected_index(original, cap[0], heads, kv)
    assert [n for n in got if n != "TRITON_MLA_SPARSE"] == original  # vLLM's own order untouched
    if cap[0] == 12:
        assert got[got.index("TRITON_MLA_SPARSE") - 1] == "FLASHINFER_MLA_SPARSE_SM120"
    if cap[0] == 10 or (cap[0] == 9 and (kv != "fp8_ds_mla" or heads > 16)):
        assert got[-1] == "TRITON_MLA_SPARSE"


def test_cuda_priorities_leave_other_lists_alone(fresh_priorities):
    from vllm.platforms.interface import DeviceCapability

    cuda_mod = fresh_priorities
    for cap in CAPABILITIES:
        dense = cuda_mod._get_backend_priorities(use_mla=False, device_capability=DeviceCapability(*cap))
        assert dense == cuda_mod._get_backend_priorities.__wrapped__(False, DeviceCapability(*cap))
        assert "TRITON_MLA_SPARSE" not in [b.name for b in dense]
    for cap in [(7, 5), (7, 0)]:  # below SM80: not added
        mla = cuda_mod._get_backend_priorities(use_mla=True, device_capability=DeviceCapability(*cap))
        assert "TRITON_MLA_SPARSE" not in [b.name for b in mla]


@pytest.mark.parametrize("mode", ["first", "off", "default", " Default ", "auto", ""])
def test_priority_env_variable(fresh_priorities, monkeypatch, plugin_log, mode):
    from vllm.platforms.interface import DeviceCapability

    cuda_mod = fresh_priorities
    monkeypatch.setenv(policy.PRIORITY_ENV, mode)
    cuda_mod._get_backend_priorities.cache_clear()
    for cap in CAPABILITIES:
        names = [b.name for b in cuda_mod._get_backend_priorities(
            use_mla=True, device_capability=DeviceCapability(*cap), num_heads=8, kv_cache_dtype="auto",
            head_size=576)]
        if mode == "off":
            assert "TRITON_MLA_SPARSE" not in names
        elif mode == "first":
            assert names[0] == "TRITON_MLA_SPARSE"
        else:
            original = [n for n in names if n != "TRITON_MLA_SPARSE"]
            assert names.index("TRITON_MLA_SPARSE") == _expected_index(original, cap[0], 8, "auto")
    assert not [r for r in plugin_log if r.levelno == logging.WARNING]


@pytest.mark.parametrize("var", [policy.PRIORITY_ENV, policy.INDEXER_ENV])
def test_bad_env_value_is_a_value_error_everywhere(fresh_priorities, monkeypatch, var):
    """One parser, one behaviour: a value outside the modes raises ValueError naming the variable and its modes,
    from register() (vLLM's start-up stops with it), from the priority list and from the parser itself."""
    from vllm.platforms.interface import DeviceCapability

    monkeypatch.setenv(var, "bogus")
    modes = policy.PRIORITY_MODES if var == policy.PRIORITY_ENV else policy.INDEXER_MODES
    message = re.escape(f"{var}: expected one of {modes}") + ".*'bogus'"
    with pytest.raises(ValueError, match=message):
        plugin.register()
    with pytest.raises(ValueError, match=var):
        policy.env_mode(var)
    if var == policy.PRIORITY_ENV:
        fresh_priorities._get_backend_priorities.cache_clear()
        with pytest.raises(ValueError, match=var):
            fresh_priorities._get_backend_priorities(use_mla=True, device_capability=DeviceCapability(8, 9))
    else:
        with pytest.raises(ValueError, match=var):
            plugin.install_indexer()


def test_cache_clear_empties_wrapper_and_vllm_cache(fresh_priorities):
    from vllm.platforms.interface import DeviceCapability

    cuda_mod = fresh_priorities
    cuda_mod._get_backend_priorities(use_mla=True, device_capability=DeviceCapability(8, 9))
    assert cuda_mod._get_backend_priorities.cache_info().currsize >= 1
    assert cuda_mod._get_backend_priorities.__wrapped__.cache_info().currsize >= 1
    cuda_mod._get_backend_priorities.cache_clear()
    assert cuda_mod._get_backend_priorities.cache_info().currsize == 0
    assert cuda_mod._get_backend_priorities.__wrapped__.cache_info().currsize == 0


def _fake_cuda_module(fn):
    mod = types.ModuleType("fake_vllm_platforms_cuda")
    mod._get_backend_priorities = fn
    return mod


def test_unexpected_signature_warns_once_and_keeps_registration(cuda_platform_module, plugin_log):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    @functools.cache
    def _get_backend_priorities(use_mla, device_capability, num_heads=None, attn_selector=None):
        return ["X"]

    mod = _fake_cuda_module(_get_backend_priorities)
    assert plugin.install_priority_hook(mod) is False
    assert plugin.install_priority_hook(mod) is False
    assert mod._get_backend_priorities is _get_backend_priorities  # left alone
    warned = [r for r in plugin_log if r.levelno == logging.WARNING]
    assert len(warned) == 1
    msg = warned[0].getMessage()
    assert "differs from the vLLM 0.33 signature" in msg and "--attention-backend TRITON_MLA_SPARSE" in msg
    assert AttentionBackendEnum["TRITON_MLA_SPARSE"].get_path() == policy.BACKEND_CLASS_PATH


def test_hook_on_a_fresh_module_with_the_expected_signature(cuda_platform_module, monkeypatch):
    """install_priority_hook wraps once, honours `off` at install time, and keeps vLLM's function reachable."""
    original = cuda_platform_module._get_backend_priorities.__wrapped__
    monkeypatch.setenv(policy.PRIORITY_ENV, "off")
    mod = _fake_cuda_module(original)
    assert plugin.install_priority_hook(mod) is False and mod._get_backend_priorities is original
    monkeypatch.delenv(policy.PRIORITY_ENV)
    assert plugin.install_priority_hook(mod) is True
    first = mod._get_backend_priorities
    assert plugin.install_priority_hook(mod) is True and mod._get_backend_priorities is first
    assert first.__wrapped__ is original


def test_register_is_idempotent_and_safe(cuda_platform_module):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    before = cuda_platform_module._get_backend_priorities
    n = len(AttentionBackendEnum.__members__)
    for _ in range(3):
        plugin.register()
    assert cuda_platform_module._get_backend_priorities is before
    assert len(AttentionBackendEnum.__members__) == n


def test_policy_index_pure():
    assert policy.policy_index(["A", "B"], (8, 0)) == 0
    assert policy.policy_index(["A", "B"], (8, 7)) == 0
    assert policy.policy_index(["A", "FLASHINFER_MLA_SPARSE_SM120", "B"], (12, 0)) == 2
    assert policy.policy_index(["A"], (12, 1)) == 1
    assert policy.policy_index(["A", "B"], (9, 0)) == 2
    # measured fastest: SM 9.x, fp8_ds_mla, <= 16 heads per GPU (policy.FASTEST_FIRST)
    assert policy.FASTEST_FIRST == {(9, "fp8_ds_mla"): 16}
    assert policy.policy_index(["A", "B"], (9, 0), num_heads=16, kv_cache_dtype="fp8_ds_mla") == 0
    assert policy.policy_index(["A", "B"], (9, 0), num_heads=8, kv_cache_dtype="fp8_ds_mla") == 0
    assert policy.policy_index(["A", "B"], (9, 0), num_heads=32, kv_cache_dtype="fp8_ds_mla") == 2
    assert policy.policy_index(["A", "B"], (9, 0), num_heads=16, kv_cache_dtype="bfloat16") == 2
    assert policy.policy_index(["A", "B"], (9, 0), num_heads=16, kv_cache_dtype="fp8") == 2
    assert policy.policy_index(["A", "B"], (9, 0), kv_cache_dtype="fp8_ds_mla") == 2  # heads unknown
    assert policy.policy_index(["A", "B"], (10, 0), num_heads=16, kv_cache_dtype="fp8_ds_mla") == 2
    assert policy.policy_index(["A", "B"], (9, 0), "off", num_heads=16, kv_cache_dtype="fp8_ds_mla") is None
    assert "first in vLLM's MLA list on SM 9.0 for fp8_ds_mla caches with at most 16 heads" in \
        policy.policy_sentence((9, 0), "default")
    assert policy.policy_sentence((10, 0), "default").endswith("(fallback)")
    assert policy.policy_index(["A", "B"], (10, 0)) == 2
    assert policy.policy_index(["A", "B"], (10, 3)) == 2
    assert policy.policy_index(["A", "B"], (11, 0)) == 0  # Jetson Thor: no vLLM sparse MLA backend runs there
    for undeclared in [(7, 5), (8, 8), (10, 1), (11, 1), (13, 0)]:  # capabilities.py does not declare these
        assert policy.policy_index(["A", "B"], undeclared) is None
        assert policy.policy_index(["A", "B"], undeclared, "first") is None
    assert policy.policy_index(["A", "B"], (10, 0), "first") == 0
    assert policy.policy_index(["A", "B"], (8, 0), "off") is None
    assert policy.policy_index(["TRITON_MLA_SPARSE"], (8, 0)) is None
    with pytest.raises(ValueError, match="mode"):
        policy.policy_index(["A"], (8, 0), "bogus")
    # vLLM's DeviceCapability is a (major, minor) pair; the old int form (a major alone) is refused, not guessed.
    from vllm.platforms.interface import DeviceCapability

    assert policy.policy_index(["A", "B"], DeviceCapability(8, 9)) == 0
    for old_form in (9, 8, 12):
        expected = rf"^capability: expected a \(major, minor\) pair of ints, got {old_form}$"
        with pytest.raises(ValueError, match=expected):
            policy.policy_index(["A", "B"], old_form)
        with pytest.raises(ValueError, match=r"^capability: expected a \(major, minor\) pair"):
            policy.place_backend(["A", "B"], old_form, "default", "TRITON_MLA_SPARSE")
    assert vllm_integration.policy_index is policy.policy_index  # the package's names are the policy's


def test_old_module_paths_are_the_new_objects():
    """integrations.vllm_backend and integrations.vllm_indexer (the paths before the vLLM integration became a
    package) re-export the same objects; triton_mla_sparse.select likewise (also in the CPU tier)."""
    pairs = [("triton_mla_sparse.integrations.vllm_backend", "triton_mla_sparse.integrations.vllm.backend"),
             ("triton_mla_sparse.integrations.vllm_indexer", "triton_mla_sparse.integrations.vllm.indexer"),
             ("triton_mla_sparse.select", "triton_mla_sparse.integrations.vllm.select")]
    for old_path, new_path in pairs:
        old, new = importlib.import_module(old_path), importlib.import_module(new_path)
        assert old.__doc__.startswith("Old path of ") and new_path in old.__doc__
        assert set(new.__all__) <= set(old.__all__), old_path
        for name in old.__all__:
            assert getattr(old, name) is getattr(new, name), (old_path, name)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from triton_mla_sparse.integrations.vllm_backend import TritonMLASparseBackend

    plugin.register()
    assert AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class() is TritonMLASparseBackend


def test_policy_and_select_paths_import_no_vllm():
    """With vLLM installed, importing the plugin package, its policy and select (new and old paths) leaves vLLM
    and Triton unimported (vLLM's plugin loader and `triton-mla-sparse select --no-vllm` rely on it)."""
    code = ("import sys, triton_mla_sparse, triton_mla_sparse.integrations.vllm, triton_mla_sparse.select, "
            "triton_mla_sparse.integrations.vllm.select; print('triton' in sys.modules, 'vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


_UNPICKLE_ONLY = (
    "import pickle, sys\n"
    "cfg = pickle.loads(sys.stdin.buffer.read())\n"
    "print(cfg.backend.name, cfg.backend.get_class().get_name())\n"
)


def test_backend_member_survives_vllms_spawned_engine_core(cuda_platform_module):
    """vLLM's engine core (``vllm serve``) is a spawned process that unpickles the config before it loads plugins:
    the member must unpickle in an interpreter that has not run ``register()`` (seen failing on the H200 before)."""
    import pickle

    from vllm.config import AttentionConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    plugin.register()
    cfg = AttentionConfig(backend="TRITON_MLA_SPARSE")
    run = functools.partial(subprocess.run, [sys.executable, "-c", _UNPICKLE_ONLY], capture_output=True, timeout=300)
    done = run(input=pickle.dumps(cfg))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split()[-2:] == ["TRITON_MLA_SPARSE", "TRITON_MLA_SPARSE"]
    # What the same pickle was before: the member by value, which a fresh process cannot resolve.
    member = AttentionBackendEnum["TRITON_MLA_SPARSE"]
    assert b"backend_member" in pickle.dumps(cfg)
    del member.__reduce_ex__
    try:
        failed = run(input=pickle.dumps(cfg))
    finally:
        member.__reduce_ex__ = plugin._reduce_member
    assert failed.returncode != 0 and b"is not a valid AttentionBackendEnum" in failed.stderr

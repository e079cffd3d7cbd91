"""The plugin on vLLM 0.33.0's ROCm platform: the sparse-MLA priority list, vLLM's selection, the DSA indexer route.

Run on this CPU host against the real ``vllm.platforms.rocm`` (the ``rocm_platform`` fixture, i.e.
``simulated_platform.rocm_platform_for``): what is simulated is the GPU only — the module is imported with an
``amdsmi`` stand-in reporting the gfx name (vLLM reads it at import, through amdsmi or else HIP), its ``_GCN_ARCH``
and the ``_ON_*`` flags are set for each target by vLLM's own definitions, and vLLM's ``RocmPlatform`` class is the
current platform with its device probes (capability from vLLM's ``_capability_from_gcn_arch``, name, memory)
answering for it. aiter is not installed here; where a test needs vLLM's aiter route it sets the two values vLLM reads
(``_aiter_ops.IS_AITER_FOUND``, ``rocm_aiter_ops._AITER_ENABLED``) and replaces vLLM's ROCm indexer op by a
recorder, since aiter's kernels cannot run here.
"""

import logging
import subprocess
import sys
import types

import pytest
import torch

from triton_mla_sparse.capabilities import ARCHS
from triton_mla_sparse.integrations.vllm import plugin, policy
from triton_mla_sparse.integrations.vllm.select import MODELS, _hip_capability, evaluate, parse_target, select_main

from test_vllm_indexer import PREFIX, TOPK, assert_matches_reference, build_metadata, make_batch, make_op  # noqa: E402

HIP = [a.name for a in ARCHS.values() if a.backend == "hip"]
#: gfx names vLLM knows that capabilities.py does not declare (CDNA 2, RDNA 2, CDNA 5).
UNDECLARED = [g for g in ("gfx90a", "gfx1030", "gfx1250") if g not in ARCHS]
PEERED = [g for g in HIP if g in policy.ROCM_PEER_TARGETS]  # gfx942, gfx950: right after ROCM_AITER_MLA_SPARSE
FIRST = [g for g in HIP if g not in policy.ROCM_PEER_TARGETS]  # RDNA: first

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def names(backends):
    return [b.name for b in backends]


@pytest.fixture
def rocm(rocm_platform, monkeypatch):
    """A function entering the ROCm simulation for a gfx name; returns ``vllm.platforms.rocm``, its priority list
    wrapped by the plugin (``register()`` under the simulated platform)."""
    monkeypatch.delenv(policy.PRIORITY_ENV, raising=False)

    def enter(gfx):
        _, mod = rocm_platform(gfx)
        plugin.register()
        return mod

    return enter


# ------------------------------------------------------------------------------------------ the priority list


@pytest.mark.parametrize("gfx", HIP)
def test_rocm_sparse_list_places_backend_per_policy(rocm, gfx):
    mod = rocm(gfx)
    assert mod._GCN_ARCH == gfx and getattr(mod._get_backend_priorities, plugin._WRAPPED_MARK)
    original = names(mod._get_backend_priorities.__wrapped__(True, True, False))
    got = names(mod._get_backend_priorities(True, True, False))
    assert original == [policy.ROCM_PEER]  # vLLM 0.33's only sparse MLA backend on ROCm
    assert [n for n in got if n != policy.BACKEND_NAME] == original and got.count(policy.BACKEND_NAME) == 1
    if gfx in PEERED:
        assert got == [policy.ROCM_PEER, policy.BACKEND_NAME]
    else:
        assert got == [policy.BACKEND_NAME, policy.ROCM_PEER]
    for use_mla, use_sparse in ((True, False), (False, False)):  # dense MLA and non-MLA lists: vLLM's
        assert names(mod._get_backend_priorities(use_mla, use_sparse, False)) == names(
            mod._get_backend_priorities.__wrapped__(use_mla, use_sparse, False))


@pytest.mark.parametrize("gfx", UNDECLARED)
def test_rocm_sparse_list_unchanged_on_undeclared_targets(rocm, gfx):
    mod = rocm(gfx)
    assert names(mod._get_backend_priorities(True, True, False)) == [policy.ROCM_PEER]


@pytest.mark.parametrize("mode", ["first", "off", "default", " Auto ", ""])
def test_rocm_priority_env_variable(rocm, monkeypatch, mode):
    monkeypatch.setenv(policy.PRIORITY_ENV, mode)
    for gfx in HIP:
        got = names(rocm(gfx)._get_backend_priorities(True, True, False))  # read per call: vLLM does not cache it
        if mode == "off":
            assert got == [policy.ROCM_PEER]
        elif mode == "first" or gfx in FIRST:
            assert got == [policy.BACKEND_NAME, policy.ROCM_PEER]
        else:
            assert got == [policy.ROCM_PEER, policy.BACKEND_NAME]


def test_rocm_hook_is_idempotent_and_honours_off_at_install(rocm, monkeypatch):
    mod = rocm("gfx942")
    wrapped = mod._get_backend_priorities
    original = wrapped.__wrapped__
    assert not getattr(original, plugin._WRAPPED_MARK, False), "wrapped twice"
    for _ in range(2):
        plugin.register()
        assert plugin.install_priority_hook(mod) is True
    assert mod._get_backend_priorities is wrapped and plugin.install_priority_hook() is True
    fresh = types.ModuleType("fake_vllm_platforms_rocm")  # vLLM's function on a module not wrapped yet
    fresh._get_backend_priorities, fresh._GCN_ARCH = original, "gfx1201"
    monkeypatch.setenv(policy.PRIORITY_ENV, "off")
    assert plugin.install_priority_hook(fresh) is False and fresh._get_backend_priorities is original
    monkeypatch.delenv(policy.PRIORITY_ENV)
    assert plugin.install_priority_hook(fresh, "rocm") is True
    first = fresh._get_backend_priorities
    assert plugin.install_priority_hook(fresh) is True and fresh._get_backend_priorities is first
    assert first.__wrapped__ is original
    expected = [policy.BACKEND_NAME, policy.ROCM_PEER] if "gfx1201" in ARCHS else [policy.ROCM_PEER]
    assert names(first(True, True)) == expected  # the fresh module's gfx name, not the simulated module's
    with pytest.raises(ValueError, match="platform: expected one of"):
        plugin.install_priority_hook(fresh, "xpu")


def test_rocm_unexpected_signature_warns_once(rocm, monkeypatch):
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    policy.logger.addHandler(handler)
    monkeypatch.setattr(policy, "_warned", set())
    try:
        def _get_backend_priorities(use_mla, use_sparse, use_kv_connector=False, device_capability=None):
            return ["X"]

        mod = types.ModuleType("fake_vllm_platforms_rocm")
        mod._get_backend_priorities, mod._GCN_ARCH = _get_backend_priorities, "gfx942"
        assert plugin.install_priority_hook(mod) is False and plugin.install_priority_hook(mod) is False
        assert mod._get_backend_priorities is _get_backend_priorities
    finally:
        policy.logger.removeHandler(handler)
    assert len(records) == 1
    msg = records[0].getMessage()
    assert "differs from the vLLM 0.33 signature ('use_mla', 'use_sparse', 'use_kv_connector')" in msg
    assert "--attention-backend TRITON_MLA_SPARSE" in msg


def test_policy_index_rocm_pure():
    peer, ours = policy.ROCM_PEER, policy.BACKEND_NAME
    for gfx in PEERED:
        assert policy.policy_index([peer], None, hip_arch=gfx) == 1
        assert policy.policy_index([peer], (9, 4), hip_arch=f"{gfx}:sramecc+:xnack-") == 1  # capability ignored
        assert policy.policy_index([], None, hip_arch=gfx) == 0  # no peer in the list: first
        assert "right after ROCM_AITER_MLA_SPARSE" in policy.policy_sentence(None, "default", hip_arch=gfx)
    for gfx in FIRST:
        assert policy.policy_index([peer], None, hip_arch=gfx) == 0
        assert "placed first" in policy.policy_sentence(None, "default", hip_arch=gfx)
    for gfx in HIP:
        assert policy.policy_index([peer], None, "first", hip_arch=gfx) == 0
        assert policy.policy_index([peer], None, "off", hip_arch=gfx) is None
        assert policy.policy_index([peer, ours], None, hip_arch=gfx) is None
        assert policy.place_backend([peer], None, "first", ours, hip_arch=gfx) == [ours, peer]
    for gfx in UNDECLARED:
        assert policy.policy_index([peer], None, "first", hip_arch=gfx) is None
        assert "not a declared architecture" in policy.policy_sentence(None, "default", hip_arch=gfx)
    with pytest.raises(ValueError, match="mode"):
        policy.policy_index([peer], None, "bogus", hip_arch="gfx942")
    with pytest.raises(ValueError, match=r"capability: expected a \(major, minor\) pair of ints, got None"):
        policy.policy_index([peer], None)  # no gfx name: a CUDA capability is required


def _valid_backends(platform, vllm_config, kv_cache_dtype):
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import AttentionSelectorConfig

    selector = AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype,
                                       block_size=None, use_mla=True, use_sparse=True)
    with set_current_vllm_config(vllm_config):
        valid, invalid = platform.get_valid_backends(platform.get_device_capability(), selector, num_heads=8)
    return [b.name for b, _ in sorted(valid, key=lambda v: v[1])], {b.name: r for b, r in invalid.items()}


@pytest.mark.parametrize("gfx", HIP + UNDECLARED)
def test_vllm_get_valid_backends_picks(rocm_platform, vllm_configs, monkeypatch, gfx):
    """vLLM's own RocmPlatform.get_valid_backends over the wrapped list: ROCM_AITER_MLA_SPARSE where it precedes ours
    (its validation checks no architecture; it rejects fp8_ds_mla), ours first on RDNA; ours refuses fp8 caches on
    ROCm (vLLM's DSA model quantizes q for them; gfx942 writes float8_e4m3fnuz)."""
    monkeypatch.delenv(policy.PRIORITY_ENV, raising=False)
    platform, mod = rocm_platform(gfx)
    plugin.register()
    for kv in ("auto", "bfloat16", "fp8", "fp8_ds_mla"):
        valid, invalid = _valid_backends(platform, vllm_configs["glm5"], kv)
        if gfx in UNDECLARED:
            assert policy.BACKEND_NAME not in valid + list(invalid)
            continue
        if kv in ("fp8", "fp8_ds_mla"):  # the ROCm DSA model quantizes q for fp8 caches; gfx942 writes e4m3fnuz
            reason = invalid[policy.BACKEND_NAME][0]
            assert "quantizes q to fp8" in reason and ("float8_e4m3fnuz" in reason) is (gfx == "gfx942"), invalid
            assert policy.BACKEND_NAME not in valid
            continue
        assert policy.BACKEND_NAME in valid, invalid
        if kv == "fp8_ds_mla":
            assert invalid[policy.ROCM_PEER] == ["kv_cache_dtype not supported"] and valid == [policy.BACKEND_NAME]
        elif gfx in PEERED:
            assert valid == [policy.ROCM_PEER, policy.BACKEND_NAME], (gfx, kv)
        else:
            assert valid == [policy.BACKEND_NAME, policy.ROCM_PEER], (gfx, kv)


def test_plugin_touches_only_its_platforms_module():
    """A CUDA process (here: vLLM's CUDA module imported, the ROCm one not) does not import vllm.platforms.rocm; a
    ROCm process (the simulated platform, in a fresh interpreter) wraps vllm.platforms.rocm and does not import
    vllm.platforms.cuda."""
    cuda = ("import sys, vllm.platforms.cuda as c\n"
            "from triton_mla_sparse.integrations.vllm import register, plugin\n"
            "register()\n"
            "print('vllm.platforms.rocm' in sys.modules, hasattr(c._get_backend_priorities, plugin._WRAPPED_MARK))\n")
    rocm = ("import sys\n"
            "from triton_mla_sparse.integrations.vllm import register, plugin, simulated_platform\n"
            "with simulated_platform.rocm_platform_for('gfx950') as (platform, rocm):\n"
            "    assert 'vllm.platforms.cuda' not in sys.modules\n"
            "    register()\n"
            "    print('vllm.platforms.cuda' in sys.modules,\n"
            "          hasattr(rocm._get_backend_priorities, plugin._WRAPPED_MARK))\n")
    for code, want in ((cuda, ["False", "True"]), (rocm, ["False", "True"])):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split()[-2:] == want, out.stdout + out.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ the indexer


@pytest.fixture
def aiter_enabled(monkeypatch):
    """The two values vLLM reads for "aiter installed and VLLM_ROCM_USE_AITER=1", and vLLM's ROCm indexer op (aiter
    or its native path) replaced by a recorder of its calls."""
    import vllm._aiter_ops as aiter_ops

    calls = []

    def enable(on=True):
        monkeypatch.setattr(aiter_ops, "IS_AITER_FOUND", on)
        monkeypatch.setattr(aiter_ops.rocm_aiter_ops, "_AITER_ENABLED", on)

    monkeypatch.setattr(torch.ops.vllm, "rocm_aiter_sparse_attn_indexer",
                        lambda *args, **kwargs: calls.append((args, kwargs)) or "vllm's ROCm indexer", raising=False)
    enable.calls = calls
    return enable


@pytest.mark.parametrize("gfx,aiter,want", [
    ("gfx942", False, True), ("gfx942", True, False),
    ("gfx950", False, True), ("gfx950", True, False),
    ("gfx1100", False, True), ("gfx1100", True, True),  # RDNA3: no aiter (vLLM's is_enabled needs CDNA 3+)
    ("gfx1201", False, True), ("gfx1201", True, False),  # RDNA4: aiter's Triton kernels
    ("gfx90a", False, False),  # not declared here
])
def test_decide_rocm(vi, gfx, aiter, want):
    if gfx not in ARCHS and want:
        pytest.skip(f"{gfx} is not declared in capabilities.ARCHS")
    use, why = vi.decide("auto", is_cuda=False, deep_gemm=False, hip_arch=gfx,
                         aiter=aiter and (gfx in ("gfx942", "gfx950", "gfx1201")))
    assert use is want and gfx in why
    assert vi.decide("always", is_cuda=False, deep_gemm=False, hip_arch=gfx, aiter=True)[0] is True
    assert vi.decide("off", is_cuda=False, deep_gemm=False, hip_arch=gfx)[0] is False
    if gfx in ARCHS:
        assert vi.decide("auto", is_cuda=False, deep_gemm=False, hip_arch=gfx, aiter=True,
                         batch_invariant=True) == (True, "VLLM_BATCH_INVARIANT=1")
    # the CUDA signature, as before: another platform keeps vLLM's indexer
    assert vi.decide("auto", is_cuda=False, deep_gemm=False)[0] is False


@pytest.mark.parametrize("gfx", ["gfx942", "gfx950", "gfx1100", "gfx1151", "gfx1200", "gfx1201", "gfx90a"])
@pytest.mark.parametrize("aiter", [False, True])
def test_route_agrees_with_vllms_forward_hip(vi, vc, rocm_platform, aiter_enabled, monkeypatch, gfx, aiter):
    """vllm_hip_route() is None exactly where vLLM's own SparseAttnIndexer.forward_hip raises; elsewhere vLLM's
    forward_hip calls its ROCm indexer op. ``auto`` then takes ours wherever vLLM does not run on aiter."""
    _, mod = rocm_platform(gfx)
    aiter_enabled(aiter)
    route = vi.vllm_hip_route()
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "off")
    op = make_op()  # vLLM's class (pass-through)
    assert not op.triton
    q = torch.zeros(2, 8, 128, dtype=torch.float8_e4m3fn)
    if route is None:
        with pytest.raises(RuntimeError, match="requires AITER or a supported native architecture"):
            op.forward_hip(torch.zeros(2, 16), q, None, torch.zeros(2, 8))
    else:
        assert op.forward_hip(torch.zeros(2, 16), q, None, torch.zeros(2, 8)) == "vllm's ROCm indexer"
        assert len(aiter_enabled.calls) == 1
    assert (route == "aiter's kernels") is vi.aiter_indexer_enabled()
    monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", "auto")
    use, why = vi.use_triton_indexer()
    assert use is (gfx in ARCHS and route != "aiter's kernels"), why
    assert make_op().triton is use


def _forward_hip(op, batch, md, vc, q=None):
    from vllm.forward_context import set_forward_context

    op.k_cache.kv_cache = batch["kv_cache"]
    op.topk_indices_buffer.fill_(12345)
    with set_forward_context({PREFIX: md}, vc):
        # what vLLM's ROCm DeepSeek-V3.2 / GLM-5 layer calls (vllm/models/deepseek_v32/amd/rocm.py _run_indexer)
        return op.forward_hip(torch.zeros(batch["T"], 16), batch["q"] if q is None else q, None, batch["weights"])


@pytest.mark.parametrize("gfx", ["gfx1100", "gfx1201"])
@pytest.mark.parametrize("case", ["mixed", "decode_only", "prefill_only"])
def test_forward_hip_on_rdna_runs_ours(vi, vc, rocm_platform, monkeypatch, gfx, case):
    """RDNA without aiter (vLLM's forward_hip raises on gfx12xx, uses its PyTorch reference on gfx11xx): ``auto``
    builds the Triton indexer and vLLM's forward_hip call computes vLLM's top-k contract with it (against vLLM's own
    indexer metadata)."""
    from test_vllm_indexer import CASES

    if gfx not in ARCHS:
        pytest.skip(f"{gfx} is not declared in capabilities.ARCHS")
    rocm_platform(gfx)
    monkeypatch.delenv("TRITON_MLA_SPARSE_INDEXER", raising=False)
    assert (vi.vllm_hip_route() is None) is gfx.startswith("gfx12")
    batch = make_batch(*CASES[case], seed=11 + len(case))
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"])
    op = make_op()
    assert isinstance(op, vi.TritonSparseAttnIndexer) and op.triton
    out = _forward_hip(op, batch, md, vc)
    assert out is op.topk_indices_buffer
    assert_matches_reference(batch, out)
    assert (out[batch["T"]:] == 12345).all()


def test_forward_hip_on_gfx942_reads_e4m3fnuz(vi, vc, rocm_platform, monkeypatch):
    """gfx942 without aiter: ours, with vLLM's fp8 there (e4m3fnuz) for q and the cache: the same bytes read as
    e4m3fn are exactly twice each value, so each row's top-k is that of the e4m3fnuz values."""
    platform, _ = rocm_platform("gfx942")
    assert platform.fp8_dtype() == torch.float8_e4m3fnuz
    monkeypatch.delenv("TRITON_MLA_SPARSE_INDEXER", raising=False)
    batch = make_batch([1, 1, 5, 40], [70, 3, 130, 40], seed=21)
    q_fnuz = (batch["q"].float() / 2).to(torch.float8_e4m3fnuz)  # exact: half of each e4m3fn value
    assert not (q_fnuz.view(torch.uint8) == 0x80).any()  # e4m3fnuz's NaN: a quantization never writes it
    assert torch.equal(q_fnuz.view(torch.float8_e4m3fn).float(), q_fnuz.float() * 2)  # the claim, by torch
    md = build_metadata(vc, monkeypatch, batch["query_lens"], batch["seq_lens"], batch["block_table"])
    op = make_op()
    assert op.triton
    assert_matches_reference(batch, _forward_hip(op, batch, md, vc, q=q_fnuz))


def test_passes_through_where_aiter_serves(vi, vc, rocm_platform, aiter_enabled, monkeypatch):
    rocm_platform("gfx942")
    aiter_enabled(True)
    monkeypatch.delenv("TRITON_MLA_SPARSE_INDEXER", raising=False)
    op = make_op()
    assert isinstance(op, vi.TritonSparseAttnIndexer) and not op.triton
    q = torch.zeros(2, 8, 128, dtype=torch.float8_e4m3fnuz)
    assert op.forward_hip(torch.zeros(2, 16), q, None, torch.zeros(2, 8)) == "vllm's ROCm indexer"
    assert len(aiter_enabled.calls) == 1


def test_rocm_cache_layer_reports_the_unshuffled_layout(vi, vc, rocm_platform, monkeypatch):
    """vLLM's ROCm indexer cache reports the shuffled layout above block size 1 (aiter's reader), and the model's
    fused write follows it; with the Triton indexer as reader the layer reports the layout ours reads."""
    import importlib

    from vllm.config import CacheConfig

    importlib.import_module("vllm.models.deepseek_v32.attention")  # the package's generic branch, on this host
    rocm_platform("gfx1201")
    amd = importlib.import_module("vllm.models.deepseek_v32.amd.rocm")
    cache_cls = amd.DeepseekV32ROCmIndexerCache
    caches = []
    for i, mode in enumerate(("off", "auto")):
        monkeypatch.setenv("TRITON_MLA_SPARSE_INDEXER", mode)
        cache = cache_cls(head_dim=132, dtype=torch.uint8, prefix=f"{PREFIX}.rocm{i}", cache_config=CacheConfig())
        cache.bind_kv_cache(torch.zeros(4, 1, 64, 132, dtype=torch.uint8))
        assert cache.uses_shuffled_layout  # vLLM's class
        op = make_op(k_cache=cache)
        assert op.triton is (mode == "auto") and (not cache.uses_shuffled_layout) is op.triton
        caches.append(cache)
    off, auto = caches
    assert type(off) is cache_cls and isinstance(auto, cache_cls) and type(auto).__name__ == cache_cls.__name__
    assert auto.get_attn_backend() is cache_cls.get_attn_backend(off)
    fresh = cache_cls(head_dim=132, dtype=torch.uint8, prefix=f"{PREFIX}.rocm2", cache_config=CacheConfig())
    fresh.bind_kv_cache(torch.zeros(4, 1, 64, 132, dtype=torch.uint8))
    assert fresh.uses_shuffled_layout  # vLLM's class is left alone


# -------------------------------------------------------------------------------------------------- select


def test_parse_target():
    assert parse_target("gfx942") == "gfx942" and parse_target(" GFX1201:xnack- ") == "gfx1201"
    assert parse_target("8.9") == (8, 9) and parse_target("sm120") == (12, 0)
    for bad in ("gfx", "gfx9-4"):
        with pytest.raises(ValueError, match="--capability: expected a gfx name"):
            parse_target(bad)


@pytest.mark.parametrize("gfx", HIP)
def test_select_evaluates_rocm_targets(cuda_platform_module, monkeypatch, gfx):
    monkeypatch.delenv(policy.PRIORITY_ENV, raising=False)
    monkeypatch.delenv("TRITON_MLA_SPARSE_INDEXER", raising=False)
    for kv in ("auto", "fp8_ds_mla"):
        r = evaluate(capability=None, hip_arch=gfx, shape=MODELS["glm5"], tp=8, kv_cache_dtype=kv)
        assert r["validation"] == "vllm" and r["hip_arch"] == gfx, r["notes"]
        order = [c["name"] for c in r["candidates"]]
        assert order == ([policy.ROCM_PEER, policy.BACKEND_NAME] if gfx in PEERED
                         else [policy.BACKEND_NAME, policy.ROCM_PEER])
        if kv == "fp8_ds_mla":  # no backend: aiter rejects it, ours too on ROCm
            assert r["selected"] is None
        else:
            assert r["selected"] == (policy.ROCM_PEER if gfx in PEERED and kv == "auto" else policy.BACKEND_NAME)
        assert r["indexer"]["triton"] is True  # no aiter on this host
        assert (r["indexer"]["vllm_route"] is None) is (gfx in ("gfx942",) or gfx.startswith("gfx12"))
        assert r["capability"] == "{}.{}".format(*_hip_capability(gfx))  # vLLM's derivation = the no-vLLM one


def test_select_main_rocm_rows(cuda_platform_module, monkeypatch, capsys):
    monkeypatch.delenv(policy.PRIORITY_ENV, raising=False)
    assert select_main(["-c", "rocm,8.9", "-m", "glm5", "--tp", "8", "--kv-cache-dtype", "auto"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[:2] == ["GPU", "kv-cache-dtype"]
    rows = {line.split()[0]: line for line in lines[3:] if line and not line.startswith("(")}
    assert list(rows) == HIP + ["8.9"]
    for gfx in HIP:
        want = "ROCM_AITER_MLA_SPARSE" if gfx in PEERED else "TRITON_MLA_SPARSE"
        assert rows[gfx].split()[2] == want, rows[gfx]
        assert rows[gfx].endswith(f"#{2 if gfx in PEERED else 1}/2 accepted; DSA indexer: Triton")
    assert rows["8.9"].split()[2] == "TRITON_MLA_SPARSE" and "DSA indexer" not in rows["8.9"]
    assert any(line.startswith("(gfx targets other than this host's GPU are simulated") for line in lines)

    assert select_main(["-c", "gfx942", "-m", "dsv32", "--tp", "8"]) == 0
    out = capsys.readouterr().out
    assert "GPU:    gfx942 (ROCm; vLLM's capability 9.4)" in out and "=> vLLM uses ROCM_AITER_MLA_SPARSE" in out
    assert "2. TRITON_MLA_SPARSE            accepted" in out
    assert "DSA indexer: Triton (triton-mla-sparse)" in out and "none (its forward_hip raises here)" in out


def test_select_rocm_declarations_only(capsys):
    for gfx in HIP:
        assert select_main(["-c", gfx, "-m", "glm5", "--tp", "8", "--no-vllm"]) == 0
        assert "TRITON_MLA_SPARSE: accepted" in capsys.readouterr().out
    for gfx in UNDECLARED:
        assert select_main(["-c", gfx, "-m", "glm5", "--no-vllm"]) == 1
        assert "compute capability not supported" in capsys.readouterr().out
    assert select_main(["-c", "gfx9-4", "-m", "glm5"]) == 2
    capsys.readouterr()


@pytest.mark.parametrize("gfx", ["gfx942", "gfx1201"])
@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_ds_mla"])
def test_impl_refuses_fp8_caches_on_rocm(rocm_platform, kv, gfx):
    """A model that names the backend itself (vLLM's ROCm DSA model does) skips vLLM's validation: the impl
    refuses at construction what supports_combination refuses (that model quantizes q for fp8 caches; gfx942's
    fp8 is float8_e4m3fnuz)."""
    from test_vllm_impl import make_impl

    rocm_platform(gfx)
    with pytest.raises(NotImplementedError, match="quantizes q to fp8" + (".*float8_e4m3fnuz" if gfx == "gfx942"
                                                                           else "")):
        make_impl("glm5", kv)


@pytest.mark.parametrize("gfx,mode,ours", [("gfx1201", "default", True), ("gfx1100", "default", True),
                                           ("gfx942", "default", False), ("gfx950", "default", False),
                                           ("gfx942", "first", True), ("gfx1201", "off", False),
                                           ("gfx90a", "first", False)])
def test_rocm_dsa_model_route(rocm_platform, monkeypatch, gfx, mode, ours):
    """vLLM's ROCm DSA attention layer names its backend itself (the module global read in its __init__); the
    plugin points that global at ours where ours goes before aiter's backend, idempotently."""
    import importlib
    import inspect

    from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseBackend

    monkeypatch.setenv(policy.PRIORITY_ENV, mode)
    rocm_platform(gfx)
    module = importlib.import_module(plugin.ROCM_DSA_MODULE)
    assert f"attn_backend={plugin.ROCM_DSA_GLOBAL}" in inspect.getsource(module.DeepseekV32MLAAttention.__init__)
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseBackend

    # vLLM's own value (an earlier register() under a simulated RDNA GPU may have re-pointed it); restored after
    monkeypatch.setattr(module, plugin.ROCM_DSA_GLOBAL, ROCMAiterMLASparseBackend)
    for _ in range(2):
        assert plugin.install_rocm_dsa_route() is ours
        assert (getattr(module, plugin.ROCM_DSA_GLOBAL) is TritonMLASparseBackend) is ours

"""Peer loading (folders, installed vLLM, DeepGEMM) and how a peer that cannot load is reported."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from triton_mla_sparse import bench
from triton_mla_sparse.bench.peers import loader


def test_peers_folder_choice(tmp_path):
    (tmp_path / ".peers").mkdir()
    assert bench.resolve_peers_dir("/x", env={"TMS_PEERS_DIR": "/y"}, cwd=str(tmp_path)) == ("/x", "--peers")
    assert bench.resolve_peers_dir(None, env={"TMS_PEERS_DIR": "/y"}, cwd=str(tmp_path)) == ("/y", "TMS_PEERS_DIR")
    assert bench.resolve_peers_dir(None, env={}, cwd=str(tmp_path)) == (str(tmp_path / ".peers"), "./.peers")
    assert bench.resolve_peers_dir(None, env={}, cwd=str(tmp_path / ".peers")) == (None, "none")


def test_missing_peers_folder_is_reported(monkeypatch):
    monkeypatch.setattr(loader, "_vllm_installed", lambda: False)
    peers = bench.load_peers("/nonexistent/peers-dir", env={})
    assert set(peers.status) == set(bench.EXTERNAL_PEERS)
    for m in bench.EXTERNAL_PEERS:
        s = peers.status[m]
        assert s.startswith("not available: ") and "/nonexistent/peers-dir" in s and "does not exist" in s
        assert ("not taken from an installed vLLM" if m == "fa3_page1" else "vLLM: not installed") in s
        assert not peers.available(m)
    assert peers.modules == {}
    # ... and a run turns them into per-case errors, never silently dropping them.
    facs = bench.method_factories(peers)
    with pytest.raises(bench.PeerUnavailable, match="not available"):
        facs["flashmla_fp8"](None)


def test_fa3_slots_are_compacted_as_vllm_passes_them():
    from triton_mla_sparse.bench.peers import compact_slots

    idx = torch.tensor([[5, -1, 3, 99, 7], [-1, -1, -1, -1, -1], [0, 1, 2, 3, 4]], dtype=torch.int32)
    slots, counts = compact_slots(idx, num_slots=10)
    assert slots.dtype == torch.int32 and counts.tolist() == [3, 0, 5]
    assert slots.tolist() == [[5, 3, 7, 0, 0], [0, 0, 0, 0, 0], [0, 1, 2, 3, 4]]


def test_deepgemm_folder_choice(tmp_path):
    (tmp_path / ".peers-deepgemm").mkdir()
    env = {"TMS_DEEPGEMM_DIR": "/y"}
    assert bench.resolve_deepgemm_dir("/x", env=env, cwd=str(tmp_path)) == ("/x", "--deepgemm-dir")
    assert bench.resolve_deepgemm_dir(None, env=env, cwd=str(tmp_path)) == ("/y", "TMS_DEEPGEMM_DIR")
    assert bench.resolve_deepgemm_dir(None, env={}, cwd=str(tmp_path), peers_dir="/p/peers/") == (
        "/p/peers-deepgemm", "beside the peers folder")
    assert bench.resolve_deepgemm_dir(None, env={}, cwd=str(tmp_path)) == (
        str(tmp_path / ".peers-deepgemm"), "./.peers-deepgemm")
    assert bench.resolve_deepgemm_dir(None, env={}, cwd=str(tmp_path / ".peers-deepgemm")) == (None, "none")


def test_missing_deepgemm_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "_vllm_installed", lambda: False)
    peers = bench.load_peers(None, env={}, cwd=str(tmp_path), wanted=bench.DEEPGEMM_KEYS,
                             deepgemm_dir=str(tmp_path / "no-such-dir"))
    assert set(peers.status) == set(bench.DEEPGEMM_KEYS) and "deepgemm" not in peers.modules
    for m in bench.DEEPGEMM_KEYS:
        s = peers.status[m]
        assert s.startswith("not available: ") and "no-such-dir" in s and "does not exist" in s
        assert "vLLM: not installed" in s and not peers.available(m)
    none = bench.load_peers(None, env={}, cwd=str(tmp_path), wanted=("deepgemm",))
    assert none.status["deepgemm"].startswith("not available: no DeepGEMM folder")


def _write_fake_deep_gemm(root, body):
    pkg = root / "deep_gemm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return root


@pytest.fixture
def no_deep_gemm():
    """Takes every ``deep_gemm`` module out of sys.modules for the test and puts the earlier state back after it."""
    def drop():
        return {k: sys.modules.pop(k) for k in list(sys.modules) if k == "deep_gemm" or k.startswith("deep_gemm.")}

    saved = drop()
    yield drop
    drop()
    sys.modules.update(saved)


def test_deepgemm_package_is_loaded_from_its_folder(tmp_path, monkeypatch, no_deep_gemm):
    monkeypatch.setattr(loader, "_vllm_installed", lambda: False)
    monkeypatch.setenv("DG_JIT_CACHE_DIR", "")  # unset for DeepGEMM; restored after the test
    good = _write_fake_deep_gemm(tmp_path / "good", "from .sub import get_num_sms\n__version__ = '9.9'\n"
                                 "def get_paged_mqa_logits_metadata(*a): pass\n"
                                 "def fp8_fp4_paged_mqa_logits(*a): pass\n"
                                 "def fp8_fp4_mqa_logits(*a): pass\n")
    (good / "deep_gemm" / "sub.py").write_text("def get_num_sms():\n    return 132\n")
    peers = bench.load_peers(None, env={}, cwd=str(tmp_path), deepgemm_dir=str(good), wanted=bench.DEEPGEMM_KEYS)
    assert peers.modules["deepgemm"].get_num_sms() == 132  # the package's relative imports work
    jit = bench.deepgemm_jit_cache_dir()
    assert peers.status["deepgemm"] == f"loaded from {good} (--deepgemm-dir), DeepGEMM 9.9; JIT cache {jit}"
    assert peers.available("deepgemm_topk") and os.environ["DG_JIT_CACHE_DIR"] == jit  # set before the import
    assert set(no_deep_gemm()) == {"deep_gemm", "deep_gemm.sub"}
    old = _write_fake_deep_gemm(tmp_path / "old", "def fp8_mqa_logits(*a): pass\n")
    peers = bench.load_peers(None, env={}, deepgemm_dir=str(old), wanted=("deepgemm",))
    assert "another DeepGEMM API" in peers.status["deepgemm"] and "fp8_fp4_mqa_logits" in peers.status["deepgemm"]
    no_deep_gemm()
    bad = _write_fake_deep_gemm(tmp_path / "bad", "raise OSError('Could not load this library: _C_extension.so')\n")
    peers = bench.load_peers(None, env={}, deepgemm_dir=str(bad), wanted=("deepgemm",))
    assert "OSError: Could not load this library" in peers.status["deepgemm"]
    assert "deep_gemm" not in sys.modules  # a failed import leaves nothing behind


def test_peer_that_fails_to_import_is_reported(tmp_path, monkeypatch):
    (tmp_path / "flash_mla_interface.py").write_text("raise OSError('Could not load this library: _flashmla_C.so')\n")
    (tmp_path / "triton_decode_attention.py").write_text("def decode_attention_fwd(*a, **k):\n    pass\n")
    monkeypatch.delitem(sys.modules, "triton_decode_attention", raising=False)
    monkeypatch.delitem(sys.modules, "flash_mla_interface", raising=False)
    peers = bench.load_peers(str(tmp_path), env={}, use_vllm=False)
    assert peers.status["page1_triton"] == f"loaded from {tmp_path} (--peers)"
    assert peers.available("page1_triton") and "page1" in peers.modules
    assert peers.status["flashmla_bf16"].startswith("not available: ")
    assert "OSError: Could not load this library" in peers.status["flashmla_fp8"]
    assert "flash_mla_interface" not in sys.modules  # a failed import leaves nothing behind
    only = bench.load_peers(str(tmp_path), env={}, use_vllm=False, wanted=("page1_triton",))
    assert set(only.status) == {"page1_triton"}


def test_page1_adapter_passes_the_scale_tensors():
    """The page1 adapter (the one place its call is written): the main call passes k/v scale tensors made once, the
    default-scales variant passes none; both write the same output buffer."""
    import torch

    from triton_mla_sparse.bench.peers import page1_call

    seen = []

    def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits, num_kv_splits,
                             sm_scale, page_size=1, is_mla=False, k_scale=None, v_scale=None):
        assert page_size == 1 and is_mla and tuple(req_to_token.shape) == (2, 4) and int(req_to_token.min()) >= 0
        seen.append((k_scale, v_scale))
        o.fill_(len(seen))

    tda = type("tda", (), {"decode_attention_fwd": staticmethod(decode_attention_fwd)})
    q = torch.zeros(2, 8, 576, dtype=torch.float16)
    kv = torch.zeros(4, 16, 576, dtype=torch.float16)
    idx = torch.tensor([[0, 5, -1, 7], [1, 2, 3, -1]], dtype=torch.int32)
    call, default, desc = page1_call(tda, q, kv, idx, 0.1)
    out = call()
    assert desc == "decode_attention_fwd page_size=1 splits4" and out.shape == (2, 8, 512)
    assert default() is out
    (k1, v1), (k2, v2) = seen
    assert float(k1) == float(v1) == 1.0 and k2 is None and v2 is None
    call()
    assert seen[2][0] is k1  # made once, not per call

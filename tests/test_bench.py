"""CPU tests of the benchmark harness (``triton_mla_sparse.bench`` and ``triton-mla-sparse bench``): device slugs,
results paths, commit, peer loading and its reports, the JSON a run writes (tiny cases through the Triton
interpreter, with fake peer modules standing in for FlashMLA and vLLM's Triton kernel), targets, compare, plots."""

from __future__ import annotations

import json
import math
import os
import sys
import types

import pytest
import torch

from triton_mla_sparse import bench, reference
from triton_mla_sparse.cli import main

REQUIRED_TOP = ("device", "date", "torch", "triton", "commit", "ceilings", "cases", "peers")
REQUIRED_CASE = ("name", "kind", "rows", "heads", "topk", "ctx", "kv_format", "methods")
TIMED = ("ms", "tflops", "gbps", "rel_err")


# ----------------------------------------------------------------------------------------------------- metadata

@pytest.mark.parametrize("name, slug", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("AMD Instinct MI300X", "mi300x"),
    ("CPU (x86_64)", "cpu"),
    ("", "unknown"),
])
def test_gpu_slug(name, slug):
    assert bench.gpu_slug(name) == slug


def test_results_path():
    assert bench.results_path("NVIDIA H200", "2026-12-01") == "benchmarks/results/h200-2026-12-01.json"
    assert bench.results_path("NVIDIA H100 80GB HBM3", "2026-12-01", "/o") == "/o/h100-2026-12-01.json"
    assert len(bench.utc_date()) == 10 and bench.utc_date()[4] == "-"


def test_commit_from_env_then_git(monkeypatch):
    assert bench.resolve_commit({"TMS_COMMIT": " abc123 "}) == ("abc123", "TMS_COMMIT", None)
    monkeypatch.setattr(bench, "_git", lambda *a: None)  # no git, or not a checkout (the GPU machine's copy)
    assert bench.resolve_commit({}) == (None, None, None)
    monkeypatch.setattr(bench, "_git", lambda *a: "f" * 40 if a[0] == "rev-parse" else "")
    assert bench.resolve_commit({"TMS_COMMIT": ""}) == ("f" * 40, "git", False)


def test_method_applies():
    dec_bf16 = bench.decode_case(16, 64, "bf16")
    dec_fp8 = bench.decode_case(16, 64, "fp8_ds_mla")
    pre_fp8 = bench.prefill_case(64, "fp8_ds_mla")
    assert [m for m in bench.METHOD_KEYS if bench.method_applies(m, dec_bf16)] == [
        "ours", "torch", "page1_triton", "flashmla_bf16"]
    assert [m for m in bench.METHOD_KEYS if bench.method_applies(m, dec_fp8)] == ["ours", "torch", "flashmla_fp8"]
    assert [m for m in bench.METHOD_KEYS if bench.method_applies(m, pre_fp8)] == ["ours", "torch", "flashmla_fp8"]
    for phase in ("decode", "prefill"):
        idx = bench.indexer_case(32, phase)
        assert [m for m in bench.INDEXER_METHOD_KEYS if bench.method_applies(m, idx)] == list(
            bench.INDEXER_METHOD_KEYS)
        assert not any(bench.method_applies(m, idx) for m in ("page1_triton", "flashmla_bf16", "flashmla_fp8"))


def test_case_list_covers_the_issue():
    attn = bench.bench_cases(kinds="attention")
    names = [c.name for c in attn]
    assert len(names) == 22 and all(bench.case_group(c) == "attention" for c in attn)
    for h in (8, 16, 32, 64, 128):
        for f in ("bf16", "fp8_ds_mla"):
            assert f"decode h{h} B=64 ctx8K {f}" in names
    assert "decode h16 B=256 ctx8K bf16" in names and "decode h128 B=1 ctx64K fp8_ds_mla" in names
    for h in (8, 16, 64, 128):
        assert f"prefill h{h} T=4096 ctx32K bf16" in names
    assert all(c.topk == 2048 and c.block_size == 64 for c in bench.bench_cases())
    assert 0 < len(bench.bench_cases(quick=True)) < 10
    # The indexer cases of issue #6: decode B=64, block 64, Hi 64 and 32, 32K and 128K; prefill 4096 rows over 32K.
    idx = bench.bench_cases(kinds=["indexer"])
    assert [c.name for c in idx] == [
        "indexer decode h64 B=64 ctx32K", "indexer decode h64 B=64 ctx128K", "indexer decode h32 B=64 ctx32K",
        "indexer decode h32 B=64 ctx128K", "indexer prefill h64 T=4096 ctx32K", "indexer prefill h32 T=4096 ctx32K"]
    assert all(c.kind == "indexer" and c.topk == 2048 and c.block_size == 64 and c.kv_format == "fp8_indexer"
               for c in idx)
    assert [c.name for c in bench.bench_cases()] == names + [c.name for c in idx]  # the default runs both
    assert any(c.kind == "indexer" for c in bench.bench_cases(quick=True))
    pre = idx[4]  # rows at positions 28672 .. 32767: 4096 · 28672 + 4096 · 4097 / 2 scored pairs (the anchors' FLOPs)
    assert pre.pairs == 4096 * 28672 + 4096 * 4097 // 2 and pre.flops == 2 * 64 * 128 * pre.pairs
    with pytest.raises(ValueError, match="kinds"):
        bench.bench_cases(kinds="attention,nope")


# ----------------------------------------------------------------------------------------------------- peers

def test_peers_folder_choice(tmp_path):
    (tmp_path / ".peers").mkdir()
    assert bench.resolve_peers_dir("/x", env={"TMS_PEERS_DIR": "/y"}, cwd=str(tmp_path)) == ("/x", "--peers")
    assert bench.resolve_peers_dir(None, env={"TMS_PEERS_DIR": "/y"}, cwd=str(tmp_path)) == ("/y", "TMS_PEERS_DIR")
    assert bench.resolve_peers_dir(None, env={}, cwd=str(tmp_path)) == (str(tmp_path / ".peers"), "./.peers")
    assert bench.resolve_peers_dir(None, env={}, cwd=str(tmp_path / ".peers")) == (None, "none")


def test_missing_peers_folder_is_reported(monkeypatch):
    monkeypatch.setattr(bench, "_vllm_installed", lambda: False)
    peers = bench.load_peers("/nonexistent/peers-dir", env={})
    assert set(peers.status) == set(bench.EXTERNAL_PEERS)
    for m in bench.EXTERNAL_PEERS:
        s = peers.status[m]
        assert s.startswith("not available: ") and "/nonexistent/peers-dir" in s and "does not exist" in s
        assert "vLLM: not installed" in s
        assert not peers.available(m)
    assert peers.modules == {}
    # ... and a run turns them into per-case errors, never silently dropping them.
    facs = bench.method_factories(peers)
    with pytest.raises(bench.PeerUnavailable, match="not available"):
        facs["flashmla_fp8"](None)


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
    monkeypatch.setattr(bench, "_vllm_installed", lambda: False)
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
    monkeypatch.setattr(bench, "_vllm_installed", lambda: False)
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


# ----------------------------------------------------------------------------------------------------- a run

def _ref(q, kv, idx, scale, fmt):
    return reference.sparse_mla_attention(q, kv, idx, scale, kv_format=fmt, compute_dtype=torch.float32,
                                          out_dtype=torch.float32).to(q.dtype)


def _fake_flashmla(calls):
    """Stands in for FlashMLA's interface: checks the argument shapes the harness passes, answers correctly."""

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale):
        assert kv.dim() == 3 and kv.shape[1] == 1 and indices.shape[1] == 1 and q.shape[1] in (8, 16, 32, 64, 128)
        calls.append(("sparse_fwd", tuple(q.shape)))
        out = _ref(q, kv.view(-1, 1, kv.shape[-1]), indices[:, 0], sm_scale, None)
        return out, None, None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, softmax_scale=None,
                               is_fp8_kvcache=False, indices=None):
        assert is_fp8_kvcache and block_table is None and head_dim_v == 512 and meta is not None
        T, s_q, hp, _ = q.shape
        assert s_q == 1 and hp in (64, 128) and k_cache.shape[2:] == (1, 656) and indices.shape[:2] == (T, 1)
        calls.append(("kvcache_fp8", tuple(q.shape)))
        out = _ref(q[:, 0], k_cache[:, :, 0], indices[:, 0], softmax_scale, "fp8_ds_mla")
        return out.view(T, 1, hp, 512), None

    return types.SimpleNamespace(flash_mla_sparse_fwd=flash_mla_sparse_fwd, get_mla_metadata=lambda: (object(), None),
                                 flash_mla_with_kvcache=flash_mla_with_kvcache)


def _fake_page1():
    """Stands in for vLLM's decode_attention_fwd: right with k/v scale tensors given (the main call), zeros without
    (the sweep.py variant), so the variant must be refused by the accuracy check and left untimed."""

    def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits, num_kv_splits,
                             sm_scale, page_size=1, is_mla=False, k_scale=None, v_scale=None):
        assert page_size == 1 and is_mla and num_kv_splits == attn_logits.shape[2] == 4
        assert k_buffer.shape[1:] == (1, 576) and v_buffer.shape[1:] == (1, 512) and (b_seq_len == 64).all()
        if k_scale is None:
            o.zero_()
        else:
            o.copy_(_ref(q, k_buffer, req_to_token, sm_scale, None))

    return types.SimpleNamespace(decode_attention_fwd=decode_attention_fwd)


def test_run_writes_the_results_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("TMS_COMMIT", "0123abc")
    calls = []
    peers = bench.Peers(modules={"flashmla": _fake_flashmla(calls), "page1": _fake_page1()},
                        status={"page1_triton": "loaded from fake", "flashmla_bf16": "loaded from fake",
                                "flashmla_fp8": "loaded from fake"})
    out = tmp_path / "res" / "cpu-test.json"
    lines = []
    rc = bench.run_bench(cpu_smoke=True, case_filter=r"^decode h(8|32) B=2 ", out=str(out), peers=peers,
                         plot=False, log=lines.append)
    assert rc == 0, "\n".join(lines)
    doc = json.loads(out.read_text())
    for k in REQUIRED_TOP:
        assert k in doc
    assert doc["commit"] == "0123abc" and doc["commit_source"] == "TMS_COMMIT" and doc["complete"] is True
    assert doc["date"] == bench.utc_date() and set(doc["ceilings"]) >= {"copy_gbps", "bf16_tflops"}
    assert doc["peers"] == {"torch": "built in (gather + matmul + softmax in q's dtype)",
                            "page1_triton": "loaded from fake", "flashmla_bf16": "loaded from fake",
                            "flashmla_fp8": "loaded from fake"}
    assert [c["name"] for c in doc["cases"]] == ["decode h8 B=2 ctx256 fp16", "decode h32 B=2 ctx256 fp8_ds_mla"]
    for c in doc["cases"]:
        for k in REQUIRED_CASE:
            assert k in c
        assert c["kind"] in ("decode", "prefill", "indexer")
        assert set(c["methods"]) <= set(bench.METHOD_KEYS)
        for m in c["methods"].values():
            assert "error" in m or all(isinstance(m[k], float) for k in TIMED)
    fp16, fp8 = (c["methods"] for c in doc["cases"])
    assert list(fp16) == ["ours", "torch", "page1_triton"]  # flashmla_* do not apply to an fp16 cache: absent
    assert list(fp8) == ["ours", "torch", "flashmla_fp8"]
    assert fp16["page1_triton"]["rel_err"] < 1e-2 and fp16["page1_triton"]["ms"] > 0
    assert fp16["page1_triton"]["ms_default_scales_error"].startswith("accuracy: rel err")
    assert "ms_default_scales" not in fp16["page1_triton"]
    assert fp8["flashmla_fp8"]["rel_err"] < 2e-2 and fp8["flashmla_fp8"]["ms"] > 0  # padded 32 -> 64, sliced back
    assert ("kvcache_fp8", (2, 1, 64, 576)) in calls
    assert fp8["ours"]["rel_err"] < 2e-2 and fp8["ours"]["config"]
    assert any("variant default_scales: ERROR accuracy" in s for s in lines)
    assert any(s.startswith("[2/2]") for s in lines)
    assert any("ours / peer" in s for s in lines)


def _fake_deepgemm(calls):
    """Stands in for DeepGEMM (vLLM 0.33's copy): checks the arguments the harness passes as its kernels require
    them, answers with the right logits at the candidate positions and garbage (1e30, which an unmasked top-k would
    pick) past each row's length and in the padding columns, as the real kernels leave them uncleaned."""
    fp8 = torch.float8_e4m3fn

    def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
        assert context_lens.dtype == torch.int32 and context_lens.dim() == 2 and context_lens.shape[1] == 1
        assert context_lens.is_contiguous() and num_sms == 7
        calls.append(("meta", block_kv))
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len):
        q8, q_sf = q
        B, next_n, H, D = q8.shape
        assert q_sf is None and q8.dtype == fp8 and next_n == 1 and D == 128
        nb, bs = kv_cache.shape[:2]
        assert kv_cache.dtype == torch.uint8 and kv_cache.shape[2:] == (1, 132) and kv_cache.stride(1) == 132
        assert weights.dtype == torch.float32 and weights.shape == (B, H) and context_lens.shape == (B, 1)
        assert block_table.dtype == torch.int32 and block_table.shape[0] == B and schedule_meta.shape == (8, 2)
        calls.append(("paged", B, H, max_context_len))
        ref = reference.indexer_logits(q8[:, 0], weights, kv_cache.view(nb, bs * 132), block_table,
                                       torch.arange(B, dtype=torch.int32), context_lens[:, 0] - 1, max_context_len)
        out = torch.full((B, max_context_len + 16), 1e30)  # a padded logits stride
        out[:, :max_context_len] = ref.masked_fill(torch.isneginf(ref), 1e30)
        return out

    def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k):
        (q8, q_sf), (k8, k_sf) = q, kv
        M, H, D = q8.shape
        assert q_sf is None and q8.dtype == fp8 and k8.dtype == fp8 and k8.is_contiguous() and k8.shape[1] == D
        assert k_sf.dtype == torch.float32 and k_sf.shape == (k8.shape[0],) and weights.shape == (M, H)
        ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
        assert ks.dtype == ke.dtype == torch.int32 and ks.shape == ke.shape == (M,) and bool((ks == 0).all())
        calls.append(("prefill", M, H, max_seqlen_k))
        s = torch.einsum("mhd,nd->mhn", q8.float(), k8.float() * k_sf[:, None]).relu()
        out = (s * weights[:, :, None]).sum(1)[:, :max_seqlen_k]  # every key scored: future ones are garbage here
        return out.masked_fill(torch.arange(max_seqlen_k)[None, :] >= ke[:, None] + 3, 1e30)

    return types.SimpleNamespace(get_num_sms=lambda: 7, get_paged_mqa_logits_metadata=get_paged_mqa_logits_metadata,
                                 fp8_fp4_paged_mqa_logits=fp8_fp4_paged_mqa_logits,
                                 fp8_fp4_mqa_logits=fp8_fp4_mqa_logits)


def test_indexer_run_writes_the_results_schema(tmp_path, monkeypatch):
    """Tiny indexer cases end to end through the interpreter: every method key, checked then timed, in the JSON."""
    monkeypatch.setenv("TMS_COMMIT", "0123abc")
    calls = []
    peers = bench.Peers(modules={"deepgemm": _fake_deepgemm(calls)},
                        status={"deepgemm": "loaded from fake", "deepgemm_topk": "loaded from fake"})
    out = tmp_path / "cpu-indexer.json"
    lines = []
    rc = bench.run_bench(cpu_smoke=True, kinds="indexer", out=str(out), peers=peers, plot=False, log=lines.append)
    assert rc == 0, "\n".join(lines)
    doc = json.loads(out.read_text())
    for k in REQUIRED_TOP:
        assert k in doc
    assert doc["kinds"] == ["indexer"] and doc["complete"] is True and doc["failed"] == []
    assert doc["peers"] == {
        "torch": "built in (indexer: paged gather, bf16 matmul, relu, weighted head sum, torch.topk)",
        "deepgemm": "loaded from fake", "deepgemm_topk": "loaded from fake"}
    assert [c["name"] for c in doc["cases"]] == ["indexer decode h4 B=3 ctx96", "indexer prefill h8 T=5 ctx80"]
    for c in doc["cases"]:
        for k in REQUIRED_CASE:
            assert k in c
        assert c["kind"] == "indexer" and c["kv_format"] == "fp8_indexer" and c["topk"] in (40, 32)
        assert list(c["methods"]) == ["ours", "ours_logits", "deepgemm", "deepgemm_topk", "torch"]
        for name, m in c["methods"].items():
            assert "error" not in m, (name, m)
            assert all(isinstance(m[k], float) for k in TIMED) and m["ms"] > 0
            assert m["rel_err"] < bench.INDEXER_TOL
        assert c["methods"]["ours"]["rel_err"] < 1e-6 and c["methods"]["ours_logits"]["rel_err"] < 1e-5
        assert c["methods"]["torch"]["ms_logits"] > 0  # the torch logits alone, checked and timed as a variant
        assert "+ torch.topk" in c["methods"]["deepgemm_topk"]["config"]
    dec, pre = doc["cases"]
    assert dec["phase"] == "decode" and dec["rows"] == dec["requests"] == 3 and dec["pairs"] == 3 * 96
    assert pre["phase"] == "prefill" and pre["requests"] == 1 and pre["checked_rows"] == 3
    assert pre["pairs"] == sum(range(76, 81)) and pre["flops"] == 2 * 8 * 128 * pre["pairs"]
    assert "-inf fill" in pre["methods"]["deepgemm_topk"]["config"]  # its uncleaned columns are masked
    assert "-inf fill" not in dec["methods"]["deepgemm_topk"]["config"]  # every column is a candidate
    assert ("paged", 3, 4, 96) in calls and ("meta", 16) in calls and ("prefill", 5, 8, 80) in calls
    assert any("ours_logits / deepgemm" in s for s in lines)


def test_missing_deepgemm_is_an_error_on_each_indexer_case(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "_vllm_installed", lambda: False)
    out = tmp_path / "r.json"
    rc = bench.run_bench(cpu_smoke=True, kinds="indexer", case_filter="prefill", out=str(out), plot=False,
                         methods=("ours", "deepgemm", "deepgemm_topk"), deepgemm_dir=str(tmp_path / "none"),
                         log=lambda s: None)
    assert rc == 0
    doc = json.loads(out.read_text())
    status = doc["peers"]["deepgemm"]
    assert set(doc["peers"]) == {"deepgemm", "deepgemm_topk"} and doc["peers"]["deepgemm_topk"] == status
    assert status.startswith("not available: ") and "does not exist" in status and "vLLM: not installed" in status
    (case,) = doc["cases"]
    assert case["methods"]["deepgemm"] == {"error": status} and case["methods"]["deepgemm_topk"] == {"error": status}
    assert case["methods"]["ours"]["ms"] > 0


def test_indexer_accuracy_check():
    inf = math.inf
    ref = torch.tensor([[3.0, 1.0, 2.0, 2.0, -inf, -inf], [-inf, 5.0, -inf, -inf, -inf, -inf]])
    for sel in ([[0, 2, 3], [1, -1, -1]], [[3, 0, 1], [-1, 1, -1]]):  # any order
        err, why = bench.indexer_error(torch.tensor(sel, dtype=torch.int32), ref, 3)
        assert why is None and err < 0.5
    err, why = bench.indexer_error(torch.tensor([[0, 3], [1, -1]]), ref, 2)  # a tie at the threshold: either one
    assert (err, why) == (0.0, None)
    assert bench.indexer_error(torch.tensor([[0, 2], [1, -1]]), ref, 2) == (0.0, None)
    bad = {
        "a row does not hold": [[0, 2], [-1, -1]],
        "selected twice": [[0, 0], [1, -1]],
        "not a candidate": [[0, 4], [1, -1]],
        "out of range": [[0, 6], [1, -1]],
    }
    for what, sel in bad.items():
        err, why = bench.indexer_error(torch.tensor(sel), ref, 2)
        assert err == inf and what in why, (what, why)
    err, why = bench.indexer_error(torch.tensor([[0, 1], [1, -1]]), ref, 2)  # the wrong one of the top two
    assert why is None and err == pytest.approx(1 / math.sqrt(3**2 + 2**2 + 5**2))
    # logits: only the candidates count (what a method leaves elsewhere is not checked)
    got = ref.masked_fill(torch.isneginf(ref), 1e30)
    assert bench.indexer_error(got, ref, 2) == (0.0, None)
    assert bench.indexer_error(got[:, :5], ref, 2)[0] == inf
    nan = ref.clone()
    nan[0, 0] = math.nan
    assert bench.indexer_error(nan, ref, 2) == (inf, "non-finite logits at candidate positions")


def test_a_wrong_method_is_refused_before_timing():
    case = bench.smoke_cases()[0]  # decode h8 B=2 fp16

    def wrong(inp):
        return bench.Prepared(fn=lambda: torch.zeros(inp.q.shape[0], inp.q.shape[1], 512, dtype=inp.q.dtype),
                              config="zeros")

    timed = []
    facs = {**bench.METHODS, "page1_triton": wrong}
    rec = bench.run_case(case, ["torch", "page1_triton"], "cpu", factories=facs,
                         timer=lambda fn: timed.append(fn) or 1.0, log=lambda s: None)
    assert rec["methods"]["page1_triton"] == {"config": "zeros", "rel_err": 1.0,
                                              "error": "accuracy: rel err 1 > 0.01; not timed"}
    assert rec["methods"]["torch"]["ms"] == 1.0 and len(timed) == 1  # only torch was timed


def test_unavailable_peer_is_an_error_on_each_case(tmp_path):
    peers = bench.Peers(status={"flashmla_fp8": "not available: no folder"})
    out = tmp_path / "r.json"
    rc = bench.run_bench(cpu_smoke=True, case_filter=r"^decode h32 B=2 ", out=str(out), peers=peers, plot=False,
                         methods=("ours", "flashmla_fp8"), log=lambda s: None)
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["peers"] == {"flashmla_fp8": "not available: no folder"}
    assert doc["cases"][0]["methods"]["flashmla_fp8"] == {"error": "not available: no folder"}


def test_budget_cuts_the_run_short_and_keeps_the_json(tmp_path):
    out = tmp_path / "r.json"
    rc = bench.run_bench(cpu_smoke=True, out=str(out), peers=bench.Peers(), methods=("ours",), budget_s=1e-9,
                         plot=False, log=lambda s: None)
    doc = json.loads(out.read_text())
    assert rc == 1 and doc["complete"] is False and len(doc["cases"]) == len(bench.smoke_cases())
    assert all(c["error"].startswith("not run: the time budget") for c in doc["cases"])


def test_bad_method_and_no_gpu():
    assert bench.run_bench(cpu_smoke=True, methods=("ours", "nope"), log=lambda s: None) == 2
    assert bench.run_bench(cpu_smoke=True, kinds="attention,indexr", log=lambda s: None) == 2
    if not torch.cuda.is_available():
        assert bench.run_bench(log=lambda s: None) == 2


# ----------------------------------------------------------------------------------------------------- reports

def _m(ms, graph=None, **kw):
    d = {"ms": ms, "tflops": 1.0, "gbps": 1.0, "rel_err": 1e-3, **kw}
    if graph is not None:
        d["graph_ms"] = graph
    return d


def _c(kind, heads, rows, fmt, **methods):
    ctx = 65536 if rows == 1 else (32768 if kind == "prefill" else 8192)
    name = f"{kind} h{heads} {'T' if kind == 'prefill' else 'B'}={rows} {fmt}"
    return {"name": name, "kind": kind, "rows": rows, "heads": heads, "topk": 2048, "ctx": ctx, "kv_format": fmt,
            "methods": methods}


def _doc(cases, **kw):
    return {"device": "NVIDIA H200", "date": "2026-12-01", "torch": "2.11", "triton": "3.6", "commit": "abc",
            "ceilings": {"copy_gbps": 4000.0, "bf16_tflops": 700.0}, "peers": {}, "cases": cases, **kw}


def _new_doc():
    return _doc([
        _c("decode", 8, 64, "bf16", ours=_m(0.05, 0.04), torch=_m(0.2, 0.19), page1_triton=_m(0.21, 0.2),
           flashmla_bf16=_m(0.25, 0.2)),
        _c("decode", 16, 64, "bf16", ours=_m(0.09, 0.07), torch=_m(0.2), page1_triton={"error": "not available: x"},
           flashmla_bf16=_m(0.25)),
        _c("decode", 8, 64, "fp8_ds_mla", ours=_m(0.05), flashmla_fp8=_m(0.1)),
        _c("decode", 16, 64, "fp8_ds_mla", ours=_m(0.063, 0.05), flashmla_fp8=_m(0.09, 0.08)),
        _c("decode", 16, 256, "bf16", ours=_m(0.2), flashmla_bf16=_m(0.25), page1_triton=_m(0.5)),
        _c("decode", 128, 64, "bf16", ours=_m(0.12), flashmla_bf16=_m(0.08)),
        _c("decode", 128, 64, "fp8_ds_mla", ours=_m(0.2), flashmla_fp8={"error": "accuracy: rel err 0.5 > 0.02"}),
        _c("prefill", 128, 4096, "bf16", ours=_m(6.0), flashmla_bf16=_m(4.0)),
        _c("prefill", 16, 4096, "bf16", ours=_m(2.0), flashmla_bf16=_m(2.6), page1_triton=_m(6.5)),
    ])


def _rows(doc):
    return {(r["target"], r["case"]): r for r in bench.target_rows(doc)}


def test_targets():
    rows = _rows(_new_doc())
    t1 = "decode h8 & h16 B=64 bf16: ours / best peer"
    r = rows[(t1, "decode h8 B=64 bf16")]
    assert r["ratio"] == pytest.approx(0.25) and r["status"] == "PASS" and r["goal_met"]  # torch 0.2 is best
    assert r["graph_ratio"] == pytest.approx(0.04 / 0.19) and "best peer: torch" in r["note"]
    r = rows[(t1, "decode h16 B=64 bf16")]
    assert r["ratio"] == pytest.approx(0.45) and r["status"] == "FAIL"  # page1's error is not a time
    r = rows[("decode h8 & h16 B=64 fp8: ours / flashmla_fp8", "decode h16 B=64 fp8_ds_mla")]
    assert r["ratio"] == pytest.approx(0.7) and r["status"] == "FAIL" and r["graph_ratio"] == pytest.approx(0.625)
    r = rows[("decode h16 B=256 bf16: ours / flashmla_bf16", "decode h16 B=256 bf16")]
    assert r["ratio"] == pytest.approx(0.8) and r["status"] == "PASS" and not r["goal_met"]
    r = rows[("decode h128 B=64 bf16: ours / flashmla_bf16", "decode h128 B=64 bf16")]
    assert r["ratio"] == pytest.approx(1.5) and r["status"] == "PASS"  # the limit itself passes
    r = rows[("decode h128 B=64 fp8: ours / flashmla_fp8", "decode h128 B=64 fp8_ds_mla")]
    assert r["status"] == "n/a" and "accuracy" in r["note"]
    t6 = "prefill h128 & h64 bf16: ours / flashmla_bf16"
    assert rows[(t6, "prefill h128 T=4096 bf16")]["ratio"] == pytest.approx(1.5)
    assert rows[(t6, "(kind=prefill heads=64 kv_format=bf16)")]["note"] == "case not in results"
    t7 = "prefill h16 & h8 bf16: ours / flashmla_bf16"
    assert rows[(t7, "prefill h16 T=4096 bf16")]["status"] == "PASS"
    page1 = [r for r in bench.target_rows(_new_doc()) if r["target"] == "every case: ours / page1_triton"]
    assert [r["case"] for r in page1] == ["decode h8 B=64 bf16", "decode h16 B=64 bf16", "decode h16 B=256 bf16",
                                          "prefill h16 T=4096 bf16"]
    assert [r["status"] for r in page1] == ["PASS", "n/a", "FAIL", "PASS"]
    r = rows[("decode h16 B=64: ours fp8 / ours bf16", "decode h16 B=64 fp8_ds_mla / bf16")]
    assert r["ratio"] == pytest.approx(0.7) and r["status"] == "PASS"  # at the limit
    assert r["graph_ratio"] == pytest.approx(0.05 / 0.07)
    text = bench.targets_text(_new_doc())
    assert "PASS" in text and "FAIL" in text and "n/a" in text
    assert text.splitlines()[-1].startswith("9 PASS, 3 FAIL, 4 n/a")


def test_targets_flag_a_limit_over_the_read_ceiling():
    """A limit whose allowed time would need the numerator case's unique bytes moved faster than the run's read
    ceiling is flagged (status unchanged); only rows whose numerator is ours, with its own case's bytes."""
    doc = _doc([
        # 604 MB of unique rows; page1 0.35 ms -> 0.33 x 0.35 = 0.1155 ms -> 5.2 TB/s > 4.4 TB/s read ceiling
        dict(_c("decode", 16, 256, "bf16", ours=_m(0.19), flashmla_bf16=_m(0.25), page1_triton=_m(0.35)),
             unique_bytes=604_000_000),
        # 152 MB; best peer torch 0.09 ms -> 0.4 x 0.09 = 0.036 ms -> 4.2 TB/s < 4.4: not flagged; page1 0.6 ms
        dict(_c("decode", 8, 64, "bf16", ours=_m(0.05), torch=_m(0.09), page1_triton=_m(0.6)),
             unique_bytes=152_000_000),
        # 152 MB; best peer page1 0.08 ms -> 0.032 ms -> 4.75 TB/s: flagged (the best-peer row)
        dict(_c("decode", 16, 64, "bf16", ours=_m(0.06), page1_triton=_m(0.08)), unique_bytes=152_000_000),
        # fp8 / bf16 at h16: the fp8 case's 86 MB over 0.7 x 0.06 ms = 2.0 TB/s (the bf16 case's bytes would give
        # 3.6 TB/s; either is under 4.4) -> checked below with a lower ceiling
        dict(_c("decode", 16, 64, "fp8_ds_mla", ours=_m(0.05), flashmla_fp8=_m(0.5)), unique_bytes=86_000_000),
    ])
    doc["ceilings"]["read_gbps"] = 4400.0
    rows = _rows(doc)
    r = rows[("every case: ours / page1_triton", "decode h16 B=256 bf16")]
    assert r["status"] == "FAIL" and r["over_read_ceiling"]
    assert r["needs_gbps"] == pytest.approx(604e6 / (0.33 * 0.35e-3) / 1e9)
    assert "4400 GB/s, the best read measured in the run" in r["note"]
    r = rows[("every case: ours / page1_triton", "decode h8 B=64 bf16")]
    assert r["status"] == "PASS" and not r["over_read_ceiling"] and "read ceiling" not in r["note"]
    best = "decode h8 & h16 B=64 bf16: ours / best peer"
    assert not rows[(best, "decode h8 B=64 bf16")]["over_read_ceiling"]
    r = rows[(best, "decode h16 B=64 bf16")]
    assert r["over_read_ceiling"] and r["needs_gbps"] == pytest.approx(152e6 / (0.4 * 0.08e-3) / 1e9)
    assert not rows[("decode h16 B=256 bf16: ours / flashmla_bf16", "decode h16 B=256 bf16")]["over_read_ceiling"]
    ratio = ("decode h16 B=64: ours fp8 / ours bf16", "decode h16 B=64 fp8_ds_mla / bf16")
    assert rows[ratio]["needs_gbps"] == pytest.approx(86e6 / (0.7 * 0.06e-3) / 1e9)  # the numerator's bytes
    text = bench.targets_text(doc)
    assert text.splitlines()[-1] == ("3 row(s) whose limit needs more bandwidth than the read ceiling of the run: "
                                     "decode h8 & h16 B=64 bf16 / decode h16 B=64 bf16; "
                                     "every case / decode h16 B=256 bf16; every case / decode h16 B=64 bf16")
    doc["ceilings"]["read_gbps"] = 3000.0  # now the fp8/bf16 row (2.0 TB/s) stays clear, the 4.2 TB/s row does not
    rows = _rows(doc)
    assert not rows[ratio]["over_read_ceiling"] and rows[(best, "decode h8 B=64 bf16")]["over_read_ceiling"]
    del doc["ceilings"]["read_gbps"]  # results without a read ceiling: nothing flagged
    assert not any(r["over_read_ceiling"] for r in bench.target_rows(doc))


def test_indexer_targets_are_checked_with_their_own_bytes():
    doc = _indexer_doc()
    for c in doc["cases"]:
        c["unique_bytes"] = 10**9
    doc["ceilings"]["read_gbps"] = 1.0  # any time is over it: every row with bytes and a peer time is flagged
    rows = bench.target_rows(doc)
    timed = [r for r in rows if r["status"] != "n/a"]
    assert timed and all(r["over_read_ceiling"] for r in timed)
    assert {r["target"].split(":")[0] for r in timed} == {
        "indexer decode logits", "indexer decode +top-k", "indexer prefill logits", "indexer prefill +top-k"}
    doc["ceilings"]["read_gbps"] = 1e9
    assert not any(r["over_read_ceiling"] for r in bench.target_rows(doc))


def test_read_sum_kernel_reads_every_word():
    from triton_mla_sparse.kernels.readbw import read_sum

    x = torch.randint(-1000, 1000, (3 * 4096 + 100,), dtype=torch.int32)  # a short last program, masked
    parts = read_sum(x, block=256, iters=4)
    assert parts.numel() == -(-x.numel() // 1024)
    assert int(parts.sum()) == int(x.sum())
    y = torch.randn(4096, dtype=torch.bfloat16)  # any dtype is read as int32 words
    diff = int(read_sum(y, block=128, iters=2).sum()) - int(y.view(torch.int32).sum())
    assert diff % 2**32 == 0  # the per-program sums wrap


def _ic(phase, heads, ctx, **methods):
    rows = 64 if phase == "decode" else 4096
    name = f"indexer {phase} h{heads} {'B' if phase == 'decode' else 'T'}={rows} ctx{ctx // 1024}K"
    return {"name": name, "kind": "indexer", "phase": phase, "rows": rows, "heads": heads, "topk": 2048, "ctx": ctx,
            "kv_format": "fp8_indexer", "methods": methods}


def _indexer_doc():
    na = {"error": "not available: no DeepGEMM folder"}
    return _doc([
        _ic("decode", 64, 32768, ours=_m(0.10, 0.09), ours_logits=_m(0.08, 0.07), deepgemm=_m(0.082, 0.08),
            deepgemm_topk=_m(0.194, 0.18), torch=_m(1.8)),
        _ic("decode", 64, 131072, ours=_m(0.4), ours_logits=_m(0.30), deepgemm=_m(0.284), deepgemm_topk=_m(0.476)),
        _ic("decode", 32, 32768, ours=_m(0.2), ours_logits=_m(0.2), deepgemm=na, deepgemm_topk=na),
        _ic("prefill", 64, 32768, ours=_m(3.0), ours_logits=_m(2.5), deepgemm=_m(2.13), deepgemm_topk=_m(4.03)),
        _ic("prefill", 32, 32768, ours=_m(3.0), ours_logits=_m(3.0), deepgemm=_m(1.15), deepgemm_topk=_m(3.07)),
    ])


def test_indexer_targets():
    rows = _rows(_indexer_doc())
    dl, dt = "indexer decode logits: ours_logits / deepgemm", "indexer decode +top-k: ours / deepgemm_topk"
    pl, pt = "indexer prefill logits: ours_logits / deepgemm", "indexer prefill +top-k: ours / deepgemm_topk"
    assert {t for t, _ in rows} == {dl, dt, pl, pt}  # no attention cases: the attention targets are left out
    assert len([k for k in rows if k[0] in (dl, dt)]) == 8 and len([k for k in rows if k[0] in (pl, pt)]) == 4
    r = rows[(dl, "indexer decode h64 B=64 ctx32K")]
    assert r["ratio"] == pytest.approx(0.08 / 0.082) and r["status"] == "PASS" and r["goal_met"]
    assert r["graph_ratio"] == pytest.approx(0.07 / 0.08) and (r["limit"], r["goal"]) == (1.30, 1.00)
    r = rows[(dl, "indexer decode h64 B=64 ctx128K")]
    assert r["ratio"] == pytest.approx(0.30 / 0.284) and r["status"] == "PASS" and not r["goal_met"]
    assert r["graph_ratio"] is None
    r = rows[(dt, "indexer decode h64 B=64 ctx32K")]
    assert r["ratio"] == pytest.approx(0.10 / 0.194) and r["graph_ratio"] == pytest.approx(0.09 / 0.18)
    assert (r["limit"], r["goal"]) == (1.00, 0.70) and r["goal_met"]
    r = rows[(dt, "indexer decode h32 B=64 ctx32K")]
    assert r["status"] == "n/a" and "not available" in r["note"]
    r = rows[(dt, "(kind=indexer phase=decode heads=32 ctx=131072 rows=64)")]
    assert r["status"] == "n/a" and r["note"] == "case not in results"
    r = rows[(pl, "indexer prefill h32 T=4096 ctx32K")]
    assert r["ratio"] == pytest.approx(3.0 / 1.15) and r["status"] == "FAIL" and (r["limit"], r["goal"]) == (2.5, 1.3)
    r = rows[(pt, "indexer prefill h64 T=4096 ctx32K")]
    assert r["ratio"] == pytest.approx(3.0 / 4.03) and r["goal_met"] and (r["limit"], r["goal"]) == (1.3, 0.9)
    assert r["graph_ratio"] is None  # prefill: no graph times
    text = bench.targets_text(_indexer_doc())
    assert "attention targets left out" in text
    assert text.splitlines()[-1] == "7 PASS, 1 FAIL, 4 n/a; goal met on 4 of 12 rows"
    assert "indexer targets left out" in bench.targets_text(_new_doc())
    both = _doc(_new_doc()["cases"] + _indexer_doc()["cases"])
    assert bench.targets_text(both).splitlines()[-1].startswith("16 PASS, 4 FAIL, 8 n/a")
    # ratios: DeepGEMM's logits against ours_logits, the rest against ours; ours_logits is not a peer column
    rr = {r["case"]: r for r in bench.ratio_rows(_indexer_doc())}
    r = rr["indexer decode h64 B=64 ctx32K"]
    assert r["ratios"]["deepgemm"] == pytest.approx(0.08 / 0.082) and "ours_logits" not in r["ratios"]
    assert r["ratios"]["deepgemm_topk"] == pytest.approx(0.10 / 0.194) and r["ratios"]["torch"] == pytest.approx(
        0.10 / 1.8)
    assert r["graph_ratios"]["deepgemm"] == pytest.approx(0.07 / 0.08) and r["ours_ms"] == 0.10
    assert "deepgemm" in rr["indexer decode h32 B=64 ctx32K"]["errors"]
    text = bench.ratios_text(both)
    assert "/deepgemm_topk" in text and "/ours_logits" not in text and "ours_logits / deepgemm" in text


def test_ratios_and_compare():
    new = _new_doc()
    rr = {r["case"]: r for r in bench.ratio_rows(new)}
    assert rr["decode h8 B=64 bf16"]["ratios"]["flashmla_bf16"] == pytest.approx(0.2)
    assert rr["decode h8 B=64 bf16"]["graph_ratios"]["flashmla_bf16"] == pytest.approx(0.2)
    assert rr["decode h16 B=64 bf16"]["ratios"]["page1_triton"] is None
    assert "page1_triton" in rr["decode h16 B=64 bf16"]["errors"]
    old = _doc([_c("decode", 8, 64, "bf16", ours=_m(0.1, 0.08), torch=_m(0.2), page1_triton=_m(0.2)),
                _c("prefill", 128, 4096, "bf16", ours=_m(12.0), torch=_m(18.0))], commit="old1")
    old["cases"][1]["name"] = "prefill h128 T=4096 ctx32K bf16"  # renamed: matched by its fields
    rows = {(r["case"], r["method"]): r for r in bench.compare_rows(old, new)}
    r = rows[("decode h8 B=64 bf16", "ours")]
    assert r["ratio"] == pytest.approx(0.5) and r["graph_ratio"] == pytest.approx(0.5)
    assert rows[("prefill h128 T=4096 bf16", "ours")]["ratio"] == pytest.approx(0.5)
    r = rows[("prefill h128 T=4096 bf16", "torch")]  # only in old
    assert r["old_ms"] == 18.0 and r["new_ms"] is None and r["ratio"] is None
    assert rows[("decode h16 B=64 bf16", "ours")]["in_old"] is False
    text = bench.compare_text(old, new, "old.json", "new.json")
    assert "old.json" in text and "commit old1" in text and "targets" in text
    # indexer cases: matched by name, else by their fields (phase included)
    old_i, new_i = _indexer_doc(), _indexer_doc()
    old_i["cases"][3]["name"] = "indexer prefill h64 (renamed)"
    old_i["cases"][3]["methods"]["ours"] = _m(6.0)
    rows = {(r["case"], r["method"]): r for r in bench.compare_rows(old_i, new_i)}
    assert rows[("indexer prefill h64 T=4096 ctx32K", "ours")]["ratio"] == pytest.approx(0.5)
    assert rows[("indexer decode h64 B=64 ctx32K", "ours_logits")]["graph_ratio"] == pytest.approx(1.0)
    assert [m for (c, m) in rows if c == "indexer decode h64 B=64 ctx32K"] == [
        "ours", "torch", "ours_logits", "deepgemm", "deepgemm_topk"]


def test_cli_report_modes(tmp_path, capsys):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps(_new_doc()))
    old.write_text(json.dumps(_doc([_c("decode", 8, 64, "bf16", ours=_m(0.1))])))
    assert main(["bench", "--targets", str(new)]) == 0
    out = capsys.readouterr().out
    assert "ours / peer" in out and "every case: ours / page1_triton" in out
    assert main(["bench", "--compare", str(old), "--against", str(new)]) == 0
    out = capsys.readouterr().out
    assert "new/old" in out and "0.50" in out
    assert main(["bench", "--against", str(new)]) == 2
    idx = tmp_path / "idx.json"
    idx.write_text(json.dumps(_indexer_doc()))
    assert main(["bench", "--targets", str(idx)]) == 0
    out = capsys.readouterr().out
    assert "indexer prefill +top-k: ours / deepgemm_topk" in out and "7 PASS, 1 FAIL, 4 n/a" in out
    assert main(["bench", "--targets", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["bench", "--targets", str(tmp_path / "bad.json")]) == 2


def _have_matplotlib() -> bool:
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _have_matplotlib(), reason="matplotlib not installed (the bench extra)")
def test_plot_redraw_from_json(tmp_path):
    p = tmp_path / "h200-2026-12-01.json"
    p.write_text(json.dumps(_new_doc()))
    assert main(["bench", "--plot", str(p)]) == 0
    png = tmp_path / "h200-2026-12-01.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    other = tmp_path / "sub" / "x.png"
    assert bench.plot_results(str(p), str(other)) == str(other) and other.stat().st_size > 1000
    assert bench.plot_results(_doc([]), str(tmp_path / "empty.png"), log=lambda s: None)  # no cases: still a PNG
    both = _doc(_new_doc()["cases"] + _indexer_doc()["cases"])  # attention and indexer cases in one plot
    assert bench.plot_results(both, str(tmp_path / "both.png")) == str(tmp_path / "both.png")
    assert (tmp_path / "both.png").stat().st_size > 1000


def test_plot_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails as if not installed
    msgs = []
    assert bench.plot_results(_new_doc(), str(tmp_path / "x.png"), log=msgs.append) is None
    assert msgs and msgs[0].startswith("plot skipped: matplotlib is not importable")
    assert not (tmp_path / "x.png").exists()


def test_do_bench_timer_takes_the_lowest_window(monkeypatch):
    """The eager timer runs do_bench in windows and reports the lowest window median (a transient host-bound
    window must not become the method's figure), keeping every window's median."""
    import triton.testing

    medians = iter([0.31, 0.20, 0.25])
    calls = []

    def fake_do_bench(fn, warmup, rep, return_mode):
        calls.append((warmup, rep, return_mode))
        return next(medians)

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    timer = bench.DoBenchTimer(windows=3, rep=60)
    assert bench.DoBenchTimer().windows == 1
    assert timer(lambda: None) == 0.20
    assert timer.last_windows == [0.31, 0.20, 0.25]
    assert [c[2] for c in calls] == ["median"] * 3 and all(c[1] == 60 for c in calls)


def test_windows_are_taken_in_turn_and_the_lowest_is_the_figure():
    """run_case(windows=3): every timed method gets two more windows after all methods' first, in turn; its ms
    (and the rates) come from the lowest window; a method refused by its accuracy check gets none."""
    case = bench.smoke_cases()[0]
    order = []
    values = {"torch": iter([3.0, 1.0, 2.0]), "ours": iter([4.0, 5.0, 2.0])}

    def timer(fn):
        name = fn.__name__
        order.append(name)
        return next(values[name])

    def named(key, factory):
        def make(inp):
            prep = factory(inp)
            fn = prep.fn

            def call():
                return fn()
            call.__name__ = key
            prep.fn = call
            return prep
        return make

    def wrong(inp):
        return bench.Prepared(fn=lambda: torch.zeros(inp.q.shape[0], inp.q.shape[1], 512, dtype=inp.q.dtype),
                              config="zeros")

    facs = {**{k: named(k, bench.METHODS[k]) for k in ("torch", "ours")}, "page1_triton": wrong}
    rec = bench.run_case(case, ["torch", "page1_triton", "ours"], "cpu", factories=facs, timer=timer,
                         log=lambda s: None, windows=3)
    assert order == ["torch", "ours", "torch", "ours", "torch", "ours"]  # the refused method: never timed
    assert "ms" not in rec["methods"]["page1_triton"] and "ms_windows" not in rec["methods"]["page1_triton"]
    t, o = rec["methods"]["torch"], rec["methods"]["ours"]
    assert t["ms_windows"] == [3.0, 1.0, 2.0] and t["ms"] == 1.0
    assert o["ms_windows"] == [4.0, 5.0, 2.0] and o["ms"] == 2.0
    assert math.isclose(o["tflops"], case.flops / 2e-3 / 1e12)


def test_measure_read_takes_the_best_configuration_and_survives_failures(monkeypatch):
    from triton_mla_sparse.kernels import readbw

    calls = []
    monkeypatch.setattr(readbw, "read_sum", lambda x, block, iters, warps: calls.append((block, iters, warps)))
    times = {c: t for c, t in zip(bench.READ_CONFIGS, (0.6, 0.5, 0.7, 0.55))}

    def fake_do_bench(fn, return_mode):
        fn()
        if calls[-1] == bench.READ_CONFIGS[2]:
            raise RuntimeError("out of resources")
        return times[calls[-1]]

    src = torch.empty(1 << 20, dtype=torch.bfloat16)
    out = bench._measure_read(src, fake_do_bench)
    assert calls == list(bench.READ_CONFIGS)
    b, i, w = bench.READ_CONFIGS[1]
    assert out["read_ms_2GiB"] == 0.5 and out["read_config"] == f"block {b} x {i}, {w} warps"
    assert out["read_gbps"] == pytest.approx(src.numel() * 2 / 0.5e-3 / 1e9)
    assert len(out["read_errors"]) == 1 and "out of resources" in out["read_errors"][0]

    def failing(fn, return_mode):
        raise RuntimeError("no GPU")

    out = bench._measure_read(src, failing)
    assert out["read_gbps"] is None and len(out["read_errors"]) == len(bench.READ_CONFIGS)

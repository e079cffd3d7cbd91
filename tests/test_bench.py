"""CPU tests of the benchmark harness (``triton_mla_sparse.bench`` and ``triton-mla-sparse bench``): device slugs,
results paths, commit, peer loading and its reports, the JSON a run writes (tiny cases through the Triton
interpreter, with fake peer modules standing in for FlashMLA and vLLM's Triton kernel), targets, compare, plots."""

from __future__ import annotations

import json
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


def test_case_list_covers_the_issue():
    names = [c.name for c in bench.bench_cases()]
    assert len(names) == 22
    for h in (8, 16, 32, 64, 128):
        for f in ("bf16", "fp8_ds_mla"):
            assert f"decode h{h} B=64 ctx8K {f}" in names
    assert "decode h16 B=256 ctx8K bf16" in names and "decode h128 B=1 ctx64K fp8_ds_mla" in names
    for h in (8, 16, 64, 128):
        assert f"prefill h{h} T=4096 ctx32K bf16" in names
    assert all(c.topk == 2048 and c.block_size == 64 for c in bench.bench_cases())
    assert 0 < len(bench.bench_cases(quick=True)) < 10


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


def test_plot_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails as if not installed
    msgs = []
    assert bench.plot_results(_new_doc(), str(tmp_path / "x.png"), log=msgs.append) is None
    assert msgs and msgs[0].startswith("plot skipped: matplotlib is not importable")
    assert not (tmp_path / "x.png").exists()

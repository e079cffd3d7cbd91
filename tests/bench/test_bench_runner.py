"""Runs on the CPU: tiny cases through the Triton interpreter, with fake peer modules standing in for FlashMLA,
vLLM's Triton kernel and DeepGEMM; the JSON a run writes, accuracy refusals, budgets and timing windows."""

from __future__ import annotations

import json
import math

import torch
from bench_helpers import REQUIRED_CASE, REQUIRED_TOP, TIMED, _fake_deepgemm, _fake_fa3, _fake_flashmla, _fake_page1

from triton_mla_sparse import bench
from triton_mla_sparse.bench.peers import loader


def test_run_writes_the_results_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("TMS_COMMIT", "0123abc")
    calls = []
    peers = bench.Peers(modules={"flashmla": _fake_flashmla(calls), "page1": _fake_page1(), "fa3": _fake_fa3(calls)},
                        status={"page1_triton": "loaded from fake", "flashmla_bf16": "loaded from fake",
                                "flashmla_fp8": "loaded from fake", "fa3_page1": "loaded from fake"})
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
                            "page1_triton": "loaded from fake", "fa3_page1": "loaded from fake",
                            "flashmla_bf16": "loaded from fake", "flashmla_fp8": "loaded from fake"}
    assert [c["name"] for c in doc["cases"]] == ["decode h8 B=2 ctx256 fp16", "decode h32 B=2 ctx256 fp8_ds_mla"]
    for c in doc["cases"]:
        for k in REQUIRED_CASE:
            assert k in c
        assert c["kind"] in ("decode", "prefill", "indexer")
        assert set(c["methods"]) <= set(bench.METHOD_KEYS)
        for m in c["methods"].values():
            assert "error" in m or all(isinstance(m[k], float) for k in TIMED)
    fp16, fp8 = (c["methods"] for c in doc["cases"])
    assert list(fp16) == ["ours", "torch", "page1_triton", "fa3_page1"]  # flashmla_* do not apply to fp16: absent
    assert fp16["fa3_page1"]["rel_err"] < 1e-2 and ("fa3", (2, 8, 576)) in calls
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


def test_v4_decode_case_runs_ours_and_flashmla(tmp_path):
    """The DeepSeek-V4 smoke case end to end through the interpreter: ours with both caches, the lengths and the
    sink, and FlashMLA's V4 call (the fake checks its shapes: heads padded to 64, both caches [.., 1, 584]) agree
    with the reference; torch and the bf16 peers do not apply."""
    calls = []
    peers = bench.Peers(modules={"flashmla": _fake_flashmla(calls)}, status={"flashmla_fp8": "loaded from fake"})
    out = tmp_path / "v4.json"
    lines = []
    rc = bench.run_bench(cpu_smoke=True, case_filter=r"^decode v4 ", out=str(out), peers=peers, plot=False,
                         log=lines.append)
    assert rc == 0, "\n".join(lines)
    (case,) = json.loads(out.read_text())["cases"]
    assert case["kv_format"] == "fp8_ds_mla_v4" and list(case["methods"]) == ["ours", "flashmla_fp8"]
    for m in case["methods"].values():
        assert m["rel_err"] < 1e-2 and m["ms"] > 0
    assert ("kvcache_fp8_v4", (2, 1, 64, 512)) in calls


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
    monkeypatch.setattr(loader, "_vllm_installed", lambda: False)
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


def test_emulate_times_ours_portable_in_a_child_process(tmp_path):
    """--emulate: the attention cases again as ours_portable, computed in a child process (DISABLE_MMA_V3=1, its own
    Triton cache) on the same inputs, checked against the reference like every method."""
    out = tmp_path / "emu.json"
    lines = []
    rc = bench.run_bench(cpu_smoke=True, kinds="attention", case_filter=r"^decode h8 B=2 |^prefill h16 ",
                         methods=("ours",), out=str(out), peers=bench.Peers(), plot=False, emulate="sm120",
                         log=lines.append)
    assert rc == 0, "\n".join(lines)
    doc = json.loads(out.read_text())
    assert doc["emulate"] == {"family": "sm120", "instructions": "no PTX compiled (interpreter)"}
    assert "ours_portable" in doc["methods"]
    for c in doc["cases"]:
        m = c["methods"]["ours_portable"]
        assert m["emulated"] == "sm120" and m["rel_err"] < 2e-2 and m["ms"] > 0, m
        assert m["config"].startswith("sm120 table: ")
    assert any("[sm120]" in s for s in lines)  # the child's log comes back
    assert bench.run_bench(cpu_smoke=True, emulate="sm90", log=lambda s: None) == 2  # sm90 is not emulated


def test_wgmma_in_any_compiled_kernel_is_found(tmp_path):
    from triton_mla_sparse.bench.portable import wgmma_kernels

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "k1.ptx").write_text("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ...")
    (tmp_path / "k2.ptx").write_text("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 ...")
    (tmp_path / "k3.cubin").write_text("wgmma.")
    assert wgmma_kernels(str(tmp_path)) == (2, ["k2.ptx"])

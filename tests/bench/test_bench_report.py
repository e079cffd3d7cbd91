"""Reports of results documents: targets (PASS / FAIL / n/a, the read-ceiling flag), ratios, compare, the CLI's
report modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import _c, _doc, _indexer_doc, _m, _new_doc

from triton_mla_sparse import bench
from triton_mla_sparse.cli import main


@pytest.fixture(autouse=True)
def _legacy_targets(monkeypatch):
    monkeypatch.setenv("TMS_TARGETS_FILE", str(Path(__file__).with_name("legacy_targets.py")))


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
    # decode rows are judged on graph times: 0.05 / 0.07 = 0.714 > 0.70, although do_bench's 0.70 is at the limit
    assert r["ratio"] == pytest.approx(0.7) and r["graph_ratio"] == pytest.approx(0.05 / 0.07)
    assert r["basis"] == "graph" and r["status"] == "FAIL"
    r = rows[("decode h16 B=256 bf16: ours / flashmla_bf16", "decode h16 B=256 bf16")]
    assert r["basis"] == "do_bench" and "no graph time for both" in r["note"]  # eager only: judged on do_bench
    assert rows[(t7, "prefill h16 T=4096 bf16")]["basis"] == "do_bench"
    text = bench.targets_text(_new_doc())
    assert "PASS" in text and "FAIL" in text and "n/a" in text
    assert text.splitlines()[-1].startswith("8 PASS, 4 FAIL, 4 n/a")


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
    assert bench.targets_text(both).splitlines()[-1].startswith("15 PASS, 5 FAIL, 8 n/a")
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


def test_targets_file_is_found_or_reported(tmp_path, monkeypatch, capsys):
    """The targets are repository data: $TMS_TARGETS_FILE or an explicit file wins; a missing one is a clear error in
    the --targets mode (exit 2, nothing printed) and a note in compare."""
    res = tmp_path / "new.json"
    res.write_text(json.dumps(_new_doc()))
    mine = tmp_path / "targets.py"
    mine.write_text("TARGETS = [('h8 bf16: ours / torch', [({'kind': 'decode', 'heads': 8, 'kv_format': 'bf16'}, "
                    "'ours', {'kind': 'decode', 'heads': 8, 'kv_format': 'bf16'}, 'torch')], 0.5, 0.2)]\n")
    assert bench.report_main(targets=str(res), targets_file=str(mine)) == 0
    out = capsys.readouterr().out
    assert "h8 bf16: ours / torch" in out and out.rstrip().splitlines()[-1] == "1 PASS, 0 FAIL, 0 n/a; goal " \
                                                                               "met on 0 of 1 rows"
    monkeypatch.setenv("TMS_TARGETS_FILE", str(tmp_path / "none.py"))
    assert bench.report_main(targets=str(res)) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "performance targets not found" in cap.err and "none.py" in cap.err
    assert bench.report_main(compare=str(res), against=str(res)) == 0
    assert "targets: not checked: performance targets not found" in capsys.readouterr().out
    with pytest.raises(bench.TargetsNotFound):
        bench.target_rows(_new_doc())
    monkeypatch.setenv("TMS_TARGETS_FILE", str(mine))
    assert [r["target"] for r in bench.target_rows(_new_doc())] == ["h8 bf16: ours / torch"]


def test_repository_targets(monkeypatch):
    """benchmarks/targets.py holds Performance v2's rows (issue #16): decode judged on graph times, FA3 page-1 as the
    bf16 peer, the best of a named set of peers, the emulated portable path against ours."""
    repo = Path(__file__).resolve().parents[2] / "benchmarks" / "targets.py"
    monkeypatch.setenv("TMS_TARGETS_FILE", str(repo))
    doc = _doc([
        _c("decode", 16, 64, "bf16", ours=_m(0.07, 0.05), fa3_page1=_m(0.06, 0.054), flashmla_bf16=_m(0.2, 0.2)),
        _c("decode", 128, 64, "bf16", ours=_m(0.24, 0.15), fa3_page1=_m(0.08, 0.077), flashmla_bf16=_m(0.07, 0.071),
           torch=_m(0.01, 0.01), ours_portable=_m(0.6, 0.2)),
        _c("decode", 16, 64, "fp8_ds_mla", ours=_m(0.1, 0.03), flashmla_fp8=_m(0.08, 0.077)),
        _c("prefill", 8, 4096, "bf16", ours=_m(2.0), fa3_page1=_m(1.85), flashmla_bf16=_m(2.6)),
    ])
    rows = _rows(doc)
    r = rows[("decode h8 & h16 B=64 bf16: ours / fa3_page1", "decode h16 B=64 bf16")]
    assert r["basis"] == "graph" and r["graph_ratio"] == pytest.approx(0.05 / 0.054) and r["status"] == "PASS"
    assert r["ratio"] == pytest.approx(0.07 / 0.06)  # eager 1.17 would fail: the graph ratio decides
    r = rows[("decode h128 B=64 bf16: ours / best of fa3_page1, flashmla_bf16", "decode h128 B=64 bf16")]
    assert r["graph_ratio"] == pytest.approx(0.15 / 0.071) and r["status"] == "FAIL"  # torch is not in the set
    assert "best peer: flashmla_bf16" in r["note"]
    r = rows[("decode h64 & h128 B=64 bf16: ours_portable / ours", "decode h128 B=64 bf16")]
    assert r["graph_ratio"] == pytest.approx(0.2 / 0.15) and r["status"] == "PASS" and not r["goal_met"]
    r = rows[("decode h16 B=64: ours fp8 / ours bf16", "decode h16 B=64 fp8_ds_mla / bf16")]
    assert r["graph_ratio"] == pytest.approx(0.6) and r["goal_met"]
    r = rows[("prefill h8 & h16 bf16: ours / fa3_page1", "prefill h8 T=4096 bf16")]
    assert r["basis"] == "do_bench" and r["ratio"] == pytest.approx(2.0 / 1.85) and r["status"] == "FAIL"
    assert {t for t, _ in rows} >= {"decode h8 & h16 B=64 fp8: ours / flashmla_fp8",
                                    "decode h16 B=256 bf16: ours / fa3_page1",
                                    "prefill h64 & h128 bf16: ours / best peer"}
    # the ours_portable method is ours, not a peer, in the ratio table
    rr = {x["case"]: x for x in bench.ratio_rows(doc)}
    assert "ours_portable" not in rr["decode h128 B=64 bf16"]["ratios"]

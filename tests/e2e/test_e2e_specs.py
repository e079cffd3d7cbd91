"""Worker specs, the correctness matrix and the results file of the end-to-end harness."""

import json

import pytest
from e2e.matrix import OURS, PEERS, SM8X_ENV, base_spec, correctness_specs, serving_specs
from e2e.models import VARIANTS, is_v41
from e2e.results import (correctness_rows, correctness_table, merge, new_document, readme_soak_table, serving_rows,
                         serving_table, summary_table)
from e2e.schema import OURS_V4, OURS_V41, PEER_V4, PEER_V41, validate_results, validate_spec
from e2e.worker import backend_env, engine_kwargs

V41 = tuple(v for v in VARIANTS if is_v41(v))
BEFORE_V41 = tuple(v for v in VARIANTS if not is_v41(v))  # the variants of the matrix before V4.1 joined


def test_matrix_covers_the_issue():
    specs, pairs = correctness_specs("/m", variants=BEFORE_V41)
    names = {s["name"] for s in specs}
    assert len(names) == len(specs)
    for p in pairs:
        assert p["ours"] in names and p["peer"] in names
    vs_peer = [p for p in pairs if p["kind"] == "vs_peer"]
    # every variant x mode x cache, with vLLM's indexer and with ours forced; V4: fp8_ds_mla, vLLM's indexer
    assert {(p["variant"], p["mode"], p["kv_cache_dtype"], p["indexer"]) for p in vs_peer} == {
        (v, m, kv, ix) for v in ("dsv32-h128", "dsv32-h16", "glm5-h8") for m in ("eager", "graphs")
        for kv in PEERS for ix in ("vllm", "ours")} | {
        (v, m, "fp8_ds_mla", ix) for v in ("dsv4-h8", "dsv4-h64") for m in ("eager", "graphs")
        for ix in ("vllm", "ours")}
    by_name = {s["name"]: s for s in specs}
    for p in vs_peer:
        if p["variant"].startswith("dsv4"):
            o, q = by_name[p["ours"]], by_name[p["peer"]]
            assert (o["backend"], q["backend"]) == (OURS_V4, PEER_V4) and q.get("shadow_attention")
            assert o.get("count_calls") and not o.get("shadow_attention")
            assert backend_env(o) == {"TRITON_MLA_SPARSE_DSV4": "triton"}
            assert backend_env(q) == {"TRITON_MLA_SPARSE_DSV4": "off"}
            assert (o["env"].get("TRITON_MLA_SPARSE_INDEXER") == "always") == (p["indexer"] == "ours")
            same = ("variant", "mode", "kv_cache_dtype", "prompts", "max_tokens", "weights_seed", "max_model_len",
                    "max_num_batched_tokens", "capture_sizes")
            assert all(o[k] == q[k] for k in same) and o["prompts"] == [17, 300, 2500, 5000, 16000]
            continue
        o, q = by_name[p["ours"]], by_name[p["peer"]]
        assert o["backend"] == OURS and q["backend"] == PEERS[p["kv_cache_dtype"]]
        same = ("variant", "mode", "kv_cache_dtype", "prompts", "max_tokens", "weights_seed", "max_model_len")
        assert all(o[k] == q[k] for k in same)
        assert (o["env"].get("TRITON_MLA_SPARSE_INDEXER") == "always") == (p["indexer"] == "ours")
        assert o["prompts"] == [17, 300, 2500, 5000, 16000] and o["max_tokens"] >= 64
    kinds = {p["kind"] for p in pairs}
    assert {"speculative_vs_peer", "speculative_vs_plain", "soft_fp8_vs_native"} <= kinds
    assert any(s["env"].get("TRITON_MLA_SPARSE_SOFT_FP8") == "always" for s in specs)
    v4_soft = [p for p in pairs if p["kind"] == "soft_fp8_vs_native" and p["variant"].startswith("dsv4")]
    assert {p["variant"] for p in v4_soft} == {"dsv4-h8", "dsv4-h64"}
    for p in v4_soft:
        o, q = by_name[p["ours"]], by_name[p["peer"]]
        assert o["env"] == {"TRITON_MLA_SPARSE_SOFT_FP8": "always"} and q["env"] == {} and o["backend"] == q["backend"]
    # DeepSeek-V4's SM 8.x path forced (every component the plugin runs instead of vLLM's) against ours plain
    sm8x = [p for p in pairs if p["kind"] == "sm8x_vs_native"]
    assert {(p["variant"], p["mode"]) for p in sm8x} == {(v, m) for v in ("dsv4-h8", "dsv4-h64")
                                                         for m in ("eager", "graphs")}
    for p in sm8x:
        o, q = by_name[p["ours"]], by_name[p["peer"]]
        assert o["env"] == {"TRITON_MLA_SPARSE_INDEXER": "always", "TRITON_MLA_SPARSE_SOFT_FP8": "always",
                            "TRITON_MLA_SPARSE_DSV4_PORTABLE": "always"} and q["env"] == {}
        assert o["backend"] == q["backend"] == OURS_V4 and o.get("count_calls")
        assert o["mode"] == q["mode"] == p["mode"] and bool(o.get("shadow_portable")) == (p["mode"] == "eager")


def test_matrix_adds_v41_runs_and_pairs():
    """V4.1 variants add per mode vLLM's V4.1 FlashMLA layer (shadowed), our V4.1 layer and ours with everything SM
    8.x runs forced (eager: each portable call shadowed), compared ours vs the peer and SM 8.x vs ours, plus the
    eager-vs-graphs yardsticks; the runs and pairs of the other variants stay as they were."""
    specs, pairs = correctness_specs("/m")
    before_specs, before_pairs = correctness_specs("/m", variants=BEFORE_V41)
    assert [s for s in specs if not is_v41(s["variant"])] == before_specs
    assert [p for p in pairs if not is_v41(p["variant"])] == before_pairs
    by_name = {s["name"]: s for s in specs}
    v41_specs = {s["name"] for s in specs if is_v41(s["variant"])}
    assert v41_specs == {f"{v}-{m}-fp8_ds_mla-{who}" for v in V41 for m in ("eager", "graphs")
                         for who in ("peer", "ours", "ours-sm8x")}
    v41_pairs = [p for p in pairs if is_v41(p["variant"])]
    assert sorted((p["variant"], p["kind"], p["mode"], p["indexer"]) for p in v41_pairs) == sorted(
        [(v, k, m, ix) for v in V41 for m in ("eager", "graphs")
         for k, ix in (("vs_peer", "vllm"), ("sm8x_vs_native", "ours"))]
        + [(v, f"{who}_eager_vs_graphs", "eager~graphs", "vllm") for v in V41 for who in ("peer", "ours")])
    for p in v41_pairs:
        o, q = by_name[p["ours"]], by_name[p["peer"]]
        assert o["kv_cache_dtype"] == q["kv_cache_dtype"] == p["kv_cache_dtype"] == "fp8_ds_mla"
        same = ("variant", "prompts", "max_tokens", "weights_seed", "max_model_len", "max_num_batched_tokens",
                "capture_sizes")
        assert all(o[k] == q[k] for k in same) and o["prompts"] == [17, 300, 2500, 5000, 16000]
        if p["kind"] == "vs_peer":
            assert (o["backend"], q["backend"]) == (OURS_V41, PEER_V41) and o["env"] == q["env"] == {}
            assert q.get("shadow_attention") and o.get("count_calls") and not o.get("shadow_attention")
            assert bool(o.get("shadow_indexer")) == (p["mode"] == "eager")  # vLLM's indexer active: ours shadows it
            assert backend_env(o) == {"TRITON_MLA_SPARSE_DSV4": "triton"}
            assert backend_env(q) == {"TRITON_MLA_SPARSE_DSV4": "off"}
        elif p["kind"] == "sm8x_vs_native":
            assert o["backend"] == q["backend"] == OURS_V41 and o["env"] == SM8X_ENV and q["env"] == {}
            assert o["mode"] == q["mode"] == p["mode"] and o.get("count_calls")
            assert bool(o.get("shadow_portable")) == (p["mode"] == "eager")


def test_engine_kwargs_per_family():
    """What each engine asks vLLM for: V4 and V4.1 layers pick their page sizes, ours on them is chosen by the switch
    (no backend named), V4.1's multimodal architecture runs its language model only."""
    def kwargs(variant, backend, kv="fp8_ds_mla", mode="graphs"):
        spec = base_spec("x", variant=variant, backend=backend, kv=kv, mode=mode, model_root="/m")
        return engine_kwargs(spec, "/m/x")

    v3 = kwargs("glm5-h8", OURS, kv="bfloat16", mode="eager")
    assert v3["block_size"] == 64 and v3["attention_config"] == {"backend": OURS} and v3["enforce_eager"]
    assert "language_model_only" not in v3 and "cudagraph_capture_sizes" not in v3
    for variant, ours, peer in (("dsv4-h8", OURS_V4, PEER_V4), ("dsv41-h8", OURS_V41, PEER_V41)):
        o, q = kwargs(variant, ours), kwargs(variant, peer)
        assert "block_size" not in o and "attention_config" not in o and q["attention_config"] == {"backend": peer}
        assert o.get("language_model_only") == q.get("language_model_only") == (True if is_v41(variant) else None)
        assert o["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 32] and o["kv_cache_dtype"] == "fp8_ds_mla"


def test_serving_specs():
    specs = serving_specs("/m")
    assert {(s["variant"], s["backend"]) for s in specs} == {
        (v, b) for v in ("dsv32-h16", "dsv32-h128") for b in (OURS, *PEERS.values())}
    assert all(s["serving"]["contexts"] == [8192, 32768] and s["mode"] == "graphs" for s in specs)
    v4 = serving_specs("/m", variants=("dsv4-h8", "dsv4-h64"))
    assert {(s["variant"], s["backend"], s["kv_cache_dtype"]) for s in v4} == {
        (v, b, "fp8_ds_mla") for v in ("dsv4-h8", "dsv4-h64") for b in (OURS_V4, PEER_V4)}
    v41 = serving_specs("/m", variants=V41)
    assert {(s["variant"], s["backend"], s["kv_cache_dtype"]) for s in v41} == {
        (v, b, "fp8_ds_mla") for v in V41 for b in (OURS_V41, PEER_V41)}


def test_v4_variants_take_v4_backends_only():
    base_spec("x", variant="dsv4-h8", backend=OURS_V4, kv="fp8_ds_mla", mode="eager", model_root="/m")
    for variant, backend, kv, msg in (("dsv4-h8", OURS, "fp8_ds_mla", "cannot run"),
                                      ("glm5-h8", PEER_V4, "fp8_ds_mla", "cannot run"),
                                      ("dsv4-h64", PEER_V4, "bfloat16", "fp8_ds_mla")):
        with pytest.raises(ValueError, match=msg):
            base_spec("x", variant=variant, backend=backend, kv=kv, mode="eager", model_root="/m")


def test_v41_variants_take_v41_backends_only():
    for backend in (OURS_V41, PEER_V41):
        base_spec("x", variant="dsv41-h8", backend=backend, kv="fp8_ds_mla", mode="graphs", model_root="/m")
    for variant, backend, kv, msg in (("dsv41-h8", OURS_V4, "fp8_ds_mla", "cannot run"),
                                      ("dsv41-h8", PEER_V4, "fp8_ds_mla", "cannot run"),
                                      ("dsv41-h64", OURS, "fp8_ds_mla", "cannot run"),
                                      ("dsv4-h8", OURS_V41, "fp8_ds_mla", "cannot run"),
                                      ("glm5-h8", PEER_V41, "fp8_ds_mla", "cannot run"),
                                      ("dsv41-h8", PEER_V41, "bfloat16", "fp8_ds_mla")):
        with pytest.raises(ValueError, match=msg):
            base_spec("x", variant=variant, backend=backend, kv=kv, mode="eager", model_root="/m")


def test_validate_spec_names_the_field():
    good = base_spec("x", variant="glm5-h8", backend=OURS, kv="bfloat16", mode="eager", model_root="/m")
    for key, value, msg in (("backend", "FLASHINFER", "backend"), ("mode", "graph", "mode"),
                            ("max_tokens", 0, "max_tokens"), ("max_model_len", 100, "max_model_len"),
                            ("weights_std", 1, "weights_std")):
        with pytest.raises(ValueError, match=msg):
            validate_spec({**good, key: value})
    with pytest.raises(ValueError, match="fp8_ds_mla"):
        validate_spec({**good, "backend": "FLASHMLA_SPARSE"})
    bad = dict(good)
    del bad["seed"]
    with pytest.raises(ValueError, match="seed"):
        validate_spec(bad)


def _worker_result(spec, tokens, ok=True):
    prompts = [{"length": n, "tokens": tokens, "first_logprobs": {"3": -0.5}, "top2_margins": []}
               for n in spec["prompts"]]
    return {"ok": ok, "spec": spec, "prompts": prompts, "calls": {"prefill_calls": 2},
            "weights": {"checksum": 12.5}} if ok else \
        {"ok": False, "spec": spec, "error": "RuntimeError: boom"}


def test_rows_merge_and_tables(tmp_path):
    specs, pairs = correctness_specs("/m", variants=("glm5-h8",), modes=("eager",))
    results = {s["name"]: _worker_result(s, [1, 2, 3]) for s in specs}
    broken = pairs[0]["peer"]
    results[broken] = _worker_result(specs[0], [], ok=False)
    rows = correctness_rows(pairs, results)
    uses_broken = [broken in (p["ours"], p["peer"]) for p in pairs]
    assert [not r["ok"] for r in rows] == uses_broken and sum(uses_broken) >= 2
    assert all(r["all_identical"] and r["same_weights"] for r in rows if r["ok"])
    assert [r for r in rows if r["kind"] == "vs_peer"][-1]["calls"] == {"prefill_calls": 2}
    serve = {"serve-a": {"ok": True, "spec": specs[0], "start_s": 1.0,
                         "serving": [{"context": 8192, "ttft_ms": 5.0, "tpot_ms": 1.0, "decode_tok_s": 900.0,
                                      "batch": 32, "batch_latency_s": 2.0}]}}
    env = {"gpu": "NVIDIA H200", "versions": {"vllm": "0.33.0", "torch": "2.11", "triton": "3.6.0"}}
    (tmp_path / "c.json").write_text(json.dumps({"environment": env, "correctness": rows}))
    (tmp_path / "s.json").write_text(json.dumps({"environment": env, "serving": serving_rows(serve)}))
    (tmp_path / "k.json").write_text(json.dumps({"soak": [{"name": "ours", "backend": OURS, "ok": False,
                                                            "error": "TimeoutError: x"}]}))
    doc = merge(new_document(commit="abc", gpu="NVIDIA H200", versions=env["versions"]),
                [tmp_path / "c.json", tmp_path / "s.json", tmp_path / "k.json"])
    table = correctness_table(doc)
    assert "failed: RuntimeError: boom" in table and "3/3" in table
    assert "| 8192 | 5.0 | 1.00 | 900 (32) |" in serving_table(doc)
    summary = summary_table(doc)
    assert "| glm5-h8 | fp8_ds_mla (FLASHMLA_SPARSE) | ours | eager | 5/5 | 3 of 3 (prompt 17) | 0.000 |" in summary
    assert summary.count("failed") == 2  # the two vs_peer rows of the broken peer
    with pytest.raises(ValueError, match="schema"):
        validate_results({**doc, "schema": 0})
    assert "| ours | TRITON_MLA_SPARSE | — | — | failed: TimeoutError: x | | | | no |" in readme_soak_table(doc)
    with pytest.raises(ValueError, match="soak"):
        validate_results({**doc, "soak": {"ok": True, "requests": 3}})
    with pytest.raises(ValueError, match="soak run"):
        validate_results({**doc, "soak": [{"name": "x", "backend": OURS, "ok": True, "requests": 3}]})


def test_run_pool_records_failures(tmp_path):
    """The pool's plumbing with a real worker process: on a machine without a GPU engine the run fails, and the
    failure is a result with the error, not an exception."""
    from e2e.matrix import run_pool

    spec = base_spec("cpu-run", variant="glm5-h8", backend=OURS, kv="bfloat16", mode="eager",
                     model_root=str(tmp_path / "m"))
    out = run_pool([spec], tmp_path / "runs", parallel=1, timeout_s=120, log=open(tmp_path / "log", "w"))
    error = out["cpu-run"]["error"]
    assert out["cpu-run"]["ok"] is False
    # no vLLM here (CPU tier), or vLLM without a GPU: the engine's own error, not one of the harness's
    assert "No module named 'vllm'" in error or "evice" in error, error
    assert json.loads((tmp_path / "runs" / "cpu-run.spec.json").read_text()) == spec
    assert "cpu-run" in (tmp_path / "log").read_text()


def test_committed_results_files_validate():
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob("e2e-*.json"))
    assert files, "no committed e2e results file"
    for path in files:
        doc = validate_results(json.loads(path.read_text()))
        assert doc.get("correctness") or doc.get("serving"), path.name
        if any(not r["variant"].startswith("dsv4") for r in doc.get("correctness", [])):  # V3.2 / GLM-5 runs
            assert "soak" in doc


def test_readme_tables_are_the_committed_results():
    """The README's "Proven in vLLM" tables are generated from the newest committed results file holding them, not
    retyped (file names sort by date; a day's later run takes a letter after the date)."""
    from pathlib import Path

    from e2e.results import readme_correctness_table, readme_serving_table, readme_soak_table

    from e2e.models import is_v4, is_v41
    from e2e.results import readme_v41_table, readme_v4_serving_table, readme_v4_table

    root = Path(__file__).resolve().parents[2]
    docs = [(path, json.loads(path.read_text())) for path in sorted((root / "benchmarks" / "results").glob("e2e-*.json"))]
    readme = (root / "README.md").read_text()
    def family(variant: str) -> str:
        return "v4" if is_v4(variant) else "v41" if is_v41(variant) else "v3"

    def newest(section: str, want: str) -> dict:
        """The newest file whose ``section`` has rows of ``want`` (v3: V3.2 / GLM-5, v4, v41), named in the README."""
        path, doc = [(p, d) for p, d in docs if any(family(r["variant"]) == want for r in d.get(section, []))][-1]
        assert path.name in readme, path.name
        return doc

    # the V3.2 / GLM-5 tables from the newest file with those models, the V4 / V4.1 tables from the newest with them
    doc = newest("correctness", "v3")
    assert readme_correctness_table(doc) in readme
    assert readme_serving_table(doc) in readme
    assert readme_soak_table(doc) in readme
    table = readme_v4_table(newest("correctness", "v4"))
    assert table in readme and "DSV4 h64 | graphs" in table
    table = readme_v4_serving_table(newest("serving", "v4"))
    assert table in readme and "DSV4 h64 | FLASHMLA_SPARSE_DSV4" in table
    table = readme_v41_table(newest("correctness", "v41"))
    assert table in readme and "DSV4.1 h64 | graphs" in table and "100% of" in table


def _v4_run(backend, **extra):
    spec = base_spec("r", variant="dsv4-h8", backend=backend, kv="fp8_ds_mla", mode="eager", model_root="/m",
                     **({"count_calls": True} if backend == OURS_V4 else {"shadow_attention": True}))
    layer = "DeepseekV4TritonMLAAttention" if backend == OURS_V4 else "DeepseekV4FlashMLAAttention"
    run = {"ok": True, "spec": spec, "layers": {layer: 3}}
    if backend == OURS_V4:
        run["calls"] = {"calls": 5}
    else:
        run["attention_shadow"] = {"calls": 4, "error_count": 0, "errors": [],
                                   "by": {"window-prefill": {"calls": 1, "rows": 9, "max_rel": 1e-3, "max_abs": 1e-3,
                                                             "nonfinite": 0}}}
    run.update(extra)
    return run


def test_v4_pairs_count_only_with_the_expected_layers_and_a_clean_shadow():
    from e2e.results import v4_checks

    assert v4_checks(_v4_run(OURS_V4)) == [] and v4_checks(_v4_run(PEER_V4)) == []
    bad = {
        "layers": _v4_run(OURS_V4, layers={"DeepseekV4FlashMLAAttention": 3}),  # the routing did not take
        "no calls": _v4_run(OURS_V4, calls={"calls": 0}),
        "shadow idle": _v4_run(PEER_V4, attention_shadow={"calls": 0, "error_count": 0, "by": {}}),
        "shadow errors": _v4_run(PEER_V4, attention_shadow={"calls": 3, "error_count": 1, "errors": ["x"], "by": {}}),
        "non-finite": _v4_run(PEER_V4, attention_shadow={"calls": 3, "error_count": 0, "by": {
            "c4a-decode": {"calls": 3, "rows": 3, "max_rel": 0.0, "max_abs": 0.0, "nonfinite": 2}}}),
    }
    forced = _v4_run(OURS_V4, indexers={"triton": 1, "vllm": 0})
    forced["spec"] = {**forced["spec"], "env": {"TRITON_MLA_SPARSE_INDEXER": "always"}}
    assert v4_checks(forced) == []
    assert v4_checks({**forced, "indexers": {"triton": 0, "vllm": 1}}), "our indexer forced but vLLM's ran"
    soft = _v4_run(OURS_V4, soft_fp8={"installed": True, "mode": "always"})
    soft["spec"] = {**soft["spec"], "env": {"TRITON_MLA_SPARSE_SOFT_FP8": "always"}}
    assert v4_checks(soft) == []
    assert v4_checks({**soft, "soft_fp8": {"installed": False, "mode": "off"}}), "casts forced but no router"
    counts = {"prenorm_calls": 2, "prenorm_captured": 0, "compress_calls": 0, "compress_captured": 4,
              "indexer_q_calls": 1, "indexer_q_captured": 0, "installed": True, "cutedsl_routes": True}
    port = _v4_run(OURS_V4, portable=counts)
    port["spec"] = {**port["spec"], "env": {"TRITON_MLA_SPARSE_DSV4_PORTABLE": "always"}}
    assert v4_checks(port) == []
    for what in ("prenorm", "compress", "indexer_q"):
        idle = {**counts, f"{what}_calls": 0, f"{what}_captured": 0}
        assert v4_checks({**port, "portable": idle}) == [f"portable {what} forced, yet not called: {idle}"]
    for flag in ("installed", "cutedsl_routes"):
        assert v4_checks({**port, "portable": {**counts, flag: False}}), f"portable forced, {flag} False"
    # with the shadow: every component compared, no shadow error
    shadow = {"prenorm_out": {"calls": 2}, "compress_bytes": {"calls": 3}, "indexer_q_values": {"calls": 1}}
    shadowed = {**port, "spec": {**port["spec"], "shadow_portable": True},
                "portable": {**counts, "shadow": shadow, "shadow_errors": [], "shadow_error_count": 0}}
    assert v4_checks(shadowed) == []
    assert v4_checks({**shadowed, "portable": {**shadowed["portable"], "shadow_error_count": 2}})
    for what in shadow:
        idle = {**shadow, what: {"calls": 0}}
        assert v4_checks({**shadowed, "portable": {**shadowed["portable"], "shadow": idle}}) == \
            [f"the portable shadow compared no {what} call"]
    for what, run in bad.items():
        assert v4_checks(run), what
    prompts = [{"length": 17, "tokens": [1, 2], "first_logprobs": {"1": -0.5}, "top2_margins": [0.1, 0.1]}]
    good = {"o": {**_v4_run(OURS_V4), "prompts": prompts}, "p": {**_v4_run(PEER_V4), "prompts": prompts}}
    pair = {"kind": "vs_peer", "variant": "dsv4-h8", "mode": "eager", "kv_cache_dtype": "fp8_ds_mla",
            "indexer": "vllm", "ours": "o", "peer": "p"}
    assert correctness_rows([pair], good)[0]["ok"]
    row = correctness_rows([pair], {**good, "o": {**bad["layers"], "prompts": prompts}})[0]
    assert not row["ok"] and "attention layers" in row["errors"]["checks"]


def test_v41_checks_expect_v41_layers_and_its_portable_component():
    """A V4.1 pair counts with V4.1's layer classes; with the portable components forced it expects V4.1's one
    (the indexer q: the routes installed, the prenorm hook need not be) and, shadowed, that one compared."""
    from e2e.results import v4_checks

    def run(backend, layer, **extra):
        spec = base_spec("r", variant="dsv41-h8", backend=backend, kv="fp8_ds_mla", mode="eager", model_root="/m",
                         **({"count_calls": True} if backend == OURS_V41 else {}))
        return {"ok": True, "spec": spec, "layers": {layer: 5}, "calls": {"calls": 4}, **extra}

    assert v4_checks(run(OURS_V41, "DeepseekV41TritonMLAAttention")) == []
    assert v4_checks(run(PEER_V41, "DeepseekV4FlashMLAAttention")) == []
    assert v4_checks(run(OURS_V41, "DeepseekV4FlashMLAAttention")), "the routing did not take"
    assert v4_checks(run(OURS_V41, "DeepseekV41TritonMLAAttention", calls={"calls": 0}))
    counts = {"prenorm_calls": 0, "prenorm_captured": 0, "compress_calls": 0, "compress_captured": 0,
              "indexer_q_calls": 3, "indexer_q_captured": 0, "installed": False, "cutedsl_routes": True}
    forced = run(OURS_V41, "DeepseekV41TritonMLAAttention", portable=counts, indexers={"triton": 3, "vllm": 0},
                 soft_fp8={"installed": True, "mode": "always"})
    forced["spec"] = {**forced["spec"], "env": dict(SM8X_ENV), "shadow_portable": True}
    forced["portable"] = {**counts, "shadow": {"indexer_q_values": {"calls": 3}}, "shadow_errors": [],
                          "shadow_error_count": 0}
    assert v4_checks(forced) == []
    assert v4_checks({**forced, "portable": {**forced["portable"], "indexer_q_calls": 0}})
    assert v4_checks({**forced, "portable": {**forced["portable"], "cutedsl_routes": False}})
    assert v4_checks({**forced, "portable": {**forced["portable"], "shadow": {}}}) == \
        ["the portable shadow compared no indexer_q_values call"]
    assert v4_checks({**forced, "indexers": {"triton": 2, "vllm": 1}}), "our indexer forced but vLLM's ran"
    shadowed = run(OURS_V41, "DeepseekV41TritonMLAAttention")
    shadowed["spec"] = {**shadowed["spec"], "shadow_indexer": True}
    good = {"steps": 9, "rows": 40, "error_count": 0, "errors": [], "candidates": {"rows": 12}}
    assert v4_checks({**shadowed, "indexer_shadow": good}) == []
    assert v4_checks(shadowed), "no indexer shadow recorded"
    assert v4_checks({**shadowed, "indexer_shadow": {**good, "error_count": 2}})
    assert v4_checks({**shadowed, "indexer_shadow": {**good, "candidates": {"rows": 0}}}) == \
        ["the indexer shadow compared no candidate-block row"]


def test_shadow_errors_measure_the_real_heads_and_rows():
    import torch
    from e2e.worker import shadow_errors

    theirs = torch.randn(6, 8, 512)
    mine = theirs.clone()
    mine[2, 1] *= 1.01  # 1 % on one (row, head) vector
    mine[5, 7] = float("nan")  # outside the compared heads
    got = shadow_errors(mine, theirs, 4, slice(0, 5))
    assert got["nonfinite"] == 0 and abs(got["max_rel"] - 0.01) < 1e-4
    assert shadow_errors(mine, theirs, 8, slice(0, 6))["nonfinite"] == 512
    assert shadow_errors(mine, theirs, 8, slice(3, 3)) == {"max_rel": 0.0, "max_abs": 0.0, "nonfinite": 0}


def test_v4_counter_counts_the_measured_calls_only(monkeypatch):
    import torch
    from e2e.worker import V4CallCounter

    from triton_mla_sparse.integrations.vllm import v4_attention

    seen = []
    monkeypatch.setattr(v4_attention, "run_v4_attention", lambda q, output, **kw: seen.append(q.shape[0]))
    counter = V4CallCounter()
    counter.install()
    q = torch.zeros(3, 8, 512)
    lens = torch.tensor([5, 512, 7])
    v4_attention.run_v4_attention(q, q, swa_indices=torch.zeros(3, 128), swa_lens=torch.tensor([1, 2, 3]))
    assert seen == [3] and counter.stats["calls"] == 0  # a warm-up call: passed through, not counted
    counter.active = True
    v4_attention.run_v4_attention(q, q, swa_indices=torch.zeros(3, 128), swa_lens=torch.tensor([1, 128, 3]),
                                  extra_cache=q, extra_indices=torch.zeros(3, 512), extra_lens=lens)
    s = counter.stats
    assert (s["calls"], s["rows"], s["extra_calls"], s["max_valid_window"], s["max_valid_extra"]) == (1, 3, 1, 128, 512)


# ------------------------------------------------------------------ several GPUs: the parallel layout, the workers

PAR = {"tensor_parallel_size": 2, "enable_expert_parallel": False, "executor": "mp"}


def test_parallel_specs_and_engine_kwargs():
    """``parallel`` reaches vLLM's engine arguments; hooks that wrap driver-process code are refused with worker
    processes (they would count nothing); bad layouts name the field."""
    spec = base_spec("p", variant="dsv32-h16", backend=OURS, kv="bfloat16", mode="graphs", model_root="/m",
                     parallel=dict(PAR))
    kw = engine_kwargs(spec, "/m/x")
    assert (kw["tensor_parallel_size"], kw["enable_expert_parallel"], kw["distributed_executor_backend"]) == \
        (2, False, "mp") and "data_parallel_size" not in kw
    assert "tensor_parallel_size" not in engine_kwargs(base_spec("q", variant="dsv32-h16", backend=OURS,
                                                                 kv="bfloat16", mode="graphs", model_root="/m"), "/x")
    uni = base_spec("u", variant="dsv32-h16", backend=OURS, kv="bfloat16", mode="eager", model_root="/m",
                    parallel={**PAR, "tensor_parallel_size": 1, "executor": "uni"}, count_calls=True)
    assert "distributed_executor_backend" not in engine_kwargs(uni, "/x")  # one process: the hooks see it all
    with pytest.raises(ValueError, match=r"\['count_calls'\] hook the driver process only"):
        base_spec("p", variant="dsv32-h16", backend=OURS, kv="bfloat16", mode="eager", model_root="/m",
                  parallel=dict(PAR), count_calls=True)
    for bad, match in (({**PAR, "executor": "ray"}, "executor must be one of"),
                       ({**PAR, "tensor_parallel_size": 0}, "must be >= 1"),
                       ({**PAR, "executor": "uni"}, "runs its ranks in worker processes"),
                       ({**PAR, "data_parallel_size": 2}, r"unknown fields \['data_parallel_size'\]"),
                       ({k: v for k, v in PAR.items() if k != "executor"}, "executor")):
        with pytest.raises(ValueError, match=match):
            base_spec("p", variant="dsv32-h16", backend=OURS, kv="bfloat16", mode="eager", model_root="/m",
                      parallel=bad)


def test_worker_checks_read_every_worker():
    from e2e.results import worker_checks

    spec = base_spec("p", variant="dsv32-h16", backend=OURS, kv="bfloat16", mode="graphs", model_root="/m",
                     parallel=dict(PAR))
    good = [{"pid": 10 + r, "backend_registered": True, "tp": [r, 2]} for r in range(2)]
    assert worker_checks({"spec": spec, "workers": good}) == []
    assert worker_checks({"spec": spec}) == []  # a run from before the workers were recorded
    assert worker_checks({"spec": spec, "workers": good[:1]}) == ["1 worker reports for tensor_parallel_size 2",
                                                                 "tensor-parallel ranks [[0, 2]], expected 0 … 1 "
                                                                 "of 2"]
    unregistered = [good[0], {**good[1], "backend_registered": False}]
    assert worker_checks({"spec": spec, "workers": unregistered}) == [
        "the plugin's backend is not registered in worker processes [11]"]
    one = base_spec("o", variant="dsv32-h16", backend=OURS, kv="bfloat16", mode="graphs", model_root="/m")
    assert worker_checks({"spec": one, "workers": [{"pid": 1, "backend_registered": True}]}) == []
    # a pair is not ok when a worker of either run lacks the plugin
    runs = {"a": {"ok": True, "spec": spec, "workers": unregistered}, "b": {"ok": True, "spec": spec,
                                                                           "workers": good}}
    row = correctness_rows([{"kind": "vs_peer", "variant": "dsv32-h16", "mode": "graphs", "kv_cache_dtype": "bfloat16",
                             "indexer": "vllm", "ours": "a", "peer": "b"}], runs)[0]
    assert not row["ok"] and "not registered" in row["errors"]["checks"]


def test_process_state_reads_this_process():
    """The probe each worker runs: the plugin's registration as this process holds it (vLLM tier)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        pytest.skip("vLLM is not installed (its tier: tests/e2e in the vLLM virtual environment)")
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {bench!r})
        from e2e.weights import process_state
        before = process_state()
        from triton_mla_sparse.integrations.vllm import register
        register()
        print(json.dumps([before, process_state()]))
    """)
    env = {**os.environ, "TRITON_MLA_SPARSE_INDEXER": "always"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after = json.loads([x for x in proc.stdout.splitlines() if x.startswith("[")][-1])
    assert not before["backend_registered"] and not before["indexer_registered"]
    assert after["backend_registered"] and after["indexer_registered"] and after["pid"] == before["pid"]
    assert "groups_error" in after  # no parallel groups outside an engine


def test_parallel_specs_pair_ours_with_the_peer_per_size():
    from e2e.matrix import NCCL_ENV, parallel_specs
    from e2e.models import model_config

    specs, pairs = parallel_specs("/m", tp_sizes=(1, 2, 8))
    by = {sp["name"]: sp for sp in specs}
    assert len(by) == len(specs) == 2 * len(pairs) == 2 * 3 * 2 * len(PEERS)
    for p in pairs:
        o, q = by[p["ours"]], by[p["peer"]]
        t = p["tensor_parallel_size"]
        assert o["parallel"] == q["parallel"] == {"tensor_parallel_size": t, "enable_expert_parallel": False,
                                                  "executor": "mp"}
        assert o["env"] == q["env"] == NCCL_ENV and o["mode"] == q["mode"] == "graphs"
        assert (o["backend"], q["backend"]) == (OURS, PEERS[p["kv_cache_dtype"]])
        assert not any(o.get(k) for k in ("count_calls", "shadow_indexer", "shadow_attention"))
    # the model of a t-way run gives each GPU the variant's heads
    one = model_config("dsv32-h16", max_position_embeddings=40960)
    eight = model_config("dsv32-h16", max_position_embeddings=40960, tensor_parallel_size=8)
    assert (one["num_attention_heads"], eight["num_attention_heads"]) == (16, 128)
    assert {k: v for k, v in eight.items() if "heads" not in k} == {k: v for k, v in one.items() if "heads" not in k}
    assert parallel_specs("/m", tp_sizes=(2,), expert_parallel=True)[0][0]["parallel"]["enable_expert_parallel"]
    with pytest.raises(ValueError, match="DeepSeek-V4"):
        parallel_specs("/m", tp_sizes=(2,), variants=("dsv4-h8",))


def test_indexer_shadow_keeps_spread_rows_up_to_the_cap():
    import torch
    from e2e.worker import IndexerShadow

    sh = IndexerShadow()
    sh.rows_per_step, sh.max_rows = 3, 5
    theirs = torch.arange(20).reshape(10, 2)
    sh.keep(torch.arange(10), theirs, theirs + 100, sh.rows)
    assert [a for a, _ in sh.rows] == [[0, 1], [8, 9], [18, 19]]  # rows 0, 4, 9: evenly spaced, first and last
    assert sh.rows[0][1] == [100, 101]
    sh.keep(torch.tensor([2, 3, 7]), theirs, theirs, sh.rows)
    assert len(sh.rows) == 5 and sh.rows[-1][0] == [6, 7]  # capped at max_rows

"""Sections of the results file from worker results, the merged document, and its tables (pure Python)."""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

from .compare import compare_runs
from .models import is_v41, uses_v4_layer
from .schema import OURS, OURS_LAYERS, OURS_V4, OURS_V41, PEER_V4, PEER_V41, PEERS, SCHEMA_VERSION, validate_results


#: The attention layer class each side of a DeepSeek-V4 / V4.1 pair must have built for every layer (vLLM's V4.1
#: FlashMLA class has V4's name, in ``vllm.models.deepseek_v41.nvidia.flashmla``).
V4_LAYER = {OURS_V4: "DeepseekV4TritonMLAAttention", PEER_V4: "DeepseekV4FlashMLAAttention",
            OURS_V41: "DeepseekV41TritonMLAAttention", PEER_V41: "DeepseekV4FlashMLAAttention"}
#: The portable components ``TRITON_MLA_SPARSE_DSV4_PORTABLE=always`` runs per model, and the shadow entry that
#: compares each with vLLM's kernel: V4.1 calls V4's indexer-q function only (its mHC prenorm is TileLang's or
#: DeepGEMM's, its compressor Triton), so the plugin installs the CuTeDSL routes for it, not the prenorm hook.
PORTABLE = {"v4": (("prenorm", "prenorm_out"), ("compress", "compress_bytes"), ("indexer_q", "indexer_q_values")),
            "v41": (("indexer_q", "indexer_q_values"),)}


def v4_checks(run: dict[str, Any]) -> list[str]:
    """What a DeepSeek-V4 or V4.1 run must show to count (empty: all of it): every attention layer of its backend's
    class; ours: calls through our layer (and, with our indexer forced, every indexer ours; with the software casts
    forced, their router installed; with the portable components forced, those of :data:`PORTABLE` run by the
    portable code — V4: the mHC prenorm, the compressor and the indexer q; V4.1: the indexer q — and with
    ``shadow_portable`` each of them compared with vLLM's kernel without error; with ``shadow_indexer`` our indexer
    op recomputing vLLM's steps without error, on V4.1 candidate blocks included); FlashMLA's with the attention
    shadow: shadowed calls, no error, no non-finite."""
    spec = run.get("spec", {})
    backend = spec.get("backend")
    v41 = spec.get("variant") is not None and is_v41(spec["variant"])
    problems = []
    layers = run.get("layers") or {}
    if not layers or set(layers) != {V4_LAYER.get(backend)}:
        problems.append(f"attention layers {layers} are not all {V4_LAYER.get(backend)}")
    if backend in OURS_LAYERS and spec.get("count_calls") and not (run.get("calls") or {}).get("calls"):
        problems.append("no call went through our layer")
    indexers = run.get("indexers") or {}
    if spec.get("env", {}).get("TRITON_MLA_SPARSE_INDEXER") == "always" and \
            not (indexers.get("triton") and not indexers.get("vllm")):
        problems.append(f"indexers {indexers}: ours forced, yet not every indexer is ours")
    port = run.get("portable") or {}
    components = PORTABLE["v41" if v41 else "v4"]
    if spec.get("env", {}).get("TRITON_MLA_SPARSE_DSV4_PORTABLE") == "always":
        for what, _ in components:
            if not port.get(f"{what}_calls", 0) + port.get(f"{what}_captured", 0):
                problems.append(f"portable {what} forced, yet not called: {port}")
        if not ((port.get("installed") or v41) and port.get("cutedsl_routes")):  # V4.1: the routes only
            problems.append(f"portable components forced, yet not installed: {port}")
    if spec.get("shadow_portable"):  # each portable component compared with vLLM's kernel, without error
        shadow = port.get("shadow") or {}
        for _, what in components:
            if not (shadow.get(what) or {}).get("calls"):
                problems.append(f"the portable shadow compared no {what} call")
        if port.get("shadow_error_count", 1):
            problems.append(f"the portable shadow failed {port.get('shadow_error_count')} times: "
                            f"{port.get('shadow_errors')}")
    soft = run.get("soft_fp8") or {}
    if spec.get("env", {}).get("TRITON_MLA_SPARSE_SOFT_FP8") == "always" and \
            not (soft.get("installed") and soft.get("mode") == "always"):
        problems.append(f"software e4m3 casts forced, yet the router is {soft}")
    if spec.get("shadow_attention"):
        sh = run.get("attention_shadow") or {}
        if not sh.get("calls"):
            problems.append("the attention shadow compared no call")
        if sh.get("error_count"):
            problems.append(f"the attention shadow failed {sh['error_count']} times: {sh.get('errors')}")
        if any(e.get("nonfinite") for e in (sh.get("by") or {}).values()):
            problems.append("the attention shadow saw non-finite outputs of ours")
    if spec.get("shadow_indexer"):  # V4.1: our indexer op recomputed vLLM's steps, candidate blocks included
        sh = run.get("indexer_shadow") or {}
        if not sh.get("rows") or sh.get("error_count", 1):
            problems.append(f"the indexer shadow compared {sh.get('rows')} rows with {sh.get('error_count')} "
                            f"errors: {sh.get('errors')}")
        if v41 and not (sh.get("candidates") or {}).get("rows"):
            problems.append("the indexer shadow compared no candidate-block row")
    return problems


def worker_checks(run: dict[str, Any]) -> list[str]:
    """What a run's worker processes must show (empty: all of it; a run without ``workers``, from before they were
    recorded, passes): one entry per tensor-parallel rank of its engine, each with the plugin registered in that
    process (read there: the backend name pointing at our class) and, where the spec names a parallel layout, the
    tensor-parallel ranks 0 … size - 1 of that size."""
    workers = run.get("workers")
    if workers is None:
        return []
    par = run.get("spec", {}).get("parallel") or {"tensor_parallel_size": 1}
    tp = par["tensor_parallel_size"]
    problems = []
    if len(workers) != tp:
        problems.append(f"{len(workers)} worker reports for tensor_parallel_size {tp}")
    missing = [w.get("pid") for w in workers if not w.get("backend_registered")]
    if missing:
        problems.append(f"the plugin's backend is not registered in worker processes {missing}")
    if "parallel" in run.get("spec", {}) and sorted(tuple(w.get("tp") or ()) for w in workers) != \
            [(r, tp) for r in range(tp)]:
        problems.append(f"tensor-parallel ranks {[w.get('tp') for w in workers]}, expected 0 … {tp - 1} of {tp}")
    return problems


def correctness_rows(pairs: list[dict], results: dict[str, dict]) -> list[dict]:
    """One row per compared pair: agreement per prompt, our call counts and the indexer shadow when recorded. A pair
    is ``ok`` only when both runs pass :func:`worker_checks`, a DeepSeek-V4 or V4.1 pair also :func:`v4_checks`."""
    rows = []
    for pair in pairs:
        ours, peer = results.get(pair["ours"], {}), results.get(pair["peer"], {})
        row = {**pair, "ok": bool(ours.get("ok") and peer.get("ok"))}
        if row["ok"]:
            problems = worker_checks(ours) + worker_checks(peer)
            if uses_v4_layer(pair["variant"]):
                problems += v4_checks(ours) + v4_checks(peer)
            if problems:
                row.update(ok=False, errors={"checks": "; ".join(problems)})
                rows.append(row)
                continue
        if row["ok"]:
            row.update(compare_runs(ours, peer))
            cw, pw = (r.get("weights", {}).get("checksum") for r in (ours, peer))
            row["same_weights"] = cw is not None and cw == pw  # both engines drew the same seeded weights
            for key in ("calls", "indexer_shadow", "speculative", "layers", "portable", "workers"):
                if key in ours:
                    row[key] = ours[key]
            for key in ("attention_shadow", "layers", "workers"):
                if key in peer:
                    row[f"peer_{key}"] = peer[key]
            if "speculative" in peer:
                row["peer_speculative"] = peer["speculative"]
        else:
            row["errors"] = {k: r.get("error", "missing") for k, r in (("ours", ours), ("peer", peer))
                             if not r.get("ok")}
        rows.append(row)
    return rows


def serving_rows(results: dict[str, dict]) -> list[dict]:
    rows = []
    for name, r in sorted(results.items()):
        spec = r.get("spec", {})
        row = {"name": name, "variant": spec.get("variant", "?"), "backend": spec.get("backend", "?"),
               "kv_cache_dtype": spec.get("kv_cache_dtype", "?"), "ok": bool(r.get("ok"))}
        if row["ok"]:
            row["contexts"] = r["serving"]
            row["start_s"] = r["start_s"]
        else:
            row["error"] = r.get("error", "missing")
        rows.append(row)
    return rows


def new_document(*, commit: str, gpu: str, versions: dict[str, str], date: str | None = None) -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, "date": date or datetime.date.today().isoformat(), "commit": commit,
            "gpu": gpu, "versions": dict(versions)}


def merge(doc: dict[str, Any], section_files: list[Path]) -> dict[str, Any]:
    """Add each section file's content (``{"correctness": [...]}``, ``{"serving": [...]}``, ``{"soak": [...]}``,
    any extra keys) to ``doc``; returns the validated document."""
    for path in section_files:
        part = json.loads(Path(path).read_text())
        for key, value in part.items():
            if key in ("correctness", "serving", "soak") and key in doc:
                doc[key] = doc[key] + value
            else:
                doc[key] = value
    return validate_results(doc)


def _fmt(x: float, nd: int = 3) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.{nd}f}"


def correctness_table(doc: dict[str, Any]) -> str:
    """Markdown: one line per compared pair; per prompt length ``prefix/length`` and the first-token logprob diff."""
    rows = [r for r in doc.get("correctness", [])]
    if not rows:
        return "(no correctness rows)"
    lengths = sorted({p["length"] for r in rows if r["ok"] for p in r["prompts"]})
    head = "| comparison | mode | cache | indexer | " + " | ".join(f"{n} tok" for n in lengths) + \
        " | max Δ logprob (1st token) |"
    lines = [head, "|" + "---|" * (5 + len(lengths))]
    for r in rows:
        label = f"{r['variant']} {r['kind'].replace('_', ' ')}"
        if not r["ok"]:
            lines.append(f"| {label} | {r['mode']} | {r['kv_cache_dtype']} | {r['indexer']} | failed: "
                         f"{'; '.join(r.get('errors', {}).values())[:120]} |")
            continue
        by_len = {p["length"]: p for p in r["prompts"]}
        cells = [f"{by_len[n]['prefix']}/{by_len[n]['length']}" if n in by_len else "—" for n in lengths]
        lines.append(f"| {label} | {r['mode']} | {r['kv_cache_dtype']} | {r['indexer']} | " + " | ".join(cells) +
                     f" | {_fmt(r['worst_first_logprob_diff'])} |")
    return "\n".join(lines)


def serving_table(doc: dict[str, Any]) -> str:
    rows = doc.get("serving", [])
    if not rows:
        return "(no serving rows)"
    lines = ["| model | backend | cache | context | TTFT ms | TPOT ms | decode tok/s (batch) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['variant']} | {r['backend']} | {r['kv_cache_dtype']} | — | failed: "
                         f"{r.get('error', '')[:100]} | | |")
            continue
        for c in r["contexts"]:
            lines.append(f"| {r['variant']} | {r['backend']} | {r['kv_cache_dtype']} | {c['context']} | "
                         f"{c['ttft_ms']:.1f} | {c['tpot_ms']:.2f} | {c['decode_tok_s']:.0f} ({c['batch']}) |")
    return "\n".join(lines)


def summary_table(doc: dict[str, Any], kinds: tuple[str, ...] = ("vs_peer",)) -> str:
    """Markdown for the README: per model, cache and indexer, ours vs vLLM's backend in eager and CUDA-graph mode —
    prompts whose greedy tokens are identical, the shortest identical prefix and the worst first-token logprob
    difference."""
    rows = [r for r in doc.get("correctness", []) if r["kind"] in kinds]
    if not rows:
        return "(no correctness rows)"
    lines = ["| model | cache (peer) | indexer | mode | identical outputs | shortest identical prefix | "
             "max Δ logprob, 1st token |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cache = f"{r['kv_cache_dtype']} ({PEERS.get(r['kv_cache_dtype'], '?')})"
        indexer = "DeepGEMM (vLLM)" if r["indexer"] == "vllm" else "ours"
        if not r["ok"]:
            lines.append(f"| {r['variant']} | {cache} | {indexer} | {r['mode']} | failed | | |")
            continue
        same = sum(p["identical"] for p in r["prompts"])
        short = min(r["prompts"], key=lambda p: p["prefix"])
        lines.append(f"| {r['variant']} | {cache} | {indexer} | {r['mode']} | {same}/{len(r['prompts'])} | "
                     f"{short['prefix']} of {short['generated']} (prompt {short['length']}) | "
                     f"{_fmt(r['worst_first_logprob_diff'])} |")
    return "\n".join(lines)


_LABEL = {"dsv32-h128": "DSV3.2 h128", "dsv32-h16": "DSV3.2 h16", "glm5-h8": "GLM-5 h8"}
_CACHE = {"bfloat16": "bf16", "fp8_ds_mla": "fp8_ds_mla"}


def _pair(doc: dict[str, Any], kind: str, variant: str, kv: str, mode: str | None = None,
          indexer: str | None = None) -> dict[str, Any] | None:
    for r in doc.get("correctness", []):
        if (r["kind"], r["variant"], r["kv_cache_dtype"]) == (kind, variant, kv) and \
                mode in (None, r["mode"]) and indexer in (None, r["indexer"]):
            return r
    return None


def _cell(r: dict[str, Any] | None) -> str:
    if r is None or not r["ok"]:
        return "—" if r is None else "failed"
    return f"{r['worst_first_logprob_diff']:.3f} · " + "/".join(str(p["prefix"]) for p in r["prompts"])


def readme_correctness_table(doc: dict[str, Any]) -> str:
    """The README's "Proven in vLLM" agreement table (tests/e2e checks that the README holds it verbatim)."""
    lines = ["| model | cache, vLLM's backend | ours vs it, eager | ours vs it, CUDA graphs | same with our indexer, "
             "graphs | it, eager vs graphs | ours, eager vs graphs |", "|---|---|---|---|---|---|---|"]
    for v in ("dsv32-h128", "dsv32-h16", "glm5-h8"):
        for kv in ("bfloat16", "fp8_ds_mla"):
            cells = [_pair(doc, "vs_peer", v, kv, "eager", "vllm"), _pair(doc, "vs_peer", v, kv, "graphs", "vllm"),
                     _pair(doc, "vs_peer", v, kv, "graphs", "ours"), _pair(doc, "peer_eager_vs_graphs", v, kv),
                     _pair(doc, "ours_eager_vs_graphs", v, kv)]
            lines.append(f"| {_LABEL[v]} | {_CACHE[kv]}, {PEERS[kv]} | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _serving_cells(r: dict[str, Any]) -> str:
    """A serving row's README cells: TTFT, TPOT and batched decode tokens/s at 8K / 32K context."""
    c = {x["context"]: x for x in r["contexts"]}
    return (f"{c[8192]['ttft_ms']:.1f} / {c[32768]['ttft_ms']:.1f} | {c[8192]['tpot_ms']:.2f} / "
            f"{c[32768]['tpot_ms']:.2f} | {c[8192]['decode_tok_s']:,.0f} / {c[32768]['decode_tok_s']:,.0f}")


def readme_serving_table(doc: dict[str, Any]) -> str:
    """The README's serving table."""
    rows = {(r["variant"], r["backend"], r["kv_cache_dtype"]): r for r in doc.get("serving", [])}
    lines = ["| model | cache | backend | TTFT 8K / 32K ms | TPOT 8K / 32K ms | decode tok/s, 32 × 8K / 8 × 32K |",
             "|---|---|---|---|---|---|"]
    for v in ("dsv32-h16", "dsv32-h128"):
        for kv in ("bfloat16", "fp8_ds_mla"):
            for backend in (OURS, PEERS[kv]):
                r = rows.get((v, backend, kv))
                if r is None or not r["ok"]:
                    lines.append(f"| {_LABEL[v]} | {_CACHE[kv]} | {backend} | — | — | — |")
                    continue
                lines.append(f"| {_LABEL[v]} | {_CACHE[kv]} | {backend} | {_serving_cells(r)} |")
    return "\n".join(lines)


def readme_soak_table(doc: dict[str, Any]) -> str:
    """The README's soak table: one line per soak run (tests/e2e checks that the README holds it verbatim)."""
    lines = ["| run | backend | VLLM_BATCH_INVARIANT | indexer | requests (errors) | preemptions | identical to "
             "alone | near tie / further | pass |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc.get("soak", []):
        env = r.get("env", {})
        invariant = "1" if env.get("VLLM_BATCH_INVARIANT") == "1" else "—"
        worker = (r.get("worker") or {}).get("results") or [{}]
        idx = worker[0].get("indexers", {})
        indexer = ("ours" if idx.get("triton") else "DeepGEMM (vLLM)") if idx else "—"  # — : no worker report
        if "error" in r:
            lines.append(f"| {r['name']} | {r['backend']} | {invariant} | {indexer} | failed: {r['error'][:86]} "
                         f"| | | | no |")
            continue
        lines.append(f"| {r['name']} | {r['backend']} | {invariant} | {indexer} | {r['requests']:,} ({r['errors']}) "
                     f"| {r['preemptions']} | {r['identical']:,} / {r['compared']:,} | {r['near_tie']:,} / "
                     f"{r['mismatch']:,} | {'yes' if r['ok'] else 'no'} |")
    return "\n".join(lines)


_V4_LABEL = {"dsv4-h8": "DSV4 h8", "dsv4-h64": "DSV4 h64"}
_SHADOW_KINDS = ("window", "c4a", "c128a")


def _shadow_cell(r: dict[str, Any] | None, phase: str, kinds: tuple[str, ...] = _SHADOW_KINDS) -> str:
    """The attention shadow's worst relative error per layer kind (V4: window / C4A / C128A) for ``phase``."""
    by = ((r or {}).get("peer_attention_shadow") or {}).get("by") or {}
    cells = [by.get(f"{k}-{phase}") for k in kinds]
    if not all(cells):
        return "—"
    return " / ".join(f"{c['max_rel']:.1e}" for c in cells) + f" ({sum(c['calls'] for c in cells)} calls)"


def readme_v4_table(doc: dict[str, Any]) -> str:
    """The README's DeepSeek-V4 table: ours (the plugin's layer) against vLLM's FlashMLA layer per model and mode,
    with vLLM's indexer and with ours forced — agreement cells as in :func:`readme_correctness_table` ("failed"
    where :func:`v4_checks` fails) —, ours with the software e4m3 casts, and with everything SM 8.x runs instead of
    vLLM's components, against ours without (CUDA graphs), the
    eager-vs-graphs yardsticks, and, for the eager engines, the attention shadow (in the FlashMLA engine our layer
    recomputes each call: worst relative error per layer kind; in CUDA-graph mode decode replays are not
    shadowed). Columns a results file has no pair for read "—"."""
    sm8x_run = any(r["kind"] == "sm8x_vs_native" for r in doc.get("correctness", []))  # a column once it ran
    lines = ["| model | mode | ours vs FLASHMLA_SPARSE_DSV4 | same, our indexer | ours, soft vs native e4m3 | "
             + ("ours, SM 8.x path vs native | " if sm8x_run else "")
             + "it, eager vs graphs | ours, eager vs graphs | shadow (eager), prefill: window / C4A / C128A | "
             "shadow (eager), decode |", "|---|---|---|---|---|---|---|---|---|" + ("---|" if sm8x_run else "")]
    for v in _V4_LABEL:
        for mode in ("eager", "graphs"):
            r = _pair(doc, "vs_peer", v, "fp8_ds_mla", mode, "vllm")
            if r is None:
                continue
            soft = _cell(_pair(doc, "soft_fp8_vs_native", v, "fp8_ds_mla", mode)) if mode == "graphs" else ""
            sm8x = _cell(_pair(doc, "sm8x_vs_native", v, "fp8_ds_mla", mode)) if mode == "graphs" else ""
            lines.append(f"| {_V4_LABEL[v]} | {mode} | {_cell(r)} | "
                         f"{_cell(_pair(doc, 'vs_peer', v, 'fp8_ds_mla', mode, 'ours'))} | {soft} | "
                         + (f"{sm8x} | " if sm8x_run else "") +
                         f"{_cell(_pair(doc, 'peer_eager_vs_graphs', v, 'fp8_ds_mla'))} | "
                         f"{_cell(_pair(doc, 'ours_eager_vs_graphs', v, 'fp8_ds_mla'))} | "
                         + (f"{_shadow_cell(r, 'prefill')} | {_shadow_cell(r, 'decode')} |" if mode == "eager"
                            else "| |"))
    return "\n".join(lines)


_V41_LABEL = {"dsv41-h8": "DSV4.1 h8", "dsv41-h64": "DSV4.1 h64"}
_V41_SHADOW_KINDS = ("window", "c2a", "c1a")  # V4.1's window-only, ratio-2 and ratio-1 layers


def _indexer_shadow_cell(r: dict[str, Any] | None) -> str:
    """Our indexer op against vLLM's steps: identical top-k rows and candidate rows, of those compared."""
    sh = (r or {}).get("indexer_shadow") or {}
    if not sh.get("rows"):
        return "—"
    cand = sh.get("candidates") or {}
    return (f"{sh['rows_identical']:.0%} of {sh['rows']:,} / {cand.get('rows_identical', 0):.0%} of "
            f"{cand.get('rows', 0):,}")


def readme_v41_table(doc: dict[str, Any]) -> str:
    """The README's DeepSeek-V4.1 table: ours against vLLM's FlashMLA V4.1 layer and ours with everything SM 8.x runs
    against ours, per model and mode (agreement cells as in :func:`readme_correctness_table`), the eager-vs-graphs
    yardsticks and, for the eager engines, the attention shadow per layer kind (window / ratio 2 / ratio 1) and the
    indexer-op shadow (identical top-k rows / identical candidate-block rows, of those compared)."""
    lines = ["| model | mode | ours vs FLASHMLA_SPARSE_DSV41 | ours, SM 8.x path vs native | it, eager vs graphs | "
             "ours, eager vs graphs | shadow (eager), prefill: window / C2 / C1 | shadow (eager), decode | "
             "indexer shadow (eager): top-k / candidates |", "|---|---|---|---|---|---|---|---|---|"]
    for v in _V41_LABEL:
        for mode in ("eager", "graphs"):
            r = _pair(doc, "vs_peer", v, "fp8_ds_mla", mode, "vllm")
            if r is None:
                continue
            eager = mode == "eager"
            lines.append(f"| {_V41_LABEL[v]} | {mode} | {_cell(r)} | "
                         f"{_cell(_pair(doc, 'sm8x_vs_native', v, 'fp8_ds_mla', mode))} | "
                         + (f"{_cell(_pair(doc, 'peer_eager_vs_graphs', v, 'fp8_ds_mla'))} | "
                            f"{_cell(_pair(doc, 'ours_eager_vs_graphs', v, 'fp8_ds_mla'))} | "
                            f"{_shadow_cell(r, 'prefill', _V41_SHADOW_KINDS)} | "
                            f"{_shadow_cell(r, 'decode', _V41_SHADOW_KINDS)} | {_indexer_shadow_cell(r)} |"
                            if eager else "| | | | |"))
    return "\n".join(lines)


def readme_v4_serving_table(doc: dict[str, Any]) -> str:
    """The README's DeepSeek-V4 serving table (same columns as :func:`readme_serving_table`)."""
    rows = {(r["variant"], r["backend"]): r for r in doc.get("serving", []) if r["kv_cache_dtype"] == "fp8_ds_mla"}
    lines = ["| model | backend | TTFT 8K / 32K ms | TPOT 8K / 32K ms | decode tok/s, 32 × 8K / 8 × 32K |",
             "|---|---|---|---|---|"]
    for v in _V4_LABEL:
        for backend in (OURS_V4, PEER_V4):
            r = rows.get((v, backend))
            if r is None:
                continue
            if not r["ok"]:
                lines.append(f"| {_V4_LABEL[v]} | {backend} | failed | | |")
                continue
            lines.append(f"| {_V4_LABEL[v]} | {backend} | {_serving_cells(r)} |")
    return "\n".join(lines)

"""The benchmark harness behind ``triton-mla-sparse bench`` (the optional ``[bench]`` extra): realistic paged
caches, every method on the same inputs, accuracy first, then timings against ceilings measured in the same run.

Modules: :mod:`.cases` (what is run), :mod:`.inputs` (the tensors), :mod:`.methods` (ours and torch) and
:mod:`.peers` (the third-party peers: loading and one adapter per peer), :mod:`.accuracy`, :mod:`.timing`,
:mod:`.ceilings`, :mod:`.runner` (:func:`run_bench`), :mod:`.results` (the JSON), :mod:`.report` (tables, targets),
:mod:`.plot`. Methodology: benchmarks/README.md in the repository.

The names below load their module on first use, so importing this package imports neither triton nor the kernels
(the CLI chooses ``TRITON_INTERPRET`` before they load).
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "cases": ("Case", "GLM5_SCALE", "DSV32_SCALE", "DSV4_SCALE", "INDEXER_KV_FORMAT", "V4_KV_FORMAT", "KINDS",
              "decode_case", "prefill_case", "v4_decode_case",
              "indexer_case", "case_group", "graph_timed", "parse_kinds", "bench_cases", "smoke_cases"),
    "inputs": ("CaseInputs", "IndexerInputs", "build_inputs", "build_indexer_inputs", "indexer_args"),
    "methods": ("Prepared", "Unsupported", "PeerUnavailable", "METHODS", "METHOD_KEYS", "PEER_KEYS", "EXTERNAL_PEERS",
                "DEEPGEMM_KEYS", "INDEXER_METHOD_KEYS", "INDEXER_ONLY", "register_method", "method_applies",
                "method_factories", "topk_positions", "invalid_columns"),
    "peers": ("Peers", "PEER_BUILDERS", "PEER_MODULES", "load_peers", "resolve_peers_dir", "resolve_deepgemm_dir",
              "deepgemm_jit_cache_dir", "flashmla_bf16_call", "flashmla_fp8_call", "flashmla_v4_call", "page1_call",
              "deepgemm_logits_call"),
    "accuracy": ("tolerance", "INDEXER_TOL", "case_tolerance", "reference_output", "indexer_reference",
                 "indexer_error", "check_output"),
    "timing": ("DoBenchTimer", "DO_BENCH_WINDOWS", "SLOW_CALL_MS", "time_do_bench", "time_events", "time_graph",
               "time_wall", "graph_replays"),
    "ceilings": ("measure_ceilings", "read_sum", "READ_CONFIGS"),
    "runner": ("run_case", "run_bench"),
    "results": ("DEFAULT_OUT_DIR", "gpu_slug", "utc_date", "results_path", "resolve_commit", "git_commit",
                "write_json", "load_results"),
    "report": ("format_table", "ratio_rows", "ratios_text", "compare_rows", "compare_text", "target_rows",
               "targets_text", "target_group", "ours_for", "BEST_PEER", "load_targets", "find_targets_file",
               "TargetsNotFound", "report_main"),
    "plot": ("plot_results", "METHOD_COLORS"),
}
_WHERE = {name: mod for mod, names in _MODULES.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

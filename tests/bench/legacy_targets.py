"""The targets of issues #6 and #13 (before Performance v2), kept as fixed data for the report's tests: the report
logic is tested on these, the repository's current targets (benchmarks/targets.py) in test_repository_targets."""

from triton_mla_sparse.bench.report import BEST_PEER


def _dec(heads: int, fmt: str, rows: int = 64) -> dict:
    return {"kind": "decode", "heads": heads, "rows": rows, "kv_format": fmt}


def _pre(heads: int, fmt: str = "bf16") -> dict:
    return {"kind": "prefill", "heads": heads, "kv_format": fmt}


def _idx(phase: str, heads: int, ctx: int = 32768, rows: int | None = None) -> dict:
    return {"kind": "indexer", "phase": phase, "heads": heads, "ctx": ctx,
            "rows": rows if rows is not None else (64 if phase == "decode" else 4096)}


_IDX_DEC = [(h, c) for h in (64, 32) for c in (32768, 131072)]


TARGETS = [
    ("decode h8 & h16 B=64 bf16: ours / best peer",
     [(_dec(h, "bf16"), "ours", _dec(h, "bf16"), BEST_PEER) for h in (8, 16)], 0.40, 0.25),
    ("decode h8 & h16 B=64 fp8: ours / flashmla_fp8",
     [(_dec(h, "fp8_ds_mla"), "ours", _dec(h, "fp8_ds_mla"), "flashmla_fp8") for h in (8, 16)], 0.60, 0.45),
    ("decode h16 B=256 bf16: ours / flashmla_bf16",
     [(_dec(16, "bf16", 256), "ours", _dec(16, "bf16", 256), "flashmla_bf16")], 0.90, 0.70),
    ("decode h128 B=64 bf16: ours / flashmla_bf16",
     [(_dec(128, "bf16"), "ours", _dec(128, "bf16"), "flashmla_bf16")], 1.50, 1.00),
    ("decode h128 B=64 fp8: ours / flashmla_fp8",
     [(_dec(128, "fp8_ds_mla"), "ours", _dec(128, "fp8_ds_mla"), "flashmla_fp8")], 1.20, 0.85),
    ("prefill h128 & h64 bf16: ours / flashmla_bf16",
     [(_pre(h), "ours", _pre(h), "flashmla_bf16") for h in (128, 64)], 1.60, 1.20),
    ("prefill h16 & h8 bf16: ours / flashmla_bf16",
     [(_pre(h), "ours", _pre(h), "flashmla_bf16") for h in (16, 8)], 0.80, 0.50),
    ("every case: ours / page1_triton", "every case:page1_triton", 0.33, 0.15),
    ("decode h16 B=64: ours fp8 / ours bf16",
     [(_dec(16, "fp8_ds_mla"), "ours", _dec(16, "bf16"), "ours")], 0.70, 0.60),
    # DSA indexer (issue #6): decode B=64 at Hi 64/32 and 32K/128K contexts; prefill 4096 rows over 32K at Hi 64/32.
    ("indexer decode logits: ours_logits / deepgemm",
     [(_idx("decode", h, c), "ours_logits", _idx("decode", h, c), "deepgemm") for h, c in _IDX_DEC], 1.30, 1.00),
    ("indexer decode +top-k: ours / deepgemm_topk",
     [(_idx("decode", h, c), "ours", _idx("decode", h, c), "deepgemm_topk") for h, c in _IDX_DEC], 1.00, 0.70),
    ("indexer prefill logits: ours_logits / deepgemm",
     [(_idx("prefill", h), "ours_logits", _idx("prefill", h), "deepgemm") for h in (64, 32)], 2.50, 1.30),
    ("indexer prefill +top-k: ours / deepgemm_topk",
     [(_idx("prefill", h), "ours", _idx("prefill", h), "deepgemm_topk") for h in (64, 32)], 1.30, 0.90),
]

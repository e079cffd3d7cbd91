"""The project's performance targets, as ours / peer time ratios: repository data that
``triton-mla-sparse bench --targets RESULTS.json`` (and the end of a run, and ``--compare``) reads from here.

``TARGETS``: ``(label, spec, limit, goal)``. ``spec`` is a list of ``(numerator case selector, method, denominator
case selector, method | BEST_PEER | (method, ...))`` -- a selector's fields must all equal the case record's; a
tuple means the fastest of those methods -- or ``"every case:<peer>"`` (each case that has the peer, ours / peer).
PASS: ratio <= limit, judged on CUDA-graph replay times for decode cases, attention and indexer (both methods
graph-timed), on do_bench medians otherwise; goal: the aim beyond the limit. See benchmarks/README.md.
"""

from triton_mla_sparse.bench.report import BEST_PEER


def _dec(heads: int, fmt: str, rows: int = 64) -> dict:
    return {"kind": "decode", "heads": heads, "rows": rows, "kv_format": fmt}


def _pre(heads: int, fmt: str = "bf16") -> dict:
    return {"kind": "prefill", "heads": heads, "kv_format": fmt}


def _v4(heads: int, rows: int) -> dict:
    return {"kind": "decode", "heads": heads, "rows": rows, "kv_format": "fp8_ds_mla_v4"}


def _idx(phase: str, heads: int, ctx: int = 32768, rows: int | None = None) -> dict:
    return {"kind": "indexer", "phase": phase, "heads": heads, "ctx": ctx,
            "rows": rows if rows is not None else (64 if phase == "decode" else 4096)}


_IDX_DEC = [(h, c) for h in (64, 32) for c in (32768, 131072)]


TARGETS = [
    # Performance v2 (issue #16): vLLM's Hopper peers. Decode rows are judged on CUDA-graph replay times.
    ("decode h8 & h16 B=64 fp8: ours / flashmla_fp8",
     [(_dec(h, "fp8_ds_mla"), "ours", _dec(h, "fp8_ds_mla"), "flashmla_fp8") for h in (8, 16)], 0.75, 0.50),
    ("decode h8 & h16 B=64 bf16: ours / fa3_page1",
     [(_dec(h, "bf16"), "ours", _dec(h, "bf16"), "fa3_page1") for h in (8, 16)], 1.00, 0.85),
    ("decode h16 B=64: ours fp8 / ours bf16",
     [(_dec(16, "fp8_ds_mla"), "ours", _dec(16, "bf16"), "ours")], 0.75, 0.60),
    ("decode h16 B=256 bf16: ours / fa3_page1",
     [(_dec(16, "bf16", 256), "ours", _dec(16, "bf16", 256), "fa3_page1")], 1.00, 0.90),
    ("decode h128 B=64 bf16: ours / best of fa3_page1, flashmla_bf16",
     [(_dec(128, "bf16"), "ours", _dec(128, "bf16"), ("fa3_page1", "flashmla_bf16"))], 2.0, 1.1),
    ("decode h128 B=64 fp8: ours / flashmla_fp8",
     [(_dec(128, "fp8_ds_mla"), "ours", _dec(128, "fp8_ds_mla"), "flashmla_fp8")], 2.0, 1.1),
    ("prefill h8 & h16 bf16: ours / fa3_page1",
     [(_pre(h), "ours", _pre(h), "fa3_page1") for h in (8, 16)], 1.05, 0.90),
    ("prefill h64 & h128 bf16: ours / best peer",
     [(_pre(h), "ours", _pre(h), BEST_PEER) for h in (64, 128)], 2.0, 1.2),
    ("decode h64 & h128 B=64 bf16: ours_portable / ours",
     [(_dec(h, "bf16"), "ours_portable", _dec(h, "bf16"), "ours") for h in (64, 128)], 1.5, 1.2),
    ("indexer decode h64 128K +top-k: ours / deepgemm_topk",
     [(_idx("decode", 64, 131072), "ours", _idx("decode", 64, 131072), "deepgemm_topk")], 0.85, 0.70),
    ("every case: ours / page1_triton", "every case:page1_triton", 0.33, 0.15),
    # DeepSeek-V4 (issue #19): decode over the window and compressed caches, against FlashMLA's V4 kernel (which
    # vLLM runs with the heads padded to 64). The issue names must-meets only: goal = limit.
    ("decode v4 h8 B=64 & 256: ours / flashmla_fp8",
     [(_v4(8, b), "ours", _v4(8, b), "flashmla_fp8") for b in (64, 256)], 1.0, 1.0),
    ("decode v4 h64 B=64 & 256: ours / flashmla_fp8",
     [(_v4(64, b), "ours", _v4(64, b), "flashmla_fp8") for b in (64, 256)], 2.0, 2.0),
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

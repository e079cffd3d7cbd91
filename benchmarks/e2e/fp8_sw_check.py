"""GPU check of the software e4m3 path (``TRITON_MLA_SPARSE_SOFT_FP8``) against the hardware one; needs CUDA.

(a) ``f32_to_e4m3`` compiled for this GPU over all 65536 bf16 bit patterns, ``--random`` random float32 bit patterns
    and the edge values, against torch's ``float8_e4m3fn`` cast and Triton's native ``.to(tl.float8e4nv)``
    (``cvt.rn.satfinite``, SM 8.9+ only).
(b) vLLM's ``fused_q`` and ``fused_norm_rope`` (``vllm.models.deepseek_v32.common.kernels``) on seeded random
    DeepSeek-V3.2-like inputs (bf16, caches bfloat16 / fp8_ds_mla / fp8), once in a subprocess with
    ``TRITON_MLA_SPARSE_SOFT_FP8=always`` and once with ``off``, sharing one Triton cache directory (so a cache-key
    collision would show), comparing every byte written. Expected: identical.

    python benchmarks/e2e/fp8_sw_check.py --out /tmp/fp8_sw_check.json

Prints the JSON summary and writes it to ``--out``; exit status 0 when everything matched, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl

from triton_mla_sparse._common.fp8 import f32_to_e4m3

E4M3_CVT = r"cvt\.[a-z.]*e4m3"


@triton.jit
def _encode_sw(x, o, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o + i, f32_to_e4m3(tl.load(x + i, mask=m, other=0.0)), mask=m)


@triton.jit
def _encode_native(x, o, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o + i, tl.load(x + i, mask=m, other=0.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=m)


def check_encode(n_random: int, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    bf16 = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    rnd = torch.randint(-(1 << 31), 1 << 31, (n_random,), generator=g, dtype=torch.int64).to(torch.int32)
    edges = torch.tensor([0.0, -0.0, 448.0, 464.0, 465.0, 480.0, 1e30, float("inf"), -float("inf"), float("nan"),
                          -float("nan"), 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -6])
    x = torch.cat([bf16, rnd.view(torch.float32), edges]).cuda()
    n, block = x.numel(), 4096
    ours = torch.empty(n, dtype=torch.uint8, device="cuda")
    _encode_sw[(triton.cdiv(n, block),)](x, ours, n, BLOCK=block)
    ref = x.to(torch.float8_e4m3fn).view(torch.uint8)
    nan_in = torch.isnan(x)
    torch_nan = ((ref & 0x7F) == 0x7F) & ~nan_in
    res = {
        "values": n,
        "torch_nan_for_non_nan_inputs": int(torch_nan.sum()),
        "sw_vs_torch_mismatches": int((ours != ref).sum()),
        "sw_vs_torch_mismatches_where_torch_not_nan": int(((ours != ref) & ~torch_nan).sum()),
    }
    bad = ((ours != ref) & ~torch_nan).nonzero()[:8, 0].tolist()
    res["sw_vs_torch_examples"] = [[float(x[i]), int(ours[i]), int(ref[i])] for i in bad]
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) >= (8, 9):
        native = torch.empty_like(ours)
        _encode_native[(triton.cdiv(n, block),)](x, native, n, BLOCK=block)
        diff = ours != native
        res["sw_vs_native_mismatches"] = int(diff.sum())
        res["sw_vs_native_mismatches_non_nan_inputs"] = int((diff & ~nan_in).sum())
        res["native_nan_codes"] = sorted({int(b) for b in native[nan_in].unique().tolist()})
        bad = diff.nonzero()[:8, 0].tolist()
        res["sw_vs_native_examples"] = [[float(x[i]), int(ours[i]), int(native[i])] for i in bad]
        res["ok"] = res["sw_vs_torch_mismatches_where_torch_not_nan"] == 0 and \
            res["sw_vs_native_mismatches_non_nan_inputs"] == 0
    else:
        res["sw_vs_native_mismatches"] = None  # no native e4m3 cast below SM 8.9
        res["ok"] = res["sw_vs_torch_mismatches_where_torch_not_nan"] == 0
    return res


def _ptx_e4m3_counts(fn) -> list[int]:
    """e4m3 cvt instructions in each build of JIT kernel ``fn`` held in this process (best effort)."""
    import re

    counts = []
    try:
        for caches in fn.device_caches.values():
            for kernel in caches[0].values():
                counts.append(len(re.findall(E4M3_CVT, kernel.asm["ptx"])))
    except Exception:  # noqa: BLE001 - Triton's private layout may differ: report nothing
        return []
    return counts


def worker(dump: Path, tokens: int, seed: int) -> None:
    """Run vLLM's two wrappers on seeded inputs; save every written tensor (as bytes) to ``dump``."""
    import torch

    from triton_mla_sparse.integrations.vllm import fp8_compat, register

    register()  # reads TRITON_MLA_SPARSE_SOFT_FP8 as vLLM's plugin loader would
    import vllm.models.deepseek_v32.common.kernels as k

    g = torch.Generator().manual_seed(seed)
    dev = "cuda"

    def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(dev)

    T, H, IH, max_pos, nb, bs = tokens, 16, 64, 4096, 8, 64
    positions = torch.randint(0, max_pos, (T,), generator=g).to(dev)
    slots = torch.randperm(nb * bs, generator=g)[:T].to(dev)
    cos_sin = rnd(max_pos, 64)
    idx_cos_sin = rnd(max_pos, 64)
    out: dict[str, torch.Tensor] = {}
    for quantize in (False, True):
        q_pe, index_q, ql_nope = rnd(T, H, 64, scale=3), rnd(T, IH, 128, scale=3), rnd(T, H, 512, scale=30)
        q_scale = torch.tensor([0.05], device=dev)
        index_weights = rnd(T, IH)
        iq, iw, mqa = k.fused_q(positions, q_pe, cos_sin, index_q, idx_cos_sin, ql_nope, q_scale, index_weights,
                                0.088, 0.125, has_indexer=True, index_rope_interleave=False, quantize_mqa=quantize)
        for name, t in (("index_q_fp8", iq), ("index_weights", iw), ("mqa_q", mqa)):
            out[f"fused_q/quant{int(quantize)}/{name}"] = t
    for cache in ("bfloat16", "fp8_ds_mla", "fp8"):
        q_c, kv_c, k_pe, index_k = rnd(T, 1536, scale=2), rnd(T, 512, scale=2), rnd(T, 64, scale=2), rnd(T, 128)
        idx_cache = torch.zeros(nb, bs, 132, dtype=torch.uint8, device=dev)
        if cache == "bfloat16":
            mla = torch.zeros(nb, bs, 576, dtype=torch.bfloat16, device=dev)
        else:
            mla = torch.zeros(nb, bs, 656 if cache == "fp8_ds_mla" else 576, dtype=torch.uint8, device=dev)
        topk = torch.zeros(T, 2048, dtype=torch.int32, device=dev)
        kv_out, kpe_out = torch.empty_like(kv_c), torch.empty_like(k_pe)
        q_out = k.fused_norm_rope(
            positions, q_c, rnd(1536), 1e-6, kv_c, rnd(512), 1e-6, k_pe, cos_sin, index_k,
            rnd(128, dtype=torch.float32), rnd(128, dtype=torch.float32), 1e-6, idx_cos_sin, topk,
            slot_mapping=slots, indexer_k_cache=idx_cache, mla_kv_cache=mla, mla_kv_cache_dtype=cache,
            mla_k_scale=torch.tensor([0.07], device=dev), skip_scale=False, has_indexer=True,
            index_rope_interleave=False, kv_c_out=kv_out, k_pe_out=kpe_out)
        for name, t in (("q_c_out", q_out), ("kv_c_out", kv_out), ("k_pe_out", kpe_out), ("indexer_cache", idx_cache),
                        ("mla_cache", mla), ("topk", topk)):
            out[f"norm_rope/{cache}/{name}"] = t
    torch.cuda.synchronize()
    meta = {"installed": fp8_compat.installed(), "mode": fp8_compat.state.mode,
            "e4m3_cvt_per_build": {"fused_q": _ptx_e4m3_counts(k._fused_q_kernel),
                                   "fused_norm_rope": _ptx_e4m3_counts(k._fused_norm_rope_kernel)}}
    torch.save({"meta": meta, "tensors": {n: t.detach().contiguous().view(torch.uint8).cpu()
                                          for n, t in out.items()}}, dump)


def check_vllm(tokens: int, seed: int, timeout: float) -> dict:
    import torch

    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        dumps = {}
        env = dict(os.environ, TRITON_CACHE_DIR=str(Path(tmp) / "triton-cache"))
        env.pop("TRITON_INTERPRET", None)
        for label, mode in (("hardware", "off"), ("software", "always")):  # the hardware build fills the cache
            dumps[label] = Path(tmp) / f"{label}.pt"
            cmd = [sys.executable, __file__, "--worker", str(dumps[label]), "--tokens", str(tokens),
                   "--seed", str(seed), "--out", os.devnull]
            proc = subprocess.run(cmd, env=dict(env, TRITON_MLA_SPARSE_SOFT_FP8=mode), capture_output=True,
                                  text=True, timeout=timeout)
            if proc.returncode != 0:
                res[label] = {"error": proc.stderr[-4000:]}
                res["ok"] = False
                return res
        hw, sw = (torch.load(dumps[k_]) for k_ in ("hardware", "software"))
    res["hardware"], res["software"] = hw["meta"], sw["meta"]
    tensors = {}
    for name, a in hw["tensors"].items():
        b = sw["tensors"][name]
        tensors[name] = {"bytes": a.numel(), "mismatched_bytes": int((a != b).sum()) if a.shape == b.shape else -1}
    res["tensors"] = tensors
    sw_cvt, hw_cvt = ([n for v in d["meta"]["e4m3_cvt_per_build"].values() for n in v] for d in (sw, hw))
    # Native builds hold e4m3 cvts and routed ones none (unless Triton's build list could not be read).
    builds_ok = not (sw_cvt and hw_cvt) or (sum(sw_cvt) == 0 and sum(hw_cvt) > 0)
    res["builds_checked"] = bool(sw_cvt and hw_cvt)
    res["ok"] = (all(t["mismatched_bytes"] == 0 for t in tensors.values()) and sw["meta"]["installed"]
                 and not hw["meta"]["installed"] and builds_ok)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where to write the JSON summary")
    p.add_argument("--random", type=int, default=1 << 24, help="random float32 bit patterns for (a) (default 16M)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per vLLM kernel call in (b)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-vllm", action="store_true", help="only (a)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per (b) subprocess")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.random < 0 or not 1 <= a.tokens <= 512:
        p.error("--random must be >= 0 and --tokens between 1 and 512 (the caches hold 512 slots)")
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    if a.worker is not None:
        worker(a.worker, a.tokens, a.seed)
        return 0
    summary = {"gpu": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability()),
               "torch": torch.__version__, "triton": triton.__version__,
               "encode": check_encode(a.random, a.seed)}
    if not a.skip_vllm:
        summary["vllm"] = check_vllm(a.tokens, a.seed, a.timeout)
    summary["ok"] = summary["encode"]["ok"] and summary.get("vllm", {"ok": True})["ok"]
    text = json.dumps(summary, indent=1)
    print(text)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

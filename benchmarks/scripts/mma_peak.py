"""The tensor-core throughput a plain Triton kernel reaches on the GPU at hand, with and without MMA v3 (wgmma):
what bounds the portable rows of issue 16, which time the sm86/sm120 entries on the H200 with ``DISABLE_MMA_V3=1``
(mma.sync, as on sm80/86/89/120) against the sm90 path (wgmma). A bf16 matmul M = N = K = 8192, float32
accumulators, a few tile configurations, the best kept; the PTX is checked for wgmma either way. Run each mode in its
own process (Triton's in-process cache ignores the variable), e.g.:

    python benchmarks/scripts/mma_peak.py wgmma
    DISABLE_MMA_V3=1 TRITON_CACHE_DIR=/tmp/tc-mma python benchmarks/scripts/mma_peak.py mma_sync"""
import os
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    group = pid // (GROUP * n_n)
    first_m = group * GROUP
    size_m = min(n_m - first_m, GROUP)
    pid_m = first_m + (pid % (GROUP * n_n)) % size_m
    pid_n = (pid % (GROUP * n_n)) // size_m
    o_m = pid_m * BM + tl.arange(0, BM)
    o_n = pid_n * BN + tl.arange(0, BN)
    o_k = tl.arange(0, BK)
    p_a = a_ptr + o_m[:, None] * K + o_k[None, :]
    p_b = b_ptr + o_k[:, None] * N + o_n[None, :]
    acc = tl.zeros([BM, BN], tl.float32)
    for _ in range(0, K, BK):
        acc = tl.dot(tl.load(p_a), tl.load(p_b), acc)
        p_a += BK
        p_b += BK * N
    tl.store(c_ptr + o_m[:, None] * N + o_n[None, :], acc.to(tl.bfloat16))


def main() -> None:
    tag = sys.argv[1] if len(sys.argv) > 1 else ("mma_sync" if os.environ.get("DISABLE_MMA_V3") else "wgmma")
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    best = None
    for bm, bn, bk, warps, stages in [(128, 128, 64, 4, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 3),
                                      (128, 128, 32, 4, 4), (256, 128, 64, 8, 3), (128, 64, 64, 4, 4)]:
        grid = (triton.cdiv(n, bm) * triton.cdiv(n, bn),)
        try:
            k = _matmul[grid](a, b, c, n, n, n, BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)
        except Exception as e:  # out of shared memory or registers for this tile: skip it
            print(f"{tag} {bm}x{bn}x{bk} w{warps} s{stages}: {type(e).__name__}")
            continue
        err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
        ms = triton.testing.do_bench(lambda: _matmul[grid](a, b, c, n, n, n, BM=bm, BN=bn, BK=bk, GROUP=8,
                                                           num_warps=warps, num_stages=stages))
        tflops = 2 * n ** 3 / ms / 1e9
        ptx = k.asm["ptx"]
        print(f"{tag} {bm}x{bn}x{bk} w{warps} s{stages}: {ms:.3f} ms {tflops:6.1f} TFLOPS (rel err {err:.1e}, "
              f"wgmma in PTX: {'wgmma' in ptx}, mma.sync: {'mma.sync' in ptx})", flush=True)
        best = max(best or 0.0, tflops)
    ms = triton.testing.do_bench(lambda: torch.matmul(a, b, out=c))
    text = "no configuration compiled" if best is None else f"{best:.1f} TFLOPS"
    print(f"{tag} best {text}; torch.matmul (cuBLAS) {2 * n ** 3 / ms / 1e9:.1f} TFLOPS")


if __name__ == "__main__":
    main()

"""GPU tier: DeepSeek-V4's fp8 pages (kv_format "fp8_ds_mla_v4") read in place by every kernel family that reads
them (the table's choice, the tl kernel, and on NVIDIA the Gluon kernels where they run), against the float32
reference: decode and prefill, bf16 q, the SWA cache alone and with the compressed cache as the extra cache
(vLLM's FlashMLA call: the window cache in pages of 64 rows, the compressed one in pages of 64 (C4A) or 2
(C128A)), garbage slots and lengths in both lists, a sink, the pages in vLLM's
view over a buffer whose every byte outside the pages' data is 0xFF (a stray read makes NaN). Skipped without a CUDA
GPU (``TMS_GPU_TESTS_ON_CPU=1``: tiny sizes through the interpreter, float16 q)."""

from __future__ import annotations

import pytest
import torch

from ._env import DEV, GPU_TIER, INT32_MAX, INT32_MIN, ON_CPU, QD  # first: may switch on the interpreter
from triton_mla_sparse import formats as F
from triton_mla_sparse import reference
from triton_mla_sparse.ops.sparse_mla.api import sparse_mla_attention_with_config
from triton_mla_sparse.testing import place_v4, rel_err, take_rows, v4_values

from .test_gpu_gluon import MMA2_WIDE

pytestmark = GPU_TIER

V4 = "fp8_ds_mla_v4"
BS = 64  # vLLM's V4 window cache and C4A compressed cache: 64 rows per page
# The compressed cache as vLLM lays it out: C4A 64 rows per page, C128A 2 (other block size, other page stride)
CMP_BS = {"c4a": 64, "c128a": 2}
if ON_CPU:
    NB_SWA, CMP_SLOTS, TOPK_SWA, TOPK_CMP, CHECK_ROWS = 2, 256, 16, 40, 4
    ROWS = {"decode": 3, "prefill": 4}
else:
    NB_SWA, CMP_SLOTS, TOPK_SWA, TOPK_CMP, CHECK_ROWS = 64, 32768, 128, 512, 128
    ROWS = {"decode": 64, "prefill": 2048}
SCALE = 512 ** -0.5
TOL = 1e-2 if QD == torch.bfloat16 else 5e-3  # the tier's tolerance by q dtype (tests/gpu/test_gpu.py)
LSE_ATOL = 1e-2


def v4_pages(nb: int, seed: int, bs: int = BS) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pages = F.quantize_fp8_ds_mla_v4(v4_values(nb, bs, generator=g)).to(DEV)
    return place_v4(pages, bs, "padded")


def garbage_slots(T: int, topk: int, num_slots: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, num_slots, (T, topk), generator=g)
    bad = torch.rand(T, topk, generator=g) < 0.2
    junk = torch.tensor([-1, num_slots, INT32_MIN, INT32_MAX])[torch.randint(0, 4, (T, topk), generator=g)]
    return torch.where(bad, junk, idx).to(torch.int32).to(DEV)


FAMILIES = {"table": {}, "tl": {"family": "tl"}, "mma2": {"family": "mma2"},
            "mma2-bh32": {"family": "mma2", **MMA2_WIDE}, "wgmma": {"family": "wgmma"},
            "wgmma_t": {"family": "wgmma_t", "overlap": True}, "wgmma_t-plain": {"family": "wgmma_t", "overlap": False}}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("with_extra", [None, "c4a", "c128a"], ids=["swa", "swa+c4a", "swa+c128a"])
@pytest.mark.parametrize("heads", [16, 64])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_v4_pages_against_the_reference(kernel, heads, with_extra, family):
    over = FAMILIES[family]
    if over.get("family", "tl") != "tl":
        from triton_mla_sparse.capabilities import arch_for_device
        from triton_mla_sparse.ops.sparse_mla.configs import gluon_supported

        if ON_CPU or not gluon_supported(over["family"], arch_for_device(torch.device(DEV)), V4, QD):
            pytest.skip(f"the {over['family']} kernel does not run here")
    T = ROWS[kernel]
    torch.manual_seed(heads + 7 * len(with_extra or ""))
    swa = v4_pages(NB_SWA, 1)
    q = torch.randn(T, heads, 512, dtype=QD, device=DEV)
    idx = garbage_slots(T, TOPK_SWA, NB_SWA * BS, 2)
    tl1 = torch.randint(0, TOPK_SWA + 1, (T,), dtype=torch.int32, device=DEV)
    sink = torch.randn(heads, device=DEV)
    extra = {}
    if with_extra:
        bs2 = CMP_BS[with_extra]
        extra = dict(extra_kv_cache=v4_pages(CMP_SLOTS // bs2, 3, bs2),
                     extra_indices=garbage_slots(T, TOPK_CMP, CMP_SLOTS, 4),
                     extra_topk_length=torch.randint(0, TOPK_CMP + 1, (T,), dtype=torch.int32, device=DEV))
    out = torch.full((T, heads, 512), float("nan"), dtype=QD, device=DEV)
    res, lse, cfg = sparse_mla_attention_with_config(q, swa, idx, SCALE, kv_format=V4, topk_length=tl1,
                                                     attn_sink=sink, out=out, kernel=kernel, return_lse=True,
                                                     return_config=True, **over, **extra)
    assert res is out and cfg.kernel == kernel and cfg.family == over.get("family", cfg.family)
    assert torch.isfinite(out).all(), "output holds NaN/inf (unwritten rows, or bytes outside the pages were read)"
    assert not torch.isnan(lse).any()
    sel = None
    if T > CHECK_ROWS:
        sel = torch.randperm(T, generator=torch.Generator().manual_seed(T))[:CHECK_ROWS].sort().values.to(DEV)
    ex = {k: (v if k == "extra_kv_cache" else take_rows(v, sel)) for k, v in extra.items()}
    ref, ref_lse = reference.sparse_mla_attention(take_rows(q, sel), swa, take_rows(idx, sel), SCALE, kv_format=V4,
                                                  topk_length=take_rows(tl1, sel), attn_sink=sink, return_lse=True,
                                                  out_dtype=torch.float32, **ex)
    o, l = take_rows(out, sel), take_rows(lse, sel)
    err = rel_err(o, ref)
    assert err <= TOL, f"relative error {err:.3e} > {TOL:.0e}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(l), fin), "lse finite/-inf pattern differs from the reference"
    if fin.any():
        d = (l[fin] - ref_lse[fin]).abs().max().item()
        assert d <= LSE_ATOL, f"lse differs by {d:.3e}"
    if (~fin).any():
        assert torch.all(o.float()[~fin] == 0)

"""Which logits kernel runs: the launch table's choice between the tl kernel and the Gluon wgmma kernel (sm90, decode
rows of e4m3 q over vLLM's fp8 cache), the one rule that refuses a problem to the wgmma kernel
(:func:`~triton_mla_sparse.ops.indexer.configs.wgmma_refusal`: block size, row stride, 16-byte alignment, the
interpreter), overrides, and the launch's fallback to the tl kernel (run through the interpreter against the
reference). The wgmma kernel itself only runs on a GPU (tests/gpu/test_gpu_indexer.py); its builds are in the
compile matrix.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import DEVICE

from triton_mla_sparse import reference
from triton_mla_sparse.capabilities import ARCHS
from triton_mla_sparse.formats import D_INDEX, FP8_E4M3_MAX, INDEXER_ROW_BYTES, quantize_indexer_cache
from triton_mla_sparse.ops.indexer import configs as C
from triton_mla_sparse.ops.indexer.api import check_indexer_inputs
from triton_mla_sparse.testing import assert_close

SM90 = ARCHS["sm90"]


def _problem(*, bs=64, rows=3, reqs=3, Hi=8, pad=0, offset=0, q_dtype=torch.float8_e4m3fn, k_fmt="fp8", seed=0):
    """Decode-shaped arguments (one row per request unless ``rows`` > ``reqs``) over a cache of blocks of ``bs``
    tokens; ``pad`` spare bytes after each block (a larger block stride), ``offset`` bytes before the cache's start."""
    g = torch.Generator().manual_seed(seed)
    nb, max_blocks = 2 * reqs + 1, 2
    values = torch.randn(nb, bs, D_INDEX, generator=g)
    if k_fmt == "fp8":
        packed = quantize_indexer_cache(values)
        width = bs * INDEXER_ROW_BYTES
        flat = torch.full((offset + nb * (width + pad),), 0xFF, dtype=torch.uint8, device=DEVICE)
        cache = flat[offset:].view(nb, width + pad)[:, :width]
        cache.copy_(packed.to(DEVICE))
    else:
        cache = values.to(torch.bfloat16)
    q = torch.randn(rows, Hi, D_INDEX, generator=g)
    q = (q * 40).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(q_dtype) if q_dtype == torch.float8_e4m3fn else q.to(q_dtype)
    w = torch.randn(rows, Hi, generator=g) / 40
    bt = torch.randperm(nb, generator=g)[:reqs * max_blocks].view(reqs, max_blocks).to(torch.int32)
    req = (torch.arange(rows) % reqs).to(torch.int32)
    pos = torch.randint(0, bs * max_blocks, (rows,), generator=g).to(torch.int32)
    args = (q.to(DEVICE), w.to(DEVICE), cache.to(DEVICE), bt.to(DEVICE), req.to(DEVICE), pos.to(DEVICE))
    return args, bs * max_blocks


@pytest.fixture
def on_sm90(monkeypatch):
    """choose_indexer_config as on an sm90 GPU (the interpreter off for the configuration only; a fresh memo)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(C, "_device_arch", lambda dev, interpreter: SM90)
    monkeypatch.setattr(C, "_CONFIGS", {})


@pytest.mark.parametrize("hi,block_h", [(64, 64), (32, 32), (20, 32), (1, 16)])
def test_table_picks_wgmma_for_sm90_fp8_decode_rows_only(hi, block_h):
    cfg = C.indexer_config_for(SM90, hi=hi, q_fp8=True, k_fp8=True, dot_bf16=False)
    assert (cfg.family, cfg.block_h, cfg.block_k, cfg.rows_per_program, cfg.num_warps) == ("wgmma", block_h, 64, 1, 4)
    assert C.wgmma_config_problem(cfg) is None and cfg.select == "split"
    others = [C.indexer_config_for(SM90, hi=hi, q_fp8=True, k_fp8=True, dot_bf16=False, shared_rows=True),
              C.indexer_config_for(SM90, hi=hi, q_fp8=False, k_fp8=True, dot_bf16=False),
              C.indexer_config_for(SM90, hi=hi, q_fp8=True, k_fp8=False, dot_bf16=True),
              C.indexer_config_for(None, hi=hi, q_fp8=True, k_fp8=True, dot_bf16=False)]
    others += [C.indexer_config_for(ARCHS[a], hi=hi, q_fp8=True, k_fp8=True, dot_bf16=False)
               for a in ARCHS if a != "sm90"]
    assert all(o.family == "tl" for o in others)


def test_forced_families():
    tl = C.indexer_config_for(SM90, hi=64, q_fp8=True, k_fp8=True, dot_bf16=False, family="tl")
    assert (tl.family, tl.block_k, tl.num_stages, tl.use_fp8_dot) == ("tl", 128, 2, True)
    prefill = C.indexer_config_for(SM90, hi=64, q_fp8=True, k_fp8=True, dot_bf16=False, shared_rows=True,
                                   family="wgmma")
    assert (prefill.family, prefill.rows_per_program, prefill.select) == ("wgmma", 1, "torch")
    for arch, q_fp8, k_fp8 in ((ARCHS["sm89"], True, True), (ARCHS["sm100"], True, True), (None, True, True),
                               (SM90, False, True), (SM90, True, False)):
        with pytest.raises(ValueError, match="^family: the wgmma logits kernel needs sm90"):
            C.indexer_config_for(arch, hi=64, q_fp8=q_fp8, k_fp8=k_fp8, dot_bf16=False, family="wgmma")
    with pytest.raises(ValueError, match="^family: expected one of"):
        C.indexer_config_for(SM90, hi=64, q_fp8=True, k_fp8=True, dot_bf16=False, family="mma2")


def test_refusal_rule(monkeypatch):
    """wgmma_refusal: None for vLLM's layout (also with a padded block stride of 16 bytes); a reason for another
    block size, a block stride or start off 16 bytes, 16-bit operands, another target, the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")

    def refusal(arch=SM90, **kw):
        return C.wgmma_refusal(check_indexer_inputs(*_problem(**kw)[0]), arch)

    assert refusal() is None
    assert refusal(pad=16) is None
    assert "blocks of 64 tokens" in refusal(bs=16)
    assert "blocks of 64 tokens" in refusal(bs=128)
    assert "16-byte vectors" in refusal(pad=4)
    assert "16-byte vectors" in refusal(offset=4)
    assert "e4m3 q" in refusal(q_dtype=torch.float16)
    assert "e4m3 q" in refusal(q_dtype=torch.bfloat16, k_fmt="bf16")
    assert "runs on sm90, got sm89" in refusal(ARCHS["sm89"])
    assert "runs on sm90, got no GPU" in refusal(None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "got the interpreter" in refusal()


def test_choice_and_fallback(on_sm90):
    """The table's wgmma kernel for decode rows; the tl kernel's own sm90 entry (not the wgmma entry's sizes) for
    a cache it refuses and for prefill rows."""
    tl_entry = C.indexer_config_for(SM90, hi=8, q_fp8=True, k_fp8=True, dot_bf16=False, family="tl")
    p = check_indexer_inputs(*_problem()[0])
    assert C.choose_indexer_config(p).family == "wgmma"
    for kw in (dict(bs=16), dict(pad=4), dict(offset=4)):
        assert C.choose_indexer_config(check_indexer_inputs(*_problem(**kw)[0])) == tl_entry, kw
    prefill = C.choose_indexer_config(check_indexer_inputs(*_problem(rows=7)[0]))
    assert prefill.family == "tl" and prefill.rows_per_program > 1


def test_overrides(on_sm90):
    p = check_indexer_inputs(*_problem()[0])
    cfg = C.choose_indexer_config(p, family="wgmma", num_stages=3, chunk_tiles=8)
    assert (cfg.family, cfg.num_stages, cfg.chunk_tiles) == ("wgmma", 3, 8)
    assert C.choose_indexer_config(p, select="torch").family == "wgmma"
    # the sweep's tl grid (no family): sizes the wgmma kernel cannot take apply to the tl kernel's entry
    tl = C.choose_indexer_config(p, block_k=128, chunk_tiles=32, num_warps=8, num_stages=3)
    assert (tl.family, tl.block_k, tl.chunk_tiles, tl.num_warps, tl.num_stages) == ("tl", 128, 32, 8, 3)
    assert C.choose_indexer_config(p, family="tl").block_k == 128
    for bad in (dict(num_warps=8), dict(block_k=128), dict(num_stages=1), dict(rows_per_program=2),
                dict(chunk_tiles=0), dict(block_h=128)):
        with pytest.raises(ValueError):
            C.choose_indexer_config(p, family="wgmma", **bad)
    with pytest.raises(ValueError, match="^family: the wgmma logits kernel reads blocks of 64"):
        C.choose_indexer_config(check_indexer_inputs(*_problem(bs=16)[0]), family="wgmma")


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the interpreter's configuration")
def test_forced_wgmma_refused_under_the_interpreter():
    p = check_indexer_inputs(*_problem()[0])
    with pytest.raises(ValueError, match="^family: the wgmma logits kernel runs on sm90, got the interpreter"):
        C.choose_indexer_config(p, family="wgmma")


@pytest.mark.parametrize("zero_ws", [False, True])
def test_launch_falls_back_to_the_tl_kernel(zero_ws):
    """A wgmma configuration handed to the launch for a problem the wgmma kernel refuses (here: the interpreter, or
    a GPU other than sm90) runs the tl kernel: the reference's logits, the workspace zeroed."""
    from triton_mla_sparse.capabilities import arch_for_device
    from triton_mla_sparse.ops.indexer.kernels import launch_indexer_logits

    args, max_len = _problem(rows=3, reqs=3, Hi=20)
    p = check_indexer_inputs(*args)
    if C.wgmma_refusal(p, arch_for_device(p.device)) is None:
        pytest.skip("the wgmma kernel takes this problem here (the GPU tier covers it)")
    cfg = C.indexer_config_for(SM90, hi=20, q_fp8=True, k_fp8=True, dot_bf16=False)
    assert cfg.family == "wgmma"
    out = torch.full((p.T, max_len), math.nan, device=DEVICE)
    ws = torch.full((p.T, 40), -7, dtype=torch.int32, device=DEVICE) if zero_ws else None
    launch_indexer_logits(p, out, cfg, ws)
    ref = reference.indexer_logits(*args, max_len, compute_dtype=torch.float64)
    fin = torch.isfinite(ref)
    assert_close(out, ref, tol=1e-5, atol=1e-4 * ref[fin].abs().max().item() + 1e-6, what="fallback")
    if zero_ws:
        assert bool((ws == 0).all())


def test_the_wgmma_launcher_imports_on_the_cpu():
    """The Gluon module imports without a GPU and its launcher takes the kernel's constexprs last (the compile
    matrix builds it: tests/common/test_compile_matrix.py)."""
    from triton_mla_sparse.ops.indexer import kernels_wgmma

    assert kernels_wgmma.launch_logits_wgmma.names[-3:] == ["BLOCK_H", "STAGES", "ZERO_WS"]

"""DeepSeek-V4's fp8 pages read in place (kv_format "fp8_ds_mla_v4"): per page of block_size tokens, rows of 448 e4m3
NoPE values and 64 bf16 RoPE values, then a footer of 7 UE8M0 exponents per token. The tl kernel against the float64
reference (which dequantises with formats.dequantize_fp8_ds_mla_v4) in every cache view vLLM / FlashMLA / the
writer use, both lists (the extra cache), garbage indices, empty lists, sinks, several block sizes and head counts;
the kernel's dequantised rows equal the formats module's exactly; every malformed argument is one ValueError."""

import math

import pytest
import torch

from helpers import (DEVICE, INT32_MAX, INT32_MIN, Problem, assert_matches, interpreter_memcheck, make_indices,
                     nan_out, run_kernel, run_reference)
from triton_mla_sparse import formats as F
from triton_mla_sparse import reference
from triton_mla_sparse.capabilities import ARCHS, problem_reasons
from triton_mla_sparse.ops.sparse_mla.api import check_attention_inputs
from triton_mla_sparse.ops.sparse_mla.configs import choose_config, v4_supported
from triton_mla_sparse.testing import V4_LAYOUTS, encode_cache, place_v4, sparse_mla_inputs, v4_values

V4 = "fp8_ds_mla_v4"
SCALE = 0.07  # a caller's softmax scale (DeepSeek-V4 passes its own)


def i32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE)


def v4_cache(num_blocks: int, block_size: int, layout: str = "vllm", gain: float = 1.0):
    """(cache tensor in ``layout``, its pages [nb, page_bytes]) of realistic V4 rows."""
    pages = F.quantize_fp8_ds_mla_v4(v4_values(num_blocks, block_size) * gain).to(DEVICE)
    return place_v4(pages, block_size, layout), pages


def v4_problem(T: int, H: int, topk: int, block_size: int, *, num_blocks: int = 3, layout: str = "vllm",
               invalid_frac: float = 0.15) -> Problem:
    kv, _ = v4_cache(num_blocks, block_size, layout)
    q = torch.randn(T, H, F.D_V4).to(torch.float16).to(DEVICE)
    n = num_blocks * block_size
    return Problem(q=q, kv_cache=kv, indices=make_indices(T, topk, n, invalid_frac), softmax_scale=SCALE,
                   kv_format=V4, num_slots=n)


def add_extra(prob: Problem, topk2: int, block_size2: int, *, num_blocks2: int = 2, lengths=None,
              layout: str = "vllm") -> Problem:
    kv2, _ = v4_cache(num_blocks2, block_size2, layout, gain=1.7)
    prob.extra = dict(extra_kv_cache=kv2, extra_indices=make_indices(prob.T, topk2, num_blocks2 * block_size2, 0.2),
                      **({"extra_topk_length": lengths} if lengths is not None else {}))
    return prob


# ------------------------------------------------------------------------------------------ against the reference

@pytest.mark.parametrize("block_size,layout,kernel,H", [
    (64, "vllm", "decode", 16),
    (64, "flashmla", "prefill", 5),
    (16, "writer", "decode", 20),
    (16, "padded", "prefill", 7),
    (1, "padded", "decode", 3),
    (1, "vllm", "prefill", 16),
])
def test_against_the_reference(block_size, layout, kernel, H):
    """Odd head counts (no padding), garbage slots (negative, >= num_slots, INT32_MIN/MAX), every accepted view
    (padded: all bytes that are not the pages' data are 0xFF, so any stray read makes NaN)."""
    prob = v4_problem(3, H, 37, block_size, num_blocks=max(2, 96 // block_size), layout=layout)
    prob.indices[0, :3] = i32([INT32_MIN, INT32_MAX, prob.num_slots])
    out, lse = run_kernel(prob, kernel, out=nan_out(3, H))
    assert_matches(out, lse, *run_reference(prob), **prob.tol, what=f"bs{block_size} {layout} {kernel}")


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_topk_length_and_sinks(kernel):
    prob = v4_problem(4, 4, 24, 16)
    tl = i32([24, 0, 5, -3])
    sink = torch.tensor([math.inf, -math.inf, 0.25, -1.0], device=DEVICE)
    out, lse = run_kernel(prob, kernel, out=nan_out(4, 4), topk_length=tl, attn_sink=sink)
    ref_out, ref_lse = run_reference(prob, topk_length=tl, attn_sink=sink)
    assert torch.isneginf(lse[1]).all() and torch.isneginf(lse[3]).all() and (out[1] == 0).all()
    assert (out[0, 0] == 0).all()  # a +inf sink takes everything
    assert_matches(out, lse, ref_out, ref_lse, **prob.tol, what=kernel)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_empty_lists(kernel):
    """No valid entry: out exactly 0 and lse -inf, whatever the sink."""
    prob = v4_problem(2, 3, 16, 16, invalid_frac=1.0)
    out, lse = run_kernel(prob, kernel, out=nan_out(2, 3), attn_sink=torch.full((3,), math.inf, device=DEVICE))
    assert torch.isneginf(lse).all() and (out == 0).all()


@pytest.mark.parametrize("kernel,num_splits", [("prefill", None), ("decode", 1), ("decode", 3), ("decode", 7)])
def test_extra_cache_in_v4_format(kernel, num_splits):
    """DeepSeek-V4's two lists (SWA window and compressed tokens): both caches in V4 pages with their own block sizes
    (64 = vLLM's and 4), lengths, garbage slots in both lists, sinks; decode splits start anywhere in either list."""
    prob = v4_problem(3, 5, 29, 64, num_blocks=2, layout="padded")
    add_extra(prob, 21, 4, num_blocks2=5, lengths=i32([13, 21, 0]))
    prob.extra["extra_indices"][1, :2] = i32([INT32_MAX, -5])
    tl = i32([29, 7, 0])
    sink = torch.tensor([0.5, -math.inf, 2.0, 0.0, -1.0], device=DEVICE)
    kw = {} if num_splits is None else {"num_splits": num_splits}
    out, lse = run_kernel(prob, kernel, out=nan_out(3, 5), topk_length=tl, attn_sink=sink, **kw)
    ref_out, ref_lse = run_reference(prob, topk_length=tl, attn_sink=sink)
    assert_matches(out, lse, ref_out, ref_lse, **prob.tol, what=f"{kernel} {num_splits}")
    assert torch.isneginf(lse[2]).all() and (out[2] == 0).all()  # both lists empty in row 2


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_empty_main_list_with_a_full_extra_list(kernel):
    """A row whose window list is empty (length 0, or only invalid ids) still attends to its compressed list (a
    layer's first tokens: the compressed cache holds what the window does not); sinks ±inf."""
    prob = v4_problem(3, 4, 16, 64, num_blocks=2, layout="padded")
    prob.indices[1] = -1
    add_extra(prob, 24, 2, num_blocks2=9, lengths=i32([24, 11, 100]))
    tl = i32([0, 16, 16])
    sink = torch.tensor([math.inf, -math.inf, 0.5, -2.0], device=DEVICE)
    out, lse = run_kernel(prob, kernel, out=nan_out(3, 4), topk_length=tl, attn_sink=sink)
    ref_out, ref_lse = run_reference(prob, topk_length=tl, attn_sink=sink)
    assert_matches(out, lse, ref_out, ref_lse, **prob.tol, what=kernel)
    assert torch.isfinite(lse[:2]).all()  # rows 0 and 1 see only their extra list


def test_reference_matches_a_literal_loop():
    """The reference on V4 pages against the formula written out: K = dequantize_fp8_ds_mla_v4 rows, V = K."""
    prob = v4_problem(2, 3, 12, 4, num_blocks=4)
    add_extra(prob, 5, 16, num_blocks2=1)
    ref_out, ref_lse = run_reference(prob)

    def rows(cache, bs):
        p = cache.as_strided((cache.shape[0], F.v4_page_bytes(bs)), (cache.stride(0), 1), cache.storage_offset())
        return F.dequantize_fp8_ds_mla_v4(p.contiguous() if cache.shape[0] > 1 else p, bs).double().reshape(-1, 512)

    lists = [(rows(prob.kv_cache, 4), prob.indices), (rows(prob.extra["extra_kv_cache"], 16),
                                                      prob.extra["extra_indices"])]
    q = prob.q.double().cpu()
    for t in range(prob.T):
        ks = [k[i] for k, idx in lists for i in idx[t].tolist() if 0 <= i < k.shape[0]]
        K = torch.stack(ks)
        s = q[t] @ K.T * SCALE
        assert torch.allclose(ref_lse[t], torch.logsumexp(s, -1), atol=1e-12)
        assert torch.allclose(ref_out[t], torch.softmax(s, -1) @ K, atol=1e-12)


def test_sparse_mla_inputs_builds_v4_problems():
    """The shared problem builder (benchmarks, check, the GPU tier) makes V4 problems: 512-wide q, vLLM's view."""
    inp = sparse_mla_inputs("decode", rows=2, heads=3, ctx=64, topk=16, requests=2, block_size=16, kv_format=V4,
                            q_dtype=torch.float16, device=DEVICE)
    assert inp.q.shape == (2, 3, 512) and inp.kv_cache.shape == (8, 16, 584) and inp.kv_cache.stride()[1:] == (584, 1)
    prob = Problem(q=inp.q, kv_cache=inp.kv_cache, indices=inp.indices, softmax_scale=SCALE, kv_format=V4)
    out, lse = run_kernel(prob, "decode", out=nan_out(2, 3))
    assert_matches(out, lse, *run_reference(prob), **prob.tol, what="sparse_mla_inputs")
    assert inp.unique_bytes == inp.unique_rows * 584 + inp.q.numel() * 2 + 2 * 3 * 512 * 2


# ------------------------------------------------------------------------------------------ the kernel's dequantisation

@pytest.mark.parametrize("block_size", [1, 16])
def test_kernel_reads_exactly_what_dequantize_gives(block_size):
    """quantize_fp8_ds_mla_v4 pages through the kernel: one valid slot per row makes out = that slot's K row, which
    must equal formats.dequantize_fp8_ds_mla_v4 bit for bit (the values are exact in float16; scales from 2^-13 to
    2^-1 and the seven groups' scales all different)."""
    nb = 2 if block_size > 1 else 12
    values = v4_values(nb, block_size) * torch.tensor([2.0 ** e for e in (-6, -2, 0, 3, 5, -4, 1, 2, -3, 4, -1, 6)
                                                       ][:nb]).reshape(nb, 1, 1)
    pages = F.quantize_fp8_ds_mla_v4(values).to(DEVICE)
    n = nb * block_size
    want = F.dequantize_fp8_ds_mla_v4(pages, block_size).reshape(n, 512)
    q = torch.randn(n, 1, 512).to(torch.float16).to(DEVICE)
    idx = torch.arange(n, dtype=torch.int32, device=DEVICE)[:, None]
    for kernel in ("decode", "prefill"):
        out, lse = run_kernel(Problem(q=q, kv_cache=F.v4_token_view(pages, block_size), indices=idx,
                                      softmax_scale=SCALE, kv_format=V4), kernel)
        assert torch.equal(out[:, 0].float().cpu(), want.cpu()), kernel
        s = (q[:, 0].double().cpu() * want.double()).sum(-1) * SCALE
        assert torch.allclose(lse[:, 0].double().cpu(), s, rtol=0, atol=1e-3), kernel


def test_garbage_indices_never_read_outside_the_cache():
    """Pages that end their allocation (the last byte of the last footer is the buffer's last byte): garbage slots
    in either list read nothing outside the cache tensors (interpreter_memcheck), footers included."""
    bs, nb = 16, 3
    pages = F.quantize_fp8_ds_mla_v4(v4_values(nb, bs)).to(DEVICE)
    used = bs * F.V4_TOKEN_BYTES
    stride = pages.shape[1] + 64
    buf = torch.full(((nb - 1) * stride + used,), 0xFF, dtype=torch.uint8, device=DEVICE)
    view = buf.as_strided((nb, bs, F.V4_TOKEN_BYTES), (stride, F.V4_TOKEN_BYTES, 1))
    for b in range(nb):
        buf[b * stride:b * stride + used] = pages[b, :used]
    q = torch.randn(2, 3, 512).to(torch.float16).to(DEVICE)
    idx = i32([[INT32_MAX, nb * bs, nb * bs - 1, -1, INT32_MIN], [0, nb * bs + 100, 5, 2 ** 30, nb * bs - 1]])
    with interpreter_memcheck() as mc:
        out, lse = run_kernel(Problem(q=q, kv_cache=view, indices=idx, softmax_scale=SCALE, kv_format=V4),
                              "decode", out=nan_out(2, 3), extra_kv_cache=view, extra_indices=idx.flip(1).contiguous())
    assert mc.launches >= 1 and not mc.violations, mc.violations
    clean = F.v4_token_view(pages, bs)
    ref_out, ref_lse = reference.sparse_mla_attention(q, clean, idx, SCALE, kv_format=V4, extra_kv_cache=clean,
                                                      extra_indices=idx.flip(1).contiguous(), return_lse=True,
                                                      compute_dtype=torch.float64, out_dtype=torch.float64)
    assert_matches(out, lse, ref_out, ref_lse, what="garbage slots")


# ------------------------------------------------------------------------------------------ validation

def _base():
    kv, pages = v4_cache(2, 16, "vllm")
    q = torch.randn(2, 4, 512).to(torch.float16).to(DEVICE)
    return q, kv, pages, make_indices(2, 8, 32, 0.0)


def _bad_cases():
    q, kv, pages, idx = _base()
    odd = torch.zeros(pages.numel() + 1, dtype=torch.uint8, device=DEVICE)[1:].view(pages.shape)[:, :16 * 584]
    overlapping = pages.as_strided((2, 16, 584), (100, 584, 1))
    return q, idx, [
        (dict(kv_cache=kv.view(torch.int8)), "kv_cache: expected dtype torch.uint8"),
        (dict(kv_cache=kv.to(torch.bfloat16)), "kv_cache: expected dtype torch.uint8"),
        (dict(kv_cache=pages[:, :656 * 2].reshape(2, 2, 656)), "kv_cache: expected uint8"),
        (dict(kv_cache=pages[:, :-1]), "kv_cache: expected uint8 .*is no multiple of 584"),
        # whole pages: the width of a padded page does not say the block size (66 · 576 bytes would be block size
        # 65's page), so 2-D means vLLM's writer view [nb, block_size · 584] only
        (dict(kv_cache=pages), "kv_cache: expected uint8 .*v4_token_view.*is no multiple of 584"),
        (dict(kv_cache=torch.zeros(2, 66 * 576, dtype=torch.uint8, device=DEVICE)),
         "kv_cache: expected uint8 .*is no multiple of 584"),
        (dict(kv_cache=pages[:, :16 * 576].reshape(2, 16, 576)), "kv_cache: expected uint8"),
        (dict(kv_cache=kv[:, ::2]), r"kv_cache: expected strides \(page stride, 584, 1\)"),
        (dict(kv_cache=overlapping), "kv_cache: expected a page stride of at least"),
        (dict(kv_cache=odd), "kv_cache: expected pages aligned to 2 bytes"),
        (dict(q=torch.randn(2, 4, 576).half().to(DEVICE)), "q: expected D_qk 512"),
        (dict(q=(q, torch.randn(2, 4, 64).half().to(DEVICE))), "q: expected D_qk 512"),
        (dict(extra_kv_cache=kv.to(torch.bfloat16), extra_indices=idx), "extra_kv_cache: expected dtype torch.uint8"),
        (dict(extra_kv_cache=encode_cache(torch.randn(2, 16, 576), "fp8_ds_mla")[0].to(DEVICE), extra_indices=idx),
         "extra_kv_cache: expected uint8"),
        (dict(kv_format="fp8_ds_mla"), "kv_cache: expected shape .*needs kv_format='fp8_ds_mla_v4'"),
        (dict(kv_format=None), "kv_cache: expected shape .*needs kv_format='fp8_ds_mla_v4'"),
        (dict(kv_format=None, kv_cache=pages), "kv_cache: expected shape .*needs kv_format='fp8_ds_mla_v4'"),
        (dict(kv_format="fp8_ds_mla_v5"), "kv_format: expected one of"),
    ]


def test_every_malformed_argument_is_one_value_error():
    q, idx, cases = _bad_cases()
    _, kv, _, _ = _base()
    from triton_mla_sparse.ops.sparse_mla import sparse_mla_attention_with_config

    for kw, match in cases:
        args = dict(q=q, kv_cache=kv, indices=idx, softmax_scale=SCALE, kv_format=V4)
        args.update(kw)
        for fn in (sparse_mla_attention_with_config, reference.sparse_mla_attention):
            out = nan_out(2, 4)
            with pytest.raises(ValueError, match=f"^{match}"):
                fn(**args, out=out)
            assert torch.isnan(out).all()  # nothing written


def test_accepted_views_normalise_to_the_same_pages():
    kv, pages = v4_cache(3, 16, "writer")
    q = torch.randn(1, 2, 512).half().to(DEVICE)
    idx = i32([[0, 47]])
    probs = [check_attention_inputs(q, place_v4(pages, 16, layout), idx, SCALE, kv_format=V4)
             for layout in V4_LAYOUTS]
    for p in probs:
        assert (p.block_size, p.num_slots, p.d_rope) == (16, 48, 0)
        assert p.kv.shape == (3, 16 * 584) and torch.equal(p.kv.cpu(), pages[:, :16 * 584].cpu())
    assert F.infer_kv_format(kv) == "fp8_ds_mla"  # uint8 alone means fp8_ds_mla: V4 is always named


def test_page_geometry():
    for bs in (1, 2, 16, 63, 64, 71, 72, 73, 128, 256):
        assert F.v4_block_size(F.v4_page_bytes(bs)) == bs
        assert F.v4_block_size(F.v4_page_bytes(bs) + 576) != bs
    assert F.v4_block_size(584) is None and F.v4_block_size(0) is None
    assert F.kv_row_width(V4) == 584 and F.KV_FORMAT_DTYPES[V4] == torch.uint8
    assert V4 in F.ALL_KV_FORMATS and V4 not in F.KV_FORMATS


# ------------------------------------------------------------------------------------------ capability and configs

def test_problem_reasons():
    assert problem_reasons(kv_format=V4, d_rope=0) == []
    assert any("D_rope" in r for r in problem_reasons(kv_format=V4, d_rope=64))


def test_v4_targets_and_the_tl_kernel():
    """Under the interpreter the tl kernel reads V4 pages (the Gluon kernels, which read them on NVIDIA GPUs, do not
    run there, so a family override is refused); the targets without a V4 table entry (RDNA3, whose build spills:
    the compile matrix) refuse the format in choose_config, and the API refuses it there before launching
    (v4_supported)."""
    cpu = torch.device("cpu")
    supported = {name for name, arch in ARCHS.items() if v4_supported(arch)}
    assert supported == {n for n, a in ARCHS.items() if a.backend == "cuda"} | {"gfx942", "gfx950", "gfx1200",
                                                                                   "gfx1201"}
    assert v4_supported(None)
    for name in supported:
        for H in (3, 16, 64, 128):
            cfg = choose_config(64, H, 2048, cpu, kv_format=V4, arch=ARCHS[name], q_dtype=torch.bfloat16)
            assert cfg.family == "tl" and not cfg.f16_dot and not cfg.low_reg, (name, cfg)
    with pytest.raises(ValueError, match="^family"):
        choose_config(64, 16, 2048, cpu, kv_format=V4, arch=ARCHS["sm90"], family="wgmma_t")
    with pytest.raises(ValueError, match="^low_reg"):
        choose_config(64, 16, 2048, cpu, kv_format=V4, low_reg=True)


def test_rdna3_is_refused(monkeypatch):
    from triton_mla_sparse.ops.sparse_mla import configs

    monkeypatch.setattr(configs, "interpreting", lambda: False)
    for name in ("gfx1100", "gfx1101", "gfx1151"):
        with pytest.raises(ValueError, match="^kv_format: 'fp8_ds_mla_v4' is not built for"):
            choose_config(64, 16, 2048, torch.device("cpu"), kv_format=V4, arch=ARCHS[name])

"""Argument validation: every bad input raises one ValueError naming the argument, before anything is written.

The same table runs against the Triton entry point and the reference (they share the checks). Wrong devices are
exercised with "meta" tensors, which works on a CPU-only machine.
"""

import pytest
import torch

import triton_mla_sparse as tms
from helpers import DEVICE, encode, kv_values, place
from triton_mla_sparse import reference
from triton_mla_sparse.ops.sparse_mla.api import sparse_mla_attention_with_config

T, H, TOPK, BS, NB = 2, 3, 4, 16, 2
SENTINEL = 7.0


@pytest.fixture(autouse=True)
def default_device():
    """New tensors of the table (torch.zeros(...) etc.) land on the test device."""
    prev = torch.get_default_device()
    torch.set_default_device(DEVICE)
    yield
    torch.set_default_device(prev)


def good(fmt: str = "fp16", d_qk: int = 576) -> dict:
    """A valid call (as keyword arguments) for format ``fmt`` on the test device."""
    stored, k_scale = encode(kv_values(NB * BS, d_qk).reshape(NB, BS, d_qk).cpu(), fmt)
    return dict(q=torch.randn(T, H, d_qk).half(), kv_cache=place(stored, "3d"),
                indices=torch.randint(0, NB * BS, (T, TOPK), dtype=torch.int32), softmax_scale=0.1, kv_format=fmt,
                k_scale=k_scale, out=torch.full((T, H, 512), SENTINEL, dtype=torch.float16))


def strided_last(shape, dtype=torch.float16):
    """A tensor of ``shape`` whose last stride is 2."""
    *lead, last = shape
    return torch.zeros(*lead, 2 * last, dtype=dtype)[..., ::2]


def qt(d):
    """(q_nope, q_pe) of the valid q."""
    return d["q"][..., :512], d["q"][..., 512:]


META = "meta"
# (id, argument name expected in the message, format of the valid base, mutation: dict -> overrides)
CASES = [
    # q
    ("q_float32", "q", "fp16", lambda d: dict(q=d["q"].float())),
    ("q_float64", "q", "fp16", lambda d: dict(q=d["q"].double())),
    ("q_int32", "q", "fp16", lambda d: dict(q=d["q"].int())),
    ("q_fp8", "q", "fp16", lambda d: dict(q=d["q"].to(torch.float8_e4m3fn))),
    ("q_width_575", "q", "fp16", lambda d: dict(q=d["q"][..., :575])),
    ("q_width_640", "q", "fp16", lambda d: dict(q=torch.zeros(T, H, 640).half())),
    ("q_2d", "q", "fp16", lambda d: dict(q=d["q"][:, 0])),
    ("q_4d", "q", "fp16", lambda d: dict(q=d["q"][:, :, None])),
    ("q_last_stride", "q", "fp16", lambda d: dict(q=strided_last((T, H, 576)))),
    ("q_no_heads", "q", "fp16", lambda d: dict(q=d["q"][:, :0], out=None)),
    ("q_none", "q", "fp16", lambda d: dict(q=None)),
    ("q_numpy", "q", "fp16", lambda d: dict(q=d["q"].cpu().numpy())),
    ("q_tuple_of_3", "q", "fp16", lambda d: dict(q=(*qt(d), qt(d)[1]))),
    ("q_tuple_of_1", "q", "fp16", lambda d: dict(q=(qt(d)[0],))),
    ("q_nope_float32", "q_nope", "fp16", lambda d: dict(q=(qt(d)[0].float(), qt(d)[1]))),
    ("q_nope_width", "q_nope", "fp16", lambda d: dict(q=(qt(d)[0][..., :511], qt(d)[1]))),
    ("q_nope_576", "q_nope", "fp16", lambda d: dict(q=(d["q"], qt(d)[1]))),
    ("q_nope_last_stride", "q_nope", "fp16", lambda d: dict(q=(strided_last((T, H, 512)), qt(d)[1]))),
    ("q_nope_not_tensor", "q_nope", "fp16", lambda d: dict(q=([0.0] * 512, qt(d)[1]))),
    ("q_pe_dtype", "q_pe", "fp16", lambda d: dict(q=(qt(d)[0], qt(d)[1].bfloat16()))),
    ("q_pe_width", "q_pe", "fp16", lambda d: dict(q=(qt(d)[0], qt(d)[1][..., :32]))),
    ("q_pe_heads", "q_pe", "fp16", lambda d: dict(q=(qt(d)[0], torch.zeros(T, H + 1, 64).half()))),
    ("q_pe_rows", "q_pe", "fp16", lambda d: dict(q=(qt(d)[0], torch.zeros(T + 1, H, 64).half()))),
    ("q_pe_last_stride", "q_pe", "fp16", lambda d: dict(q=(qt(d)[0], strided_last((T, H, 64))))),
    ("q_pe_not_tensor", "q_pe", "fp16", lambda d: dict(q=(qt(d)[0], 1.0))),
    ("q_pe_device", "q_pe", "fp16", lambda d: dict(q=(qt(d)[0], qt(d)[1].to(META)))),
    # kv_cache / kv_format
    ("kv_float32", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"].float(), kv_format=None)),
    ("kv_float32_fmt", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"].float())),
    ("kv_e5m2", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"].to(torch.float8_e5m2), kv_format=None)),
    ("kv_int8", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"].to(torch.int8), kv_format=None)),
    ("kv_bf16_as_fp16", "kv_cache", "bf16", lambda d: dict(kv_format="fp16")),
    ("kv_fp16_as_bf16", "kv_cache", "fp16", lambda d: dict(kv_format="bf16")),
    ("kv_fp16_as_ds_mla", "kv_cache", "fp16", lambda d: dict(kv_format="fp8_ds_mla")),
    ("kv_uint8_as_e4m3", "kv_cache", "fp8_ds_mla", lambda d: dict(kv_format="fp8_e4m3", k_scale=1.0)),
    ("kv_e4m3_as_ds_mla", "kv_cache", "fp8_e4m3", lambda d: dict(kv_format="fp8_ds_mla", k_scale=None)),
    ("kv_format_unknown", "kv_format", "fp16", lambda d: dict(kv_format="fp8")),
    ("kv_format_case", "kv_format", "fp16", lambda d: dict(kv_format="FP16")),
    ("kv_format_int", "kv_format", "fp16", lambda d: dict(kv_format=16)),
    ("kv_format_dtype", "kv_format", "fp16", lambda d: dict(kv_format=torch.float16)),
    ("kv_row_575", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"][..., :575])),
    ("kv_row_512_for_576", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"][..., :512])),
    ("kv_row_576_for_nope", "kv_cache", "fp16", lambda d: dict(q=d["q"][..., :512])),
    ("kv_ds_mla_655", "kv_cache", "fp8_ds_mla", lambda d: dict(kv_cache=d["kv_cache"][..., :655])),
    ("kv_ds_mla_576", "kv_cache", "fp8_ds_mla", lambda d: dict(kv_cache=d["kv_cache"][..., :576])),
    ("kv_1d", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"][0, 0])),
    ("kv_5d", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"][:, :, None, None])),
    ("kv_4d_two_heads", "kv_cache", "fp16",
     lambda d: dict(kv_cache=d["kv_cache"][:, :, None].expand(NB, BS, 2, 576))),
    ("kv_last_stride", "kv_cache", "fp16", lambda d: dict(kv_cache=strided_last((NB, BS, 576)))),
    ("kv_overlapping_blocks", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"][:1].expand(NB, BS, 576))),
    ("kv_overlapping_rows", "kv_cache", "fp16",
     lambda d: dict(kv_cache=d["kv_cache"].as_strided((NB, BS, 576), (BS * 576, 100, 1)))),
    ("kv_block_stride_short", "kv_cache", "fp16",
     lambda d: dict(kv_cache=d["kv_cache"].as_strided((NB, BS, 576), ((BS - 1) * 576, 576, 1)))),
    ("kv_flat_overlapping", "kv_cache", "fp16",
     lambda d: dict(kv_cache=d["kv_cache"].reshape(-1, 576).as_strided((NB * BS, 576), (288, 1)))),
    ("kv_ds_mla_misaligned_start", "kv_cache", "fp8_ds_mla",
     lambda d: dict(kv_cache=torch.zeros(NB * BS * 656 + 1, dtype=torch.uint8)[1:].view(NB, BS, 656))),
    ("kv_ds_mla_misaligned_rows", "kv_cache", "fp8_ds_mla",
     lambda d: dict(kv_cache=torch.zeros(NB, BS, 658, dtype=torch.uint8)[..., :656])),
    ("kv_none", "kv_cache", "fp16", lambda d: dict(kv_cache=None)),
    ("kv_device", "kv_cache", "fp16", lambda d: dict(kv_cache=d["kv_cache"].to(META))),
    # indices
    ("indices_int64", "indices", "fp16", lambda d: dict(indices=d["indices"].long())),
    ("indices_int16", "indices", "fp16", lambda d: dict(indices=d["indices"].short())),
    ("indices_uint32", "indices", "fp16", lambda d: dict(indices=d["indices"].to(torch.uint32))),
    ("indices_float", "indices", "fp16", lambda d: dict(indices=d["indices"].float())),
    ("indices_list", "indices", "fp16", lambda d: dict(indices=d["indices"].tolist())),
    ("indices_rows", "indices", "fp16", lambda d: dict(indices=torch.zeros(T + 1, TOPK, dtype=torch.int32))),
    ("indices_1d", "indices", "fp16", lambda d: dict(indices=d["indices"].reshape(-1))),
    ("indices_topk_0", "indices", "fp16", lambda d: dict(indices=d["indices"][:, :0])),
    ("indices_3d", "indices", "fp16", lambda d: dict(indices=torch.zeros(T, 2, TOPK, dtype=torch.int32))),
    ("indices_device", "indices", "fp16", lambda d: dict(indices=d["indices"].to(META))),
    # softmax_scale
    ("scale_tensor", "softmax_scale", "fp16", lambda d: dict(softmax_scale=torch.tensor(0.1))),
    ("scale_str", "softmax_scale", "fp16", lambda d: dict(softmax_scale="0.1")),
    ("scale_none", "softmax_scale", "fp16", lambda d: dict(softmax_scale=None)),
    ("scale_bool", "softmax_scale", "fp16", lambda d: dict(softmax_scale=True)),
    ("scale_nan", "softmax_scale", "fp16", lambda d: dict(softmax_scale=float("nan"))),
    ("scale_inf", "softmax_scale", "fp16", lambda d: dict(softmax_scale=float("inf"))),
    ("scale_zero", "softmax_scale", "fp16", lambda d: dict(softmax_scale=0.0)),
    ("scale_int_zero", "softmax_scale", "fp16", lambda d: dict(softmax_scale=0)),
    ("scale_negative", "softmax_scale", "fp16", lambda d: dict(softmax_scale=-0.1)),
    # k_scale
    ("k_scale_missing", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=None)),
    ("k_scale_for_fp16", "k_scale", "fp16", lambda d: dict(k_scale=1.0)),
    ("k_scale_tensor_for_bf16", "k_scale", "bf16", lambda d: dict(k_scale=torch.ones(1))),
    ("k_scale_for_ds_mla", "k_scale", "fp8_ds_mla", lambda d: dict(k_scale=1.0)),
    ("k_scale_float64", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=torch.ones(1, dtype=torch.float64))),
    ("k_scale_float16", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=torch.ones(1, dtype=torch.float16))),
    ("k_scale_int", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=torch.ones(1, dtype=torch.int32))),
    ("k_scale_two", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=torch.ones(2))),
    ("k_scale_empty", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=torch.ones(0))),
    ("k_scale_zero", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=0.0)),
    ("k_scale_negative", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=-1.0)),
    ("k_scale_nan", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=float("nan"))),
    ("k_scale_inf", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=float("inf"))),
    ("k_scale_bool", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=True)),
    ("k_scale_str", "k_scale", "fp8_e4m3", lambda d: dict(k_scale="1.0")),
    ("k_scale_list", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=[1.0])),
    ("k_scale_device", "k_scale", "fp8_e4m3", lambda d: dict(k_scale=torch.ones(1, device=META))),
    # topk_length
    ("topk_length_int64", "topk_length", "fp16", lambda d: dict(topk_length=torch.ones(T, dtype=torch.int64))),
    ("topk_length_float", "topk_length", "fp16", lambda d: dict(topk_length=torch.ones(T))),
    ("topk_length_rows", "topk_length", "fp16", lambda d: dict(topk_length=torch.ones(T + 1, dtype=torch.int32))),
    ("topk_length_2d", "topk_length", "fp16", lambda d: dict(topk_length=torch.ones(T, 1, dtype=torch.int32))),
    ("topk_length_0d", "topk_length", "fp16", lambda d: dict(topk_length=torch.tensor(1, dtype=torch.int32))),
    ("topk_length_list", "topk_length", "fp16", lambda d: dict(topk_length=[1] * T)),
    ("topk_length_device", "topk_length", "fp16",
     lambda d: dict(topk_length=torch.ones(T, dtype=torch.int32, device=META))),
    # attn_sink
    ("attn_sink_float16", "attn_sink", "fp16", lambda d: dict(attn_sink=torch.zeros(H, dtype=torch.float16))),
    ("attn_sink_float64", "attn_sink", "fp16", lambda d: dict(attn_sink=torch.zeros(H, dtype=torch.float64))),
    ("attn_sink_bf16", "attn_sink", "fp16", lambda d: dict(attn_sink=torch.zeros(H, dtype=torch.bfloat16))),
    ("attn_sink_heads", "attn_sink", "fp16", lambda d: dict(attn_sink=torch.zeros(H + 1))),
    ("attn_sink_2d", "attn_sink", "fp16", lambda d: dict(attn_sink=torch.zeros(1, H))),
    ("attn_sink_0d", "attn_sink", "fp16", lambda d: dict(attn_sink=torch.tensor(0.0))),
    ("attn_sink_list", "attn_sink", "fp16", lambda d: dict(attn_sink=[0.0] * H)),
    ("attn_sink_device", "attn_sink", "fp16", lambda d: dict(attn_sink=torch.zeros(H, device=META))),
    # out
    ("out_float32", "out", "fp16", lambda d: dict(out=torch.full((T, H, 512), SENTINEL))),
    ("out_bf16", "out", "fp16", lambda d: dict(out=torch.full((T, H, 512), SENTINEL, dtype=torch.bfloat16))),
    ("out_width_576", "out", "fp16", lambda d: dict(out=torch.full((T, H, 576), SENTINEL).half())),
    ("out_heads", "out", "fp16", lambda d: dict(out=torch.full((T, H + 1, 512), SENTINEL).half())),
    ("out_rows", "out", "fp16", lambda d: dict(out=torch.full((T + 1, H, 512), SENTINEL).half())),
    ("out_2d", "out", "fp16", lambda d: dict(out=torch.full((T * H, 512), SENTINEL).half())),
    ("out_last_stride", "out", "fp16",
     lambda d: dict(out=torch.full((T, H, 1024), SENTINEL).half()[..., ::2])),
    ("out_numpy", "out", "fp16", lambda d: dict(out=torch.zeros(T, H, 512).half().cpu().numpy())),
    ("out_device", "out", "fp16", lambda d: dict(out=torch.zeros(T, H, 512, device=META).half())),
    # limits: unsupported sizes are rejected up front, with the reason
    ("q_129_heads", "q", "fp16", lambda d: dict(q=torch.randn(T, 129, 576).half())),
    ("q_4096_heads", "q", "fp16", lambda d: dict(q=torch.zeros(T, 1, 576).half().expand(T, 4096, 576))),
    ("q_tuple_129_heads", "q", "fp16",
     lambda d: dict(q=(torch.zeros(T, 129, 512).half(), torch.zeros(T, 129, 64).half()))),
    ("q_nope_129_heads", "q", "fp16", lambda d: dict(q=torch.zeros(T, 129, 512).half(), kv_format=None,
                                                     kv_cache=torch.zeros(NB, BS, 512).half())),
    ("q_rows_2_31", "q", "fp16", lambda d: dict(q=torch.zeros(1, H, 576).half().expand(2**31, H, 576))),
    ("indices_topk_16385", "indices", "fp16", lambda d: dict(indices=torch.zeros(T, 16385, dtype=torch.int32))),
    ("indices_topk_2_20", "indices", "fp16",
     lambda d: dict(indices=torch.zeros(T, 1, dtype=torch.int32).expand(T, 2**20))),
]
IMPLS = {"triton": tms.sparse_mla_attention, "reference": reference.sparse_mla_attention}


def call(fn, d, **extra):
    d = dict(d)
    return fn(d.pop("q"), d.pop("kv_cache"), d.pop("indices"), d.pop("softmax_scale"), **d, **extra)


def assert_rejected(fn, d, name, **extra):
    outs = [d["out"]] if isinstance(d.get("out"), torch.Tensor) and d["out"].device.type != META else []
    before = [o.clone() for o in outs]
    with pytest.raises(ValueError) as e:
        call(fn, d, **extra)
    msg = str(e.value)
    assert msg.startswith(name) or f"{name}:" in msg or f"({name})" in msg, f"{name!r} not named in: {msg}"
    for o, b in zip(outs, before):
        assert torch.equal(o, b), "out was written although the call was rejected"


def test_table_covers_every_argument():
    named = {c[1] for c in CASES}
    assert named >= {"q", "q_nope", "q_pe", "kv_cache", "kv_format", "indices", "softmax_scale", "k_scale",
                     "topk_length", "attn_sink", "out"}
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla"])
def test_valid_base_is_accepted(fmt, impl):
    """The base of every table case is valid (so each case fails for its one mutation only)."""
    d = good(fmt)
    res = call(IMPLS[impl], d, attn_sink=torch.zeros(H), topk_length=torch.full((T,), TOPK, dtype=torch.int32))
    assert res is d["out"] and torch.isfinite(res).all() and not (res == SENTINEL).all()


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("case_id,name,fmt,mutate", CASES, ids=[c[0] for c in CASES])
def test_rejects(case_id, name, fmt, mutate, impl):
    d = good(fmt)
    d.update(mutate(d))
    assert_rejected(IMPLS[impl], d, name)


def test_reference_rejects_compute_dtype():
    d = good()
    for cd in (torch.float16, torch.bfloat16, "float64", None):
        assert_rejected(reference.sparse_mla_attention, d, "compute_dtype", compute_dtype=cd)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    """CPU tensors without TRITON_INTERPRET: the Triton entry point refuses them (naming q) before writing anything;
    the reference runs anywhere. The interpreter switch is read per call, so it can be turned off here."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch.set_default_device("cpu")
    d = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in good().items()}
    assert_rejected(tms.sparse_mla_attention, d, "q")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        call(tms.sparse_mla_attention, d)
    assert call(reference.sparse_mla_attention, d) is d["out"]


def test_kernel_choice_rejected():
    d = good()
    assert_rejected(sparse_mla_attention_with_config, d, "kernel", kernel="split")


def test_accepted_variants():
    """Inputs that look unusual but are valid: int softmax_scale and k_scale, 0-dim k_scale tensor, indices
    [T, 1, topk], q_pe None / width 0 for NoPE, empty T."""
    d = good("fp8_e4m3")
    for kw in (dict(softmax_scale=1), dict(k_scale=2), dict(k_scale=torch.tensor(0.5)),
               dict(indices=d["indices"][:, None, :])):
        call(reference.sparse_mla_attention, {**d, **kw})
    dn = good("fp16", d_qk=512)
    q = dn.pop("q")
    for qf in ((q, None), (q, q[..., :0])):
        call(reference.sparse_mla_attention, {**dn, "q": qf})


@pytest.mark.parametrize("impl", list(IMPLS))
def test_limit_messages_give_the_limit_and_reason(impl):
    d = good()
    for mutation, name, words in [
        (dict(q=torch.randn(T, 129, 576).half()), "q", ("at most 128 heads", "129")),
        (dict(indices=torch.zeros(T, 16385, dtype=torch.int32)), "indices", ("topk <= 16384", "16385")),
        (dict(q=torch.zeros(1, H, 576).half().expand(2**31, H, 576)), "q", ("2147483647 rows", "launch grid")),
    ]:
        with pytest.raises(ValueError) as e:
            call(IMPLS[impl], {**d, **mutation})
        msg = str(e.value)
        assert msg.startswith(f"{name}: expected") and all(w in msg for w in words), msg
        assert "(" in msg.split("got")[0], f"no reason given: {msg}"
    assert (d["out"] == SENTINEL).all()


def test_limits_themselves_are_accepted():
    """128 heads, topk 16384 and 2^31 - 1 rows pass validation (checked without running: expanded views)."""
    from triton_mla_sparse.capabilities import MAX_HEADS, MAX_TOPK
    from triton_mla_sparse.ops.sparse_mla.api import MAX_ROWS, check_attention_inputs

    assert (MAX_HEADS, MAX_TOPK, MAX_ROWS) == (128, 16384, 2**31 - 1)
    d = good()
    p = check_attention_inputs(torch.zeros(1, 1, 576).half().expand(MAX_ROWS, MAX_HEADS, 576), d["kv_cache"],
                               torch.zeros(1, 1, dtype=torch.int32).expand(MAX_ROWS, MAX_TOPK), 0.1)
    assert (p.T, p.H, p.topk) == (MAX_ROWS, MAX_HEADS, MAX_TOPK)
    p = check_attention_inputs((torch.zeros(2, 128, 512).half(), None), d["kv_cache"][..., :512].contiguous(),
                               torch.zeros(2, 1, MAX_TOPK, dtype=torch.int32), 0.1)
    assert (p.H, p.topk) == (128, MAX_TOPK)


def test_reference_at_the_limits():
    """The reference computes a call at the largest supported head count and top-k (one row)."""
    d = good()
    idx = torch.randint(-5, NB * BS + 5, (1, 16384), dtype=torch.int32)
    q = torch.randn(1, 128, 576).half()
    out, lse = reference.sparse_mla_attention(q, d["kv_cache"], idx, 0.1, return_lse=True)
    assert out.shape == (1, 128, 512) and torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_head_block_too_large_for_the_target_is_refused(monkeypatch):
    """sm100 cannot build a 64-head block (tensor memory): an override asking for one fails up front, by name."""
    import torch

    from triton_mla_sparse.capabilities import ARCHS
    from triton_mla_sparse.ops.sparse_mla import configs

    monkeypatch.setattr(configs, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="block_h: at most 32 on sm100"):
        configs.choose_config(64, 128, 2048, torch.device("cpu"), "prefill", arch=ARCHS["sm100"], block_h=64)
    cfg = configs.choose_config(64, 128, 2048, torch.device("cpu"), "prefill", arch=ARCHS["sm90"], block_h=64,
                                block_n=64)
    assert (cfg.block_h, cfg.block_n) == (64, 64)
    assert configs.choose_config(64, 128, 2048, torch.device("cpu"), "prefill", arch=ARCHS["sm100"]).block_h == 32

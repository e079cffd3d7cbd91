"""The launch table's kernel choice (configs.choose_config): which family serves a problem on which target, read
against the table data itself (GLUON_TABLE / TABLE), and the family override's checks. CPU only: nothing launches."""

from __future__ import annotations

import pytest
import torch

from triton_mla_sparse.capabilities import ARCHS
from triton_mla_sparse.ops.sparse_mla import configs
from triton_mla_sparse.ops.sparse_mla.configs import (GLUON_TABLE, HEAD_CLASSES, TABLE, cache_class, choose_config,
                                                      gluon_config_problem, gluon_supported, head_class)
from triton_mla_sparse.ops.sparse_mla.kernels import _rows_16b_aligned

CPU = torch.device("cpu")
FORMATS = ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla")
NATIVE = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture
def on_gpu(monkeypatch):
    """choose_config as on a 132-SM GPU (outside the interpreter)."""
    monkeypatch.setattr(configs, "interpreting", lambda: False)
    monkeypatch.setattr(configs, "multiprocessor_count", lambda device: 132)


def test_gluon_supported(on_gpu):
    assert not gluon_supported("mma2", None, "bf16")
    for name, arch in ARCHS.items():
        cuda80 = arch.backend == "cuda" and int(arch.target) >= 80
        assert gluon_supported("mma2", arch, "bf16") is cuda80
        assert gluon_supported("mma2", arch, "fp8_ds_mla") is cuda80
        assert gluon_supported("mma2", arch, "fp16", torch.float16) is cuda80
        assert gluon_supported("wgmma", arch, "bf16") is (name == "sm90")
        assert not gluon_supported("mma2", arch, "fp8_e4m3")  # per-tensor fp8 stays on the tl kernel
        assert not gluon_supported("mma2", arch, "bf16", torch.float16)  # a cache read in another dtype
        assert not gluon_supported("mma2", arch, "fp8_ds_mla", torch.float16)  # the rows' RoPE is bf16
        assert gluon_supported("mma2", arch, "fp8_ds_mla_v4", torch.bfloat16) is cuda80  # DeepSeek-V4 pages
        assert gluon_supported("wgmma_t", arch, "fp8_ds_mla_v4") is (name == "sm90")
        assert not gluon_supported("mma2", arch, "fp8_ds_mla_v4", torch.float16)
        assert not gluon_supported("tl", arch, "bf16")


def test_interpreter_runs_the_tl_kernel():
    """Gluon kernels cannot run in Triton's interpreter: every choice there is the tl kernel."""
    if not configs.interpreting():
        pytest.skip("the interpreter is off")
    for fmt in FORMATS:
        for H in (8, 16, 64, 128):
            assert choose_config(64, H, 2048, CPU, kv_format=fmt, arch=ARCHS["sm90"]).family == "tl"
    with pytest.raises(ValueError, match="family: the mma2 kernel"):
        choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["sm90"], family="mma2")


@pytest.mark.parametrize("arch_name", [a for a in ARCHS])
def test_every_choice_follows_the_table(on_gpu, arch_name):
    """A Gluon entry serves its classes where its family runs the problem; the tl entry serves everything else, and
    each config carries its entry's sizes (prefill_block_n / prefill_stages only for prefill)."""
    arch = ARCHS[arch_name]
    for fmt in FORMATS:
        for H in (8, 16, 24, 32, 64, 128):
            for T in (1, 64, 256, 4096):
                for q_dtype in (None, torch.bfloat16, torch.float16):
                    cfg = choose_config(T, H, 2048, CPU, kv_format=fmt, arch=arch, q_dtype=q_dtype)
                    key = (head_class(H), cache_class(fmt))
                    entry = GLUON_TABLE.get(arch_name, {}).get(key)
                    gluon = entry is not None and gluon_supported(entry.family, arch, fmt, q_dtype)
                    if gluon and cfg.kernel == "prefill" and entry.prefill is not None:
                        entry = entry.prefill  # the prefill kernel's own entry (another family)
                    want = entry if gluon else TABLE[arch_name][key]
                    assert cfg.family == (entry.family if gluon else "tl"), (arch_name, fmt, H, T, q_dtype)
                    block_n = want.prefill_block_n if cfg.kernel == "prefill" and want.prefill_block_n else \
                        want.block_n
                    stages = want.prefill_stages if cfg.kernel == "prefill" and want.prefill_stages else \
                        want.num_stages
                    assert (cfg.block_h, cfg.block_n, cfg.num_warps, cfg.num_stages) == \
                        (want.block_h, block_n, want.num_warps, stages), (arch_name, fmt, H, T, cfg)
                    if q_dtype is not None and fmt in NATIVE and q_dtype != NATIVE[fmt]:
                        assert cfg.family == "tl"  # the Gluon kernels read 16-bit caches in q's dtype only


def test_prefill_entries_and_one_wave_decode(on_gpu):
    """sm90's <= 16-head bf16 class decodes with wgmma_t and prefills with mma2's one-buffer entry; a forced family
    takes the entry of that family; wgmma_t's decode splits fill one wave of one program per SM."""
    sm90 = ARCHS["sm90"]
    dec = choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, kernel="decode")
    pre = choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, kernel="prefill")
    assert (dec.family, dec.block_n, dec.num_warps, dec.num_stages) == ("wgmma_t", 64, 4, 2)
    assert (pre.family, pre.block_n, pre.num_warps, pre.num_stages) == ("mma2", 64, 4, 1)
    forced = choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, kernel="prefill", family="wgmma_t")
    assert (forced.family, forced.block_n) == ("wgmma_t", 64)
    forced = choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, kernel="decode", family="mma2")
    assert (forced.family, forced.block_n, forced.num_stages) == ("mma2", 32, 2)  # the class's mma2 entry, decode
    # B = 64 rows on 132 SMs: one wave of two splits, not two waves of four (a tie the default breaks upwards)
    assert (configs._split_count(64, 32, 132, max_waves=1), configs._split_count(64, 32, 132)) == (2, 4)
    assert configs._split_count(256, 32, 132, max_waves=1) == 1
    fp8 = choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90)
    assert (fp8.family, fp8.overlap) == ("wgmma_t", True)
    assert not choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, family="mma2").overlap


@pytest.mark.parametrize("arch_name", ["sm80", "sm86", "sm89", "sm120"])
def test_mma2_entries_above_16_heads(arch_name, on_gpu):
    """sm8x / sm120 run more than 16 heads as 32-head blocks of 16-row tiles (V4 pages: 16-head blocks), and the
    table's split count leaves splits of 128 entries or more: one 64K request at 128 heads takes 16 splits of 128
    entries, not the 64 of 32 that would fill two waves, whatever tile an override asks for; a num_splits override is
    taken as given."""
    arch = ARCHS[arch_name]
    for fmt in ("bf16", "fp8_ds_mla"):
        one = choose_config(1, 128, 2048, CPU, kv_format=fmt, arch=arch, kernel="decode")
        assert (one.family, one.block_h, one.block_n, one.num_warps) == ("mma2", 32, 16, 4)
        assert one.dsplit == (fmt == "bf16")  # the dims split: bf16/fp16 caches
        # its software-pipelined loop (three stages) where one program fills the SM anyway, two stages on sm80
        assert one.num_stages == (3 if fmt == "bf16" and arch_name != "sm80" else 2)
        assert (one.num_splits, one.split_len) == (16, 128)
        # a tile the dims split cannot take: the mma2 kernel itself, same splits
        wide = choose_config(1, 128, 2048, CPU, kv_format=fmt, arch=arch, kernel="decode", block_n=64)
        assert (wide.family, wide.dsplit, wide.num_splits, wide.split_len) == ("mma2", False, 16, 128)
        assert choose_config(1, 128, 2048, CPU, kv_format=fmt, arch=arch, num_splits=64).num_splits == 64
        assert choose_config(64, 64, 2048, CPU, kv_format=fmt, arch=arch, kernel="decode").num_splits == 2
        assert choose_config(1, 16, 2048, CPU, kv_format=fmt, arch=arch).block_h == 16
    assert choose_config(1, 64, 640, CPU, kv_format="fp8_ds_mla_v4", arch=arch).block_h == 16


def test_the_kernel_is_chosen_with_the_tl_entry(on_gpu):
    """Decode or prefill is decided by the tl entry's sizes whatever family then runs it (a Gluon entry does not
    move the switch between the two)."""
    for arch_name in GLUON_TABLE:
        for hc in HEAD_CLASSES:
            for fmt in ("bf16", "fp8_ds_mla"):
                for T in (1, 16, 64, 130, 132, 264, 528, 4096):
                    gluon = choose_config(T, hc, 2048, CPU, kv_format=fmt, arch=ARCHS[arch_name])
                    tl = choose_config(T, hc, 2048, CPU, kv_format=fmt, arch=ARCHS[arch_name], family="tl")
                    assert gluon.kernel == tl.kernel, (arch_name, hc, fmt, T)


def test_family_override(on_gpu):
    sm90, sm86 = ARCHS["sm90"], ARCHS["sm86"]
    # forcing tl where a Gluon entry exists, and a Gluon family where none does
    assert choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, family="tl").family == "tl"
    cfg = choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, family="wgmma")
    assert (cfg.family, cfg.block_h, cfg.num_warps) == ("wgmma", 64, 8)
    cfg = choose_config(64, 32, 2048, CPU, kv_format="bf16", arch=sm90, family="mma2", block_n=64, num_stages=3,
                        num_warps=8, programs_per_sm=2)
    assert (cfg.family, cfg.block_n, cfg.num_stages, cfg.num_warps, cfg.programs_per_sm) == ("mma2", 64, 3, 8, 2)
    with pytest.raises(ValueError, match="family: the wgmma kernel needs sm90"):
        choose_config(64, 64, 2048, CPU, kv_format="bf16", arch=sm86, family="wgmma")
    with pytest.raises(ValueError, match="family: the mma2 kernel"):
        choose_config(64, 16, 2048, CPU, kv_format="fp8_e4m3", arch=sm90, family="mma2")
    with pytest.raises(ValueError, match="family: the mma2 kernel"):
        choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["gfx942"], family="mma2")
    with pytest.raises(ValueError, match="family: expected 'tl', 'mma2', 'wgmma', 'wgmma_t' or 'wgmma_ws'"):
        choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, family="cuda")
    # the transposed wgmma kernel: sm90 only, 64-row tiles on one warpgroup, one program per SM by default
    cfg = choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, family="wgmma_t")
    assert (cfg.family, cfg.block_h, cfg.block_n, cfg.num_warps, cfg.programs_per_sm) == ("wgmma_t", 16, 64, 4, 1)
    with pytest.raises(ValueError, match="family: the wgmma_t kernel needs sm90"):
        choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm86, family="wgmma_t")
    # the warp-specialised kernel: sm90 and fp8_ds_mla only, 64-row tiles, one consumer warpgroup
    cfg = choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, family="wgmma_ws")
    assert (cfg.family, cfg.block_h, cfg.block_n, cfg.num_warps, cfg.num_stages) == ("wgmma_ws", 16, 64, 12, 2)
    for fmt, arch in (("bf16", sm90), ("fp8_ds_mla_v4", sm90), ("fp8_ds_mla", sm86)):
        with pytest.raises(ValueError, match="family: the wgmma_ws kernel needs sm90 and fp8_ds_mla"):
            choose_config(64, 16, 2048, CPU, kv_format=fmt, arch=arch, family="wgmma_ws")
    for over, what in (({"block_n": 32}, "block_n"), ({"num_warps": 4}, "block_h / num_warps"),
                       ({"num_stages": 1}, "num_stages"), ({"num_stages": 3, "block_h": 32}, "shared memory"),
                       ({"f16_dot": True}, "f16_dot")):
        with pytest.raises(ValueError, match=what):
            choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, family="wgmma_ws", **over)
    # more stages or heads than the shared memory holds: refused by name when forced, the tl kernel otherwise
    with pytest.raises(ValueError, match=r"needs \d+ bytes of shared memory"):
        choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, family="wgmma_t", num_stages=3)
    assert choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, num_stages=3).family == "tl"
    assert choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, kernel="prefill",
                         block_h=32).family == "wgmma_ws"  # the class's prefill entry, two tile buffers: 189 KB
    assert choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, kernel="prefill", block_h=32,
                         num_stages=3).family == "tl"  # three tile buffers at 32 heads: 262 KB
    assert choose_config(64, 32, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, family="wgmma_t").num_stages == 2
    for over, field in (({"block_n": 32}, "block_n"), ({"num_warps": 2}, "num_warps"), ({"block_h": 64}, "block_h"),
                        ({"block_h": 8, "num_warps": 8}, "num_warps"),
                        ({"num_stages": 1}, "num_stages"), ({"f16_dot": True}, "f16_dot")):
        with pytest.raises(ValueError, match=field):
            choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=sm90, family="wgmma_t", **over)


def test_describe_names_the_family(on_gpu):
    cfg = choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["sm90"], family="mma2")
    assert cfg.describe().startswith("mma2 decode")
    assert not choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["sm90"],
                             family="tl").describe().startswith(("mma2", "wgmma"))


def test_rows_16b_aligned():
    """The Gluon kernels copy 16-byte vectors: a cache runs them only when every row starts on a 16-byte boundary."""
    kv = torch.empty(4, 64, 576, dtype=torch.bfloat16)
    assert _rows_16b_aligned(kv)
    assert not _rows_16b_aligned(torch.empty(4, 64, 578, dtype=torch.bfloat16)[..., :576])  # row stride 1156 B
    # 1168 B is a multiple of 16 bytes, but 584 elements is not one of 16: Triton would not vectorise the copy
    assert not _rows_16b_aligned(torch.empty(4, 64, 584, dtype=torch.bfloat16)[..., :576])
    assert not _rows_16b_aligned(torch.empty(4 * 64 * 576 + 1, dtype=torch.bfloat16)[1:].view(4, 64, 576))
    assert _rows_16b_aligned(torch.empty(4, 64, 656, dtype=torch.uint8))
    assert not _rows_16b_aligned(torch.empty(4, 64, 660, dtype=torch.uint8)[..., :656])


def test_overrides_a_gluon_kernel_cannot_take(on_gpu):
    """Overrides meant for the tl kernel on a class the table gives a Gluon kernel run the tl kernel with them; with
    the family named they are refused by name; no config that reaches a launch has a problem."""
    sm90 = ARCHS["sm90"]
    for over in ({"block_h": 32}, {"block_h": 16}, {"num_warps": 4}, {"num_stages": 1}, {"block_n": 128},
                 {"low_reg": True}):
        cfg = choose_config(64, 128, 2048, CPU, kv_format="bf16", arch=sm90, **over)  # the table: wgmma
        assert cfg.family == "tl" and all(getattr(cfg, k) == v for k, v in over.items()), over
        with pytest.raises(ValueError, match=next(iter(over))):
            choose_config(64, 128, 2048, CPU, kv_format="bf16", arch=sm90, family="wgmma", **over)
    for over in ({"block_n": 16}, {"num_warps": 2}, {"block_n": 128}, {"low_reg": True}):
        cfg = choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=sm90, **over)  # the table: mma2 bn32 w4
        assert cfg.family == "tl" and all(getattr(cfg, k) == v for k, v in over.items()), over
    # overrides a Gluon kernel takes keep it
    cfg = choose_config(64, 128, 2048, CPU, kv_format="bf16", arch=sm90, block_n=32, num_stages=3, num_splits=4)
    assert (cfg.family, cfg.block_n, cfg.num_stages, cfg.num_splits) == ("wgmma", 32, 3, 4)
    for arch_name in ARCHS:
        for fmt in FORMATS:
            for H in (8, 32, 128):
                for over in ({}, {"block_h": 16}, {"num_stages": 1}, {"block_n": 64}):
                    cfg = choose_config(64, H, 2048, CPU, kv_format=fmt, arch=ARCHS[arch_name], **over)
                    assert gluon_config_problem(cfg) is None, (arch_name, fmt, H, over, cfg)


def test_fp16_q_with_fp8_ds_mla_runs_the_tl_kernel(on_gpu):
    """fp8_ds_mla rows keep a bf16 RoPE part, which the Gluon kernels copy as stored: fp16 q runs the tl kernel."""
    cfg = choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=ARCHS["sm90"], q_dtype=torch.float16)
    assert cfg.family == "tl"
    assert choose_config(64, 16, 2048, CPU, kv_format="fp8_ds_mla", arch=ARCHS["sm90"],
                         q_dtype=torch.bfloat16).family == "wgmma_t"


def test_gluon_fp8_entries_run_exact_tiles(on_gpu):
    """No Gluon entry has f16_dot (bf16 tiles of exact values measured faster on the H200 and hold any scales); the
    float16 tiles in chunk units stay reachable by override and keep the Gluon kernel."""
    for arch_name, entries in GLUON_TABLE.items():
        for (hc, cc), launch in entries.items():
            assert not launch.f16_dot, (arch_name, hc, cc)
    cfg = choose_config(64, 128, 2048, CPU, kv_format="fp8_ds_mla", arch=ARCHS["sm90"])
    assert (cfg.family, cfg.f16_dot) == ("wgmma", False)
    cfg = choose_config(64, 128, 2048, CPU, kv_format="fp8_ds_mla", arch=ARCHS["sm90"], f16_dot=True)
    assert (cfg.family, cfg.f16_dot) == ("wgmma", True)


def test_the_gpu_tier_shapes_are_buildable(on_gpu):
    """Every Gluon launch shape the GPU tier forces is one choose_config accepts with its family named."""
    from gpu.test_gpu_gluon import SHAPES, _family

    for name, heads, block_h, block_n, num_warps, stages in SHAPES:
        family, switches = _family(name)
        for fmt in ("bf16", "fp8_ds_mla"):
            if family == "wgmma_t" and stages > 2 and fmt == "bf16":
                continue  # the tier skips it: two stages of 64 bf16 rows fill the shared memory (refused above)
            if family == "wgmma_ws" and fmt == "bf16":
                continue  # the tier skips it: the kernel reads fp8_ds_mla only
            if switches.get("dsplit") and fmt != "bf16":
                continue  # the tier skips it: the dims split reads bf16/fp16 caches
            for kernel in ("decode", "prefill"):
                cfg = choose_config(64, heads, 2048, CPU, kernel, kv_format=fmt, arch=ARCHS["sm90"], family=family,
                                    block_h=block_h, block_n=block_n, num_warps=num_warps, num_stages=stages,
                                    **switches)
                assert (cfg.family, cfg.block_h, cfg.block_n, cfg.dsplit) == (family, block_h, block_n,
                                                                               switches.get("dsplit", False))


@pytest.mark.parametrize("bad", [16, 256, 128.0, "128", True])
def test_max_registers_is_checked(on_gpu, bad):
    with pytest.raises(ValueError, match="max_registers"):
        choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["sm90"], max_registers=bad)


def test_max_registers_is_nvidia_only(on_gpu):
    """ptxas's cap has no ROCm equivalent (Triton's HIP options reject maxnreg): refused up front there."""
    assert choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["sm90"], max_registers=255).max_registers \
        == 255
    with pytest.raises(ValueError, match="max_registers.*gfx942"):
        choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["gfx942"], max_registers=128)


def test_gluon_reads_problem():
    """What the API checks before choosing: aligned bf16 rows read in q's dtype and fp8_ds_mla rows with bf16 q
    are the Gluon kernels'; rows off 16 elements, converted rows and fp16 q with fp8_ds_mla are not."""
    from triton_mla_sparse.ops.sparse_mla.api import check_attention_inputs
    from triton_mla_sparse.ops.sparse_mla.kernels import gluon_reads_problem
    from triton_mla_sparse.testing import encode_cache

    idx = torch.zeros(2, 64, dtype=torch.int32)
    q16, qbf = torch.randn(2, 16, 576, dtype=torch.float16), torch.randn(2, 16, 576, dtype=torch.bfloat16)
    values = torch.randn(4, 64, 576)
    bf16 = values.to(torch.bfloat16)
    ds, _ = encode_cache(values, "fp8_ds_mla")

    def reads(q, kv, fmt=None):
        return gluon_reads_problem(check_attention_inputs(q, kv, idx, 0.1, kv_format=fmt))

    assert reads(qbf, bf16) and reads(qbf, ds, "fp8_ds_mla")
    assert not reads(qbf, torch.zeros(4, 64, 584, dtype=torch.bfloat16)[..., :576])  # row stride 584: not 16 x k
    assert not reads(q16, bf16)  # a bf16 cache read as fp16
    assert not reads(q16, ds, "fp8_ds_mla")

    # DeepSeek-V4 pages (rows 576 bytes apart inside a page, whatever the view's row stride): a 16-byte aligned
    # start and page stride, bf16 q; with an extra cache both caches must be readable
    from triton_mla_sparse.formats import quantize_fp8_ds_mla_v4, v4_page_bytes, v4_token_view

    def v4(nb, bs, pad=0):
        pages = torch.zeros(nb, v4_page_bytes(bs) + pad, dtype=torch.uint8)
        pages[:, :v4_page_bytes(bs)] = quantize_fp8_ds_mla_v4(torch.randn(nb, bs, 512))
        return v4_token_view(pages, bs)

    q4b, q4h = torch.randn(2, 16, 512, dtype=torch.bfloat16), torch.randn(2, 16, 512, dtype=torch.float16)
    good, odd = v4(4, 64), v4(4, 64, pad=8)  # page strides 37440 and 37448 bytes
    assert reads(q4b, good, "fp8_ds_mla_v4") and reads(q4b, v4(8, 2), "fp8_ds_mla_v4")
    assert not reads(q4h, good, "fp8_ds_mla_v4") and not reads(q4b, odd, "fp8_ds_mla_v4")
    idx2 = torch.zeros(2, 8, dtype=torch.int32)

    def reads2(kv, kv2):
        return gluon_reads_problem(check_attention_inputs(q4b, kv, idx, 0.1, kv_format="fp8_ds_mla_v4",
                                                          extra_kv_cache=kv2, extra_indices=idx2))

    assert reads2(good, v4(8, 2)) and not reads2(good, odd) and not reads2(odd, good)


def test_max_registers_from_the_table_and_overrides(on_gpu, monkeypatch):
    """A table entry's register cap reaches the config (and its description); an override replaces it."""
    entry = configs.replace(GLUON_TABLE["sm90"][(16, "16bit")], max_registers=128)
    monkeypatch.setitem(GLUON_TABLE["sm90"], (16, "16bit"), entry)
    cfg = choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["sm90"])
    assert cfg.max_registers == 128 and " reg128" in cfg.describe()
    assert choose_config(64, 16, 2048, CPU, kv_format="bf16", arch=ARCHS["sm90"], max_registers=96).max_registers == 96
    assert choose_config(64, 64, 2048, CPU, kv_format="bf16", arch=ARCHS["sm90"]).max_registers is None


def test_max_registers_reaches_the_launch(monkeypatch):
    """The cap goes to Triton's launch as ``maxnreg`` (the interpreter runs the tl kernel and ignores it)."""
    from triton_mla_sparse.ops.sparse_mla import kernels
    from triton_mla_sparse.ops.sparse_mla.api import sparse_mla_attention_with_config

    seen = []
    real = kernels._launch_fwd

    def spy(grid, args, constexprs, **options):
        seen.append(options)
        return real(grid, args, constexprs, **options)

    monkeypatch.setattr(kernels, "_launch_fwd", spy)
    torch.manual_seed(0)
    q = torch.randn(2, 16, 576, dtype=torch.float16)
    kv = torch.randn(64, 1, 576, dtype=torch.float16)
    idx = torch.randint(0, 64, (2, 32), dtype=torch.int32)
    sparse_mla_attention_with_config(q, kv, idx, 0.05, max_registers=128)
    sparse_mla_attention_with_config(q, kv, idx, 0.05)
    assert [o.get("maxnreg") for o in seen] == [128, None]



def test_pdl_where_the_table_asks_and_the_target_has_it(on_gpu):
    """The combine kernel as a programmatic dependent launch: decode of the table entries that set it (sm90
    fp8_ds_mla at <= 16 heads), not prefill or the other entries; forced with ``pdl=True`` from sm90 on, refused
    with a ValueError before (no griddepcontrol) and on ROCm."""
    sm90 = ARCHS["sm90"]
    assert choose_config(64, 16, 2048, CPU, "decode", kv_format="fp8_ds_mla", arch=sm90).pdl
    assert not choose_config(64, 16, 2048, CPU, "prefill", kv_format="fp8_ds_mla", arch=sm90).pdl
    assert not choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", arch=sm90).pdl
    assert not choose_config(64, 16, 2048, CPU, "decode", kv_format="fp8_ds_mla", arch=ARCHS["sm120"]).pdl
    for name, entries in GLUON_TABLE.items():
        for key, entry in entries.items():
            if entry.pdl:
                assert name == "sm90" and key in ((16, "fp8_ds_mla"), (16, "fp8_ds_mla_v4")), (name, key)
    assert choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", arch=ARCHS["sm120"], pdl=True).pdl
    for arch in ("sm86", "gfx942"):
        with pytest.raises(ValueError, match="pdl"):
            choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", arch=ARCHS[arch], pdl=True)


def test_pdl_is_refused_under_the_interpreter():
    assert not choose_config(64, 16, 2048, CPU, "decode", kv_format="fp8_ds_mla", arch=ARCHS["sm90"]).pdl
    with pytest.raises(ValueError, match="pdl"):
        choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", pdl=True)


def test_merge_where_the_table_asks(on_gpu):
    """The in-kernel split merge: decode of the table entries that set it (sm90 bf16 at <= 16 heads), not prefill,
    not fp8_ds_mla (measured slower with it) nor other architectures; forced with ``merge=True`` on the wgmma_t
    kernel only (another family: one ValueError naming ``merge``), and refused on AMD targets."""
    sm90 = ARCHS["sm90"]
    assert choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", arch=sm90).merge
    assert not choose_config(64, 16, 2048, CPU, "prefill", kv_format="bf16", arch=sm90).merge
    assert not choose_config(64, 16, 2048, CPU, "decode", kv_format="fp8_ds_mla", arch=sm90).merge
    assert not choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", arch=ARCHS["sm120"]).merge
    for name, entries in GLUON_TABLE.items():
        for key, entry in entries.items():
            if entry.merge:
                assert name == "sm90" and key == (16, "16bit") and entry.family == "wgmma_t", (name, key)
    assert choose_config(64, 16, 2048, CPU, "decode", kv_format="fp8_ds_mla", arch=sm90, merge=True).merge
    with pytest.raises(ValueError, match="merge"):
        choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", arch=sm90, family="mma2", merge=True)
    with pytest.raises(ValueError, match="merge"):
        choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", arch=ARCHS["gfx942"], merge=True)
    with pytest.raises(ValueError, match="merge"):
        choose_config(64, 16, 2048, CPU, "prefill", kv_format="bf16", arch=sm90, merge=True)


def test_merge_is_refused_under_the_interpreter():
    assert not choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", arch=ARCHS["sm90"]).merge
    with pytest.raises(ValueError, match="merge"):
        choose_config(64, 16, 2048, CPU, "decode", kv_format="bf16", merge=True)

def test_extra_cache_where_its_build_fits():
    """The kernels with an extra cache are in the compile matrix (decode-extra / prefill-extra rows) exactly where
    the API takes one: NVIDIA targets (AMD builds spill with it, so the API refuses an extra cache there)."""
    from triton_mla_sparse.ops.sparse_mla.aot import matrix_entries
    from triton_mla_sparse.ops.sparse_mla.configs import extra_cache_supported

    assert extra_cache_supported(None)
    for name, arch in ARCHS.items():
        assert extra_cache_supported(arch) == (arch.backend == "cuda"), name
        kernels = {e[3] for e in matrix_entries(name)}
        assert ({"decode-extra", "prefill-extra"} <= kernels) == (arch.backend == "cuda"), name

"""Property-based fuzzing (hypothesis) of the Triton kernels against the float64 reference.

On the CPU the kernels run in Triton's interpreter, inside :class:`helpers.interpreter_memcheck`: every load and
store must land inside the strided extent of one of the launch's tensors, so "never out of bounds" is checked here
too (caches are often placed so that their last row ends their allocation, see :func:`helpers.place_at_end`).

Properties
  * ``test_fuzz_matches_reference``: any valid configuration (format, D_qk 576/512, heads, rows, top-k, block
    size, cache layout, q form, index pattern, topk_length, attn_sink, out=, kernel and its config overrides).
  * ``test_fuzz_unselected_nan_inf_never_leak``: NaN/inf in every unselected slot and in row/block padding.
  * ``test_fuzz_garbage_indices_in_bounds``: garbage indices with every tensor ending its own allocation.
  * ``test_fuzz_numerics_edges``: huge/tiny softmax scales, logits past fp16's range, equal scores, single and
    trailing valid entries, extreme fp8 scales (within the range of q's dtype; see the module notes below).
  * ``test_fuzz_topk_to_slots``: the indexer-to-slot conversion against a Python loop, garbage included.

Budget: derandomized (a fixed seed per property) with a bounded number of examples (about 1.5 minutes on two cores
of a CI runner). ``pytest --long tests/ops/sparse_mla/test_fuzz.py`` (or ``TMS_FUZZ_LONG=1``) draws ``LONG_FACTOR``
times more with a fresh random seed each run (hypothesis prints the seed/blob to reproduce a failure);
``TMS_FUZZ_EXAMPLES=N`` sets every property's count directly.

Every failure found is kept in ``REGRESSIONS`` (replayed as explicit ``@example`` cases in every run, also after its
fix) or as a named test at the end of this module.

Numerics notes (what the properties assume, documented as the package's domain): the kernels dequantise cache
values into q's dtype before their tensor-core dots, so a dequantised value must be representable in q's dtype
(float16: |x| <= 65504, full precision above 2^-14), scores softmax_scale · q·k and the partial dot products must fit
in float32, and the output must fit in q's dtype. Inside that domain the result matches the float64 reference.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from helpers import (DEVICE, FORMATS, INT32_MAX, INT32_MIN, LSE_ATOL, REL_TOL, Problem, assert_matches, encode,
                     interpreter_memcheck, kv_values, place, place_at_end, real_rows, run_kernel, run_reference,
                     tensor_extent)
from triton_mla_sparse import reference, topk_to_slots
from triton_mla_sparse.ops.sparse_mla.configs import COMPILED_ONLY_SWITCHES, GLUON_ONLY_SWITCHES, AttentionConfig

pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning",  # exp2(sink - lse) with huge sinks: inf, then 1 / (1 + inf) = 0
    "ignore:invalid value encountered:RuntimeWarning")

LONG = os.environ.get("TMS_FUZZ_LONG", "0") not in ("", "0")
LONG_FACTOR = 20
# Boolean switches of the tl kernel's launch configuration (whatever this version of the kernels has): each is drawn
# both ways (the interpreter runs the tl kernel only, and no compiled-launch switch).
SWITCHES = sorted(f.name for f in dataclasses.fields(AttentionConfig)
                  if f.type in ("bool", bool) and f.name not in GLUON_ONLY_SWITCHES + COMPILED_ONLY_SWITCHES)


def fuzz_settings(n: int) -> settings:
    """``n`` examples in CI (derandomized), ``LONG_FACTOR · n`` with a random seed under --long."""
    count = int(os.environ.get("TMS_FUZZ_EXAMPLES", "0")) or (n * LONG_FACTOR if LONG else n)
    return settings(max_examples=count, deadline=None, derandomize=not LONG, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])


def with_examples(*cases):
    """Apply ``@example(case=c)`` for each regression case."""
    def deco(fn):
        for c in reversed(cases):
            fn = example(case=c)(fn)
        return fn
    return deco


# ---------------------------------------------------------------------------------------------------------------
# one drawn configuration


CACHE_LAYOUTS = ("3d", "4d", "flat", "padded", "flat_padded", "end", "end_padded", "end_flat")
END_LAYOUTS = ("end", "end_padded", "end_flat")
PATTERNS = ("valid", "mixed", "garbage", "edges", "single", "tail", "empty_rows", "compact", "dups", "per_row")
ROW_PATTERNS = ("valid", "mixed", "garbage", "edges", "single", "tail", "empty", "compact", "dups")


@dataclasses.dataclass(frozen=True)
class Case:
    """Everything one example draws; tensors are built from it by :func:`build` (deterministic in ``seed``)."""

    fmt: str = "fp16"
    scale_format: str = "pow2"  # fp8_ds_mla writers: power-of-two or arbitrary float32 tile scales
    d_qk: int = 576  # 576, or 512 for NoPE
    T: int = 2
    H: int = 3
    topk: int = 8
    block_size: int = 16
    num_blocks: int = 2
    layout: str = "3d"  # CACHE_LAYOUTS
    q_form: str = "fused"  # fused | fused_view | tuple | tuple_strided (576); fused | tuple_none | tuple_empty (512)
    pattern: str = "mixed"  # PATTERNS
    topk_length: str = "none"  # none | random | extreme | counts
    sink: str = "none"  # none | random | extreme
    out: str = "none"  # none | nan | nan_view
    kernel: str = "decode"  # decode | prefill | auto
    overrides: tuple = ()  # AttentionConfig overrides as (name, value) pairs
    k_scale_tensor: bool = False
    infer_format: bool = False
    softmax_scale: float = 192 ** -0.5
    # numerics edges
    q_mag: float = 1.0
    kv_mag: float = 1.0
    tile_gains: tuple | None = None  # extra gain per 128-wide latent tile (fp8 scales at the extremes)
    k_scale: float | None = None  # fp8_e4m3: the per-tensor scale (None: amax / 400)
    equal_rows: bool = False  # every cache slot holds the same row (all scores equal)
    zero_q: bool = False  # q = 0 (all scores 0: uniform weights)
    all_tensors_at_end: bool = False  # q, indices, topk_length, sink and out end their allocations too
    seed: int = 0


def _encode(values: torch.Tensor, case: Case):
    """(stored rows, k_scale) of real values [nb, bs, d] (possibly empty) in the case's format, with the case's
    fp8_e4m3 k_scale when it has one."""
    return encode(values, case.fmt, scale_format=case.scale_format, k_scale=case.k_scale)


def _place(stored: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "end":
        return place_at_end(stored)
    if layout == "end_padded":
        return place_at_end(stored, row_pad=16, block_pad=48)
    if layout == "end_flat":
        nb, bs, row = stored.shape
        return place_at_end(stored.reshape(1, nb * bs, row))[0]
    return place(stored, layout)


def at_end(t: torch.Tensor | None) -> torch.Tensor | None:
    """A copy of ``t`` (same strides pattern: contiguous) whose last element ends its own allocation."""
    if t is None or t.numel() == 0:
        return t
    flat = place_at_end(t.reshape(1, 1, -1)).reshape(t.shape)
    assert tensor_extent(flat)[1] == flat.untyped_storage().data_ptr() + flat.untyped_storage().nbytes()
    return flat


def _row_indices(g: torch.Generator, topk: int, S: int, pattern: str) -> list[int]:
    """One row of int32 slot ids following ``pattern`` (S = num_slots; every invalid kind appears somewhere)."""
    def valid(n):
        return torch.randint(0, S, (n,), generator=g).tolist() if S > 0 else [-1] * n

    def garbage(n):
        x = torch.randint(INT32_MIN, INT32_MAX + 1, (n,), generator=g, dtype=torch.int64)
        return [v if not (0 <= v < S) else -1 - v for v in x.tolist()]

    edges = [-1, -2, -S - 1, S, S + 1, INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1]
    pick = lambda vals, n: [vals[i] for i in torch.randint(0, len(vals), (n,), generator=g).tolist()]  # noqa: E731
    if pattern == "valid":
        return valid(topk)
    if pattern == "mixed":
        row = valid(topk)
        bad = garbage(topk) + pick(edges, topk)
        return [b if torch.rand((), generator=g) < 0.25 else v for v, b in zip(row, bad[::2])]
    if pattern == "garbage":
        row = garbage(topk)
        keep = valid(topk)
        return [v if torch.rand((), generator=g) < 0.1 else b for v, b in zip(keep, row)]
    if pattern == "edges":  # slot 0, the last slot and the values around the valid range
        return pick([0, S - 1, S - 1] + edges if S > 0 else edges, topk)
    if pattern in ("single", "tail", "empty"):
        row = pick(edges, topk)
        if pattern == "single" and S > 0:
            row[int(torch.randint(0, topk, (1,), generator=g))] = valid(1)[0]
        if pattern == "tail" and S > 0:
            k = int(torch.randint(1, min(3, topk) + 1, (1,), generator=g))
            row[topk - k:] = valid(k)
        return row
    if pattern == "compact":  # vLLM's compacted lists: valid slots first, then -1
        n = int(torch.randint(0, topk + 1, (1,), generator=g))
        return valid(n) + [-1] * (topk - n) if S > 0 else [-1] * topk
    if pattern == "dups":
        few = valid(min(3, topk))
        return pick(few, topk)
    raise AssertionError(pattern)


def make_case_indices(case: Case, S: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(case.seed)
    rows = []
    for t in range(case.T):
        pat = case.pattern
        if pat == "per_row":
            pat = ROW_PATTERNS[int(torch.randint(0, len(ROW_PATTERNS), (1,), generator=g))]
        elif pat == "empty_rows":
            pat = "empty" if torch.rand((), generator=g) < 0.5 else "mixed"
        rows.append(_row_indices(g, case.topk, S, pat))
    return torch.tensor(rows, dtype=torch.int64).reshape(case.T, case.topk).to(torch.int32).to(DEVICE)


def _make_q(case: Case):
    T, H, d = case.T, case.H, case.d_qk
    q = torch.randn(T, H, d) * case.q_mag
    if case.zero_q:
        q.zero_()
    q = q.half().to(DEVICE)
    if case.all_tensors_at_end:
        q = at_end(q)
    form = case.q_form
    if d == 512:
        if form == "tuple_none":
            return (q, None)
        if form == "tuple_empty":
            return (q, q.new_empty(T, H, 0))
        return q
    if form == "fused_view":  # a slice of a wider NaN buffer
        buf = torch.full((T, H, 600), float("nan"), dtype=q.dtype, device=DEVICE)
        buf[..., 16:592] = q
        return buf[..., 16:592]
    if form == "tuple":
        buf = torch.full((T, H, 640), float("nan"), dtype=q.dtype, device=DEVICE)
        buf[..., 64:576] = q[..., :512]
        return (buf[..., 64:576], q[..., 512:].contiguous())
    if form == "tuple_strided":
        return (q[..., :512], q[..., 512:].transpose(0, 1).contiguous().transpose(0, 1))
    return q


def build(case: Case):
    """(Problem, call kwargs, config overrides, clean Problem for the oracle) of a case."""
    torch.manual_seed(case.seed)
    nb, bs, d = case.num_blocks, case.block_size, case.d_qk
    S = nb * bs
    values = kv_values(S, d).reshape(nb, bs, d) * case.kv_mag
    if case.tile_gains is not None:
        for c, gain in enumerate(case.tile_gains):
            values[..., 128 * c:128 * (c + 1)] *= gain
    if case.equal_rows and S > 0:
        values[:] = values[0, 0]
    stored, k_scale = _encode(values, case)
    kv = _place(stored, case.layout)
    if k_scale is not None and case.k_scale_tensor:
        k_scale = torch.tensor([k_scale], dtype=torch.float32, device=DEVICE)
    q = _make_q(case)
    indices = make_case_indices(case, S)
    g = torch.Generator().manual_seed(case.seed + 1)
    call = {}
    if case.topk_length == "random":
        call["topk_length"] = torch.randint(-2, case.topk + 3, (case.T,), generator=g, dtype=torch.int32)
    elif case.topk_length == "extreme":
        vals = torch.tensor([INT32_MIN, -1, 0, 1, case.topk - 1, case.topk, case.topk + 1, INT32_MAX])
        call["topk_length"] = vals[torch.randint(0, len(vals), (case.T,), generator=g)].to(torch.int32)
    elif case.topk_length == "counts":  # vLLM passes the valid count of compacted lists
        call["topk_length"] = ((indices >= 0) & (indices < S)).sum(1).to(torch.int32).cpu()
    if case.sink == "random":
        call["attn_sink"] = torch.randn(case.H, generator=g) * 3
    elif case.sink == "extreme":
        vals = torch.tensor([-1e4, -30.0, 0.0, 30.0, 1e4, math.inf])
        call["attn_sink"] = vals[torch.randint(0, len(vals), (case.H,), generator=g)].float()
    for k in ("topk_length", "attn_sink"):
        if k in call:
            call[k] = call[k].to(DEVICE)
            if case.all_tensors_at_end:
                call[k] = at_end(call[k])
    if case.all_tensors_at_end:
        indices = at_end(indices)
    if case.out == "nan":
        call["out"] = torch.full((case.T, case.H, 512), float("nan"), dtype=torch.float16, device=DEVICE)
        if case.all_tensors_at_end:
            call["out"] = at_end(call["out"])
    elif case.out == "nan_view":  # heads-major buffer seen as [T, H, 512]
        buf = torch.full((case.H, case.T, 520), float("nan"), dtype=torch.float16, device=DEVICE)
        call["out"] = buf[..., 8:].transpose(0, 1)
    prob = Problem(q=q, kv_cache=kv, indices=indices, softmax_scale=case.softmax_scale,
                   kv_format=None if case.infer_format else case.fmt, k_scale=k_scale, num_slots=S,
                   scale_format=case.scale_format)
    return prob, call, dict(case.overrides)


def oracle_problem(prob: Problem, case: Case, cfg) -> Problem:
    """The problem the kernel's result is compared with, in float64: the same one, except for fp8_ds_mla with
    float32 tile scales, whose latents the kernel (without ``f16_dot``, which applies the scales in float32) rounds
    once to q's dtype (float16) before its dots (documented): then a float16 cache of exactly those rounded values
    (test_attention_features pins that equivalence)."""
    if case.fmt != "fp8_ds_mla" or case.scale_format != "fp32" or prob.num_slots == 0 or cfg.f16_dot:
        return prob
    d = case.d_qk
    rounded = real_rows(prob)[:, :d].half().reshape(case.num_blocks, case.block_size, d)
    return Problem(**{**prob.__dict__, "kv_cache": place(rounded, "3d"), "kv_format": "fp16", "k_scale": None,
                      "scale_format": "pow2"})


def expected(prob: Problem, **call):
    """The float64 reference's (out, lse); for a cache of no slots also checked against the contract's answer
    (out 0, lse -inf: every index is invalid there)."""
    ref_out, ref_lse = run_reference(prob, **call)
    if prob.num_slots == 0:
        assert (ref_out == 0).all() and torch.isneginf(ref_lse).all(), "reference: empty cache must give 0 / -inf"
    return ref_out, ref_lse


def check(out, lse, ref_out, ref_lse, *, tol=REL_TOL, lse_rtol=LSE_ATOL, what=""):
    """assert_matches' structural checks (no NaN/inf, -inf lse exactly where the reference has it, empty rows 0) and
    out within ``tol`` relative L2 error, measured against max(‖ref‖, a float16-subnormal floor) so that outputs
    that underflow float16 (an attn_sink far above lse) count as exact; lse within ``lse_rtol · max(1, |lse|)``."""
    assert_matches(out, lse, ref_out, ref_lse, tol=math.inf, lse_atol=math.inf, what=what)
    out, ref = out.cpu().double(), ref_out.cpu().double()
    floor = 2.0 ** -14 * math.sqrt(max(1, ref.numel()))
    err = (out - ref).norm().item() / max(ref.norm().item(), floor)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"
    lse, ref_lse = lse.cpu().double(), ref_lse.cpu().double()
    fin = torch.isfinite(ref_lse)
    if fin.any():
        d = ((lse[fin] - ref_lse[fin]).abs() / ref_lse[fin].abs().clamp(min=1.0)).max().item()
        assert d <= lse_rtol, f"{what}: lse relative error {d:.3e} > {lse_rtol:.1e}"
    return err


def run_checked(prob: Problem, case: Case, call: dict, overrides: dict):
    """The kernel under the interpreter's bounds check; returns (out, lse, cfg)."""
    for e in (f"fmt {case.fmt}/{case.d_qk}", f"kernel {case.kernel}", f"layout {case.layout}",
              f"pattern {case.pattern}", f"T {case.T}", f"H {'<=16' if case.H <= 16 else '>16'}",
              f"topk {'<=16' if case.topk <= 16 else '>16'}", f"slots {'0' if not case.num_blocks else '>0'}"):
        event(e)  # shown by pytest --hypothesis-show-statistics
    with interpreter_memcheck() as mc:
        out, lse, cfg = run_kernel(prob, case.kernel, return_config=True, **call, **overrides)
    assert not mc.violations, f"out-of-bounds accesses ({cfg}):\n" + "\n".join(mc.violations)
    if "out" in call:
        assert out is call["out"]
    assert out.shape == (case.T, case.H, 512) and out.dtype == torch.float16
    if case.kernel != "auto":
        assert cfg.kernel == case.kernel
    return out, lse, cfg


# ---------------------------------------------------------------------------------------------------------------
# strategies


def _overrides(draw, kernel: str, H: int) -> tuple:
    o = []
    bn = draw(st.sampled_from([None, 16, 32, 64]))
    if bn:
        o.append(("block_n", bn))
    if kernel == "decode":
        ns = draw(st.sampled_from([None, 1, 2, 3, 5]))
        if ns:
            o.append(("num_splits", ns))
    bh = draw(st.sampled_from([None, 16, 32, 64]))
    if bh:
        o.append(("block_h", bh))
    for name in SWITCHES:
        v = draw(st.sampled_from([None, True, False]))
        if v is not None:
            o.append((name, v))
    return tuple(o)


@st.composite
def cases(draw, *, layouts=CACHE_LAYOUTS, patterns=PATTERNS, sinks=("none", "random", "extreme")):
    fmt = draw(st.sampled_from(FORMATS))
    d_qk = draw(st.sampled_from([576, 512]))
    H = draw(st.integers(1, 16)) if draw(st.integers(0, 3)) else draw(st.sampled_from([17, 64, 70, 128]))
    T = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 0]) if H <= 16 else st.integers(1, 2))
    block_size = draw(st.sampled_from([1, 2, 3, 5, 16, 17, 64]))
    num_blocks = draw(st.integers(0, max(1, 200 // block_size)))
    kernel = draw(st.sampled_from(["decode", "prefill", "auto"]))
    q_forms = ["fused", "fused_view", "tuple", "tuple_strided"] if d_qk == 576 else ["fused", "tuple_none",
                                                                                    "tuple_empty"]
    return Case(
        fmt=fmt, scale_format=draw(st.sampled_from(["pow2", "fp32"])), d_qk=d_qk, T=T, H=H,
        topk=draw(st.integers(1, 70)), block_size=block_size, num_blocks=num_blocks,
        layout=draw(st.sampled_from(layouts)), q_form=draw(st.sampled_from(q_forms)),
        pattern=draw(st.sampled_from(patterns)),
        topk_length=draw(st.sampled_from(["none", "random", "extreme", "counts"])),
        sink=draw(st.sampled_from(sinks)), out=draw(st.sampled_from(["none", "nan", "nan_view"])),
        kernel=kernel, overrides=_overrides(draw, kernel, H), k_scale_tensor=draw(st.booleans()),
        infer_format=draw(st.booleans()),
        softmax_scale=draw(st.floats(1e-3, 1.0)) if draw(st.booleans()) else 192 ** -0.5,
        seed=draw(st.integers(0, 2**16)))


# ---------------------------------------------------------------------------------------------------------------
# properties

# Failures found by the fuzzers, replayed in every run (keep them after the fix).
REGRESSIONS = [
    # NoPE (D_qk 512) caches whose last slot is selected: the kernels requested the 64 RoPE elements past the
    # end of the row (the cache's allocation for the last slot) although HAS_ROPE is off (found 2026-11-30 in the
    # interpreter's bounds check; the loads' results were unused).
    Case(fmt="bf16", d_qk=512, T=1, H=1, topk=1, block_size=1, num_blocks=1, layout="end", pattern="valid",
         kernel="prefill"),
    Case(fmt="fp8_e4m3", d_qk=512, T=1, H=1, topk=3, block_size=3, num_blocks=2, layout="end_padded",
         pattern="edges", kernel="decode", overrides=(("num_splits", 2),)),
]


@fuzz_settings(200)
@with_examples(*REGRESSIONS)
@given(case=cases())
def test_fuzz_matches_reference(case):
    prob, call, overrides = build(case)
    out, lse, cfg = run_checked(prob, case, call, overrides)
    ref_out, ref_lse = expected(oracle_problem(prob, case, cfg),
                                     **{k: v for k, v in call.items() if k != "out"})
    check(out, lse, ref_out, ref_lse, lse_rtol=LSE_ATOL * max(1.0, case.softmax_scale / 192 ** -0.5),
          what=f"{case} {cfg}")


def _poison_bytes(fmt: str, g: torch.Generator, row_bytes: int) -> torch.Tensor:
    """One row of bytes that is NaN or ±inf in the format (chosen at random)."""
    kind = int(torch.randint(0, 3, (1,), generator=g))
    if fmt in ("bf16", "fp16"):
        dt = torch.bfloat16 if fmt == "bf16" else torch.float16
        v = (float("nan"), float("inf"), float("-inf"))[kind]
        return torch.full((row_bytes // 2,), v, dtype=dt).view(torch.uint8)
    if fmt == "fp8_e4m3":  # no inf in e4m3fn: both NaN encodings
        return torch.full((row_bytes,), (0x7F, 0xFF, 0x7F)[kind], dtype=torch.uint8)
    row = torch.full((row_bytes,), 0xFF, dtype=torch.uint8)  # NaN latent, NaN scales, NaN rope
    if kind == 1:  # finite latent bytes, +inf tile scales
        row[:512] = 0x38  # e4m3 1.0
        row[512:528] = torch.tensor([float("inf")] * 4, dtype=torch.float32).view(torch.uint8)
    elif kind == 2:  # finite latent and scales, NaN rope only
        row[:512] = 0x38
        row[512:528] = torch.tensor([1.0] * 4, dtype=torch.float32).view(torch.uint8)
    return row


@fuzz_settings(60)
@given(case=cases(layouts=("padded", "flat_padded", "end_padded", "end"), sinks=("none", "random")))
def test_fuzz_unselected_nan_inf_never_leak(case):
    """NaN/±inf in every slot that no used entry selects (including slot 0, where an invalid id is clamped, and
    every slot past a row's topk_length), in the padding between rows and blocks, in the RoPE bytes of NoPE
    fp8_ds_mla rows and in out=: neither the kernels' nor the reference's results see them."""
    prob, call, overrides = build(case)
    clean = Problem(**{**prob.__dict__, "kv_cache": place(_stored_copy(prob.kv_cache), "3d")})
    S = prob.num_slots
    idx = prob.indices.cpu()
    n = torch.full((case.T,), case.topk) if "topk_length" not in call else \
        call["topk_length"].cpu().long().clamp(0, case.topk)
    used = {int(v) for t in range(case.T) for v in idx[t, :int(n[t])].tolist() if 0 <= v < S}
    kv = prob.kv_cache[:, :, 0] if prob.kv_cache.dim() == 4 else prob.kv_cache
    raw = kv.view(torch.uint8) if kv.dtype != torch.uint8 else kv
    g = torch.Generator().manual_seed(case.seed + 7)
    for s in range(S):
        if s not in used:
            at = (s,) if raw.dim() == 2 else (s // case.block_size, s % case.block_size)
            raw[at] = _poison_bytes(case.fmt, g, raw.shape[-1]).to(DEVICE)
    out, lse, cfg = run_checked(prob, case, call, overrides)
    plain = {k: v for k, v in call.items() if k != "out"}
    ref_out, ref_lse = expected(oracle_problem(clean, case, cfg), **plain)
    check(out, lse, ref_out, ref_lse, lse_rtol=LSE_ATOL * max(1.0, case.softmax_scale / 192 ** -0.5),
          what=f"{case} {cfg}")
    # The reference's own contract: invalid ids are never read either.
    r_out, r_lse = reference.sparse_mla_attention(*prob.args(), **prob.kwargs(**plain), return_lse=True,
                                                  compute_dtype=torch.float64, out_dtype=torch.float64)
    c_out, c_lse = reference.sparse_mla_attention(*clean.args(), **clean.kwargs(**plain), return_lse=True,
                                                  compute_dtype=torch.float64, out_dtype=torch.float64)
    assert torch.equal(r_out, c_out) and torch.equal(r_lse, c_lse), "reference saw an unselected slot"


def _stored_copy(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache's rows as a contiguous [nb, bs, row] copy (any layout)."""
    kv = kv_cache[:, :, 0] if kv_cache.dim() == 4 else kv_cache
    kv = kv if kv.dim() == 3 else kv[:, None]
    return kv.clone().contiguous().cpu()


@fuzz_settings(60)
@given(case=cases(layouts=END_LAYOUTS, patterns=("garbage", "edges", "per_row", "tail")),
       ends=st.booleans())
def test_fuzz_garbage_indices_in_bounds(case, ends):
    """Random int32 ids (INT32_MIN/MAX, negatives, >= num_slots, the last slot) against a cache whose last row ends
    its allocation and (``ends``) q, indices, topk_length, attn_sink and out ending theirs: every access stays inside
    the tensors, and the result is the reference's."""
    case = dataclasses.replace(case, all_tensors_at_end=ends, out="nan" if ends else case.out)
    prob, call, overrides = build(case)
    out, lse, cfg = run_checked(prob, case, call, overrides)
    ref_out, ref_lse = expected(oracle_problem(prob, case, cfg), **{k: v for k, v in call.items() if k != "out"})
    check(out, lse, ref_out, ref_lse, lse_rtol=LSE_ATOL * max(1.0, case.softmax_scale / 192 ** -0.5),
          what=f"{case} {cfg}")


EDGES = ("huge_scale", "tiny_scale", "big_logits", "equal_rows", "zero_q", "single", "tail", "k_scale_extreme",
         "tile_scale_extreme", "sink_extreme")


@st.composite
def numerics_cases(draw):
    base = draw(cases(layouts=("3d", "end"), sinks=("none",)))
    edge = draw(st.sampled_from(EDGES))
    r = dict(sink="none", topk_length="none")
    if edge == "huge_scale":  # scores in the hundreds to thousands: one-hot weights
        r.update(softmax_scale=draw(st.floats(5.0, 200.0)))
    elif edge == "tiny_scale":  # uniform weights
        r.update(softmax_scale=draw(st.floats(1e-12, 1e-4)))
    elif edge == "big_logits":  # q·k far beyond float16's 65504 (the dot accumulates in float32)
        mag = draw(st.sampled_from([30.0, 100.0]))
        r.update(q_mag=mag, kv_mag=mag, fmt=draw(st.sampled_from(["fp16", "bf16", "fp8_e4m3"])),
                 softmax_scale=draw(st.sampled_from([192 ** -0.5 / mag ** 2, 192 ** -0.5 / mag, 192 ** -0.5])))
    elif edge == "equal_rows":
        r.update(equal_rows=True, pattern=draw(st.sampled_from(["valid", "mixed", "dups"])))
    elif edge == "zero_q":
        r.update(zero_q=True, pattern=draw(st.sampled_from(["valid", "mixed", "tail"])))
    elif edge == "single":
        r.update(pattern="single")
    elif edge == "tail":  # only the last entries are valid: every earlier decode split is empty
        r.update(pattern="tail", kernel="decode", overrides=(("block_n", 16), ("num_splits", 5)))
    elif edge == "k_scale_extreme":  # fp8_e4m3 per-tensor scale 2^-24 .. 1.37 · 2^6: real values (<= 448 · k_scale)
        ks = 2.0 ** draw(st.integers(-24, 6)) * draw(st.sampled_from([1.0, 1.37]))  # stay in fp16's range
        r.update(fmt="fp8_e4m3", k_scale=ks, kv_mag=ks * 100, softmax_scale=192 ** -0.5 / (ks * 100))
    elif edge == "tile_scale_extreme":  # fp8_ds_mla tile scales from 2^-12 to 2^7 in one row
        gains = tuple(2.0 ** draw(st.integers(-3, 10)) for _ in range(4))
        mag = 2.0 ** draw(st.integers(-9, 0))
        r.update(fmt="fp8_ds_mla", tile_gains=gains, kv_mag=mag,
                 softmax_scale=192 ** -0.5 / (mag * max(gains)))
    elif edge == "sink_extreme":
        r.update(sink="extreme")
    return dataclasses.replace(base, **r)


NUMERICS_REGRESSIONS = [
    # The largest fp8_e4m3 k_scale of the domain (real values up to 448 · 87.7 = 39 283 in a float16 out). Found by
    # --long at k_scale 175 (2^7 · 1.37), whose outputs (up to 78 561) cannot be float16: the strategy's range was
    # wrong, not the kernel (its out was inf, as the float16 cast of the reference's would be).
    Case(fmt="fp8_e4m3", T=1, H=17, topk=1, block_size=1, num_blocks=1, pattern="valid", kernel="prefill",
         k_scale=2.0 ** 6 * 1.37, kv_mag=2.0 ** 6 * 137, softmax_scale=192 ** -0.5 / (2.0 ** 6 * 137)),
]


@fuzz_settings(120)
@with_examples(*NUMERICS_REGRESSIONS)
@given(case=numerics_cases())
def test_fuzz_numerics_edges(case):
    prob, call, overrides = build(case)
    out, lse, cfg = run_checked(prob, case, call, overrides)
    ref_out, ref_lse = expected(oracle_problem(prob, case, cfg), **{k: v for k, v in call.items() if k != "out"})
    check(out, lse, ref_out, ref_lse, lse_rtol=2 * LSE_ATOL, what=f"{case} {cfg}")
    if case.tile_gains is not None:  # every latent tile on its own (they differ by up to 2^13 in magnitude)
        for c in range(4):
            sl = slice(128 * c, 128 * (c + 1))
            check(out[..., sl], lse, ref_out[..., sl], ref_lse, lse_rtol=2 * LSE_ATOL, what=f"tile {c} {case}")


# ---------------------------------------------------------------------------------------------------------------
# the indexer's slot conversion


@fuzz_settings(150)
@given(data=st.data())
def test_fuzz_topk_to_slots(data):
    T = data.draw(st.integers(0, 6))
    topk = data.draw(st.integers(1, 12))
    R = data.draw(st.integers(0, 4))
    max_blocks = data.draw(st.integers(0, 5))
    bs = data.draw(st.sampled_from([1, 2, 3, 16, 64]))
    i32 = st.one_of(st.integers(-3, max(1, max_blocks * bs + 3)), st.sampled_from([INT32_MIN, INT32_MAX, -1]),
                    st.integers(INT32_MIN, INT32_MAX))
    blk = st.one_of(st.integers(-2, 50), st.sampled_from([INT32_MIN, INT32_MAX // max(bs, 1) - 1]))
    pos = data.draw(st.lists(st.lists(i32, min_size=topk, max_size=topk), min_size=T, max_size=T))
    req = data.draw(st.lists(st.one_of(st.integers(-1, R), st.sampled_from([INT32_MIN, INT32_MAX])),
                             min_size=T, max_size=T))
    table = data.draw(st.lists(st.lists(blk, min_size=max_blocks, max_size=max_blocks), min_size=R, max_size=R))
    compact = data.draw(st.booleans())
    t = lambda x, shape: torch.tensor(x, dtype=torch.int32).reshape(shape).to(DEVICE)  # noqa: E731
    res = topk_to_slots(t(pos, (T, topk)), t(req, (T,)), t(table, (R, max_blocks)), bs, compact=compact)
    want = []
    for row, r in zip(pos, req):
        w = []
        for p in row:
            col = p // bs if p >= 0 else -1
            ok = p >= 0 and col < max_blocks and 0 <= r < R
            s = table[r][col] * bs + p % bs if ok else -1
            w.append(s if ok and 0 <= s <= INT32_MAX else -1)
        want.append(w)
    if not compact:
        assert res.cpu().tolist() == [list(w) for w in want] if T else res.shape == (0, topk)
        return
    slots, counts = res
    for t_, w in enumerate(want):
        v = [s for s in w if s >= 0]
        assert counts[t_].item() == len(v)
        assert slots[t_].cpu().tolist() == v + [-1] * (topk - len(v))


# ---------------------------------------------------------------------------------------------------------------
# the tools the properties rely on, and regressions that are not cases of a property


def test_interpreter_memcheck_detects_overruns():
    """The bounds check sees a kernel reading one element past (or before) a tensor, and nothing else."""
    if DEVICE.type != "cpu":
        pytest.skip("checks the interpreter (CPU) path")
    import triton
    import triton.language as tl

    @triton.jit
    def copy(x_ptr, y_ptr, n, OFF: tl.constexpr):
        o = tl.arange(0, 16)
        tl.store(y_ptr + o, tl.load(x_ptr + o + OFF, mask=o < n), mask=o < n)

    x = at_end(torch.arange(10, dtype=torch.float32))
    for off, bad in ((0, 0), (1, 1), (-1, 1)):
        y = torch.zeros(10)
        with interpreter_memcheck() as mc:
            copy[(1,)](x, y, 10, OFF=off)
        assert mc.launches == 1 and len(mc.violations) == bad, (off, mc.violations)


@pytest.mark.parametrize("row_pad,block_pad", [(0, 0), (16, 48)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_place_at_end(fmt, row_pad, block_pad):
    stored, _ = encode(kv_values(3 * 5).reshape(3, 5, 576), fmt)
    v = place_at_end(stored, row_pad=row_pad, block_pad=block_pad)
    st_ = v.untyped_storage()
    assert st_.nbytes() % 512 == 0
    assert tensor_extent(v)[1] == st_.data_ptr() + st_.nbytes()
    assert torch.equal(v.cpu().view(torch.uint8) if v.dtype != torch.uint8 else v.cpu(),
                       stored.view(torch.uint8) if stored.dtype != torch.uint8 else stored)
    assert v.stride() == (5 * (stored.shape[-1] + row_pad) + block_pad, stored.shape[-1] + row_pad, 1)


@pytest.mark.parametrize("kernel", ["decode", "prefill", "reference"])
def test_sink_minus_inf_on_empty_row(kernel):
    """A sink of -inf means "no sink" (factor 1); on a row without any valid index out must stay 0."""
    case = Case(fmt="fp16", T=2, H=2, topk=4, pattern="valid", sink="none", out="nan")
    prob, call, _ = build(case)
    prob.indices[1] = -1
    sink = torch.tensor([-math.inf, 0.0], device=DEVICE)
    if kernel == "reference":
        out, lse = reference.sparse_mla_attention(*prob.args(), **prob.kwargs(), attn_sink=sink, return_lse=True)
    else:
        out, lse = run_kernel(prob, kernel, attn_sink=sink)
    assert torch.isneginf(lse[1]).all()
    assert (out[1] == 0).all(), out[1, :, :4]
    assert torch.isfinite(out).all()


def test_reference_empty_cache():
    case = Case(fmt="fp16", T=2, H=3, topk=4, num_blocks=0, pattern="mixed")
    prob, _, _ = build(case)
    out, lse = reference.sparse_mla_attention(*prob.args(), **prob.kwargs(), return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_topk_to_slots_beyond_int32_is_no_token():
    pos = torch.tensor([[5, 5]], dtype=torch.int32, device=DEVICE)
    req = torch.tensor([0], dtype=torch.int32, device=DEVICE)
    table = torch.tensor([[2 ** 26, 2 ** 25]], dtype=torch.int32, device=DEVICE)
    pos[0, 1] = 64 + 5  # second block column
    slots = topk_to_slots(pos, req, table, 64)
    assert slots.tolist() == [[-1, -1]], slots

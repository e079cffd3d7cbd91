"""The split select (the top-k operator's Triton kernels) and the torch select on crafted rows, on the CPU through
Triton's interpreter (or a GPU when there is one): special values (±0, ±inf, NaN, huge and tiny magnitudes), ties,
rows of one value, more chunks than histogram copies, the bound pass (its counts, a partial last chunk), bad chunk
sizes. Results are checked exactly against the rows' own top values (:func:`topk_checks.assert_topk_matches`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import DEVICE
from topk_checks import assert_topk_matches

from triton_mla_sparse.ops.topk import split_select as S
from triton_mla_sparse.ops.topk import torch_select
from triton_mla_sparse.ops.topk.configs import SelectConfig
from triton_mla_sparse.ops.topk.split_select import launch_split_select


def _cfg(chunk: int, block: int, bound: bool, min_chunks: int, tail: int = 1024, atomic: int = 0) -> SelectConfig:
    return SelectConfig(select="split", split_chunk=chunk, split_block=block, split_tail=tail, split_atomic=atomic,
                        bound=bound, bound_min_chunks=min_chunks)


@pytest.mark.parametrize("tail,atomic", ((4, 0), (4, 1 << 14), (1024, 64)))
def test_select_kernel_special_values(tail, atomic):
    """The split selection alone on crafted rows: ±0, +inf, huge and tiny magnitudes, negatives, many ties, a row
    of equal values (its whole width in one histogram bin); ``tail`` 4: boundary bins of more keys than the last
    program's step (read again per radix pass), 1024: every bin read once into registers; ``atomic`` 0: every
    slot claimed by a step's block scan, 2^14: every slot claimed per position, 64: per position in the rows whose
    boundary bin holds fewer keys (the rows of ties keep the scan)."""
    rows = [
        [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, 3e38, -3e38, 1e-40, -1e-40],
        [-5.0] * 7 + [-math.inf] * 3,
        [-math.inf] * 10,
        [2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, -math.inf, 0.5],
        [-3.4028234663852886e38, 1.0, 2.0] + [-math.inf] * 7,  # -FLT_MAX: the lowest key that is a candidate
    ]
    x = torch.tensor(rows, dtype=torch.float32)
    x = torch.cat([x, torch.randn(3, 10)], 0)
    x = torch.cat([x, torch.full((x.shape[0], 190), -math.inf)], 1)  # several chunks
    x = x[:, torch.randperm(200)].contiguous().to(DEVICE)
    configs = {
        "four chunks of two steps": _cfg(64, 32, False, 1, tail),
        "more chunks than histogram copies (NREP = 8)": _cfg(16, 16, False, 1, tail),
        "with the bound pass (two chunks)": _cfg(128, 32, True, 1, tail),
    }
    ties = torch.full((2, 200), 1.5)
    ties[1, ::3] = -math.inf
    # ties at the k-th value behind a larger key of the same boundary bin (1.0 and 1.1 share the top 11 key bits):
    # taking one tie too many, or restarting the tie count per step, drops the 1.1
    mixed = torch.full((2, 200), -math.inf)
    mixed[0, :4] = torch.tensor([1.0, 1.0, 1.0, 1.1])
    mixed[1, :10] = torch.tensor([1.0] * 9 + [1.1])
    x = torch.cat([x, ties.to(DEVICE), mixed.to(DEVICE)], 0)  # ties: one boundary bin holding the whole row
    for name, cfg in configs.items():
        for topk in (1, 3, 6, 9, 12, 150):
            out = torch.full((x.shape[0], topk), 777, dtype=torch.int32, device=DEVICE)
            launch_split_select(x, out, topk, replace(cfg, split_atomic=atomic))
            assert_topk_matches(out, x, topk, what=f"{name} topk={topk}", exact=True)


def test_split_select_rejects_bad_chunks():
    bad = _cfg(48, 32, False, 1)
    big_block = _cfg(32768, 32768, False, 1)  # two of its counts would not fit one int32
    not_pow2 = _cfg(384, 128, True, 1)
    bad_tail = _cfg(128, 32, True, 1, tail=48)
    bad_atomic = _cfg(128, 32, True, 1, atomic=-1)

    x = torch.arange(100, dtype=torch.float32, device=DEVICE)[None]
    for cfg, match in ((bad, "multiple of split_block"), (big_block, "split_block .32768. must be a power of 2 up to"),
                       (not_pow2, "must be a power of 2"), (bad_tail, "split_tail .48. must be a power of 2"),
                       (bad_atomic, "^split_atomic: expected an int >= 0")):
        with pytest.raises(ValueError, match=match):
            launch_split_select(x, torch.empty(1, 10, dtype=torch.int32, device=DEVICE), 10, cfg)


@pytest.mark.parametrize("atomic", (0, 1 << 14))
def test_bound_with_a_partial_last_chunk(atomic):
    """The bound pass's last chunk runs past the row (masked positions are not candidates): a falling row whose
    short last chunk holds only small logits still selects the first positions (slots claimed by block scans, or
    per position)."""
    cfg = _cfg(128, 32, True, 1, atomic=atomic)

    x = torch.cat([-1 - torch.arange(128) / 128, torch.full((72,), -10.0)])[None].repeat(2, 1)
    x[1, 128:] = -math.inf
    x = x.to(DEVICE)
    for topk in (1, 2, 5):
        out = torch.full((2, topk), 777, dtype=torch.int32, device=DEVICE)
        launch_split_select(x, out, topk, cfg)
        assert out.cpu().sort(1).values.tolist() == [list(range(topk))] * 2, topk


@pytest.mark.parametrize("atomic", (0, 1 << 14))
def test_select_nan_ranks_highest_like_the_reference(atomic):
    """A NaN logit (only non-finite inputs produce one) ranks above every number, whatever its sign bit, in both
    selections, as in torch.topk / the reference; -inf is never selected."""
    neg_nan = torch.tensor([-math.nan]).view(torch.int32)[0].item() | (1 << 31)
    nan_neg = torch.tensor([neg_nan], dtype=torch.int32).view(torch.float32)[0].item()
    x = torch.tensor([[1.0, math.nan, 2.0, -math.inf, nan_neg, 0.5]], dtype=torch.float32, device=DEVICE)

    cfg = _cfg(128, 32, True, 1, atomic=atomic)

    for topk in (2, 4, 6):
        want = [1, 4, 2, 0, 5][:topk]  # the candidates (all but the -inf at 3), largest first: NaNs, 2, 1, 0.5
        for name in ("split", "torch"):
            out = torch.full((1, topk), 777, dtype=torch.int32, device=DEVICE)
            if name == "torch":
                torch_select(x, out, topk)
            else:
                launch_split_select(x, out, topk, cfg)
            got = out[0].tolist()
            assert sorted(v for v in got if v >= 0) == sorted(want), (name, topk, got)
            assert got.count(-1) == topk - len(want), (name, topk, got)


def _sortable_keys(x: torch.Tensor) -> torch.Tensor:
    """The split select's unsigned 32-bit order keys (int64) of float32 logits: -inf lowest, NaN highest."""
    bits = x.contiguous().view(torch.int32).long()
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF) + 2**31
    return torch.where(torch.isnan(x), torch.full_like(key, 2**32 - 1), key)


@pytest.mark.parametrize("topk", (1, 7, 30, 150))
def test_topk_bound_counts_enough(topk):
    """The split select's bound pass: per group size, the chunks all of whose groups hold a candidate take part;
    the bound the histogram counts from has at least min(topk, candidates) logits at or above it; on iid rows and
    small top-k it excludes most of the row (or the pass would be useless); the selection stays exact."""
    cfg = _cfg(256, 64, True, 8, atomic=1 << 14)  # every slot claimed per position

    g = torch.Generator().manual_seed(topk)
    L = 2048
    x = torch.randn(6, L, generator=g)
    x[1, 1500:] = -math.inf  # a shorter row: its last chunks vouch for nothing
    x[2, ::3] = -math.inf  # gaps: groups of 16 still hold candidates
    x[3, 100:116] = -math.inf  # one empty 16-group: that chunk only vouches at 32 positions per group and up
    x[4] = torch.linspace(-3, 3, L)  # rising: the large logits in the last chunk
    x[5, 3:] = -math.inf  # fewer candidates than most top-k
    # one large logit per 128 positions, the rest small: the 128-groups vouch for 16 in all, the 64-groups for 32
    # (a bound that over-counts what a level vouches for drops needed positions at topk 30)
    big = torch.arange(0, L, 128) + torch.randint(0, 128, (L // 128,), generator=g)
    spiky = torch.randn(L, generator=g) * 0.01 - 5
    spiky[big] = torch.randn(L // 128, generator=g) + 5
    x = torch.cat([x, spiky[None]], 0)
    T = x.shape[0]
    x = x.to(DEVICE)
    out = torch.full((T, topk), 777, dtype=torch.int32, device=DEVICE)
    ws, _ = launch_split_select(x, out, topk, cfg)
    assert_topk_matches(out, x, topk, what=f"topk={topk}", exact=True)
    slots = ws[:, S.NREP * S.NBINS + 10:S.NREP * S.NBINS + 18].cpu().long()
    counted = ws[:, :S.NREP * S.NBINS].sum(1).cpu()
    in_bin = ws[:, S.NREP * S.NBINS + 9].cpu()
    # one claim per taken position: the output slots claimed are the candidates above the threshold bin, the
    # boundary slots those in it
    claims = ws[:, S.NREP * S.NBINS:S.NREP * S.NBINS + 2].cpu()
    assert claims[:, 0].tolist() == ws[:, S.NREP * S.NBINS + 7].cpu().tolist()
    assert claims[:, 1].tolist() == in_bin.tolist()
    keys = _sortable_keys(x.cpu())
    cand = keys > S.KEY_NINF
    for t in range(T):
        lo = S.KEY_NINF + 1
        for j in range(4):
            size = S.BOUND_GROUP << j
            full = sum(bool(cand[t, c:c + 256].view(-1, size).any(1).all()) for c in range(0, L, 256))
            assert int(slots[t, 2 * j + 1]) == full, (t, j)
            if full * (256 // size) >= topk:
                lo = max(lo, 2**32 - 1 - (int(slots[t, 2 * j]) & 0xFFFFFFFF))
        assert int((cand[t] & (keys[t] >= lo)).sum()) >= min(topk, int(cand[t].sum())), t
        assert int(counted[t]) == int((cand[t] & (keys[t] >= lo)).sum()), t  # the kernels count from that bound
        kmax = int(ws[t, S.NREP * S.NBINS + 18]) & 0xFFFFFFFF  # the row maximum the bins span up to
        assert kmax == (int(keys[t][cand[t]].max()) if cand[t].any() else 0), t
        if t == 0 and topk <= 30:
            assert int((keys[t] >= lo).sum()) < L // 4, "the bound excluded too little of an iid row"
            # bins from the bound to the maximum: a few candidates share the threshold bin (top-11-bit bins would
            # hold dozens of these N(0, 1) logits)
            assert int(in_bin[t]) <= 8, int(in_bin[t])

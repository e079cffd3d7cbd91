"""The top-k contract as a test check, shared by the indexer's and the top-k operator's tests (importable by name:
tests/conftest.py's folder is on sys.path, as for helpers.py)."""

from __future__ import annotations

import torch


def assert_topk_matches(sel, ref_logits, topk, what="", exact=False):
    """``sel`` int32 [T, topk] against reference logits [T, L]: the selected positions are distinct candidates,
    -1 exactly for the missing ones, and their sorted logit values equal the reference's top values (within
    1e-5 · the row's largest magnitude, for kernel-computed logits; ``exact`` when the selection ran on
    ``ref_logits`` itself)."""
    sel = sel.cpu().long()
    ref_logits = ref_logits.cpu().to(torch.float64)
    T, L = ref_logits.shape
    assert sel.shape == (T, topk) and sel.dtype == torch.int64
    for t in range(T):
        row = ref_logits[t]
        n = int((~torch.isneginf(row)).sum())
        k = min(topk, n)
        s = sel[t]
        valid = s >= 0
        assert int(valid.sum()) == k, f"{what} row {t}: {int(valid.sum())} positions, expected {k}"
        assert bool((s[~valid] == -1).all()), f"{what} row {t}: padding must be -1"
        pos = s[valid]
        assert bool((pos < L).all()) and len(set(pos.tolist())) == k, f"{what} row {t}: bad/duplicate positions"
        got = row[pos]
        assert not torch.isneginf(got).any(), f"{what} row {t}: selected a non-candidate"
        want = torch.topk(row, k).values if k else row[:0]
        got_sorted, want_sorted = torch.sort(got).values, torch.sort(want).values
        if exact:
            assert torch.equal(got_sorted.nan_to_num(nan=7.5), want_sorted.nan_to_num(nan=7.5)), f"{what} row {t}"
            continue
        tol = 1e-5 * float(row[~torch.isneginf(row)].abs().max()) if n else 0.0
        assert torch.allclose(got_sorted, want_sorted, rtol=0, atol=tol + 1e-7), f"{what} row {t}"

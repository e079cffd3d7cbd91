"""The indexer's accuracy check (logits over the candidates, top-k as sets of selected reference logits)."""

from __future__ import annotations

import math

import pytest
import torch

from triton_mla_sparse import bench


def test_indexer_accuracy_check():
    inf = math.inf
    ref = torch.tensor([[3.0, 1.0, 2.0, 2.0, -inf, -inf], [-inf, 5.0, -inf, -inf, -inf, -inf]])
    for sel in ([[0, 2, 3], [1, -1, -1]], [[3, 0, 1], [-1, 1, -1]]):  # any order
        err, why = bench.indexer_error(torch.tensor(sel, dtype=torch.int32), ref, 3)
        assert why is None and err < 0.5
    err, why = bench.indexer_error(torch.tensor([[0, 3], [1, -1]]), ref, 2)  # a tie at the threshold: either one
    assert (err, why) == (0.0, None)
    assert bench.indexer_error(torch.tensor([[0, 2], [1, -1]]), ref, 2) == (0.0, None)
    bad = {
        "a row does not hold": [[0, 2], [-1, -1]],
        "selected twice": [[0, 0], [1, -1]],
        "not a candidate": [[0, 4], [1, -1]],
        "out of range": [[0, 6], [1, -1]],
    }
    for what, sel in bad.items():
        err, why = bench.indexer_error(torch.tensor(sel), ref, 2)
        assert err == inf and what in why, (what, why)
    err, why = bench.indexer_error(torch.tensor([[0, 1], [1, -1]]), ref, 2)  # the wrong one of the top two
    assert why is None and err == pytest.approx(1 / math.sqrt(3**2 + 2**2 + 5**2))
    # logits: only the candidates count (what a method leaves elsewhere is not checked)
    got = ref.masked_fill(torch.isneginf(ref), 1e30)
    assert bench.indexer_error(got, ref, 2) == (0.0, None)
    assert bench.indexer_error(got[:, :5], ref, 2)[0] == inf
    nan = ref.clone()
    nan[0, 0] = math.nan
    assert bench.indexer_error(nan, ref, 2) == (inf, "non-finite logits at candidate positions")

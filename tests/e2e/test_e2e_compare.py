"""Comparison logic of the end-to-end harness."""

import math

import pytest
from e2e.compare import compare_runs, divergence_is_a_near_tie, logprob_diff, set_agreement, token_agreement


def test_token_agreement():
    assert token_agreement([1, 2, 3], [1, 2, 3]) == {"prefix": 3, "equal": 1.0, "identical": True, "generated": 3}
    r = token_agreement([1, 2, 3, 4], [1, 9, 3, 4])
    assert (r["prefix"], r["equal"], r["identical"]) == (1, 0.75, False)
    r = token_agreement([1, 2], [1, 2, 3])
    assert (r["prefix"], r["identical"], r["generated"]) == (2, False, 3)
    with pytest.raises(ValueError):
        token_agreement([], [1])


def test_logprob_diff():
    assert logprob_diff({1: -0.5, 2: -1.0}, {1: -0.4, 3: -2.0}) == pytest.approx(0.1)
    assert logprob_diff({1: -0.5}, {2: -0.5}) == math.inf
    assert logprob_diff({1: float("nan")}, {1: -0.5}) == math.inf


def test_set_agreement_ignores_order_and_padding():
    r = set_agreement([[3, 1, 2, -1], [5, 6]], [[1, 2, 3, -1], [5, 7]])
    assert r["rows"] == 2 and r["rows_identical"] == 0.5
    assert r["mean_overlap"] == pytest.approx((1.0 + 0.5) / 2) and r["min_overlap"] == 0.5
    assert set_agreement([[-1, -1]], [[-1]])["mean_overlap"] == 1.0
    with pytest.raises(ValueError):
        set_agreement([[1]], [])


def _run(tokens, first):
    return {"prompts": [{"length": len(t) * 10, "tokens": t, "first_logprobs": f} for t, f in zip(tokens, first)]}


def test_compare_runs():
    ours = _run([[1, 2, 3], [4, 5]], [{"1": -0.1, "7": -2.0}, {"4": -0.3}])
    peer = _run([[1, 2, 3], [4, 6]], [{"1": -0.12, "7": -2.5}, {"4": -0.3}])
    r = compare_runs(ours, peer)
    assert not r["all_identical"] and r["worst_first_logprob_diff"] == pytest.approx(0.5)
    assert [p["prefix"] for p in r["prompts"]] == [3, 1]
    assert [p["length"] for p in r["prompts"]] == [30, 20] and [p["generated"] for p in r["prompts"]] == [3, 2]
    with pytest.raises(ValueError, match="same prompts"):
        compare_runs(ours, _run([[1]], [{}]))


def test_divergence_is_a_near_tie():
    lps = [{1: -0.1, 2: -3.0}, {5: -0.70, 6: -0.71}]
    assert divergence_is_a_near_tie([1, 5], [1, 6], lps, margin=0.05) is True
    assert divergence_is_a_near_tie([1, 5], [2, 6], lps, margin=0.05) is False
    assert divergence_is_a_near_tie([1, 5], [1, 5], lps, margin=0.05) is None

"""The top-k operator's public entry (:func:`~triton_mla_sparse.ops.topk.topk_select`) and its configuration: both
selects through the validated call, the workspace contract of :func:`launch_select`, one ``ValueError`` naming the
argument for each bad input, and the per-architecture choice (:func:`select_config_for`)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import DEVICE
from topk_checks import assert_topk_matches

from triton_mla_sparse.capabilities import ARCHS
from triton_mla_sparse.ops import topk as T


def _rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 700, generator=g)
    x[1, 10:] = -math.inf  # fewer candidates than most top-k
    x[2] = -math.inf
    x[3, ::2] = 0.25  # ties
    return x.to(DEVICE)


@pytest.mark.parametrize("select", ("split", "torch", None))
def test_topk_select_matches_the_contract(select):
    x = _rows()
    for topk in (1, 17, 900):
        assert_topk_matches(T.topk_select(x, topk, select=select), x, topk, what=f"{select} {topk}", exact=True)
    out = torch.full((x.shape[0], 17), 777, dtype=torch.int32, device=DEVICE)
    strided = x.t().contiguous().t()  # column-major logits: any strides
    assert T.topk_select(strided, 17, out=out, select=select) is out
    assert_topk_matches(out, x, 17, what=f"{select} out=", exact=True)
    assert T.topk_select(x[:0], 4, select=select).shape == (0, 4)


def test_launch_select_with_a_zeroed_workspace():
    """``select_workspace`` is uninitialised (the caller zeroes it): zeroed, the split select runs on it."""
    x = _rows()
    cfg = T.select_config_for(None)
    ws = T.select_workspace(cfg, x.shape[0], x.device)
    assert ws.dtype == torch.int32 and ws.shape[0] == x.shape[0]
    ws.zero_()
    out = torch.empty(x.shape[0], 30, dtype=torch.int32, device=DEVICE)
    T.launch_select(x, out, 30, cfg, ws)
    assert_topk_matches(out, x, 30, exact=True)
    assert T.select_workspace(T.SelectConfig(select="torch"), 4, x.device) is None


def test_bad_inputs_name_the_argument():
    x = _rows()
    cases = [
        ("logits", lambda: T.topk_select(x.double(), 4)),
        ("logits", lambda: T.topk_select(x[0], 4)),
        ("logits", lambda: T.topk_select([[1.0]], 4)),
        ("topk", lambda: T.topk_select(x, 0)),
        ("topk", lambda: T.topk_select(x, 2.0)),
        ("select", lambda: T.topk_select(x, 4, select="radix")),
        ("out", lambda: T.topk_select(x, 4, out=torch.empty(5, 4, dtype=torch.int64, device=DEVICE))),
        ("out", lambda: T.topk_select(x, 4, out=torch.empty(5, 3, dtype=torch.int32, device=DEVICE))),
    ]
    for arg, call in cases:
        with pytest.raises(ValueError, match=f"^{arg}: expected"):
            call()
    with pytest.raises(ValueError, match=r"^select: expected one of \('split', 'torch'\) or None, got 'radix'$"):
        T.check_select("radix")


def test_the_choice_per_architecture():
    """sm90 decode rows take the split select (measured faster there); prefill rows and the other architectures
    ``torch.topk``; the interpreter the split select with small chunks (so tests cover several)."""
    for name, arch in ARCHS.items():
        assert T.select_config_for(arch).select == ("split" if name == "sm90" else "torch"), name
        assert T.select_config_for(arch, shared_rows=True).select == "torch", name
    interp = T.select_config_for(None)
    assert (interp.select, interp.split_chunk, interp.split_block, interp.split_tail, interp.split_atomic,
            interp.bound_min_chunks) == ("split", 256, 64, 16, 64, 2)
    sm90 = T.select_config_for(ARCHS["sm90"])
    assert (sm90.split_chunk, sm90.split_block, sm90.split_tail, sm90.split_atomic, sm90.bound,
            sm90.bound_min_chunks) == (8192, 2048, 512, 4096, True, 8)
    assert T.choose_select_config(torch.device("cpu")) == interp  # tests run under the interpreter

"""The read-bandwidth ceiling: the read_sum kernel and the choice among its configurations."""

from __future__ import annotations

import pytest
import torch

from triton_mla_sparse.bench import ceilings


def test_read_sum_kernel_reads_every_word():
    read_sum = ceilings.read_sum
    x = torch.randint(-1000, 1000, (3 * 4096 + 100,), dtype=torch.int32)  # a short last program, masked
    parts = read_sum(x, block=256, iters=4)
    assert parts.numel() == -(-x.numel() // 1024)
    assert int(parts.sum()) == int(x.sum())
    y = torch.randn(4096, dtype=torch.bfloat16)  # any dtype is read as int32 words
    diff = int(read_sum(y, block=128, iters=2).sum()) - int(y.view(torch.int32).sum())
    assert diff % 2**32 == 0  # the per-program sums wrap


def test_measure_read_takes_the_best_configuration_and_survives_failures(monkeypatch):
    calls = []
    monkeypatch.setattr(ceilings, "read_sum", lambda x, block, iters, warps: calls.append((block, iters, warps)))
    times = {c: t for c, t in zip(ceilings.READ_CONFIGS, (0.6, 0.5, 0.7, 0.55))}

    def fake_do_bench(fn, return_mode):
        fn()
        if calls[-1] == ceilings.READ_CONFIGS[2]:
            raise RuntimeError("out of resources")
        return times[calls[-1]]

    src = torch.empty(1 << 20, dtype=torch.bfloat16)
    out = ceilings._measure_read(src, fake_do_bench)
    assert calls == list(ceilings.READ_CONFIGS)
    b, i, w = ceilings.READ_CONFIGS[1]
    assert out["read_ms_2GiB"] == 0.5 and out["read_config"] == f"block {b} x {i}, {w} warps"
    assert out["read_gbps"] == pytest.approx(src.numel() * 2 / 0.5e-3 / 1e9)
    assert len(out["read_errors"]) == 1 and "out of resources" in out["read_errors"][0]

    def failing(fn, return_mode):
        raise RuntimeError("no GPU")

    out = ceilings._measure_read(src, failing)
    assert out["read_gbps"] is None and len(out["read_errors"]) == len(ceilings.READ_CONFIGS)

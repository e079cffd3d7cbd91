"""The eager timer's windows."""

from __future__ import annotations

from triton_mla_sparse import bench


def test_do_bench_timer_takes_the_lowest_window(monkeypatch):
    """The eager timer runs do_bench in windows and reports the lowest window median (a transient host-bound
    window must not become the method's figure), keeping every window's median."""
    import triton.testing

    medians = iter([0.31, 0.20, 0.25])
    calls = []

    def fake_do_bench(fn, warmup, rep, return_mode):
        calls.append((warmup, rep, return_mode))
        return next(medians)

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    timer = bench.DoBenchTimer(windows=3, rep=60)
    assert bench.DoBenchTimer().windows == 1
    assert timer(lambda: None) == 0.20
    assert timer.last_windows == [0.31, 0.20, 0.25]
    assert [c[2] for c in calls] == ["median"] * 3 and all(c[1] == 60 for c in calls)

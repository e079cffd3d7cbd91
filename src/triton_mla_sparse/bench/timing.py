"""Timers: eager ``triton.testing.do_bench`` windows (:class:`DoBenchTimer`), CUDA events for slow calls,
CUDA-graph replay (:func:`time_graph`) and wall clock (CPU smoke runs). ``triton.testing`` is imported inside the
timers, so importing this module does not import triton."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

SLOW_CALL_MS = 20.0  # calls slower than this are timed by CUDA events over 3 calls instead of do_bench


def sync(device: torch.device | str) -> None:
    """Wait for the device (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


DO_BENCH_WINDOWS = 3  # eager timing: do_bench windows per method, round-robin over a case's methods; lowest median


class DoBenchTimer:
    """``timer(fn)``: the lowest of ``windows`` ``triton.testing.do_bench`` medians of ``fn`` (each window ~``rep``
    ms of calls, the L2 flushed before every call); the window medians of the last call are kept in
    ``last_windows``. The bench calls it with one window per method in turn (:func:`run_case`, ``windows``).

    Why windows: on the lent GPU machines a window now and then runs host-bound (a transient host slowdown that can
    outlast one method's back-to-back windows, hence round-robin); the lowest window is the steady-state figure,
    taken the same way for every method (benchmarks/NOTES.md has the measurements)."""

    def __init__(self, windows: int = 1, rep: int = 60) -> None:
        self.windows, self.rep = windows, rep
        self.last_windows: list[float] = []

    def __call__(self, fn: Callable[[], object]) -> float:
        from triton.testing import do_bench

        self.last_windows = [float(do_bench(fn, warmup=25 if i == 0 else 5, rep=self.rep, return_mode="median"))
                             for i in range(self.windows)]
        return min(self.last_windows)


def time_do_bench(fn: Callable[[], object]) -> float:
    """Lowest of :data:`DO_BENCH_WINDOWS` back-to-back ``triton.testing.do_bench`` medians of ``fn``
    (:class:`DoBenchTimer`)."""
    return DoBenchTimer(DO_BENCH_WINDOWS)(fn)


def time_events(fn: Callable[[], object], n: int = 3) -> float:
    """Median milliseconds of ``n`` calls of ``fn``, each between two CUDA events (for calls of tens of ms, where
    do_bench's fixed 5-call estimate plus warmup would cost seconds and memory churn)."""
    times = []
    for _ in range(n):
        st = torch.cuda.Event(enable_timing=True)
        en = torch.cuda.Event(enable_timing=True)
        st.record()
        fn()
        en.record()
        en.synchronize()
        times.append(st.elapsed_time(en))
    return float(statistics.median(times))


def graph_replays(call_ms: float | None, target_ms: float = 50.0) -> int:
    """Replays per timed batch of :func:`time_graph`: about ``target_ms`` of work, between 3 and 50."""
    if not call_ms or call_ms <= 0:
        return 50
    return int(max(3, min(50, round(target_ms / call_ms))))


def time_graph(fn: Callable[[], object], replays: int = 50, repeats: int = 5) -> float:
    """Milliseconds per call of ``fn`` captured once in a CUDA graph and replayed ``replays`` times back to back
    (median over ``repeats`` batches, timed with CUDA events). No L2 flush between replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    try:
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            st = torch.cuda.Event(enable_timing=True)
            en = torch.cuda.Event(enable_timing=True)
            st.record()
            for _ in range(replays):
                g.replay()
            en.record()
            en.synchronize()
            times.append(st.elapsed_time(en) / replays)
        return float(statistics.median(times))
    finally:
        del g
        torch.cuda.synchronize()


def time_wall(fn: Callable[[], object], device: torch.device | str | None = None) -> float:
    """Wall-clock milliseconds of one call (synchronised; CPU / interpreter smoke runs, timer choice)."""
    sync(device or "cpu")
    t0 = time.perf_counter()
    fn()
    sync(device or "cpu")
    return (time.perf_counter() - t0) * 1e3


def warm_up(fn: Callable[[], object], device: torch.device | str) -> float:
    """One call (DeepGEMM JIT-compiles its kernels on first use), synchronised; returns its seconds."""
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0

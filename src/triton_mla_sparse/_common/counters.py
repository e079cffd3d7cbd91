"""Arrival counters for kernels whose last program of a group finishes the group's work (the attention decode's
in-kernel split merge, ``AttentionConfig.merge``).

A kernel adds 1 to its group's counter when its part is written; the program that reads ``parts - 1`` is the last,
does the group's remaining work and puts the counter back to 0. So counters need zeroing once, not per call (a
memset per call would cost what the merge saves). Each call takes its own region of one zeroed ring per device,
the next ``n`` counters after the previous call's: calls in flight at the same time on different streams, and CUDA
graphs captured from different calls, use different counters, as long as fewer than :data:`RING` counters' worth of
calls are in flight at once. The ring is allocated (and zeroed, synchronously) by the first call that is not being
captured into a CUDA graph; a call captured before it exists gets ``None`` and runs without counters. Importing this
module touches no GPU.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["RING", "take"]

RING = 1 << 16  # int32 counters per device (256 KB)
_MAX_TAKE = RING // 16  # a call asking for more runs without counters
_lock = threading.Lock()
_rings: dict[tuple[str, int], list] = {}  # (device type, index) -> [counters, next free offset]


def take(device: torch.device, n: int) -> torch.Tensor | None:
    """``n`` zeroed int32 counters on ``device`` for one launch (a view of the ring, 16-byte aligned), or ``None``
    where none can be had: more than ``RING // 16`` asked for, or no ring yet and the current stream is capturing."""
    if n < 1 or n > _MAX_TAKE:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (device.type, index)
    with _lock:
        ring = _rings.get(key)
        if ring is None:
            if torch.cuda.is_current_stream_capturing():
                return None  # a zeroing memset captured into the graph would run only when the graph replays
            ring = [torch.zeros(RING, dtype=torch.int32, device=torch.device(device.type, index)), 0]
            torch.cuda.synchronize(ring[0].device)  # zeroed before any stream's kernel counts on it
            _rings[key] = ring
        n4 = -(-n // 4) * 4
        start = ring[1] if ring[1] + n4 <= RING else 0
        ring[1] = start + n4
        return ring[0][start:start + n]

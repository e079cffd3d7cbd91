"""Arrival counters for kernels whose last program of a group finishes the group's work (the attention decode's
in-kernel split merge, ``AttentionConfig.merge``).

A kernel adds 1 to its group's counter when its part is written; the program that reads ``parts - 1`` is the last,
does the group's remaining work and puts the counter back to 0. So counters need zeroing once, not per call (a
memset per call would cost what the merge saves). They come from one zeroed ring per device, allocated (and zeroed,
synchronously, once) by the first call that is not being captured into a CUDA graph:

* a call captured into a CUDA graph gets a region of its own for good (the graph replays with it): no other call,
  captured or not, is ever given those counters, so graphs replayed on different streams never share one; when the
  ring has no unused region left, a captured call gets ``None`` (and runs without counters);
* an eager call gets the next region of a small part of the ring reserved for eager calls, reused round-robin:
  calls on one stream are ordered, and calls in flight at once on different streams take different regions as long
  as fewer than :data:`EAGER` counters' worth of them are in flight;
* a call captured before the ring exists gets ``None``.

Importing this module touches no GPU.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["EAGER", "RING", "ring", "take"]

RING = 1 << 20  # int32 counters per device (4 MB)
EAGER = 1 << 14  # the first EAGER counters serve eager calls, round-robin; the rest go to captured calls for good
_lock = threading.Lock()
_rings: dict[tuple[str, int], list] = {}  # (device type, index) -> [counters, next eager offset, next captured offset]


def _key(device: torch.device) -> tuple[str, int]:
    return device.type, device.index if device.index is not None else torch.cuda.current_device()


def ring(device: torch.device) -> torch.Tensor | None:
    """The device's whole ring (every counter is 0 whenever no counting kernel runs), or ``None`` before the first
    call has allocated it (tests and diagnostics)."""
    entry = _rings.get(_key(device))
    return None if entry is None else entry[0]


def take(device: torch.device, n: int) -> torch.Tensor | None:
    """``n`` zeroed int32 counters on ``device`` for one launch (a 16-byte aligned view of the ring), or ``None``
    where none can be had: more than ``EAGER // 4`` asked for, no ring yet while capturing, or no unused region left
    for a captured call."""
    if n < 1 or n > EAGER // 4:
        return None
    key = _key(device)
    capturing = torch.cuda.is_current_stream_capturing()
    n4 = -(-n // 4) * 4
    with _lock:
        entry = _rings.get(key)
        if entry is None:
            if capturing:
                return None  # a zeroing memset captured into the graph would run only when the graph replays
            entry = [torch.zeros(RING, dtype=torch.int32, device=torch.device(*key)), 0, EAGER]
            torch.cuda.synchronize(entry[0].device)  # zeroed before any stream's kernel counts on it
            _rings[key] = entry
        if capturing:
            start = entry[2]
            if start + n4 > RING:
                return None
            entry[2] = start + n4
        else:
            start = entry[1] if entry[1] + n4 <= EAGER else 0
            entry[1] = start + n4
        return entry[0][start:start + n]

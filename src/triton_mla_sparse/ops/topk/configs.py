"""Launch parameters of the top-k select: a pure function of the architecture and the kind of rows.

:class:`SelectConfig` holds them (the indexer's ``IndexerConfig`` extends it, so ``indexer_topk`` passes its own
configuration to the select); :func:`select_config_for` chooses them per architecture (shared by the launch and the
ahead-of-time compile matrix), :func:`choose_select_config` per device (memoised). Importing this module touches
neither CUDA nor triton.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..._common.runtime import interpreting

if TYPE_CHECKING:
    import torch

    from ...capabilities import Arch

__all__ = ["SELECTS", "SelectConfig", "choose_select_config", "select_config_for"]

SELECTS = ("split", "torch")


@dataclass(frozen=True, kw_only=True)
class SelectConfig:
    """The select's launch parameters: which select, and the split select's chunking and bound pass."""

    select: str  # "split" (this package's multi-program select) or "torch" (torch.topk)
    split_chunk: int = 8192  # positions per program of the split select
    split_block: int = 1024  # positions per step of the split select (8 warps)
    split_tail: int = 256  # boundary keys per step of each row's last select program (a bin of at most this many,
    # the usual case, is read once and resolved in registers; larger tails cost registers: 1024 took 80 on sm90)
    split_atomic: int = 0  # split select, a threshold on the boundary bin's size (keys): rows whose bin holds
    # fewer claim output and boundary slots per position (an atomic each) instead of per step (block-wide sums and
    # scans); 0: never
    bound: bool = True  # split select: a bound pass first, so that the histogram counts only the candidates above it
    bound_min_chunks: int = 8  # ... on rows of at least this many split chunks (shorter: one launch fewer, measured
    # neutral on the GPU at 32K, where eager calls are bound by the host's launches)


@functools.lru_cache(maxsize=64)
def select_config_for(arch: Arch | None, *, shared_rows: bool = False) -> SelectConfig:
    """The select's parameters on ``arch`` (a :class:`~triton_mla_sparse.capabilities.Arch`; None: Triton's
    interpreter); ``shared_rows``: many rows of one request (prefill) rather than one row per request (decode)."""
    if arch is None:  # interpreter: small chunks and steps so tests cover several of each, and the bound pass
        return SelectConfig(select="split", split_chunk=256, split_block=64, split_tail=16, split_atomic=64,
                            bound_min_chunks=2)
    # Measured on the H200 (benchmarks/NOTES.md): for decode rows (one per request) the split select beat
    # torch.topk (64 rows x 32K: 0.059 vs 0.092-0.105 ms; x 128K with the bound pass and bins up to the row
    # maximum: 0.091 vs 0.147, benchmarks/scripts/select_profile.py); with the block scans, steps of 4096 positions
    # beat 1024 (128K: 0.085 vs 0.088 ms, 32K: 0.054-0.058 vs 0.059-0.061) and a 512-key tail beat 256 at 32K
    # (boundary bins of ~800 keys; benchmarks/scripts/ab_select.py); for prefill rows torch.topk won (4096 x 32K:
    # 1.68 vs 1.80 ms, before the bound pass); claiming slots per position where the boundary bin holds fewer than
    # 4096 keys beat the block scans (64 x 128K logits + select with steps of 2048 357 us (one sample), of 1024
    # 354-358 vs 366-370 with the scans' steps of 4096; h32 128K 343 / 339-341 vs 354; 64 x 32K level at 133;
    # benchmarks/scripts/ab_select.py; the bins measured held at most 1745 keys, so the 4096 threshold itself is
    # unmeasured): steps of 2048, as 1024 with triton 3.9 spill 8 B on sm90. Unmeasured architectures keep
    # torch.topk.
    if arch.name == "sm90" and not shared_rows:
        return SelectConfig(select="split", split_block=2048, split_tail=512, split_atomic=4096)
    return SelectConfig(select="torch")


_CONFIGS: dict = {}  # choose_select_config's memo (device x row kind x interpreter)


def choose_select_config(device: torch.device, *, shared_rows: bool = False) -> SelectConfig:
    """The select's parameters for logits on ``device`` (memoised: it runs on every eager call): the declared
    architecture's (:func:`select_config_for`), the interpreter's for CPU tensors under ``TRITON_INTERPRET=1``, and
    ``torch.topk`` elsewhere (CPU tensors without the interpreter, an undeclared GPU)."""
    interpreter = interpreting()
    key = (device, shared_rows, interpreter)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        if interpreter:
            cfg = select_config_for(None, shared_rows=shared_rows)
        elif device.type == "cuda":
            from ...capabilities import arch_for_device

            arch = arch_for_device(device)
            cfg = select_config_for(arch, shared_rows=shared_rows) if arch is not None else SelectConfig(select="torch")
        else:
            cfg = SelectConfig(select="torch")
        _CONFIGS[key] = cfg
    return cfg

"""Fixtures of the GPU tier."""

import pytest


def _count_launches(monkeypatch, launchers) -> dict:
    """Replace each ``(key, module, name)`` launcher with one that counts its calls into the returned dict."""
    counts = {key: 0 for key, _, _ in launchers}
    for key, mod, name in launchers:
        real = getattr(mod, name)

        def counted(*args, _real=real, _key=key, **kwargs):
            counts[_key] += 1
            return _real(*args, **kwargs)

        counted.__wrapped_launcher__ = real

        monkeypatch.setattr(mod, name, counted)
    return counts


@pytest.fixture
def gluon_launches(monkeypatch):
    """Counts the launches of each Gluon attention kernel (the API sends caches they cannot read to the tl
    kernel)."""
    from triton_mla_sparse.ops.sparse_mla import (kernels_mma2, kernels_mma2d, kernels_wgmma, kernels_wgmma_t,
                                                  kernels_wgmma_ws)

    return _count_launches(monkeypatch, (("mma2", kernels_mma2, "launch_fwd_mma2"),
                                         ("mma2d", kernels_mma2d, "launch_fwd_mma2d"),
                                         ("wgmma", kernels_wgmma, "launch_fwd_wgmma"),
                                         ("wgmma_t", kernels_wgmma_t, "launch_fwd_wgmma_t"),
                                         ("wgmma_ws", kernels_wgmma_ws, "launch_fwd_wgmma_ws")))


@pytest.fixture
def wgmma_launches(monkeypatch):
    """Counts the indexer's wgmma logits kernel's launches (the launch runs the tl kernel where the wgmma kernel
    refuses a problem, so a silent fallback shows as 0)."""
    from triton_mla_sparse.ops.indexer import kernels_wgmma

    return _count_launches(monkeypatch, (("wgmma", kernels_wgmma, "launch_logits_wgmma"),))

"""Fixtures of the GPU tier."""

import pytest


@pytest.fixture
def gluon_launches(monkeypatch):
    """Counts the launches of each Gluon kernel (the API sends caches they cannot read to the tl kernel)."""
    from triton_mla_sparse.ops.sparse_mla import kernels_mma2, kernels_wgmma, kernels_wgmma_t

    counts = {"mma2": 0, "wgmma": 0, "wgmma_t": 0}
    for family, mod, name in (("mma2", kernels_mma2, "launch_fwd_mma2"), ("wgmma", kernels_wgmma, "launch_fwd_wgmma"),
                              ("wgmma_t", kernels_wgmma_t, "launch_fwd_wgmma_t")):
        real = getattr(mod, name)

        def counted(*args, _real=real, _family=family, **kwargs):
            counts[_family] += 1
            return _real(*args, **kwargs)

        counted.__wrapped_launcher__ = real

        monkeypatch.setattr(mod, name, counted)
    return counts

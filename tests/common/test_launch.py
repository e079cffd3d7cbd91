"""The cached launcher (_common/launch.py) keeps one compiled kernel per specialisation key, so its key must separate
every pair of arguments that Triton's own specialiser (``native_specialize_impl``) separates: ints equal to 1,
divisible by 16 or not, 32/64-bit and unsigned 64-bit; tensors by dtype and 16-byte alignment, and on ROCm by
whether their storage is under 2 GiB (buffer operations with 32-bit offsets). Checked here against Triton's
specialiser for the NVIDIA-like base backend and the AMD backend; the GPU tier runs the launcher itself."""

import pytest
import torch
import triton
import triton.language as tl
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

import triton_mla_sparse._common.launch as L

INTS = [1, 0, 16, -16, 17, 3, 2**31 - 16, 2**31, 2**31 + 1, 2**40, 2**63 - 1, 2**63, 2**63 + 16, -(2**31), -(2**31) - 1]


def _tensors():
    buf = torch.zeros(64, dtype=torch.float16)
    return [buf[:8], buf[1:9], buf[8:16], buf[:8].float(), torch.zeros(8, dtype=torch.int32)]


def _assert_same_partition(values, backend):
    triton_keys = [native_specialize_impl(backend, v, False, True, True) for v in values]
    ours = [L._specialisation_key([v]) for v in values]
    for i in range(len(values)):
        for j in range(len(values)):
            assert (triton_keys[i] == triton_keys[j]) == (ours[i] == ours[j]), (values[i], values[j])


def test_ints_partition_like_triton():
    _assert_same_partition(INTS, BaseBackend)


def test_tensors_partition_like_triton():
    _assert_same_partition(_tensors(), BaseBackend)


def test_rocm_tensors_partition_like_triton(monkeypatch):
    amd = pytest.importorskip("triton.backends.amd.compiler")
    monkeypatch.setattr(L, "_HIP", True)
    big = torch.empty(2**31 // 2 + 8, dtype=torch.float16)  # 2 GiB + 16 B of storage, never touched
    values = _tensors() + [big[:8], big[8:16]]
    _assert_same_partition(values, amd.HIPBackend)


def test_other_values_by_value():
    key = L._specialisation_key
    assert key([0.5]) == key([2.0])
    assert key([None]) != key([0.5])
    assert key([True]) != key([False]) != key([1])


@triton.jit
def _constexpr_in_the_middle(x_ptr, N: tl.constexpr, y_ptr):
    pass


def test_launcher_needs_constexprs_last():
    from triton_mla_sparse.ops.indexer import kernels as logits
    from triton_mla_sparse.ops.sparse_mla import kernels as attention
    from triton_mla_sparse.ops.topk import split_select

    for launcher in (attention._launch_fwd, attention._launch_combine, logits._launch_logits,
                     split_select._launch_bound, split_select._launch_hist, split_select._launch_split_select):
        assert launcher.names  # built at import: their constexprs are last
    with pytest.raises(TypeError, match="constexpr parameters last"):
        L.CachedLauncher(_constexpr_in_the_middle)

"""The cached launcher's key (kernels/launch.py) must separate every specialisation Triton compiles separately: an
int equal to 1, an int divisible by 16, any other int, 64-bit ints, tensors by dtype and 16-byte alignment. (The GPU
tier runs the launcher itself across aligned/misaligned tensors and strides.)"""

import torch

from triton_mla_sparse.kernels.launch import _specialisation_key as key


def test_int_classes_are_distinct():
    classes = [1, 16, 17, 2**40, 2**40 + 1]
    keys = [key([v]) for v in classes]
    assert len(set(keys)) == len(keys), keys
    assert key([32]) == key([16]) == key([0]) == key([-16])
    assert key([3]) == key([17])


def test_tensors_by_dtype_and_alignment():
    buf = torch.zeros(64, dtype=torch.float16)
    aligned, misaligned = buf[:8], buf[1:9]
    assert aligned.data_ptr() % 16 == 0
    assert key([aligned]) != key([misaligned])
    assert key([aligned]) != key([aligned.float()])
    assert key([buf[8:16]]) == key([aligned])  # 16 bytes further: still aligned


def test_other_values_by_value():
    assert key([0.5]) == key([2.0])
    assert key([None]) != key([0.5])
    assert key([True]) != key([False]) != key([1])

"""What every GPU-tier module shares: whether it runs on a CUDA GPU or, with ``TMS_GPU_TESTS_ON_CPU=1`` (developer
hook), at tiny sizes through the Triton interpreter. Import this before anything imports triton: it switches the
interpreter on for that hook."""

from __future__ import annotations

import os

import pytest
import torch

ON_CPU = os.environ.get("TMS_GPU_TESTS_ON_CPU", "0") == "1"
if ON_CPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

HAVE_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAVE_CUDA and not ON_CPU else "cpu"
QD = torch.float16 if ON_CPU else torch.bfloat16  # the interpreter's bf16 dots are garbage
INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1

# the module-level marks of a GPU-tier module, and the one for cases the interpreter cannot run
GPU_TIER = [pytest.mark.gpu, pytest.mark.skipif(not (HAVE_CUDA or ON_CPU), reason="needs a CUDA GPU")]
gpu_only = pytest.mark.skipif(DEV != "cuda", reason="needs a CUDA GPU (not the interpreter)")

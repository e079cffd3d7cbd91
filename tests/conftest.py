"""Test configuration for the CPU tier (and any machine without CUDA).

Without CUDA the Triton kernels run in the interpreter, which must be switched on before triton is imported.
Importing torch does not import triton, and neither does importing triton_mla_sparse (its kernels import lazily),
so setting the variable here, before any test module is collected, is early enough.
"""

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """Seed torch's global RNG per test case: reproducible, and different for every parametrized case."""
    s = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(s)
    return s


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="property-based fuzz tests (tests/ops/sparse_mla/test_fuzz.py) draw many more examples, with a fresh "
                          "random seed each run (same as TMS_FUZZ_LONG=1)")


def pytest_configure(config):
    # The interpreter evaluates log2(0) and 1/0 with numpy for rows without a valid index (lse -inf by design).
    config.addinivalue_line("filterwarnings",
                            "ignore:divide by zero encountered:RuntimeWarning:triton.runtime.interpreter")
    config.addinivalue_line("markers", "memcheck: GPU cases that benchmarks/memcheck.sh runs under "
                                       "compute-sanitizer --tool memcheck (garbage indices, buffers ending their "
                                       "allocation)")
    if config.getoption("--long"):
        # Read by tests/ops/sparse_mla/test_fuzz.py when it is imported (collection comes after pytest_configure).
        os.environ["TMS_FUZZ_LONG"] = "1"

"""Where kernels run when a command starts: the GPU, or the CPU through Triton's interpreter."""

from __future__ import annotations

import os
import sys

from .._common.runtime import interpreting


def prepare_device(want_cpu: bool = False) -> None:
    """Without a CUDA GPU (or when the CPU is asked for), switch on Triton's interpreter before triton is imported."""
    import torch

    if want_cpu or not torch.cuda.is_available():
        if "triton" in sys.modules and not interpreting():
            print("warning: triton was imported before TRITON_INTERPRET could be set; kernels may fail on the CPU",
                  file=sys.stderr)
        os.environ.setdefault("TRITON_INTERPRET", "1")
        try:
            import numpy  # noqa: F401  (Triton's interpreter imports it)
        except ImportError:
            print("triton-mla-sparse: running kernels on the CPU uses Triton's interpreter, which needs numpy: "
                  "pip install numpy  (or: pip install 'triton-mla-sparse[cpu]')", file=sys.stderr)
            raise SystemExit(2)

"""Helpers shared by the operators: argument validation (:mod:`.validate`), the runtime (:mod:`.runtime`: the
interpreter switch, device checks and guards), the cached kernel launcher (:mod:`.launch`), the ``@triton.jit``
e4m3 decode (:mod:`.fp8`) and the ahead-of-time compile matrix over every operator's kernels (:mod:`.aot`).

Importing this package (or ``validate`` and ``runtime``) touches neither CUDA nor triton; ``launch`` imports torch
only, ``fp8`` and ``aot`` import triton.
"""

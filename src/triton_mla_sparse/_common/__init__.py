"""Helpers shared by the operators, below all of them (they import no operator): argument validation
(:mod:`.validate`), the runtime (:mod:`.runtime`: the interpreter switch, device checks and guards), the cached
kernel launcher (:mod:`.launch`), the ``@triton.jit`` e4m3 decode (:mod:`.fp8`) and the ahead-of-time compilation
helpers the operators' ``aot`` modules build their kernels with (:mod:`.compile`; the cross-operator compile matrix
is :mod:`triton_mla_sparse.aot`).

Importing this package (or ``validate`` and ``runtime``) touches neither CUDA nor triton; ``launch`` imports torch
only, ``fp8`` and ``compile`` import triton.
"""

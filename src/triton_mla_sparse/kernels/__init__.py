"""Triton kernels. Importing this package imports triton (set TRITON_INTERPRET before, to run on a CPU)."""

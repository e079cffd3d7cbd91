"""Programmatic dependent launch (NVIDIA sm90 on): a kernel launched with ``launch_pdl=True`` may start while the
kernel before it in the stream still runs, once every program of that one has signalled ``launch_dependents`` (or
ended); it must ``griddepcontrol.wait`` (the earlier grid has finished and its writes are visible) before it touches
memory that kernel writes. The attention's combine kernel is launched so where the launch table asks for it
(``AttentionConfig.pdl``): its launch and start-up then overlap the split kernel's tail. The ``tl`` kernels use
``triton.language.extra.cuda``'s ``gdc_wait`` / ``gdc_launch_dependents``; this is the Gluon kernels' signal.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["launch_dependents"]


@gluon.jit
def launch_dependents():
    """``griddepcontrol.launch_dependents``: the kernel launched after this one may start (a no-op without one)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)

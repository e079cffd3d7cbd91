"""Old path of the vLLM backend classes: a re-export of :mod:`triton_mla_sparse.integrations.vllm.backend`.

Imports vLLM (as that module does). vLLM's registry names the class by its new path
(:data:`triton_mla_sparse.integrations.vllm.BACKEND_CLASS_PATH`); the classes here are the same objects.
"""

from __future__ import annotations

from .vllm import backend as _backend
from .vllm.backend import *  # noqa: F403  (the old path's names are the new module's)

__all__ = list(_backend.__all__)

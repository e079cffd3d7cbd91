"""The vLLM 0.33 integration: the ``TRITON_MLA_SPARSE`` sparse-MLA attention backend and the Triton DSA indexer.

``triton_mla_sparse.integrations.vllm:register`` is the ``vllm.general_plugins`` entry point. Importing this package
imports neither vLLM nor CUDA; the modules that need vLLM import it themselves:

* :mod:`.plugin` — :func:`register`: backend registration, the CUDA and ROCm priority hooks, the indexer
  installation;
* :mod:`.policy` — names, the environment variables, the priority policy and the backend's declarations, all
  derived from :mod:`triton_mla_sparse.capabilities` (no vLLM);
* :mod:`.backend` — the backend, metadata builder and impl classes (imports vLLM);
* :mod:`.indexer` — the Triton ``SparseAttnIndexer`` (imports vLLM);
* :mod:`.v4` — the DeepSeek-V4 / V4.1 build check on GPUs where vLLM's V4 path does not run (imports vLLM inside
  functions);
* :mod:`.select` — ``triton-mla-sparse select``: which sparse MLA backend vLLM selects, and why.

The paths before this package (``triton_mla_sparse.integrations.vllm_backend``, ``…integrations.vllm_indexer``,
``triton_mla_sparse.select``) re-export :mod:`.backend`, :mod:`.indexer` and :mod:`.select`; this package
re-exports the names of the old ``integrations/vllm.py`` except ``MIN_CAPABILITY_MAJOR`` (see ``__all__``).
"""

from .plugin import EXPECTED_PRIORITY_PARAMS, install_indexer, install_priority_hook, register
from .policy import (
    BACKEND_CLASS_PATH,
    BACKEND_NAME,
    INDEXER_ENV,
    INDEXER_MODES,
    KV_CACHE_FORMATS,
    KV_LORA_RANK,
    PRIORITY_ENV,
    PRIORITY_MODES,
    ROPE_DIMS,
    SM120_PEER,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_SIZES,
    SUPPORTED_KV_CACHE_DTYPES,
    place_backend,
    policy_index,
    priority_mode,
    static_reasons,
)

# The names of the single module this package replaced (``integrations/vllm.py``), minus MIN_CAPABILITY_MAJOR: the
# kernels are declared per (major, minor) now (triton_mla_sparse.capabilities), so no lowest major describes them.
__all__ = ["register", "install_priority_hook", "install_indexer", "BACKEND_NAME", "BACKEND_CLASS_PATH",
           "PRIORITY_ENV", "PRIORITY_MODES", "INDEXER_ENV", "INDEXER_MODES", "SM120_PEER", "SUPPORTED_DTYPES",
           "SUPPORTED_KV_CACHE_DTYPES", "SUPPORTED_HEAD_SIZES", "KV_CACHE_FORMATS", "KV_LORA_RANK", "ROPE_DIMS",
           "EXPECTED_PRIORITY_PARAMS", "priority_mode", "policy_index", "place_backend", "static_reasons"]

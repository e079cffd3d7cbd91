"""The vLLM 0.33 integration: the ``TRITON_MLA_SPARSE`` sparse-MLA attention backend and the Triton DSA indexer.

``triton_mla_sparse.integrations.vllm:register`` is the ``vllm.general_plugins`` entry point. Importing this package
imports neither vLLM nor CUDA; the modules that need vLLM import it themselves:

* :mod:`.plugin` — :func:`register`: backend registration, the CUDA priority hook, the indexer installation;
* :mod:`.policy` — names, the two environment variables, the priority policy and the backend's declarations, all
  derived from :mod:`triton_mla_sparse.capabilities` (no vLLM);
* :mod:`.backend` — the backend, metadata builder and impl classes (imports vLLM);
* :mod:`.indexer` — the Triton ``SparseAttnIndexer`` (imports vLLM);
* :mod:`.select` — ``triton-mla-sparse select``: which sparse MLA backend vLLM selects, and why.
"""

from .plugin import install_indexer, install_priority_hook, register
from .policy import (
    BACKEND_CLASS_PATH,
    BACKEND_NAME,
    INDEXER_ENV,
    INDEXER_MODES,
    PRIORITY_ENV,
    PRIORITY_MODES,
    place_backend,
    policy_index,
    priority_mode,
    static_reasons,
)

__all__ = ["register", "install_priority_hook", "install_indexer", "BACKEND_NAME", "BACKEND_CLASS_PATH",
           "PRIORITY_ENV", "PRIORITY_MODES", "INDEXER_ENV", "INDEXER_MODES", "priority_mode", "policy_index",
           "place_backend", "static_reasons"]

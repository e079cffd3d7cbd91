"""Framework integrations of triton-mla-sparse.

Only :mod:`triton_mla_sparse.integrations.vllm` imports vLLM, and only in the modules that need it (``backend``,
``indexer``) or inside functions; see that package. ``vllm_backend`` and ``vllm_indexer`` here are the old paths of
those two modules (re-exports; they import vLLM like the modules they re-export).
"""

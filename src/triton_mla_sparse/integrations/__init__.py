"""Framework integrations of triton-mla-sparse.

Only :mod:`triton_mla_sparse.integrations.vllm` imports vLLM, and only in the modules that need it (``backend``,
``indexer``) or inside functions; see that package.
"""

"""Framework integrations of triton-mla-sparse.

Only the modules named ``integrations/vllm*`` import vLLM, and only when they are imported themselves:

* :mod:`triton_mla_sparse.integrations.vllm` — the ``vllm.general_plugins`` entry point (``register``), the
  priority policy and its environment variable. Importable without vLLM (vLLM is imported inside functions).
* :mod:`triton_mla_sparse.integrations.vllm_backend` — the ``TRITON_MLA_SPARSE`` attention backend classes
  (imports vLLM at import time).
"""

"""The operators, one package each: :mod:`.sparse_mla` (sparse MLA attention), :mod:`.indexer` (the DSA indexer's
logits and top-k, and the conversion of its positions to cache slots) and :mod:`.topk` (the per-row top-k select the
indexer uses). Each holds its reference, validation and API, launch configurations, kernels and ahead-of-time
builds; what they share lives in :mod:`triton_mla_sparse._common`, the compile matrix over all of them in
:mod:`triton_mla_sparse.aot`. An operator uses another only through its package's public names
(``from ..topk import launch_select``), never its modules or private names (``tests/common/test_layout.py``)."""

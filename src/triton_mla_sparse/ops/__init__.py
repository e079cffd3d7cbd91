"""The operators, one package each: :mod:`.sparse_mla` (sparse MLA attention), :mod:`.indexer` (the DSA indexer's
logits and top-k, and the conversion of its positions to cache slots) and :mod:`.topk` (the per-row top-k select the
indexer uses). Each holds its reference, validation and API, launch configurations and kernels; what they share lives
in :mod:`triton_mla_sparse._common`. No operator imports another's kernels or private names."""

"""triton-mla-sparse: portable Triton sparse MLA attention for DeepSeek-Sparse-Attention models.

Importing the package touches neither CUDA nor triton; the kernels are imported on first use.
"""

from . import reference
from .formats import dequantize_fp8_ds_mla, quantize_fp8_ds_mla
from .ops.indexer import indexer_logits, indexer_topk, topk_to_slots
from .ops.sparse_mla import sparse_mla_attention

__version__ = "0.1.0"
__all__ = ["sparse_mla_attention", "quantize_fp8_ds_mla", "dequantize_fp8_ds_mla", "topk_to_slots", "indexer_logits",
           "indexer_topk", "reference"]

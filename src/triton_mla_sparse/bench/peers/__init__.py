"""The third-party peers: how each is loaded (:mod:`.loader`) and called (one adapter module per peer).

:data:`PEER_BUILDERS` maps a method key to the loaded module it needs and the factory that builds its call.
"""

from __future__ import annotations

from .deepgemm import DEEPGEMM_FUNCTIONS, build_deepgemm, build_deepgemm_topk, deepgemm_logits_call
from .fa3 import build_fa3_page1, compact_slots, fa3_page1_call
from .flashmla import build_flashmla_bf16, build_flashmla_fp8, flashmla_bf16_call, flashmla_fp8_call, flashmla_v4_call
from .loader import (DEEPGEMM_VLLM_MODULE, PEER_MODULES, Peers, deepgemm_jit_cache_dir, load_peers,
                     resolve_deepgemm_dir, resolve_peers_dir)
from .page1 import build_page1_triton, page1_call

PEER_BUILDERS = {"page1_triton": ("page1", build_page1_triton), "flashmla_bf16": ("flashmla", build_flashmla_bf16),
                 "flashmla_fp8": ("flashmla", build_flashmla_fp8), "deepgemm": ("deepgemm", build_deepgemm),
                 "deepgemm_topk": ("deepgemm", build_deepgemm_topk), "fa3_page1": ("fa3", build_fa3_page1)}

__all__ = ["PEER_BUILDERS", "PEER_MODULES", "DEEPGEMM_FUNCTIONS", "DEEPGEMM_VLLM_MODULE", "Peers", "load_peers",
           "resolve_peers_dir", "resolve_deepgemm_dir", "deepgemm_jit_cache_dir", "flashmla_bf16_call",
           "flashmla_fp8_call", "flashmla_v4_call", "page1_call", "deepgemm_logits_call", "build_flashmla_bf16",
           "build_flashmla_fp8", "build_page1_triton", "build_deepgemm", "build_deepgemm_topk", "build_fa3_page1",
           "fa3_page1_call", "compact_slots"]

"""The script that builds the plugin's DeepSeek-V4 attention layer through vLLM's own constructor (a child process:
vLLM's distributed state stays out of the test process), shared by the V4 layer tests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

_PRELUDE = r'''
import json, os, socket, sys, tempfile
import torch
from transformers import DeepseekV4Config

import vllm.platforms.cuda as cuda_mod
from triton_mla_sparse.integrations.vllm import register, v4_portable
from triton_mla_sparse.integrations.vllm.simulated_platform import cuda_platform_for
from triton_mla_sparse.integrations.vllm.v4_attention import triton_attention_cls

d = tempfile.mkdtemp()
DeepseekV4Config(hidden_size=1024, num_attention_heads=8, q_lora_rank=256, o_lora_rank=256, o_groups=8,
                 num_hidden_layers=2, layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
                 mlp_layer_types=["moe", "moe"], n_routed_experts=16, num_experts_per_tok=2, moe_intermediate_size=256,
                 vocab_size=2048, max_position_embeddings=8192, architectures=["DeepseekV4ForCausalLM"],
                 torch_dtype="bfloat16", **QUANT).save_pretrained(d)
register()
with cuda_platform_for(cuda_mod, *CAPABILITY, True):
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    vc = VllmConfig(model_config=ModelConfig(model=d, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096),
                    cache_config=CacheConfig(cache_dtype="fp8"))
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
        initialize_model_parallel(1, 1)
        # layer 2 of a 2-layer model: the window-only attention of the MTP block (the compressed layers allocate
        # their compressor's state on CUDA at construction)
        layer = triton_attention_cls()(vc, prefix="model.layers.2.attn")
'''
#: An fp8 checkpoint's quantization config (128 x 128 block scales), as DeepSeek-V4's ship.
FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def build_v4_layer(tmp_path: Path, body: str, *, capability: tuple[int, int], quantization: dict | None = None,
                   env: dict[str, str] | None = None) -> dict:
    """Build the layer at the simulated ``capability`` from a tiny V4 config (``quantization``: its
    ``quantization_config``), run ``body`` (code at the level of the platform block, with ``layer`` and ``vc``;
    it prints one JSON line) and return that line."""
    quant = {"quantization_config": quantization} if quantization else {}
    script = tmp_path / "build.py"
    script.write_text(f"QUANT = {quant!r}\nCAPABILITY = {tuple(capability)!r}\n" + _PRELUDE
                      + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path), env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1])

"""Model folders and prompts of the end-to-end harness."""

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from e2e.models import VARIANTS, is_v4, is_v41, model_config, uses_v4_layer, write_model
from e2e.prompts import CORRECTNESS_LENGTHS, prompt_set, random_prompt, repetitive_prompt

V41 = sorted(v for v in VARIANTS if is_v41(v))


@pytest.mark.parametrize("variant", sorted(v for v in VARIANTS if not is_v41(v)))
def test_model_config_shapes(variant):
    v = VARIANTS[variant]
    cfg = model_config(variant, max_position_embeddings=40960)
    assert cfg["max_position_embeddings"] == 40960
    if is_v4(variant):  # V4-Flash's attention: one KV head 512 wide, window 128, top-k 512, one layer of each kind
        # vLLM routes V4's sqrtsoftplus scores only with the correction bias that ``noaux_tc`` creates
        assert cfg["topk_method"] == "noaux_tc" and "scoring_func" not in cfg
        assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (v.heads, 1, 512)
        assert (cfg["sliding_window"], cfg["index_topk"], cfg["index_n_heads"], cfg["index_head_dim"]) == \
            (128, 512, 64, 128)
        assert cfg["architectures"] == ["DeepseekV4ForCausalLM"] and cfg["model_type"] == "deepseek_v4"
        assert sorted(cfg["layer_types"]) == ["compressed_sparse_attention", "heavily_compressed_attention",
                                              "sliding_attention"]
        assert v.heads % cfg["o_groups"] == 0
        return
    assert cfg["num_attention_heads"] == cfg["num_key_value_heads"] == v.heads
    assert cfg["kv_lora_rank"] == 512 and cfg["qk_rope_head_dim"] == 64 and cfg["index_topk"] == 2048
    assert cfg["max_position_embeddings"] == 40960
    assert cfg["architectures"] == (["DeepseekV32ForCausalLM"] if v.family == "dsv32" else ["GlmMoeDsaForCausalLM"])
    if v.family == "glm5":
        assert (cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["index_n_heads"]) == (192, 256, 32)
    else:
        assert (cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["index_n_heads"]) == (128, 128, 64)


def _plan(text):
    """Per layer of a V4.1 text config: its compress ratio, the kv and index source it reads (None on window-only
    layers) and whether it is a kv / index source, as vLLM 0.33's ``deepseek_v41/attention.py`` derives them."""
    kv, ix = text["kv_source_layer_ids"], text["index_source_layer_ids"]
    return [{"ratio": r, "kv_src": max((s for s in kv if s <= i), default=None) if r else None,
             "ix_src": max((s for s in ix if s <= i), default=None) if r else None,
             "is_kv": i in kv, "is_ix": i in ix} for i, r in enumerate(text["compress_ratios"])]


@pytest.mark.parametrize("variant", V41)
def test_v41_model_config(variant):
    """The V4.1 config: nested under text_config, V4-Flash's attention, no vision / engram / MTP / quantization,
    and a layer plan with every kind of V4.1 layer that vLLM accepts."""
    v = VARIANTS[variant]
    cfg = model_config(variant, max_position_embeddings=40960)
    assert uses_v4_layer(variant) and not is_v4(variant)
    assert cfg["architectures"] == ["DeepseekV41ForCausalLM"] and cfg["model_type"] == "deepseek_v41"
    assert set(cfg) == {"architectures", "model_type", "dtype", "text_config"}  # no vision_config, no quantization
    t = cfg["text_config"]
    assert t["max_position_embeddings"] == 40960 and not t.get("engram_layer_ids")
    assert (t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"], t["qk_rope_head_dim"]) == \
        (v.heads, 1, 512, 64)  # V4.1's compressor asserts head 512, rope 64
    assert (t["sliding_window"], t["index_topk"], t["index_n_heads"], t["index_head_dim"]) == (128, 512, 64, 128)
    assert v.heads % t["o_groups"] == 0 and t["topk_method"] == "noaux_tc"
    plan = _plan(t)
    assert len(plan) == t["num_hidden_layers"] and t["num_nextn_predict_layers"] == 0  # one ratio per layer
    assert {p["ratio"] for p in plan} == {0, 1, 2}
    for i, p in enumerate(plan):
        if p["ratio"]:  # a compressed layer reads a source of its own ratio (the cache's entries are per ratio)
            assert p["kv_src"] is not None and p["ix_src"] is not None
            assert plan[p["kv_src"]]["ratio"] == plan[p["ix_src"]]["ratio"] == p["ratio"]
        if p["is_ix"]:  # an index source divides by its ratio and scores the index keys of a kv source
            assert p["ratio"] > 0 and p["kv_src"] is not None
    assert all(plan[i]["is_kv"] for i in t["kv_source_layer_ids"])
    # a layer that reads another's compressed cache and top-k and owns neither (a consumer)
    assert any(p["ratio"] and not p["is_kv"] and not p["is_ix"] for p in plan)
    # the candidate source writes candidates (a kv and index source); a later index source, not a kv source, of the
    # same ratio masks to them
    src = t["candidate_source_layer_id"]
    assert plan[src]["is_kv"] and plan[src]["is_ix"]
    users = [i for i, p in enumerate(plan) if p["is_ix"] and 0 <= src < i]
    assert users and all(plan[i]["ratio"] == plan[src]["ratio"] and not plan[i]["is_kv"] for i in users)
    # vLLM's decoder replay (from the last kv source on) asserts that layer's ratio is at most 1 (nvidia/model.py)
    assert plan[max(t["kv_source_layer_ids"])]["ratio"] <= 1
    # the candidates hold more than the top-k and fewer entries than each long prompt has: those select within them
    candidates = t["candidate_topk_blocks"] * t["candidate_block_size"]
    entries = [n // plan[src]["ratio"] for n in CORRECTNESS_LENGTHS]
    assert candidates >= t["index_topk"] and [n > candidates for n in entries].count(True) >= 3
    assert any(n <= t["index_topk"] for n in entries)  # and a short prompt takes every entry


_BUILD = r'''
import json, os, socket, sys
sys.path.insert(0, sys.argv[1])
import torch
try:
    import vllm.platforms.cuda as cuda_mod
except (ImportError, OSError) as e:  # no libcuda.so.1 (ci/vllm-env.sh provides a stand-in)
    print(json.dumps({"skip": f"vllm.platforms.cuda did not import ({type(e).__name__}: {e})"}))
    sys.exit(0)
from e2e.matrix import base_spec
from e2e.models import write_model
from e2e.schema import OURS_V41, PEER_V41
from e2e.weights import recompute_v4, rule
from e2e.worker import backend_env, engine_kwargs
from triton_mla_sparse.integrations.vllm import plugin, register
from triton_mla_sparse.integrations.vllm.simulated_platform import cuda_platform_for


class NoStream:  # the decoder creates CUDA streams and events at construction; nothing runs here
    def __init__(self, *args, **kwargs):
        pass


torch.cuda.Stream = torch.cuda.Event = NoStream
register()
out = {}
with cuda_platform_for(cuda_mod, 9, 0, True):
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.registry import ModelRegistry

    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    for variant in sys.argv[3:]:
        for backend in (PEER_V41, OURS_V41):
            for mode in ("eager", "graphs"):
                spec = base_spec("x", variant=variant, backend=backend, kv="fp8_ds_mla", mode=mode,
                                 model_root=sys.argv[2])
                os.environ.update(backend_env(spec))
                plugin.install_dsv4_check()  # reads the switch, as register() does in an engine
                folder = write_model(variant, spec["model_root"], max_position_embeddings=spec["max_model_len"])
                # the worker's engine settings as vLLM reads them (LLM passes its keyword arguments to EngineArgs)
                vc = EngineArgs(**engine_kwargs(spec, str(folder))).create_engine_config()
            mc = vc.model_config  # the model is built from the CUDA-graph engine's settings
            cls, _ = ModelRegistry.resolve_model_cls(mc.architectures, mc)
            with set_current_vllm_config(vc):
                if not out:
                    initialize_model_parallel(1, 1)
                with torch.device("meta"):
                    model = cls(vllm_config=vc, prefix="")
            text = model.language_model.model
            layers = []
            for layer in text.layers:
                a, ix = layer.attn, layer.attn.indexer
                op = ix.indexer_op if ix is not None else None
                layers.append({"cls": f"{type(a).__module__}.{type(a).__name__}", "ratio": a.compress_ratio,
                               "is_kv": a.is_kv_source, "is_ix": a.is_index_source,
                               "compressor": a.compressor is not None, "cache_of": a.compressed_cache_prefix,
                               "owns_k": ix.owns_k if ix else None, "topk": ix.topk_tokens if ix else None,
                               "writes": op.candidate_write if op else None,
                               "masks": op.candidate_blocks is not None and not op.candidate_write if op else None,
                               "heads": a.n_local_heads, "window": a.window_size})
            rules, names = {}, []
            for name, p in model.named_parameters():
                rules[rule(name, p)] = rules.get(rule(name, p), 0) + 1
                names.append(name)
            out[f"{variant}/{backend}"] = {
                "cls": f"{cls.__module__}.{cls.__qualname__}", "head_size": mc.get_head_size(),
                "quantized": vc.quant_config is not None, "engram": vc.engram_config is not None,
                "mm_inputs": mc.supports_multimodal_inputs, "kv": vc.cache_config.cache_dtype,
                "candidate_buffer": list(text.candidate_block_buffer.shape), "layers": layers, "rules": rules,
                "parameters": sorted(names), "recomputed": recompute_v4(model)}
    from e2e.worker import AttentionShadow
    from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekV4FlashMLAAttention

    AttentionShadow(v41=True).install()  # the peer's shadow finds V4.1's FlashMLA class and our V4.1 forward
    out["shadowed"] = DeepseekV4FlashMLAAttention.forward_mqa.__name__ == "wrapped"
print(json.dumps(out))
'''


def test_v41_config_builds_in_vllm(tmp_path):
    """vLLM 0.33 (its tier; skipped without it) reads the worker's engine settings of each V4.1 variant, resolves its
    architecture to V4.1's CUDA model and builds it (on the meta device, at a simulated SM 9.0) with the planned
    layers: vLLM's FlashMLA V4.1 layer for the peer, the plugin's for ours; the weights rules find every sink and
    the model's load step; the attention shadow wraps V4.1's FlashMLA class."""
    try:
        version("vllm")
    except PackageNotFoundError:
        pytest.skip("vLLM is not installed (its tier: tests/e2e in the vLLM virtual environment)")
    from e2e.results import V4_LAYER
    from e2e.schema import OURS_V41, PEER_V41

    script = tmp_path / "build.py"
    script.write_text(_BUILD)
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    proc = subprocess.run([sys.executable, str(script), bench, str(tmp_path / "models"), *V41], capture_output=True,
                          text=True, timeout=600, cwd=str(tmp_path))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1])
    if "skip" in got:
        (pytest.fail if os.environ.get("TMS_VLLM_REQUIRED") == "1" else pytest.skip)(got["skip"])
    assert got["shadowed"]
    classes = {PEER_V41: "vllm.models.deepseek_v41.nvidia.flashmla.", OURS_V41: "triton_mla_sparse.integrations.vllm."
               "v4_attention."}
    for variant in V41:
        t = model_config(variant, max_position_embeddings=40960)["text_config"]
        plan = _plan(t)
        for backend in (PEER_V41, OURS_V41):
            run = got[f"{variant}/{backend}"]
            assert run["cls"] == "vllm.models.deepseek_v41.nvidia.vl_model.DeepseekV41ForCausalLM"
            assert (run["head_size"], run["quantized"], run["engram"], run["mm_inputs"], run["kv"]) == \
                (512, False, False, False, "fp8_ds_mla")
            assert run["candidate_buffer"][1] == t["candidate_topk_blocks"]
            assert run["rules"]["sink"] == len(plan) and "hash" not in run["rules"] and run["recomputed"]
            # the same parameter names on both sides: the seeded draws give both engines the same weights
            assert run["parameters"] == got[f"{variant}/{PEER_V41}"]["parameters"]
            for i, (layer, p) in enumerate(zip(run["layers"], plan, strict=True)):
                assert layer["cls"] == classes[backend] + V4_LAYER[backend]
                assert (layer["ratio"], layer["is_kv"], layer["is_ix"], layer["compressor"]) == \
                    (p["ratio"], p["is_kv"], p["is_ix"], p["is_kv"])
                assert layer["cache_of"] == (f"language_model.model.layers.{p['kv_src']}.attn" if p["ratio"] else None)
                assert (layer["heads"], layer["window"]) == (VARIANTS[variant].heads, t["sliding_window"])
                if p["is_ix"]:
                    src = t["candidate_source_layer_id"]
                    assert (layer["owns_k"], layer["topk"]) == (p["is_kv"], t["index_topk"])
                    assert (layer["writes"], layer["masks"]) == (i == src, 0 <= src < i)
                else:
                    assert layer["owns_k"] is None


def test_model_config_rejects_bad_input():
    with pytest.raises(ValueError, match="variant"):
        model_config("dsv5", max_position_embeddings=40960)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model_config("dsv32-h16", max_position_embeddings=100)


def test_write_model_is_idempotent(tmp_path):
    d = write_model("glm5-h8", tmp_path, max_position_embeddings=8192)
    first = (d / "config.json").stat().st_mtime_ns
    assert json.loads((d / "config.json").read_text())["num_attention_heads"] == 8
    assert write_model("glm5-h8", tmp_path, max_position_embeddings=8192) == d
    assert (d / "config.json").stat().st_mtime_ns == first
    write_model("glm5-h8", tmp_path, max_position_embeddings=16384)
    assert json.loads((d / "config.json").read_text())["max_position_embeddings"] == 16384
    t2 = write_model("glm5-h8", tmp_path, max_position_embeddings=8192, tensor_parallel_size=2)
    assert t2 == tmp_path / "glm5-h8-tp2" and json.loads((t2 / "config.json").read_text())["num_attention_heads"] == 16
    with pytest.raises(ValueError, match="tensor_parallel_size must be an int >= 1"):
        write_model("glm5-h8", tmp_path, tensor_parallel_size=0)


def test_prompts_are_reproducible_and_in_vocab():
    a, b = prompt_set(seed=3), prompt_set(seed=3)
    assert a == b and [len(p) for p in a] == list(CORRECTNESS_LENGTHS)
    assert prompt_set(seed=4) != a
    assert all(2 <= t < 2048 for p in a for t in p)
    rep = repetitive_prompt(100, seed=1, period=10)
    assert rep[:10] == rep[10:20] and len(rep) == 100
    with pytest.raises(ValueError):
        random_prompt(0, seed=0)
    with pytest.raises(ValueError, match="kind"):
        prompt_set(kind="other")

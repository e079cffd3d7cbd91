"""Model folders and prompts of the end-to-end harness."""

import json

import pytest
from e2e.models import VARIANTS, is_v4, model_config, write_model
from e2e.prompts import CORRECTNESS_LENGTHS, prompt_set, random_prompt, repetitive_prompt


@pytest.mark.parametrize("variant", sorted(VARIANTS))
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

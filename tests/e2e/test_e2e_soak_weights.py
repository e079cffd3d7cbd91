"""The soak's judgement and request pool, and the seeded weights of the end-to-end harness."""

import pytest
import torch
from e2e.compare import margin_at
from e2e.soak import judge, request_pool
from e2e.weights import param_seed, recompute_mla, reinit_parameters, rule


def test_request_pool_mixed_and_reproducible():
    pool = request_pool(12)
    assert pool == request_pool(12) and len({(r["prompt_len"]) for r in pool}) == 6
    assert len({r["seed"] for r in pool}) == 12
    with pytest.raises(ValueError):
        request_pool(0)


def test_judge_classifies_divergences():
    alone = {0: {"tokens": [1, 2, 3], "top_logprobs": [{"a": -0.1, "b": -3}, {"a": -0.5, "b": -0.52}, None]},
             1: {"tokens": [4, 5], "top_logprobs": [{"a": -0.1, "b": -3}, {"a": -0.1, "b": -3}]}}
    soak = [{"id": 0, "tokens": [1, 2, 3]}, {"id": 0, "tokens": [1, 9, 9]}, {"id": 1, "tokens": [4, 6]},
            {"id": 1, "tokens": [7, 6]}]
    r = judge(soak, alone, margin=0.05)
    assert (r["identical"], r["near_tie"], r["mismatch"], r["compared"]) == (1, 1, 2, 4)
    assert r["mismatch_margin_max"] == pytest.approx(2.9) and r["mismatches"][0]["margin"] == pytest.approx(2.9)
    assert margin_at([{"x": -1.0, "y": -1.5}], 0) == pytest.approx(0.5)
    assert margin_at([None], 0) is None and margin_at([], 3) is None


def test_soak_runs_are_named_and_unknown_names_fail(tmp_path):
    from e2e.soak import SOAKS, run_soak

    assert SOAKS["ours-batch-invariant"] == ("TRITON_MLA_SPARSE", {"VLLM_BATCH_INVARIANT": "1"}, (), None)
    assert all(env.get("VLLM_BATCH_INVARIANT") != "1" for n, (_, env, _, _) in SOAKS.items() if "invariant" not in n)
    with pytest.raises(ValueError, match="^name: one of"):
        run_soak(tmp_path, name="ours-fast")


class _Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kv_b_proj = torch.nn.Linear(4, 6, bias=False)
        self.q_a_layernorm = torch.nn.LayerNorm(4)
        self.W_UK_T = torch.nn.Parameter(torch.zeros(2, 2), requires_grad=False)
        self._k_scale = torch.nn.Parameter(torch.tensor(1.0), requires_grad=False)
        self.calls = 0

    def process_weights_after_loading(self, dtype):
        self.calls += 1
        self.W_UK_T.copy_(self.kv_b_proj.weight[:2, :2])


def _model():
    m = torch.nn.Module()
    m.attn = _Attn()
    m.e_score_correction_bias = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    m.embed = torch.nn.Embedding(10, 4)
    return m


def test_rules():
    p1, p2 = torch.zeros(3), torch.zeros(3, 3)
    assert rule("model.layers.0.input_layernorm.weight", p1) == "ones"
    assert rule("model.layers.0.mlp.gate.e_score_correction_bias", p1) == "zeros"
    assert rule("layers.0.self_attn.W_UK_T", p2) == "keep" and rule("attn._k_scale", p1) == "keep"
    assert rule("model.layers.0.self_attn.q_b_proj.weight", p2) == "normal"
    assert rule("x.norm_weights", torch.zeros(3, dtype=torch.int32)) == "keep"
    assert param_seed(0, "a") != param_seed(0, "b") and param_seed(1, "a") != param_seed(0, "a")


def test_reinit_leaves_meta_parameters_alone():
    """Parameters vLLM never materialised (V4.1's vision tower under ``language_model_only``) are kept, not drawn."""
    m = torch.nn.Module()
    m.proj = torch.nn.Linear(4, 4)
    m.vision = torch.nn.Linear(4, 4, device="meta")
    info = reinit_parameters(m, seed=1)
    assert info["counts"]["keep"] == 2 and info["counts"]["normal"] == 1 and info["counts"]["zeros"] == 1
    assert m.vision.weight.device.type == "meta"


def test_reinit_is_seeded_in_place_and_recomputes_mla():
    a, b = _model(), _model()
    ptr = a.embed.weight.data_ptr()
    ia = reinit_parameters(a, seed=5)
    ib = reinit_parameters(b, seed=5)
    assert ia == ib and ia["counts"]["keep"] == 2
    assert a.embed.weight.data_ptr() == ptr
    assert torch.equal(a.embed.weight, b.embed.weight)
    assert 0.015 < float(a.embed.weight.detach().std()) < 0.025
    assert torch.all(a.attn.q_a_layernorm.weight == 1) and torch.all(a.attn.q_a_layernorm.bias == 0)
    assert torch.all(a.e_score_correction_bias == 0) and float(a.attn._k_scale) == 1.0
    assert not torch.equal(a.embed.weight, (c := _model(), reinit_parameters(c, seed=6))[0].embed.weight)
    assert recompute_mla(a) == 1 and a.attn.calls == 1
    assert torch.equal(a.attn.W_UK_T, a.attn.kv_b_proj.weight[:2, :2])


def _v4(padded_heads, experts=6):
    """A stand-in for the parts of a DeepSeek-V4 model that the weights treat apart: a sink over padded heads, a
    hash-MoE gate's table and weight, mHC mixing weights and vLLM's mHC broadcast step."""
    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.Module()
            self.attn.n_local_heads = 3
            self.attn.attn_sink = torch.nn.Parameter(torch.full((padded_heads,), float("-inf")), requires_grad=False)
            self.gate = torch.nn.Linear(4, experts, bias=False)
            self.gate.tid2eid = torch.nn.Parameter(torch.zeros(50, 2, dtype=torch.int32), requires_grad=False)
            self.hc_attn_scale = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
            self.broadcast = None

        def finalize_mhc_broadcast_weights(self):
            self.broadcast = self.hc_attn_scale.detach().clone()

    m = torch.nn.Module()
    m.model = Inner()
    return m


def test_v4_weights_match_whatever_the_head_padding():
    """FlashMLA's layer pads 8 heads to 64: the real heads' sinks must be drawn alike, the padding left at -inf; the
    hash table is redrawn from the seed within the gate's experts; mHC scales are weights; the model's own mHC step
    runs again."""
    from e2e.weights import reinit, recompute_v4

    assert rule("model.layers.0.attn.attn_sink", torch.zeros(8)) == "sink"
    assert rule("model.layers.0.ffn.gate.tid2eid", torch.zeros(2, dtype=torch.int32)) == "hash"
    assert rule("model.layers.0.hc_attn_scale", torch.zeros(3)) == "normal"
    assert rule("model.layers.0.attn._k_scale", torch.zeros(1)) == "keep"
    a, b = _v4(3), _v4(64)
    ia, ib = reinit(a, seed=2), reinit(b, seed=2)
    assert ia["v4"] and ib["v4"] and ia["mla_layers"] == 0 and ia["checksum"] == ib["checksum"]
    assert torch.equal(a.model.attn.attn_sink, b.model.attn.attn_sink[:3])
    assert torch.isinf(b.model.attn.attn_sink[3:]).all() and torch.isfinite(a.model.attn.attn_sink).all()
    assert torch.equal(a.model.gate.tid2eid, b.model.gate.tid2eid)
    t = a.model.gate.tid2eid
    assert t.dtype == torch.int32 and int(t.min()) >= 0 and int(t.max()) < 6 and len(t.unique()) > 1
    assert torch.equal(a.model.broadcast, a.model.hc_attn_scale) and bool(a.model.hc_attn_scale.abs().sum() > 0)
    c = _v4(3)
    reinit(c, seed=3)
    assert not torch.equal(t, c.model.gate.tid2eid)  # another seed, another table
    assert not recompute_v4(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="no MLA layer"):
        reinit(torch.nn.Linear(2, 2))


def test_v41_weights_found_inside_the_multimodal_wrapper():
    """vLLM builds DeepSeek-V4.1 as a multimodal wrapper (``language_model.model``): the model's mHC step is found
    there and runs again, and the sinks are drawn alike whatever the head padding."""
    from e2e.weights import recompute_v4, reinit

    def wrapped(heads):
        outer = torch.nn.Module()
        outer.language_model = _v4(heads)
        return outer

    a, b = wrapped(3), wrapped(64)
    ia, ib = reinit(a, seed=5), reinit(b, seed=5)
    assert ia["v4"] and ia["mla_layers"] == 0 and ia["checksum"] == ib["checksum"]
    inner = a.language_model.model
    assert torch.equal(inner.broadcast, inner.hc_attn_scale)
    assert torch.equal(inner.attn.attn_sink, b.language_model.model.attn.attn_sink[:3])
    assert recompute_v4(a) and not recompute_v4(torch.nn.Sequential(torch.nn.Linear(2, 2)))

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

"""The trace of where batching changes a request's numbers: row hashes, finding the target's rows, the hooks on a
toy model with one batch-dependent module, and the trace spec."""

import pytest
import torch
from e2e.matrix import trace_specs
from e2e.trace import MIN_RUN, Tracer, compare, culprit, gathered_differences, plan, row_hashes, target_rows


def test_row_hashes_see_every_bit():
    x = torch.randn(5, 3, 8, dtype=torch.bfloat16)
    h = row_hashes(x)
    assert len(h) == 5 and h == row_hashes(x.clone())
    y = x.clone()
    y.view(torch.int16)[2, 1, 3] ^= 1  # one bit of one element
    assert [a == b for a, b in zip(h, row_hashes(y))] == [True, True, False, True, True]
    assert row_hashes(torch.tensor([[1, 2], [2, 1]])) [0] != row_hashes(torch.tensor([[1, 2], [2, 1]]))[1]
    assert row_hashes(x[3:4]) == h[3:4]  # a row's hash does not depend on the other rows


def test_target_rows_takes_prefill_runs_and_decode_rows_only():
    seq = list(range(100, 130))  # prompt 0..19, decode 20..29
    prompt_len = 20
    # request A (positions 5..9, other tokens), the target's chunk 0..5, a decode row of another request at 25 with
    # the target's token there, the target's decode row at 22, a too-short matching run of another request
    ids = [1, 2, 3, 4, 5] + seq[0:6] + [seq[25]] + [seq[22]] + [seq[3], seq[4], 7]
    pos = [5, 6, 7, 8, 9] + list(range(6)) + [25 + 100] + [22] + [3, 4, 5]
    rows = target_rows(ids, pos, seq, prompt_len)
    assert rows == list(range(5, 11)) + [12]
    assert target_rows(ids, pos, None, prompt_len) == list(range(len(ids)))
    # a chunk glued to the previous request's rows by consecutive positions is still found
    ids2 = [9] * 3 + seq[3:3 + MIN_RUN]
    assert target_rows(ids2, [0, 1, 2, 3, 4, 5, 6], seq, prompt_len) == [3, 4, 5, 6]
    assert target_rows(seq[3:3 + MIN_RUN - 1], [3, 4, 5], seq, prompt_len) == []


class _Mix(torch.nn.Module):
    """Adds the batch's mean to every row when ``leak`` is set: a batch-dependent op."""

    def __init__(self):
        super().__init__()
        self.leak = False

    def forward(self, x):
        return x + x.mean(0, keepdim=True) if self.leak else x * 2


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)
        self.a = torch.nn.Linear(8, 8)
        self.mix = _Mix()
        self.o_proj = torch.nn.Linear(8, 8)
        self.impl = _Impl()

    def forward(self, input_ids, positions):
        x = self.mix(self.a(self.embed(input_ids) + positions[:, None].float()))
        n = x.shape[0] - 1  # the impl sees the tokens without the last (padding) row
        topk = positions[:n, None] - torch.arange(3)[None]  # each row's 3 latest positions as "slots"
        out, _ = self.impl._forward_mqa_kernel(x[:n], self.kv, topk, None, layer=None, block_size=1, is_decode=False)
        return self.o_proj(torch.cat([out, x[n:]]))


class _Impl:
    def __init__(self):
        self.topk_indices_buffer = None

    def _kv_rows(self, kv, block_size):
        return kv

    def _forward_mqa_kernel(self, q, kv_cache, topk_indices, valid_counts, *, layer, block_size, is_decode):
        g = kv_cache[topk_indices.clamp(min=0)].sum(1)
        return q + g, None


class _Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Inner()


@pytest.mark.parametrize("leak", [False, True])
def test_tracer_finds_the_batch_dependent_module(leak):
    torch.manual_seed(0)
    toy = _Toy()
    toy.model.kv = torch.randn(64, 8)
    tr = Tracer(toy)
    tr.wrap_impl(_Impl)
    seq = [int(t) for t in torch.randint(2, 64, (12,))]
    with torch.no_grad():
        tr.start(None, 10)
        toy.model(torch.tensor(seq[:10] + [0]), torch.cat([torch.arange(10), torch.tensor([0])]))
        alone = tr.take()
        toy.model.mix.leak = leak
        tr.start(seq, 10)
        others = torch.randint(2, 64, (7,))
        toy.model(torch.cat([others, torch.tensor(seq[:10]), torch.tensor([0])]),
                  torch.cat([torch.arange(7), torch.arange(10), torch.tensor([0])]))
        # a decode row of the target (position 10) after another request's row
        toy.model(torch.tensor([5, seq[10], 0]), torch.tensor([3, 10, 0]))
        batched = tr.take()
    assert alone["order"] == ["model.embed", "model.a", "model.mix", "attn.q", "attn.out", "model.o_proj.in",
                              "model.o_proj", "model"]
    rows = compare(alone, batched)
    assert [r["positions"] for r in rows] == [10] * len(rows)  # position 10 was not in the alone run
    assert batched["records"]["attn.kv_gathered"].keys() == {10}  # decode rows only
    assert gathered_differences(batched) == []  # no decode row alone: nothing to compare
    if leak:
        assert culprit(rows)["module"] == "model.mix" and culprit(rows)["first"] == 0
        assert [r["differ"] for r in rows] == [0, 0, 10, 10, 10, 10, 10, 10]
    else:
        assert culprit(rows) is None


def test_trace_specs_and_plan():
    specs = trace_specs("/tmp/m")
    assert {s["env"].get("VLLM_DISABLE_SHARED_EXPERTS_STREAM") for s in specs} == {None, "1"}
    assert all(s["mode"] == "eager" and s["env"]["VLLM_BATCH_INVARIANT"] == "1" for s in specs)
    p = plan(specs[0])
    assert len(p["target"]) == 2345 and len(p["others"]) == 63
    bad = dict(specs[0], trace=dict(specs[0]["trace"], target_len=1250))
    with pytest.raises(ValueError, match="overlap"):
        plan(bad)
    from e2e.schema import validate_spec

    with pytest.raises(ValueError, match="mode must be 'eager'"):
        validate_spec(dict(specs[0], mode="graphs"))


def test_gathered_rows_are_described_where_they_differ():
    tr = Tracer(_Toy())
    rows = torch.randn(4, 576, dtype=torch.bfloat16)
    local = [100, 99, 30, -1]
    tr.start(None, 90)
    tr._gathered("l0", 100, local, rows)
    tr.take()
    tr.start(list(range(200)), 90)
    tr._gathered("l0", 100, local, rows.clone())
    changed = rows.clone()
    changed[2, 520] += 1
    tr._gathered("l0", 100, local, changed)
    tr._gathered("l0", 101, local, changed)  # no alone row kept: nothing
    d = gathered_differences(tr.take())
    assert len(d) == 1 and d[0]["position"] == 100 and d[0]["entries"] == 1 and d[0]["offsets"] == [70]
    assert d[0]["cols_nope_rope"] == [0, 1] and d[0]["pages"] == [0] and d[0]["same_topk"]

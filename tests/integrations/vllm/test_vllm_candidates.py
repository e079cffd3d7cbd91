"""DeepSeek-V4.1's candidate-block step (``integrations.vllm.candidates``) against a row-by-row statement of vLLM's
semantics (CPU) and against vLLM 0.33's own kernels (``vllm.model_executor.kernels.attention.dsa.candidate_blocks``,
CUDA only: skipped without a GPU)."""

import math

import pytest
import torch

from triton_mla_sparse.integrations.vllm.candidates import apply_candidate_mask, select_candidate_blocks

BS = 8  # candidate_block_size


def make_logits(rows, width, visible, *, seed, device="cpu"):
    """Random float32 logits, -inf at and past each row's context length (as the indexer writes them), garbage
    (large values) there in half of the rows to show the step ignores columns past ``visible``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g)
    cols = torch.arange(width)
    for r in range(rows):
        x[r, cols >= visible[r]] = -math.inf if r % 2 else 50.0
    return x.to(device)


def ref_select(logits, visible, bs, k):
    """Row by row: block scores = max over the block's columns below visible (NaN first), the newest block +inf,
    the k best blocks with a score above -inf, as sets."""
    out = []
    for r in range(logits.shape[0]):
        v = int(visible[r])
        n = -(-logits.shape[1] // bs)
        scores = []
        for b in range(n):
            vals = [float(logits[r, c]) for c in range(b * bs, min((b + 1) * bs, logits.shape[1])) if c < v]
            s = -math.inf if not vals else (math.nan if any(math.isnan(y) for y in vals) else max(vals))
            if v > 0 and b == (v - 1) // bs:
                s = math.inf
            scores.append((b, s))
        ranked = sorted((t for t in scores if t[1] != -math.inf),
                        key=lambda t: (0 if math.isnan(t[1]) else 1, -t[1] if not math.isnan(t[1]) else 0))
        out.append({b for b, _ in ranked[:k]})
    return out


def ref_mask(logits, visible, cand, bs):
    x = logits.clone()
    width = x.shape[1]
    for r in range(x.shape[0]):
        blocks = {int(b) for b in cand[r] if b >= 0}
        for c in range(width):
            keep = c < int(visible[r]) and (c // bs in blocks
                                            or (c == width - 1 and any(b * bs >= width for b in blocks)))
            if not keep:
                x[r, c] = -math.inf
    return x


@pytest.mark.parametrize("k", [3, 6, 20])  # 20 > the blocks of a row: -1 padding
def test_select_matches_the_rule(k):
    visible = torch.tensor([0, 1, 8, 9, 37, 61, 61, 23])
    logits = make_logits(8, 61, visible, seed=k)
    logits[5, 17] = math.nan  # a NaN block ranks first
    out = torch.full((8, k), 12345, dtype=torch.int32)
    select_candidate_blocks(logits, visible.int(), BS, out)
    want = ref_select(logits, visible, BS, k)
    for r in range(8):
        got = out[r].tolist()
        assert set(b for b in got if b >= 0) == want[r], (r, got, want[r])
        assert got.count(-1) == k - len(want[r]) and all(b >= -1 for b in got), (r, got)
    assert out[0].eq(-1).all()  # nothing visible: no candidate
    assert 2 in set(out[5].tolist())  # block of the NaN


@pytest.mark.parametrize("seed", range(6))
def test_select_and_mask_on_random_shapes(seed):
    """Random widths, block sizes, context lengths, a NaN and candidate lists (some past the width): both steps equal
    the rule row by row."""
    g = torch.Generator().manual_seed(seed)
    rows, width, bs = 7, int(torch.randint(1, 90, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
    visible = torch.randint(0, width + 1, (rows,), generator=g)
    logits = make_logits(rows, width, visible, seed=seed + 100)
    nan_row = int(visible.argmax())  # one NaN (several would tie: torch.topk orders NaNs arbitrarily)
    logits[nan_row, int(torch.randint(0, int(visible[nan_row]) or 1, (1,), generator=g))] = math.nan
    k = int(torch.randint(1, 9, (1,), generator=g))
    out = torch.empty(rows, k, dtype=torch.int32)
    select_candidate_blocks(logits, visible.int(), bs, out)
    want = ref_select(logits, visible, bs, k)
    for r in range(rows):
        assert set(b for b in out[r].tolist() if b >= 0) == want[r], (seed, r)
    cand = torch.randint(-1, -(-width // bs) + 2, (rows, k), generator=g, dtype=torch.int32)
    got = logits.clone()
    apply_candidate_mask(got, visible.int(), cand, bs)
    assert torch.equal(got.isnan(), ref_mask(logits, visible, cand, bs).isnan())
    assert torch.equal(got.nan_to_num(0.5), ref_mask(logits, visible, cand, bs).nan_to_num(0.5))


def test_select_zero_width_and_zero_rows():
    out = torch.full((3, 4), 7, dtype=torch.int32)
    select_candidate_blocks(torch.empty(3, 0), torch.zeros(3, dtype=torch.int32), BS, out)
    assert out.eq(-1).all()
    select_candidate_blocks(torch.empty(0, 5), torch.zeros(0, dtype=torch.int32), BS, out[:0])


def test_mask_matches_the_rule():
    visible = torch.tensor([0, 5, 30, 61, 61, 44])
    logits = make_logits(6, 61, visible, seed=3)
    cand = torch.tensor([[0, 1, -1], [0, -1, -1], [3, 1, -1], [7, 2, 0], [9, -1, 4], [-1, -1, -1]],
                        dtype=torch.int32)  # row 4: block 9 starts past the width (61 columns): keeps column 60
    want = ref_mask(logits, visible, cand, BS)
    got = logits.clone()
    apply_candidate_mask(got, visible.int(), cand, BS)
    assert torch.equal(got, want)
    assert got[4, 60] != -math.inf and got[5].eq(-math.inf).all()


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="^logits: expected a float32"):
        select_candidate_blocks(torch.zeros(2, 4, dtype=torch.float16), torch.zeros(2), BS,
                                torch.empty(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="^visible: expected one context length per row"):
        apply_candidate_mask(torch.zeros(2, 4), torch.zeros(3), torch.zeros(2, 1), BS)
    with pytest.raises(ValueError, match="^block_size: expected a positive int"):
        apply_candidate_mask(torch.zeros(2, 4), torch.zeros(2), torch.zeros(2, 1), 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM's candidate kernels take CUDA tensors only")
@pytest.mark.parametrize("width,k", [(61, 3), (4096, 64), (16000, 256)])
def test_same_as_vllms_kernels_on_the_gpu(width, k):
    """Ours and vLLM's ``select_candidate_blocks`` / ``apply_candidate_mask`` (row_starts None, row_repeat 1) on
    the same float32 logits: the same candidate sets, then bit-identical masked logits."""
    from vllm.model_executor.kernels.attention.dsa import candidate_blocks as vk

    rows = 33
    g = torch.Generator().manual_seed(width)
    visible = torch.randint(0, width + 1, (rows,), generator=g)
    visible[:3] = torch.tensor([0, 1, width])
    logits = make_logits(rows, width, visible, seed=width, device="cuda")
    logits[5, 0] = math.nan
    vis = visible.to(torch.int32).cuda()
    ours = torch.full((rows, k), 777, dtype=torch.int32, device="cuda")
    theirs = ours.clone()
    select_candidate_blocks(logits, vis, BS, ours)
    vk.select_candidate_blocks(logits, None, vis, k, BS, theirs)
    for r in range(rows):
        assert set(ours[r].tolist()) == set(theirs[r].tolist()), r
    other = make_logits(rows, width, visible, seed=width + 1, device="cuda")
    a, b = other.clone(), other.clone()
    apply_candidate_mask(a, vis, theirs, BS)
    vk.apply_candidate_mask(b, None, vis, theirs, BS)
    assert torch.equal(a, b)

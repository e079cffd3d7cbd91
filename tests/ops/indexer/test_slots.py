"""topk_to_slots: request-local top-k positions -> global cache slots."""

import pytest
import torch

from triton_mla_sparse import topk_to_slots

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def loop_slots(positions, req_ids, block_table, block_size):
    """The docstring, literally, as a Python loop."""
    R = len(block_table)
    out = []
    for t, row in enumerate(positions):
        r = req_ids[t]
        res = []
        for p in row:
            if p < 0 or not 0 <= r < R or p // block_size >= len(block_table[r]):
                res.append(-1)
                continue
            s = block_table[r][p // block_size] * block_size + p % block_size
            res.append(s if s >= 0 else -1)
        out.append(res)
    return out


def random_case(T, topk, R, max_blocks, block_size):
    """A block table holding a random permutation of physical blocks (some unallocated = -1), rows spread over the
    requests (a few with an out-of-range request id), positions up to two blocks past the table and some -1."""
    n_phys = R * max_blocks + 3
    table = torch.randperm(n_phys)[:R * max_blocks].reshape(R, max_blocks).to(torch.int32)
    table[torch.rand(R, max_blocks) < 0.1] = -1
    req = torch.randint(0, R, (T,), dtype=torch.int32)
    req[torch.rand(T) < 0.1] = R  # out of range
    positions = torch.randint(-2, (max_blocks + 2) * block_size, (T, topk), dtype=torch.int32)
    positions[torch.rand(T, topk) < 0.2] = -1
    positions[0, 0] = INT32_MIN
    positions[0, 1] = INT32_MAX
    return positions, req, table


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("T,topk,R,max_blocks", [(1, 5, 1, 3), (9, 33, 4, 5), (40, 128, 7, 2)])
def test_matches_loop(T, topk, R, max_blocks, block_size):
    positions, req, table = random_case(T, topk, R, max_blocks, block_size)
    slots = topk_to_slots(positions, req, table, block_size)
    assert slots.dtype == torch.int32 and slots.shape == (T, topk)
    want = loop_slots(positions.tolist(), req.tolist(), table.tolist(), block_size)
    assert slots.tolist() == want
    assert (slots >= -1).all()
    # positions past the table (block column >= max_blocks) always give -1
    past = positions.long() >= max_blocks * block_size
    assert (slots[past] == -1).all()
    assert (slots[positions < 0] == -1).all()


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_compact(block_size):
    T, topk, R, max_blocks = 12, 40, 3, 4
    positions, req, table = random_case(T, topk, R, max_blocks, block_size)
    positions[3] = -1  # a row with nothing valid
    slots = topk_to_slots(positions, req, table, block_size)
    packed, counts = topk_to_slots(positions, req, table, block_size, compact=True)
    assert packed.dtype == torch.int32 and packed.shape == (T, topk)
    assert counts.dtype == torch.int32 and counts.shape == (T,)
    for t in range(T):
        valid = [s for s in slots[t].tolist() if s >= 0]
        assert counts[t].item() == len(valid)
        assert packed[t].tolist() == valid + [-1] * (topk - len(valid))
    assert counts[3] == 0


def test_single_request_identity_table():
    """One request whose table is [0, 1, 2, ...]: slot == position for in-range positions."""
    table = torch.arange(4, dtype=torch.int32)[None]
    positions = torch.tensor([[0, 1, 15, 16, 63, 64, -1, 100]], dtype=torch.int32)
    slots = topk_to_slots(positions, torch.zeros(1, dtype=torch.int32), table, 16)
    assert slots.tolist() == [[0, 1, 15, 16, 63, -1, -1, -1]]


def test_empty_inputs():
    table = torch.zeros(2, 3, dtype=torch.int32)
    s = topk_to_slots(torch.zeros(0, 4, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), table, 16)
    assert s.shape == (0, 4) and s.dtype == torch.int32
    p, c = topk_to_slots(torch.zeros(0, 4, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), table, 16,
                         compact=True)
    assert p.shape == (0, 4) and c.shape == (0,) and c.dtype == torch.int32
    # an empty block table: nothing maps
    s = topk_to_slots(torch.tensor([[0, 5]], dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                      torch.zeros(0, 0, dtype=torch.int32), 16)
    assert s.tolist() == [[-1, -1]]


def test_non_contiguous_inputs():
    positions, req, table = random_case(6, 10, 3, 4, 16)
    want = topk_to_slots(positions, req, table, 16)
    pos_nc = positions.t().contiguous().t()
    table_nc = table.t().contiguous().t()
    req_nc = torch.stack([req, req], 1)[:, 0]
    assert not pos_nc.is_contiguous() and not req_nc.is_contiguous()
    assert torch.equal(topk_to_slots(pos_nc, req_nc, table_nc, 16), want)


def _good():
    return (torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
            torch.zeros(3, 5, dtype=torch.int32), 16)


BAD = [
    ("positions", lambda p, r, b, s: (p.long(), r, b, s)),
    ("positions", lambda p, r, b, s: (p.float(), r, b, s)),
    ("positions", lambda p, r, b, s: (p[0], r, b, s)),
    ("positions", lambda p, r, b, s: (p[None], r, b, s)),
    ("positions", lambda p, r, b, s: (p.tolist(), r, b, s)),
    ("req_id_per_token", lambda p, r, b, s: (p, r.long(), b, s)),
    ("req_id_per_token", lambda p, r, b, s: (p, r[:, None], b, s)),
    ("req_id_per_token", lambda p, r, b, s: (p, torch.zeros(3, dtype=torch.int32), b, s)),
    ("req_id_per_token", lambda p, r, b, s: (p, None, b, s)),
    ("req_id_per_token", lambda p, r, b, s: (p, r.to("meta"), b, s)),
    ("block_table", lambda p, r, b, s: (p, r, b.long(), s)),
    ("block_table", lambda p, r, b, s: (p, r, b[0], s)),
    ("block_table", lambda p, r, b, s: (p, r, None, s)),
    ("block_table", lambda p, r, b, s: (p, r, b.to("meta"), s)),
    ("block_size", lambda p, r, b, s: (p, r, b, 0)),
    ("block_size", lambda p, r, b, s: (p, r, b, -16)),
    ("block_size", lambda p, r, b, s: (p, r, b, 16.0)),
    ("block_size", lambda p, r, b, s: (p, r, b, True)),
    ("block_size", lambda p, r, b, s: (p, r, b, "16")),
    ("block_size", lambda p, r, b, s: (p, r, b, None)),
]


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("name,mutate", BAD, ids=[f"{n}{i}" for i, (n, _) in enumerate(BAD)])
def test_rejects(name, mutate, compact):
    args = mutate(*_good())
    with pytest.raises(ValueError) as e:
        topk_to_slots(*args, compact=compact)
    assert name in str(e.value), str(e.value)

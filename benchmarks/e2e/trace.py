"""Where a busy batch changes one request's numbers: exact per-module row hashes of a *target* request served alone
and inside batches of other requests, in one eager engine (``task: trace`` of :mod:`.worker`).

Forward hooks on every module of the model hash, per token position of the target, each output tensor's row (the
bits, not the values, so any difference counts). The alone run marks every row; in a batch the target's rows are
found from the token ids and positions the model receives (:func:`target_rows`). :func:`compare` then lists, per
module in call order, how many of the target's positions differ from the alone run and the first one: the first
module in call order at the smallest differing position is where the batch got in.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

#: A prefill run of rows is taken as the target's only when this many consecutive rows match its tokens.
MIN_RUN = 4
_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def row_hashes(x: torch.Tensor) -> list[int]:
    """One int64 per row of ``x`` (first dimension) from the row's bits: equal rows give equal hashes; a row
    differing in any bit gives another hash except with negligible probability."""
    rows = x.reshape(x.shape[0], -1) if x.dim() > 1 else x.reshape(-1, 1)
    if rows.is_floating_point():
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.int8}[rows.element_size()]
        rows = rows.contiguous().view(bits)
    rows = rows.to(torch.int64)
    key = (rows.shape[1], str(rows.device))
    w = _WEIGHTS.get(key)
    if w is None:
        g = torch.Generator().manual_seed(rows.shape[1])
        w = torch.randint(1, 2**31 - 1, (rows.shape[1],), generator=g, dtype=torch.int64).to(rows.device)
        _WEIGHTS[key] = w
    return (rows * w).sum(dim=1).tolist()  # int64 wrap-around is deterministic


def target_rows(input_ids: list[int], positions: list[int], seq: list[int] | None, prompt_len: int) -> list[int]:
    """The rows of one forward that belong to the target whose tokens are ``seq`` (``None``: every row).

    Rows are split into runs of consecutive positions (one request's chunk each). A row is the target's when its
    token id is ``seq[position]`` and it lies in :data:`MIN_RUN` or more such consecutive matching rows (a prefill
    chunk), or when it is a run of its own at a position at or past ``prompt_len`` (a decode row: :func:`plan`
    keeps the other requests' decode positions away from the target's)."""
    if seq is None:
        return list(range(len(input_ids)))
    match = [0 <= p < len(seq) and t == seq[p] for t, p in zip(input_ids, positions)]
    rows: list[int] = []
    i, n = 0, len(match)
    while i < n:
        j = i + 1
        while j < n and positions[j] == positions[j - 1] + 1:
            j += 1
        if j - i == 1:
            if match[i] and positions[i] >= prompt_len:
                rows.append(i)
        else:
            k = i
            while k < j:
                if not match[k]:
                    k += 1
                    continue
                e = k + 1
                while e < j and match[e]:
                    e += 1
                if e - k >= MIN_RUN:
                    rows.extend(range(k, e))
                k = e
        i = j
    return rows


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


class Tracer:
    """Hooks on every module of a vLLM model; :meth:`start` begins a recording, :meth:`take` ends it and returns
    ``{module: {position: [hash tuple, ...]}}`` plus the modules' first-call order."""

    def __init__(self, model: torch.nn.Module, *, inputs_of: tuple[str, ...] = ("o_proj",)) -> None:
        self.seq: list[int] | None = None
        self.prompt_len = 0
        self.on = False
        self.rows: torch.Tensor | None = None
        self.pos: list[int] = []
        self.m = 0
        self.final: dict[int, int] = {}
        self.records: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
        self.detail: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
        self.kept: dict[tuple[str, int], tuple[list, torch.Tensor]] = {}
        self.order: list[str] = []
        inner = getattr(model, "model", model)
        inner.register_forward_pre_hook(self._begin, with_kwargs=True)
        inner.register_forward_hook(self._end)
        for name, mod in model.named_modules():
            if mod is inner or mod is model:
                continue
            if type(mod).__name__ == "LogitsProcessor":
                mod.register_forward_hook(self._logits)
            else:
                mod.register_forward_hook(self._hook(name))
            if name.rsplit(".", 1)[-1] in inputs_of:
                mod.register_forward_pre_hook(self._pre_hook(name + ".in"))

    def start(self, seq: list[int] | None, prompt_len: int) -> None:
        self.seq, self.prompt_len, self.on = seq, prompt_len, True
        self.records = defaultdict(lambda: defaultdict(list))
        self.detail = defaultdict(lambda: defaultdict(list))

    def take(self) -> dict[str, Any]:
        self.on = False
        return {"records": {k: dict(v) for k, v in self.records.items()}, "order": list(self.order),
                "detail": {k: dict(v) for k, v in self.detail.items()}}

    def _begin(self, module, args, kwargs) -> None:
        self.rows = None
        if not self.on:
            return
        names = ("input_ids", "positions")
        vals = [kwargs.get(n) if n in kwargs else (args[i] if len(args) > i else None) for i, n in enumerate(names)]
        input_ids, positions = vals
        if input_ids is None or positions is None:
            return
        ids, pos = input_ids.tolist(), positions.tolist()
        rows = target_rows(ids, pos, self.seq, self.prompt_len)
        self.m = len(ids)
        if rows:
            self.rows = torch.tensor(rows, device=positions.device)
            self.pos = [pos[r] for r in rows]

    def _record(self, name: str, out: Any, *, actual: bool = False) -> None:
        """Hash the target's rows of each tensor of ``out`` with one row per token (``actual``: also tensors of
        the first T < M rows, the unpadded tokens an attention impl sees)."""
        rows, pos = self.rows, self.pos
        if actual:
            ts = [t for t in _tensors(out) if t.dim() >= 1 and t.shape[0] <= self.m]
            n = min((t.shape[0] for t in ts), default=0)
            keep = [i for i, r in enumerate(rows.tolist()) if r < n]
            rows, pos = rows[keep], [pos[i] for i in keep]
        else:
            ts = [t for t in _tensors(out) if t.dim() >= 1 and t.shape[0] == self.m]
        hashes = [row_hashes(t.index_select(0, rows)) for t in ts]
        if not hashes or not pos:
            return
        if name not in self.records:
            if name not in self.order:
                self.order.append(name)
        rec = self.records[name]
        for i, p in enumerate(pos):
            rec[p].append(tuple(h[i] for h in hashes))

    def _hook(self, name: str):
        def hook(module, args, out) -> None:
            if self.rows is not None:
                self._record(name, out)
        return hook

    def _pre_hook(self, name: str):
        def hook(module, args) -> None:
            if self.rows is not None:
                self._record(name, args)
        return hook

    def wrap_impl(self, cls: type) -> None:
        """Record inside our attention impl (``TritonMLASparseImpl._forward_mqa_kernel``): q, the request-local
        top-k positions (sorted, under the batch-invariant mode, by the impl before the kernel), the valid counts, the cache rows each decode row gathers (in its
        top-k order; slot numbers themselves differ between runs), and the kernel's output and lse."""
        original = cls._forward_mqa_kernel
        tracer = self

        def traced(impl, q, kv_cache, topk_indices, valid_counts, **kw):
            out = original(impl, q, kv_cache, topk_indices, valid_counts, **kw)
            if tracer.rows is None:
                return out
            tag = getattr(kw.get("layer"), "layer_name", "attn")
            t = topk_indices.shape[0]
            tracer._record(f"{tag}.q", q, actual=True)
            if impl.topk_indices_buffer is not None:
                tracer._record(f"{tag}.topk_local", impl.topk_indices_buffer[:t], actual=True)
            if valid_counts is not None:
                tracer._record(f"{tag}.valid", valid_counts, actual=True)
            decode = [i for i, (r, p) in enumerate(zip(tracer.rows.tolist(), tracer.pos))
                      if r < t and p >= tracer.prompt_len]
            if decode:
                kv = impl._kv_rows(kv_cache, kw["block_size"])
                sel = tracer.rows[decode]
                idx = topk_indices.index_select(0, sel).long()
                g = kv.index_select(0, idx.clamp(min=0).reshape(-1)).reshape(*idx.shape, -1)
                g = torch.where((idx >= 0)[..., None], g, torch.zeros_like(g))
                saved = tracer.rows, tracer.pos
                tracer.rows, tracer.pos = torch.arange(len(decode), device=g.device), [tracer.pos[i] for i in decode]
                tracer._record(f"{tag}.kv_gathered", g, actual=True)
                local = impl.topk_indices_buffer.index_select(0, sel).tolist() \
                    if impl.topk_indices_buffer is not None else [[None] * idx.shape[1]] * len(decode)
                for i, p in enumerate(tracer.pos):
                    tracer._gathered(f"{tag}.kv_gathered", p, local[i], g[i])
                tracer.rows, tracer.pos = saved
            tracer._record(f"{tag}.out", out, actual=True)
            return out

        cls._forward_mqa_kernel = traced

    def _gathered(self, tag: str, pos: int, local: list, rows: torch.Tensor) -> None:
        """Keep a decode row's gathered cache rows (alone run), or describe how they differ from the alone run's:
        which entries, by how much, in which columns, in which 64-token pages."""
        if self.seq is None:
            self.kept[(tag, pos)] = (local, rows.cpu())
            return
        ref = self.kept.get((tag, pos))
        if ref is None:
            return
        a_local, a = ref
        b = rows.cpu()
        ne = (a.view(torch.int16) != b.view(torch.int16)) if a.element_size() == 2 else (a != b)
        bad = ne.any(dim=1).nonzero().flatten().tolist()
        if not bad:
            self.detail[tag][pos].append({"entries": 0})
            return
        diff = (a.float() - b.float()).abs()
        pages = sorted({a_local[k] // 64 for k in bad if a_local[k] is not None and a_local[k] >= 0})
        self.detail[tag][pos].append({
            "entries": len(bad), "same_topk": a_local == local,
            "offsets": sorted({pos - a_local[k] for k in bad if a_local[k] is not None})[:24],
            "max_abs_diff": float(diff.max()), "max_abs": float(a.float().abs().max()),
            "cols_differ": int(ne.any(dim=0).sum()), "cols_nope_rope": [int(ne[:, :512].any(dim=0).sum()),
                                                                         int(ne[:, 512:].any(dim=0).sum())],
            "pages": pages[:40], "page_count": len(pages),
            "nan_or_zero_rows": [int(b[bad].isnan().any(dim=1).sum()), int((b[bad] == 0).all(dim=1).sum())],
            "sample": [{"local": a_local[k], "alone": a[k, :4].float().tolist(), "batched": b[k, :4].float().tolist(),
                        "diff": float(diff[k].max())} for k in bad[:3]]})

    def _end(self, module, args, out) -> None:
        if self.rows is None:
            return
        self._record("model", out)
        t = _tensors(out)[0]
        self.final = {h: p for h, p in zip(row_hashes(t.index_select(0, self.rows)), self.pos)}

    def _logits(self, module, args, out) -> None:
        """The logits rows are the sampled rows only: found by their input rows' hashes among the model's
        output rows of this step."""
        if not self.on or not self.final or len(args) < 2 or not isinstance(out, torch.Tensor):
            return
        keys = row_hashes(args[1])
        hashes = row_hashes(out)
        if "logits" not in self.order:
            self.order.append("logits")
        for k, h in zip(keys, hashes):
            if k in self.final:
                self.records["logits"][self.final[k]].append((h,))
        self.final = {}


def compare(alone: dict[str, Any], batched: dict[str, Any]) -> list[dict[str, Any]]:
    """Per module (in the alone run's call order): the target positions both runs recorded, how many differ (a batched
    row hash the alone run did not produce at that position), and the first differing position."""
    rows = []
    for name in alone["order"]:
        a = alone["records"].get(name, {})
        b = batched["records"].get(name, {})
        common = sorted(set(a) & set(b))
        bad = [p for p in common if not set(b[p]) <= set(a[p])]
        rows.append({"module": name, "positions": len(common), "differ": len(bad),
                     "first": bad[0] if bad else None})
    return rows


def gathered_differences(batched: dict[str, Any]) -> list[dict[str, Any]]:
    """The decode positions whose gathered cache rows differ from the alone run's (:meth:`Tracer._gathered`)."""
    return [{"tag": tag, "position": p, **d} for tag, per_pos in batched.get("detail", {}).items()
            for p in sorted(per_pos) for d in per_pos[p] if d["entries"]]


def culprit(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first module in call order whose first differing position is the smallest of all."""
    bad = [r for r in rows if r["first"] is not None]
    if not bad:
        return None
    first = min(r["first"] for r in bad)
    return next(r for r in bad if r["first"] == first)


def plan(spec: dict[str, Any]) -> dict[str, Any]:
    """The target and the other requests of a trace run: the target's prompt length is outside the others' lengths
    and their decode positions (see :func:`target_rows`)."""
    from .prompts import random_prompt
    from .soak import MAX_TOKENS, PROMPT_LENGTHS, request_pool

    t = spec["trace"]
    target_len, max_tokens = t["target_len"], t["max_tokens"]
    others = request_pool(t["others"], seed=t.get("seed", 7))
    for o in others:
        if not (o["prompt_len"] + max(MAX_TOKENS) < target_len or o["prompt_len"] > target_len + max_tokens):
            raise ValueError(f"trace.target_len {target_len}: decode positions overlap prompt length "
                             f"{o['prompt_len']} of {PROMPT_LENGTHS}")
    return {"target": random_prompt(target_len, seed=t.get("target_seed", 4242)), "max_tokens": max_tokens,
            "others": [(random_prompt(o["prompt_len"], seed=o["seed"]), o["max_tokens"]) for o in others]}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """The trace task: the target alone, then alone again (is one engine step deterministic at all?) and inside the
    others (target first, in the middle, last), each run compared with the first one module by module."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from .worker import _engine

    llm, meta = _engine(spec)
    model = llm.apply_model(lambda m: m)[0]  # the engine core runs in this process
    tracer = Tracer(model)
    if spec["backend"] == "TRITON_MLA_SPARSE":
        from triton_mla_sparse.integrations.vllm.backend import TritonMLASparseImpl

        tracer.wrap_impl(TritonMLASparseImpl)
    p = plan(spec)

    def sp(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)

    target = TokensPrompt(prompt_token_ids=p["target"])
    tracer.start(None, len(p["target"]))
    alone_out = llm.generate([target], sp(p["max_tokens"]), use_tqdm=False)[0].outputs[0].token_ids
    alone = tracer.take()
    seq = p["target"] + list(alone_out)
    others = [(TokensPrompt(prompt_token_ids=q), sp(n)) for q, n in p["others"]]
    runs = []
    for where in ("alone", "first", "middle", "last"):
        k = {"alone": 0, "first": 0, "middle": len(others) // 2, "last": len(others)}[where]
        batch = [(target, sp(p["max_tokens"]))] if where == "alone" else \
            others[:k] + [(target, sp(p["max_tokens"]))] + others[k:]
        tracer.start(seq, len(p["target"]))
        outs = llm.generate([b[0] for b in batch], [b[1] for b in batch], use_tqdm=False)
        rec = tracer.take()
        tokens = list(outs[k].outputs[0].token_ids)
        prefix = next((i for i, (x, y) in enumerate(zip(tokens, alone_out)) if x != y), len(tokens))
        rows = compare(alone, rec)
        runs.append({"where": where, "identical": tokens == list(alone_out), "prefix": prefix,
                     "culprit": culprit(rows), "gathered": gathered_differences(rec)[:40],
                     "modules": rows})
    return {**meta, "target_len": len(p["target"]), "others": len(others), "runs": runs}

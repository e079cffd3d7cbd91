"""Accuracy first: every method's output is checked against the float32 reference on the same inputs (a random
subset of rows for large cases) before it is timed."""

from __future__ import annotations

import math

import torch

from ..testing import rel_err
from .cases import Case
from .inputs import CaseInputs, IndexerInputs, indexer_args

def tolerance(kv_format: str) -> float:
    """Relative-error limit vs the float32 reference (fp8: vs the reference on the same fp8 cache)."""
    return 2e-2 if kv_format.startswith("fp8") else 1e-2


INDEXER_TOL = 1e-2  # indexer logits: relative error over the candidates; top-k: over the sorted selected logits


def case_tolerance(case: Case) -> float:
    """The accuracy limit of a case's methods (:func:`tolerance` for attention, :data:`INDEXER_TOL` for indexer)."""
    return INDEXER_TOL if case.kind == "indexer" else tolerance(case.kv_format)


def _check_rows(c: Case, device: torch.device, seed: int) -> torch.Tensor | None:
    """The sorted random subset of rows checked (None: all of them)."""
    if c.rows <= c.check_rows:
        return None
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randperm(c.rows, generator=g)[: c.check_rows].sort().values.to(device)


def indexer_reference(inp: IndexerInputs, seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 reference logits ``[checked rows, max_len]`` (-inf where not a candidate) of a random subset of at
    most ``case.check_rows`` rows: ``(ref, row_ids)`` (``row_ids`` None when all rows are checked)."""
    from .. import reference

    sel = _check_rows(inp.case, inp.device, seed)
    q, w, kc, bt, req, pos = indexer_args(inp)
    if sel is not None:  # (q's rows picked through a uint8 view: fp8 indexing kernels are not everywhere)
        q = q.view(torch.uint8)[sel].view(q.dtype) if q.dtype == torch.float8_e4m3fn else q[sel]
        w, req, pos = w[sel], req[sel], pos[sel]
    ref = reference.indexer_logits(q, w, kc, bt, req, pos, inp.max_len, compute_dtype=torch.float32)
    return ref, sel


def indexer_error(out: torch.Tensor, ref: torch.Tensor, topk: int) -> tuple[float, str | None]:
    """Error of an indexer method's output on the checked rows against the reference logits ``ref`` (-inf = not a
    candidate): ``(error, problem)``, ``problem`` None unless the output is structurally wrong (error inf then).

    * logits (a float tensor ``[rows, max_len]``): relative error over the candidate positions; what a method writes
      elsewhere is not checked (DeepGEMM leaves those columns uncleaned).
    * top-k positions (an integer tensor ``[rows, topk]``): each row must hold exactly min(topk, candidates)
      distinct candidate positions, -1 elsewhere; the error is the relative error of their reference logits, sorted,
      against the reference's own top values (a set comparison that any choice among ties passes)."""
    T, L = ref.shape
    ref = ref.float()
    if out.dtype.is_floating_point:
        if tuple(out.shape) != (T, L):
            return math.inf, f"logits of shape {tuple(out.shape)}, expected {(T, L)}"
        cand = ~torch.isneginf(ref)
        got = out[cand].float()
        if not bool(torch.isfinite(got).all()):
            return math.inf, "non-finite logits at candidate positions"
        return rel_err(got, ref[cand]), None
    if out.dim() != 2 or tuple(out.shape) != (T, topk):
        return math.inf, f"top-k of shape {tuple(out.shape)}, expected {(T, topk)}"
    pos = out.long()
    sel = pos >= 0
    n = (~torch.isneginf(ref)).sum(1)
    want_k = n.clamp(max=topk)
    if not torch.equal(sel.sum(1), want_k):
        return math.inf, "a row does not hold min(topk, candidates) positions"
    if bool((pos >= L).any()) or bool(((pos < 0) & (pos != -1)).any()):
        return math.inf, "a position out of range (padding must be -1)"
    key = torch.where(sel, pos, -1 - torch.arange(topk, device=pos.device)[None, :])  # padding: distinct negatives
    key = key.sort(dim=1).values
    if bool((key[:, 1:] == key[:, :-1]).any()):
        return math.inf, "a position selected twice"
    vals = torch.gather(ref, 1, torch.where(sel, pos, torch.zeros_like(pos)))
    if bool(torch.isneginf(vals[sel]).any()):
        return math.inf, "a selected position is not a candidate"
    got = torch.where(sel, vals, torch.full_like(vals, -math.inf)).sort(dim=1, descending=True).values
    k = min(topk, L)
    want = torch.topk(ref, k, dim=1).values
    if k < topk:
        want = torch.cat([want, want.new_full((T, topk - k), -math.inf)], 1)
    cols = torch.arange(topk, device=ref.device)[None, :] < want_k[:, None]
    if not bool(cols.any()):
        return 0.0, None
    return rel_err(got[cols], want[cols]), None


def check_output(case: Case, out: torch.Tensor, ref: torch.Tensor,
                 sel: torch.Tensor | None) -> tuple[float, str | None]:
    """``(error, problem)`` of a method's output on the checked rows (``sel``) against the case's reference."""
    got = out if sel is None else out[sel]
    if case.kind == "indexer":
        return indexer_error(got, ref, case.topk)
    return rel_err(got, ref), None


def reference_output(inp: CaseInputs | IndexerInputs,
                     seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 reference on a random subset of at most ``case.check_rows`` rows: returns ``(ref, row_ids)``
    (``row_ids`` None when all rows are checked). Indexer cases: :func:`indexer_reference`."""
    from .. import reference

    if isinstance(inp, IndexerInputs):
        return indexer_reference(inp, seed)
    sel = _check_rows(inp.case, inp.device, seed)
    q, idx = (inp.q, inp.indices) if sel is None else (inp.q[sel], inp.indices[sel])
    ref = reference.sparse_mla_attention(q, inp.kv_cache, idx, inp.softmax_scale, kv_format=inp.kv_format,
                                         compute_dtype=torch.float32, out_dtype=torch.float32, **inp.extras(sel))
    return ref, sel

"""Comparisons of two engines' outputs (pure Python; tested on the CPU)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def token_agreement(a: Sequence[int], b: Sequence[int]) -> dict[str, Any]:
    """Greedy tokens of two runs of one prompt: ``prefix`` (tokens equal before the first difference), ``equal``
    (fraction of equal positions), ``identical`` (same length and tokens), ``generated`` (the longer length)."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError(f"token lists must be non-empty, got lengths {len(a)} and {len(b)}")
    prefix = 0
    for x, y in zip(a, b):
        if x != y:
            break
        prefix += 1
    n = max(len(a), len(b))
    equal = sum(1 for x, y in zip(a, b) if x == y) / n
    return {"prefix": prefix, "equal": equal, "identical": list(a) == list(b), "generated": n}


def logprob_diff(a: Mapping[int, float], b: Mapping[int, float]) -> float:
    """Largest |logprob_a - logprob_b| over the tokens both runs report at one position (the first generated token:
    both engines rank the same top tokens from the same context). ``inf`` when a shared value is not finite or no
    token is shared."""
    shared = set(a) & set(b)
    if not shared:
        return math.inf
    worst = 0.0
    for t in shared:
        x, y = float(a[t]), float(b[t])
        if not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        worst = max(worst, abs(x - y))
    return worst


def set_agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Top-k index lists of two indexers for the same rows (-1 = padding, order free): ``mean_overlap`` (mean over
    rows of |A ∩ B| / max(|A|, |B|)), ``min_overlap`` and ``rows_identical`` (fraction of rows with equal sets)."""
    if len(a) != len(b):
        raise ValueError(f"row counts differ: {len(a)} and {len(b)}")
    if not a:
        raise ValueError("no rows to compare")
    overlaps, same = [], 0
    for ra, rb in zip(a, b):
        sa = {int(i) for i in ra if int(i) >= 0}
        sb = {int(i) for i in rb if int(i) >= 0}
        denom = max(len(sa), len(sb))
        overlaps.append(1.0 if denom == 0 else len(sa & sb) / denom)
        same += sa == sb
    return {"rows": len(a), "mean_overlap": sum(overlaps) / len(a), "min_overlap": min(overlaps),
            "rows_identical": same / len(a)}


def compare_runs(ours: Mapping[str, Any], peer: Mapping[str, Any]) -> dict[str, Any]:
    """Per prompt of two worker results (:mod:`.worker`): token agreement and the first-token logprob difference."""
    if [p["length"] for p in ours["prompts"]] != [p["length"] for p in peer["prompts"]]:
        raise ValueError("the two runs did not use the same prompts")
    rows = []
    for po, pp in zip(ours["prompts"], peer["prompts"]):
        agree = token_agreement(po["tokens"], pp["tokens"])
        lo = {int(k): v for k, v in po["first_logprobs"].items()}
        lp = {int(k): v for k, v in pp["first_logprobs"].items()}
        rows.append({"length": po["length"], **agree, "first_logprob_diff": logprob_diff(lo, lp)})
    return {"prompts": rows,
            "all_identical": all(r["identical"] for r in rows),
            "worst_first_logprob_diff": max(r["first_logprob_diff"] for r in rows)}


def divergence_is_a_near_tie(tokens_a: Sequence[int], tokens_b: Sequence[int],
                             logprobs_a: Sequence[Mapping[Any, float] | None], *, margin: float) -> bool | None:
    """Whether two greedy outputs first differ where run A's two best tokens were within ``margin`` nats (a near tie,
    which reordered float sums can flip); None when the outputs are identical."""
    agree = token_agreement(tokens_a, tokens_b)
    if agree["identical"]:
        return None
    m = margin_at(logprobs_a, agree["prefix"])
    return m is not None and m <= margin


def margin_at(logprobs: Sequence[Mapping[Any, float] | None], i: int) -> float | None:
    """The gap between the best two logprobs at position ``i`` (None when not recorded or fewer than two)."""
    if i >= len(logprobs) or not logprobs[i]:
        return None
    top = sorted((float(v) for v in logprobs[i].values()), reverse=True)
    return top[0] - top[1] if len(top) > 1 else None

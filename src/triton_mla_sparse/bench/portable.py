"""``ours_portable``: our attention kernels with another architecture family's launch-table entries and its
instruction path, timed on the GPU at hand (``triton-mla-sparse bench --emulate sm86|sm89|sm120``), so that the
path A100, L40S, RTX 4090 and RTX PRO 6000 users get has a number on the H200.

Triton lowers ``tl.dot`` to mma.sync on sm80/86/89/120 and to wgmma (MMA v3) on sm90 unless ``DISABLE_MMA_V3=1``.
Triton keys its in-process kernel cache by a kernel's arguments, not by that variable, so the emulated kernels are
compiled and timed in a child process that has it from the start and its own Triton cache folder; the child then
reads every kernel it compiled and refuses the figures if any PTX holds a wgmma instruction. Everything else (the
head and gather blocks, splits, warps, stages, the software e4m3 decode where the family has no fp8 conversions)
comes from the family's table entry (:func:`emulated_overrides`); the multiprocessor count stays the device's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

import torch

from .cases import Case
from .inputs import CaseInputs
from .methods import MethodFactory, Prepared, Unsupported

EMULATED = ("sm80", "sm86", "sm89", "sm120")  # the families whose Triton path has no wgmma
METHOD = "ours_portable"


def emulated_overrides(arch_name: str, case: Case, q: torch.Tensor, **choice: object) -> tuple[str, dict]:
    """The kernel and every field of the config that ``arch_name``'s launch table (with ``choice``: e.g. ``family``,
    ``block_h``) picks for ``case``, as overrides for ``sparse_mla_attention_with_config`` on the GPU at hand
    (split_len is left to follow num_splits; the multiprocessor count is the device's)."""
    from ..capabilities import ARCHS
    from ..ops.sparse_mla.configs import choose_config

    # both lists' length, as the API counts them (DeepSeek-V4 cases: window + compressed)
    cfg = choose_config(case.rows, case.heads, case.topk + case.extra_topk, q.device, "auto",
                        kv_format=case.kv_format, arch=ARCHS[arch_name], q_dtype=q.dtype, **choice)
    return cfg.kernel, {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("kernel", "split_len")}


def portable_factory(family: str) -> MethodFactory:
    """The ``ours_portable`` method factory for ``family`` (one of :data:`EMULATED`)."""
    if family not in EMULATED:
        raise ValueError(f"family: one of {EMULATED}, got {family!r}")
    from ..capabilities import ARCHS, unsupported_reasons
    from ..formats import D_V

    arch = ARCHS[family]

    def build(inp: CaseInputs) -> Prepared:
        from ..ops.sparse_mla import sparse_mla_attention_with_config

        c = inp.case
        if c.kind not in ("decode", "prefill"):
            raise Unsupported("ours_portable emulates the attention kernels")
        q, kv, idx, scale, fmt = inp.q, inp.kv_cache, inp.indices, inp.softmax_scale, c.kv_format
        reasons = unsupported_reasons(arch, q_dtype=q.dtype, kv_format=fmt, d_rope=q.shape[-1] - D_V, heads=c.heads,
                                      topk=c.topk, block_size=c.block_size, device_desc=family)
        if reasons:
            raise Unsupported("; ".join(reasons))
        kernel, over = emulated_overrides(family, c, q)
        out = torch.empty(q.shape[0], q.shape[1], D_V, dtype=q.dtype, device=q.device)
        kw = inp.extras()  # DeepSeek-V4 cases: the second cache, lengths, sink
        _, used = sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt, out=out, kernel=kernel,
                                                   return_config=True, **kw, **over)

        def fn() -> torch.Tensor:
            return sparse_mla_attention_with_config(q, kv, idx, scale, kv_format=fmt, out=out, kernel=kernel,
                                                    **kw, **over)

        return Prepared(fn=fn, config=f"{family} table: {used.describe()}")

    return build


def wgmma_kernels(cache_dir: str) -> tuple[int, list[str]]:
    """``(PTX files read, names of those holding a wgmma instruction)`` under a Triton cache folder."""
    n, bad = 0, []
    for root, _, files in os.walk(cache_dir):
        for f in files:
            if f.endswith(".ptx"):
                n += 1
                with open(os.path.join(root, f), errors="replace") as fh:
                    if "wgmma." in fh.read():
                        bad.append(f)
    return n, sorted(bad)


def child_main(argv: list[str]) -> int:
    """``python -m triton_mla_sparse.bench.portable FAMILY CASES.json OUT.json SEED``: run ``ours_portable`` on
    each case (the same inputs as the parent's, from the same seed) and write the method records."""
    family, cases_path, out_path, seed = argv[0], argv[1], argv[2], int(argv[3])
    from .runner import run_case, timers

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer, graph_timer, windows = timers(device)
    with open(cases_path) as f:
        payload = json.load(f)
    factories = {METHOD: portable_factory(family)}
    records = {}
    for d in payload["cases"]:
        case = Case(**d)
        rec = run_case(case, [METHOD], device, factories=factories, ceilings=payload.get("ceilings"), seed=seed,
                       timer=timer, graph_timer=graph_timer, windows=windows,
                       log=lambda s: print(s, file=sys.stderr, flush=True))
        records[case.name] = rec.get("methods", {}).get(METHOD) or {"error": rec.get("error", "not run")}
    cache = os.environ.get("TRITON_CACHE_DIR", "")
    checked, bad = wgmma_kernels(cache) if cache else (0, [])
    with open(out_path, "w") as f:
        json.dump({"family": family, "records": records, "ptx_checked": checked, "wgmma_ptx": bad}, f)
    return 0


def run_portable(cases: list[Case], family: str, *, seed: int, ceilings: dict | None,
                 log: Callable[[str], None] = print, timeout_s: float = 1800.0) -> dict:
    """Run the child for ``cases`` (attention ones) and return ``{"records": {case name: method record},
    "instructions": text}``; if any compiled kernel holds wgmma, every record becomes an error, and so does every
    record when the child fails or runs past ``timeout_s``."""
    if family not in EMULATED:
        raise ValueError(f"emulate: one of {', '.join(EMULATED)}, got {family!r}")
    todo = [c for c in cases if c.kind in ("decode", "prefill")]
    with tempfile.TemporaryDirectory(prefix="tms-portable-") as tmp:
        cases_path, out_path = os.path.join(tmp, "cases.json"), os.path.join(tmp, "out.json")
        with open(cases_path, "w") as f:
            json.dump({"cases": [dataclasses.asdict(c) for c in todo], "ceilings": ceilings}, f)
        env = {**os.environ, "DISABLE_MMA_V3": "1", "TRITON_CACHE_DIR": os.path.join(tmp, "triton-cache")}
        log(f"--emulate {family}: {len(todo)} attention cases in a child process (DISABLE_MMA_V3=1, own Triton cache)")
        try:
            proc = subprocess.run([sys.executable, "-m", "triton_mla_sparse.bench.portable", family, cases_path,
                                   out_path, str(seed)], env=env, stderr=subprocess.PIPE, text=True,
                                  timeout=timeout_s)
            rc, lines = proc.returncode, proc.stderr.splitlines()
        except subprocess.TimeoutExpired as e:
            rc, lines = f"a timeout ({timeout_s:g} s)", (e.stderr or b"").decode(errors="replace").splitlines()
        for line in lines:
            log(f"  [{family}] {line}")
        if rc != 0 or not os.path.exists(out_path):
            err = f"the emulation child ended with {rc}"
            return {"records": {c.name: {"error": err} for c in todo}, "instructions": err}
        with open(out_path) as f:
            res = json.load(f)
    records = res["records"]
    if res["wgmma_ptx"]:
        text = f"wgmma in {len(res['wgmma_ptx'])} of {res['ptx_checked']} compiled kernels: not the {family} path"
        records = {n: {"error": text} for n in records}
    else:
        text = (f"no wgmma in any of the {res['ptx_checked']} kernels compiled (mma.sync path)"
                if res["ptx_checked"] else "no PTX compiled (interpreter)")
    for r in records.values():
        r["emulated"] = family
    return {"records": records, "instructions": text}


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

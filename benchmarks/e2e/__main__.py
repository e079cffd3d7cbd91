"""``python -m e2e {correctness,serving,soak,trace,merge,tables}`` (run from ``benchmarks/``; GPU + vLLM for the first
four)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _versions() -> dict[str, str]:
    import torch
    import triton
    import vllm

    return {"vllm": vllm.__version__, "torch": torch.__version__, "triton": triton.__version__}


def _gpu() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("correctness", help="the correctness matrix (section file DIR/correctness.json)")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--parallel", type=int, default=8)
    c.add_argument("--timeout", type=float, default=540, help="seconds per engine run")
    c.add_argument("--budget", type=float, default=900, help="start no run after this many seconds")
    c.add_argument("--variants", default="dsv32-h128,dsv32-h16,glm5-h8")
    c.add_argument("--modes", default="eager,graphs")
    c.add_argument("--only", default="", help="regex: run only the specs whose name matches")
    c.add_argument("--tp", default="", help="tensor-parallel sizes, e.g. 2,4: the tensor-parallel runs (ours vs the "
                   "peer, CUDA graphs, worker processes) instead of the matrix, one engine at a time")
    c.add_argument("--expert-parallel", action="store_true", help="with --tp: experts split over the ranks too")
    c.add_argument("--from-runs", type=Path, default=None,
                   help="rebuild the section from an earlier run's worker results (DIR/runs) instead of running; "
                        "the environment is read from DIR/correctness.json")
    s = sub.add_parser("serving", help="serving figures, one engine at a time (DIR/serving.json)")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--variants", default="dsv32-h16,dsv32-h128")
    s.add_argument("--timeout", type=float, default=400, help="seconds per engine run")
    s.add_argument("--budget", type=float, default=720, help="start no run after this many seconds")
    s.add_argument("--only", default="")
    k = sub.add_parser("soak", help="vllm serve under concurrent load (DIR/soak.json)")
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("--duration", type=float, default=300)
    k.add_argument("--concurrency", type=int, default=64)
    k.add_argument("--name", default="ours-batch-invariant", help="one of soak.SOAKS")
    k.add_argument("--port", type=int, default=8377)
    r = sub.add_parser("trace", help="where batching changes a request's numbers, module by module (DIR/trace.json)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--timeout", type=float, default=900)
    m = sub.add_parser("merge", help="merge section files into a results file (no GPU)")
    m.add_argument("sections", nargs="+", type=Path)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--commit", required=True)
    m.add_argument("--date", default=None)
    t = sub.add_parser("tables", help="print the markdown tables of a results file (no GPU)")
    t.add_argument("results", type=Path)
    a = p.parse_args(argv)

    if a.cmd in ("merge", "tables"):
        from .results import (correctness_table, merge, new_document, readme_correctness_table, readme_serving_table,
                              readme_soak_table, readme_v41_table, readme_v4_serving_table, readme_v4_table,
                              serving_table, summary_table)

        if a.cmd == "merge":
            first = json.loads(a.sections[0].read_text())
            env = first.get("environment", {})
            doc = new_document(commit=a.commit, gpu=env.get("gpu", "?"), versions=env.get("versions", {}),
                               date=a.date)
            doc = merge(doc, a.sections)
            a.out.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {a.out}")
        else:
            doc = json.loads(a.results.read_text())
            print(readme_correctness_table(doc), "\n")
            print(readme_serving_table(doc), "\n")
            print(readme_soak_table(doc), "\n")
            print(readme_v4_table(doc), "\n")
            print(readme_v41_table(doc), "\n")
            print(readme_v4_serving_table(doc), "\n")
            print(summary_table(doc), "\n")
            print(correctness_table(doc), "\n")
            print(serving_table(doc))
        return 0

    import re

    from .matrix import correctness_specs, parallel_specs, run_pool, serving_specs, trace_specs
    from .results import correctness_rows, serving_rows

    a.out.mkdir(parents=True, exist_ok=True)
    env = {} if getattr(a, "from_runs", None) else {"gpu": _gpu(), "versions": _versions()}
    if a.cmd == "correctness":
        if a.tp:
            specs, pairs = parallel_specs(str(a.out / "models"), tp_sizes=tuple(int(t) for t in a.tp.split(",")),
                                          variants=tuple(a.variants.split(",")), expert_parallel=a.expert_parallel)
            a.parallel = 1  # each engine takes its ranks' GPUs from device 0 on
        else:
            specs, pairs = correctness_specs(str(a.out / "models"), variants=tuple(a.variants.split(",")),
                                             modes=tuple(a.modes.split(",")))
        if a.only:
            specs = [sp for sp in specs if re.search(a.only, sp["name"])]
        specs.sort(key=lambda sp: ("h128" not in sp["name"], sp["mode"] != "graphs"))  # longest first
        if a.from_runs is not None:
            results = {sp["name"]: json.loads((a.from_runs / "runs" / f"{sp['name']}.json").read_text())
                       for sp in specs if (a.from_runs / "runs" / f"{sp['name']}.json").exists()}
            env = json.loads((a.from_runs / "correctness.json").read_text())["environment"]
        else:
            results = run_pool(specs, a.out / "runs", parallel=a.parallel, timeout_s=a.timeout, budget_s=a.budget)
        names = set(results)
        pairs = [pr for pr in pairs if pr["ours"] in names and pr["peer"] in names]
        section = {"environment": env, "correctness": correctness_rows(pairs, results)}
        path = a.out / "correctness.json"
    elif a.cmd == "serving":
        specs = serving_specs(str(a.out / "models"), variants=tuple(a.variants.split(",")))
        if a.only:
            specs = [sp for sp in specs if re.search(a.only, sp["name"])]
        results = run_pool(specs, a.out / "runs", parallel=1, timeout_s=a.timeout, budget_s=a.budget)
        section = {"environment": env, "serving": serving_rows(results)}
        path = a.out / "serving.json"
    elif a.cmd == "trace":
        specs = trace_specs(str(a.out / "models"))
        results = run_pool(specs, a.out / "runs", parallel=len(specs), timeout_s=a.timeout)
        section = {"environment": env, "trace": [{"name": n, **{k: r.get(k) for k in ("ok", "error", "runs")}}
                                                 for n, r in results.items()]}
        path = a.out / "trace.json"
    else:
        from .soak import run_soak

        section = {"environment": env, "soak": [run_soak(a.out, name=a.name, duration_s=a.duration,
                                                         concurrency=a.concurrency, port=a.port)]}
        path = a.out / "soak.json"
    path.write_text(json.dumps(section, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

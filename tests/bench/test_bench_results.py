"""Results files: device slugs, paths, the commit of a run."""

from __future__ import annotations

import pytest

from triton_mla_sparse import bench
from triton_mla_sparse.bench import results


@pytest.mark.parametrize("name, slug", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("AMD Instinct MI300X", "mi300x"),
    ("CPU (x86_64)", "cpu"),
    ("", "unknown"),
])
def test_gpu_slug(name, slug):
    assert bench.gpu_slug(name) == slug


def test_results_path():
    assert bench.results_path("NVIDIA H200", "2026-12-01") == "benchmarks/results/h200-2026-12-01.json"
    assert bench.results_path("NVIDIA H100 80GB HBM3", "2026-12-01", "/o") == "/o/h100-2026-12-01.json"
    assert len(bench.utc_date()) == 10 and bench.utc_date()[4] == "-"


def test_commit_from_env_then_git(monkeypatch):
    assert bench.resolve_commit({"TMS_COMMIT": " abc123 "}) == ("abc123", "TMS_COMMIT", None)
    monkeypatch.setattr(results, "_git", lambda *a: None)  # no git, or not a checkout (the GPU machine's copy)
    assert bench.resolve_commit({}) == (None, None, None)
    monkeypatch.setattr(results, "_git", lambda *a: "f" * 40 if a[0] == "rev-parse" else "")
    assert bench.resolve_commit({"TMS_COMMIT": ""}) == ("f" * 40, "git", False)

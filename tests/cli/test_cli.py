"""CPU smoke tests of the ``triton-mla-sparse`` command through its installed entry point (the console script that
``pip install`` made), so the argument wiring, the device set-up and each command's output are what a user gets."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _entry_point() -> str:
    exe = shutil.which("triton-mla-sparse", path=os.pathsep.join([str(pathlib.Path(sys.executable).parent),
                                                                  os.environ.get("PATH", "")]))
    assert exe, "the triton-mla-sparse console script is not installed (pip install -e .)"
    return exe


def run_cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the installed command in a fresh process without CUDA devices (the interpreter is its own choice)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([_entry_point(), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def test_version_and_commands():
    r = run_cli("--help")
    assert r.returncode == 0, r.stderr
    for command in ("demo", "check", "info", "bench", "select"):
        assert command in r.stdout
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("triton-mla-sparse "), r.stdout + r.stderr


def test_no_command_is_an_error():
    r = run_cli()
    assert r.returncode == 2 and "COMMAND" in r.stderr


def test_demo_on_the_cpu():
    r = run_cli("demo", "--device", "cpu", "--seed", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CPU (Triton interpreter)" in r.stdout and "seed 3" in r.stdout
    assert "-> OK" in r.stdout
    assert "kernel: decode bh" in r.stdout or "kernel: prefill bh" in r.stdout


def test_demo_refuses_cuda_without_a_gpu():
    r = run_cli("demo", "--device", "cuda")
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr


def test_check_on_the_cpu():
    r = run_cli("check")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("triton-mla-sparse check on CPU")
    rows = [line for line in lines if line.split()[:1] and line.split()[0].split("/")[0] in
            ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla")]
    assert len(rows) == 20 and all("pass" in row for row in rows), r.stdout
    assert lines[-1] == "20 passed, 0 failed"


def test_info_without_a_gpu_and_for_an_arch():
    r = run_cli("info")
    assert r.returncode == 0 and "device: none" in r.stdout, r.stdout + r.stderr
    r = run_cli("info", "--arch", "sm86")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "architecture family: sm86" in r.stdout and "launch table" in r.stdout
    assert "integer decode" in r.stdout  # sm86 has no native e4m3 conversion
    assert "+pdl" not in r.stdout
    # more than 16 heads: the dims split (three stages, pipelined) and the split-length floor
    assert "16bit: mma2 bh32 bn16 w4 s3 x1 +dsplit split>=128" in r.stdout
    r = run_cli("info", "--arch", "sm90")  # the entry whose combine is a programmatic dependent launch says so
    assert r.returncode == 0 and "fp8_ds_mla: wgmma_t bh16 bn64 w4 s2 x1 +overlap +pdl waves<=1; prefill wgmma_ws " \
        "bh16 bn64 w12 s2 x1" in r.stdout, r.stdout
    r = run_cli("info", "--arch", "sm42")
    assert r.returncode == 2 and "unknown architecture 'sm42'" in r.stdout


@pytest.mark.parametrize("capability, accepted", [("8.9", True), ("7.5", False), ("11.0", True), ("13.0", False)])
def test_select_without_vllm(capability, accepted):
    r = run_cli("select", "-c", capability, "-m", "glm5", "--tp", "8", "--no-vllm", "--json")
    assert r.returncode == (0 if accepted else 1), r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["capability"] == capability and report["heads_per_gpu"] == 8
    ours = [c for c in report["candidates"] if c["name"] == "TRITON_MLA_SPARSE"]
    assert len(ours) == 1 and ours[0]["accepted"] is accepted
    assert bool(ours[0]["reasons"]) is not accepted


def test_select_help_is_argparse():
    r = run_cli("select", "--help")
    assert r.returncode == 0 and "--capability" in r.stdout and "--no-vllm" in r.stdout


def test_bench_report_modes_need_no_gpu(tmp_path):
    results = ROOT / "benchmarks" / "results" / "h200-2026-11-30.json"
    r = run_cli("bench", "--targets", str(results))
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert "PASS" in r.stdout and "FAIL" in r.stdout
    png = tmp_path / "plot.png"
    r = run_cli("bench", "--plot", str(results), "--png", str(png))
    assert r.returncode == 0 and png.stat().st_size > 0, r.stdout + r.stderr
    r = run_cli("bench", "--against", str(results))
    assert r.returncode == 2 and "--against needs --compare" in r.stderr

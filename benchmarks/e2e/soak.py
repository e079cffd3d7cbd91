"""The soak: ``vllm serve`` with our backend, many concurrent requests of mixed lengths for minutes against the
local HTTP endpoint, a KV budget small enough that vLLM preempts, then every distinct request again alone.

Pass: no request errors, vLLM reports preemptions, and every soak output equals the same request served alone.
Outputs that differ are classified by where they first differ: a *near tie* when the alone run's two best tokens at
that position were within ``margin`` nats (reordered float sums in differently shaped batches can flip it), a
*mismatch* otherwise (what a wrong slot, a corrupted cache after preemption or a race would produce).

:data:`SOAKS` names the runs: ours under vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``; the run the
pass applies to), the same with vLLM's DeepGEMM indexer, and ours and FLASH_ATTN_MLA_SPARSE without it (yardsticks:
vLLM's default numerics are not batch invariant, so identity is not expected there). Each run records what its
worker reports about itself (``weights.probe_model``).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .compare import margin_at, token_agreement
from .matrix import BENCH_DIR
from .models import write_model
from .prompts import random_prompt

PROMPT_LENGTHS = (17, 300, 1200, 2500, 4000, 6000)
BATCH_INVARIANT = {"VLLM_BATCH_INVARIANT": "1"}
#: name -> (attention backend, extra environment of the server, extra server arguments, KV bytes or None)
SOAKS: dict[str, tuple[str, dict[str, str], tuple[str, ...], int | None]] = {
    "ours-batch-invariant": ("TRITON_MLA_SPARSE", BATCH_INVARIANT, (), None),
    "ours-batch-invariant-deepgemm-indexer": ("TRITON_MLA_SPARSE",
                                              {**BATCH_INVARIANT, "TRITON_MLA_SPARSE_INDEXER": "off"}, (), None),
    "ours": ("TRITON_MLA_SPARSE", {}, (), None),
    "fa3-page1": ("FLASH_ATTN_MLA_SPARSE", {}, (), None),
    # diagnostics (where the batch-invariant run's differences come from): no CUDA graphs; no preemption
    "ours-batch-invariant-eager": ("TRITON_MLA_SPARSE", BATCH_INVARIANT, ("--enforce-eager",), None),
    "ours-batch-invariant-roomy": ("TRITON_MLA_SPARSE", BATCH_INVARIANT, (), 4 << 30),
    "ours-batch-invariant-eager-roomy": ("TRITON_MLA_SPARSE", BATCH_INVARIANT, ("--enforce-eager",), 4 << 30),
    # vLLM runs the shared experts on a second CUDA stream for batches of <= 256 tokens
    "ours-batch-invariant-eager-one-stream": ("TRITON_MLA_SPARSE",
                                              {**BATCH_INVARIANT, "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"},
                                              ("--enforce-eager",), None),
    "ours-batch-invariant-one-stream": ("TRITON_MLA_SPARSE",
                                        {**BATCH_INVARIANT, "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"}, (), None),
}
MAX_TOKENS = (32, 64, 128)


def request_pool(n: int, *, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` distinct request definitions of mixed prompt lengths and output lengths."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(seed)
    return [{"id": i, "prompt_len": PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)], "max_tokens": rng.choice(MAX_TOKENS),
             "seed": seed * 100003 + i} for i in range(n)]


def judge(soak: list[dict[str, Any]], alone: dict[int, dict[str, Any]], *, margin: float) -> dict[str, Any]:
    """Compare every soak completion with the same request served alone (see the module docstring)."""
    identical = near_tie = mismatch = 0
    worst = []
    for s in soak:
        a = alone[s["id"]]
        agree = token_agreement(s["tokens"], a["tokens"])
        if agree["identical"]:
            identical += 1
            continue
        m = margin_at(a["top_logprobs"], agree["prefix"])
        if m is not None and m <= margin:
            near_tie += 1
        else:
            mismatch += 1
            worst.append({"id": s["id"], "prefix": agree["prefix"], "generated": agree["generated"], "margin": m})
    margins = sorted((w["margin"] for w in worst if w["margin"] is not None), reverse=True)
    worst.sort(key=lambda w: -1.0 if w["margin"] is None else w["margin"], reverse=True)
    return {"compared": len(soak), "identical": identical, "near_tie": near_tie, "mismatch": mismatch,
            "mismatches": worst[:20], "margin": margin, "mismatch_margin_max": margins[0] if margins else None,
            "mismatch_margin_median": margins[len(margins) // 2] if margins else None,
            "mismatch_without_margin": sum(w["margin"] is None for w in worst)}


class Server:
    """``vllm serve`` in its own process group; :meth:`stop` ends it."""

    def __init__(self, model_dir: Path, *, port: int, args: list[str], env: dict[str, str], log: Path) -> None:
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir), "--port", str(port),
               "--served-model-name", "tiny", *args]
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, cwd=BENCH_DIR, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, timeout_s: float) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode} during start-up")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.time() - t0
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        raise TimeoutError(f"vllm serve not ready after {timeout_s} s")

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$",
                                                            text, re.M))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        self.log.close()


def complete(server: Server, req: dict[str, Any]) -> dict[str, Any]:
    """One greedy completion of a pool request: its token ids and top-2 logprobs per position."""
    body = {"model": "tiny", "prompt": random_prompt(req["prompt_len"], seed=req["seed"]),
            "max_tokens": req["max_tokens"], "temperature": 0.0, "ignore_eos": True, "logprobs": 2,
            "return_token_ids": True, "return_tokens_as_token_ids": True}
    out = server.post("/v1/completions", body)
    choice = out["choices"][0]
    return {"id": req["id"], "tokens": list(choice["token_ids"]),
            "top_logprobs": (choice.get("logprobs") or {}).get("top_logprobs") or []}


def run_soak(out_dir: Path, *, name: str = "ours-batch-invariant", duration_s: float = 300, concurrency: int = 64,
             pool_size: int = 96, kv_bytes: int = 100 << 20, port: int = 8377, margin: float = 0.05,
             kv_cache_dtype: str = "bfloat16", variant: str = "dsv32-h16") -> dict[str, Any]:
    if name not in SOAKS:
        raise ValueError(f"name: one of {tuple(SOAKS)}, got {name!r}")
    backend, extra_env, extra_args, kv_override = SOAKS[name]
    kv_bytes = kv_override or kv_bytes
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = write_model(variant, out_dir / "models", max_position_embeddings=40960)
    env = {**os.environ, "PYTHONPATH": f"{BENCH_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "VLLM_SERVER_DEV_MODE": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1", **extra_env}
    args = ["--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16", "--attention-backend", backend,
            "--kv-cache-dtype", kv_cache_dtype, "--block-size", "64", "--max-model-len", "8192",
            "--max-num-seqs", str(concurrency), "--kv-cache-memory-bytes", str(kv_bytes),
            "--gpu-memory-utilization", "0.05", "--no-enable-prefix-caching",
            "--cudagraph-capture-sizes", "1", "2", "4", "8", "16", "32", "64",
            "--worker-extension-cls", "e2e.weights.ReinitExtension", *extra_args]
    server = Server(model_dir, port=port, args=args, env=env, log=out_dir / "soak-server.log")
    result: dict[str, Any] = {"name": name, "backend": backend, "env": extra_env, "args": list(extra_args),
                              "kv_cache_dtype": kv_cache_dtype,
                              "variant": variant, "concurrency": concurrency, "pool": pool_size,
                              "kv_cache_memory_bytes": kv_bytes}
    try:
        result["start_s"] = server.wait_ready(600)
        result["weights"] = server.post("/collective_rpc", {"method": "e2e_reinit", "args": ["0", "0.02"]})
        result["worker"] = server.post("/collective_rpc", {"method": "e2e_probe"})
        pool = request_pool(pool_size)
        done: list[dict[str, Any]] = []
        errors: list[str] = []
        lock = threading.Lock()
        t0 = time.time()
        counter = iter(range(10**9))

        def loop() -> None:
            while time.time() - t0 < duration_s:
                req = pool[next(counter) % len(pool)]
                try:
                    r = complete(server, req)
                    with lock:
                        done.append(r)
                except Exception as e:  # counted: the soak passes only with none
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}"[:300])

        with ThreadPoolExecutor(concurrency) as ex:
            for _ in range(concurrency):
                ex.submit(loop)
        result["duration_s"] = time.time() - t0
        result["requests"] = len(done) + len(errors)
        result["errors"] = len(errors)
        result["error_samples"] = errors[:5]
        result["output_tokens"] = sum(len(r["tokens"]) for r in done)
        result["preemptions"] = int(server.metric("vllm:num_preemptions_total"))
        t1 = time.time()
        alone = {req["id"]: complete(server, req) for req in pool}
        result["alone_s"] = time.time() - t1
        result.update(judge(done, alone, margin=margin))
        result["ok"] = (result["errors"] == 0 and result["identical"] == result["compared"] > 0
                        and result["preemptions"] > 0)
    except Exception as e:
        result["ok"] = False
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        server.stop()
    return result

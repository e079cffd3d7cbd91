"""Results files: where they go (:func:`results_path`, :func:`gpu_slug`), what identifies a run (commit,
versions) and the JSON itself (:func:`write_json`, :func:`load_results`)."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import subprocess
from collections.abc import Mapping

import torch

DEFAULT_OUT_DIR = os.path.join("benchmarks", "results")

_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "instinct", "radeon", "intel", "r", "tm", "data",
                 "center", "gpu", "graphics", "accelerator"}
_NOISE_TOKEN = re.compile(r"^(\d+gb|\d+g|sxm\d*|pcie|hbm\d*e?|nvl|nvlink|oam|mig|\d+c)$")


def gpu_slug(device_name: str | None) -> str:
    """Short lowercase name of a device for file names: "NVIDIA H200" -> "h200", "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA GeForce RTX 4090" -> "rtx4090", "AMD Instinct MI300X" -> "mi300x",
    "CPU (...)" -> "cpu". Vendor words and memory / form-factor tokens are dropped; the name runs up to the first
    token with a digit."""
    if not device_name or not device_name.strip():
        return "unknown"
    low = device_name.strip().lower()
    if low.startswith("cpu"):
        return "cpu"
    toks = [t for t in re.split(r"[^a-z0-9]+", low) if t and t not in _VENDOR_WORDS]
    picked = []
    for t in toks:
        if _NOISE_TOKEN.match(t):
            continue
        picked.append(t)
        if any(ch.isdigit() for ch in t):
            break
    slug = "".join(picked)[:24]
    return slug or (re.sub(r"[^a-z0-9]+", "-", low).strip("-")[:24] or "unknown")


def utc_date() -> str:
    """Today's date in UTC, ``YYYY-MM-DD``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def results_path(device_name: str, date: str | None = None, out_dir: str | None = None) -> str:
    """``<out_dir>/<gpu slug>-<YYYY-MM-DD>.json`` (UTC date by default)."""
    name = f"{gpu_slug(device_name)}-{date or utc_date()}.json"
    return os.path.join(out_dir or DEFAULT_OUT_DIR, name)


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
        return r.stdout.strip() if r.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def resolve_commit(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None, bool | None]:
    """``(commit, source, dirty)``: ``$TMS_COMMIT`` when set (a copy without .git, e.g. the GPU machine), else
    ``git rev-parse HEAD`` of the package's checkout (``dirty``: tracked files modified), else ``(None, None,
    None)``."""
    env = os.environ if env is None else env
    c = (env.get("TMS_COMMIT") or "").strip()
    if c:
        return c, "TMS_COMMIT", None
    sha = _git("rev-parse", "HEAD")
    if not sha:
        return None, None, None
    st = _git("status", "--porcelain", "--untracked-files=no")
    return sha, "git", (bool(st) if st is not None else None)


def git_commit() -> str | None:
    """The commit of the package's checkout with ``-dirty`` appended when tracked files are modified (or None)."""
    sha, _, dirty = resolve_commit({})
    return None if sha is None else sha + ("-dirty" if dirty else "")


def versions() -> dict:
    """Python, torch and triton versions (triton's as "unavailable (...)" when it does not import)."""
    v = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        v["triton"] = f"unavailable ({type(e).__name__})"
    return v


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return str(x)


def _clean(x):
    """JSON-safe copy: non-finite floats become None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(doc: dict, path: str) -> None:
    """Write ``doc`` to ``path`` atomically (a half-written file never replaces a good one)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(doc), f, indent=1, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)


def load_results(path: str) -> dict:
    """A results JSON written by :func:`~triton_mla_sparse.bench.runner.run_bench` (ValueError when it is not one)."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise ValueError(f"{path}: not a triton-mla-sparse bench results file (no 'cases' list)")
    return doc

"""``triton-mla-sparse select``: which sparse MLA attention backend vLLM will use, and why the others were rejected.

Given a CUDA compute capability (or the current GPU), a model shape (``--model glm5|dsv32`` or explicit dims), the
tensor-parallel size, the kv-cache dtype and the block size, it runs vLLM's own automatic selection for a sparse
MLA layer: vLLM's CUDA priority list (with this package's plugin registered, so ``TRITON_MLA_SPARSE`` sits where
``TRITON_MLA_SPARSE_PRIORITY`` puts it) and every candidate's ``validate_configuration`` under a real vLLM
configuration of that model. It prints the backend vLLM picks (the first accepted one in the list) and, for every
sparse candidate in vLLM's order, "accepted" or vLLM's reasons for rejecting it; ``--json`` prints the same as one
JSON object.

A capability other than the local GPU's is evaluated on this host with vLLM's device probes answering for that
capability (vLLM's CUDA platform class with the capability substituted); checks that depend on installed packages
(FlashInfer, FlashAttention builds, DeepGEMM) answer for this host's packages. Without vLLM (or when vLLM's CUDA
platform module cannot be imported here) only this package's own declarations are checked and the other backends
are not evaluated; the output says so.

``--capability`` also takes ROCm gfx names (``gfx942``, ``gfx1201``; ``rocm``: every declared gfx target). Such a
target is evaluated with vLLM's ROCm platform: its sparse-MLA priority list (with ``TRITON_MLA_SPARSE`` placed by
the plugin), its ``get_valid_backends`` and the DSA indexer route (vLLM's ``forward_hip`` or ours, see
:mod:`~triton_mla_sparse.integrations.vllm.indexer`). What is simulated, unless this host is a ROCm GPU of that
name: ``vllm.platforms.rocm`` is imported with an ``amdsmi`` stand-in that reports the gfx name (vLLM reads it at
import), its ``_GCN_ARCH`` and the ``_ON_*`` flags it derives from it are set for the target (re-derived with vLLM's
own definitions), and vLLM's ROCm platform class answers device probes for it; aiter, like every package, answers
for this host's installation (absent here: vLLM's aiter-only paths count as disabled). The simulated platforms:
:mod:`.simulated_platform`.

The CLI wiring: :func:`add_arguments` on the ``select`` subparser, then :func:`run` with the parsed namespace
(:func:`select_main` does both for an argv). This module imports vLLM inside functions only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any

from . import policy
from .simulated_platform import cuda_platform_for, quiet_vllm_logs, rocm_platform_for

# (parse_target and hip_targets are not listed: the old path, triton_mla_sparse.select, re-exports this list.)
__all__ = ["MODELS", "ModelShape", "add_arguments", "run", "select_main", "evaluate", "parse_capability",
           "format_report", "format_table"]


@dataclass(frozen=True)
class ModelShape:
    """The dims of a DSA model that vLLM's MLA layer and the backend's validation read."""

    label: str
    model_type: str  # transformers model_type (the config class vLLM reads the model's shape from)
    architecture: str
    num_heads: int
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    index_topk: int = 2048

    @property
    def head_size(self) -> int:  # what vLLM's MLA layer asks the backend for: latent + RoPE
        return self.kv_lora_rank + self.qk_rope_head_dim


MODELS = {
    "glm5": ModelShape("GLM-5", "glm_moe_dsa", "GlmMoeDsaForCausalLM", num_heads=64, qk_nope_head_dim=192,
                       v_head_dim=256),
    "dsv32": ModelShape("DeepSeek-V3.2", "deepseek_v32", "DeepseekV32ForCausalLM", num_heads=128),
}
DTYPES = ("bfloat16", "float16")


def parse_capability(text: str) -> tuple[int, int]:
    """``"8.9"``, ``"89"``, ``"sm89"``, ``"sm_120"``, ``"12.0"`` -> (major, minor)."""
    t = text.strip().lower().removeprefix("sm").removeprefix("_").removeprefix("compute_")
    try:
        if "." in t:
            major, minor = (int(x) for x in t.split(".", 1))
        else:
            v = int(t)
            major, minor = divmod(v, 10)
    except ValueError:
        raise ValueError(f"--capability: expected e.g. 8.9, 89 or sm89, got {text!r}") from None
    if major < 1 or not 0 <= minor <= 9:
        raise ValueError(f"--capability: expected e.g. 8.9, 89 or sm89, got {text!r}")
    return major, minor


def hip_targets() -> list[str]:
    """The declared ROCm gfx targets (:data:`triton_mla_sparse.capabilities.ARCHS`), in their order."""
    from ...capabilities import ARCHS

    return [a.name for a in ARCHS.values() if a.backend == "hip"]


def parse_target(text: str) -> tuple[int, int] | str:
    """A CUDA compute capability as :func:`parse_capability` reads it, or a ROCm gfx name (``"gfx942"``,
    ``"gfx1201:xnack-"`` -> ``"gfx1201"``), returned as given without its feature suffix."""
    t = text.strip().lower()
    if t.startswith("gfx"):
        gfx = t.split(":")[0]
        if len(gfx) < 5 or not gfx[3:].isalnum():
            raise ValueError(f"--capability: expected a gfx name such as gfx942 or gfx1201, got {text!r}")
        return gfx
    return parse_capability(text)


def _hip_capability(gfx: str) -> tuple[int, int]:
    """The (major, minor) HIP reports for a gfx name (gfx942 -> 9.4, gfx1201 -> 12.0), for reports without vLLM."""
    digits = gfx[3:]
    digits = digits[:-1] if not digits[-1].isdigit() else digits  # gfx90a
    return (int(digits[0]), int(digits[1])) if len(digits) <= 3 else (int(digits[:2]), int(digits[2]))


def _vllm_version() -> str | None:
    # Metadata, not find_spec: a folder named vllm on sys.path is no vLLM.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


def _local_capability() -> tuple[int, int] | None:
    try:
        import torch

        if torch.cuda.is_available():
            return tuple(torch.cuda.get_device_capability())
    except Exception:
        pass
    return None


def _model_config(shape: ModelShape, dtype: str, tmp: str) -> Any:
    """A real vLLM ModelConfig for ``shape``, from a config.json written with transformers' config class."""
    from transformers import CONFIG_MAPPING
    from vllm.config import ModelConfig

    cfg = CONFIG_MAPPING[shape.model_type]().to_dict()
    cfg.update(
        architectures=[shape.architecture],
        num_attention_heads=shape.num_heads,
        kv_lora_rank=shape.kv_lora_rank,
        qk_nope_head_dim=shape.qk_nope_head_dim,
        qk_rope_head_dim=shape.qk_rope_head_dim,
        v_head_dim=shape.v_head_dim,
        index_topk=shape.index_topk,
        torch_dtype=dtype,
    )
    path = os.path.join(tmp, shape.model_type)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return ModelConfig(model=path, skip_tokenizer_init=True, dtype=dtype)


def _evaluate_vllm(report: dict, shape: ModelShape, major: int, minor: int, simulate: bool, tp: int, dtype: str,
                   kv_cache_dtype: str, block_size: int | None, dcp: int = 1) -> None:
    import torch

    try:
        import vllm.platforms.cuda as cuda_mod
    except (ImportError, OSError) as e:
        raise _NoVllm(f"vLLM's CUDA platform module did not import here ({type(e).__name__}: {e}); on a machine "
                      f"without the NVIDIA driver, ci/vllm-env.sh provides a libcuda.so.1 stand-in") from e
    from vllm.config import set_current_vllm_config
    from vllm.config.cache import is_known_kv_cache_dtype
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from . import plugin

    if not is_known_kv_cache_dtype(kv_cache_dtype):
        raise ValueError(f"--kv-cache-dtype: {kv_cache_dtype!r} is not a vLLM kv-cache dtype")
    plugin.register()
    hooked = plugin.install_priority_hook(cuda_mod)
    if not hooked:
        report["notes"].append(f"{policy.BACKEND_NAME} is not in vLLM's priority list "
                               f"({policy.PRIORITY_ENV}={policy.priority_mode()} or an unexpected vLLM signature): "
                               f"only --attention-backend {policy.BACKEND_NAME} selects it")
    cap = DeviceCapability(major, minor)
    heads = shape.num_heads // tp
    with cuda_platform_for(cuda_mod, major, minor, simulate) as platform, tempfile.TemporaryDirectory() as tmp:
        vllm_config = _vllm_config(shape, dtype, tp, kv_cache_dtype, block_size, tmp, dcp)
        with set_current_vllm_config(vllm_config):
            selector = AttentionSelectorConfig(
                head_size=shape.head_size,
                dtype=getattr(torch, dtype),
                kv_cache_dtype=kv_cache_dtype,
                block_size=block_size,
                use_mla=True,
                use_sparse=True,
            )
            order = cuda_mod._get_backend_priorities(
                use_mla=True,
                device_capability=cap,
                num_heads=heads,
                kv_cache_dtype=kv_cache_dtype,
                use_non_causal=selector.use_non_causal,
                head_size=selector.head_size,
                use_mm_prefix=selector.use_mm_prefix,
            )
            valid, invalid = platform.get_valid_backends(
                device_capability=cap, attn_selector_config=selector, num_heads=heads)
            _fill_selection(report, order, valid, invalid, kv_cache_dtype)
        report["device"] = platform.get_device_name() if not simulate else report["device"]


def _fill_selection(report: dict, order: list, valid: list, invalid: dict, kv_cache_dtype: str) -> None:
    """The report's candidates (vLLM's list ``order`` with each backend's verdict from vLLM's ``get_valid_backends``),
    the backend vLLM selects (the first valid one) and the kv-cache dtype it then stores."""
    # vLLM's CUDA platform gives (backend, priority) records and {backend: (priority, reasons)}; its ROCm platform
    # (backend, priority) pairs and {backend: reasons}.
    valid = [(c.backend, c.priority) if hasattr(c, "backend") else tuple(c) for c in valid]
    invalid = {b: r[1] if isinstance(r, tuple) else r for b, r in invalid.items()}
    accepted = {backend for backend, _ in valid}
    candidates = []
    for prio, backend in enumerate(order):
        try:
            sparse = bool(backend.get_class().is_sparse())
        except Exception:
            sparse = None
        entry = {"name": backend.name, "position": prio + 1, "sparse": sparse,
                 "accepted": backend in accepted, "reasons": list(invalid.get(backend, []))}
        candidates.append(entry)
    selected = min(valid, key=lambda c: c[1])[0] if valid else None
    report["candidates"] = candidates
    report["selected"] = selected.name if selected is not None else None
    report["kv_cache_dtype_used"] = kv_cache_dtype
    if selected is not None:
        with contextlib.suppress(Exception):
            from vllm.model_executor.layers.attention.mla_attention import _canonicalize_sparse_mla_kv_cache_dtype

            report["kv_cache_dtype_used"] = _canonicalize_sparse_mla_kv_cache_dtype(selected.get_class(),
                                                                                    kv_cache_dtype)


def _vllm_config(shape: ModelShape, dtype: str, tp: int, kv_cache_dtype: str, block_size: int | None,
                 tmp: str, dcp: int = 1) -> Any:
    from vllm.config import CacheConfig, VllmConfig

    cache_kwargs = {"cache_dtype": kv_cache_dtype}
    if block_size is not None:
        cache_kwargs["block_size"] = block_size
    vllm_config = VllmConfig(model_config=_model_config(shape, dtype, tmp), cache_config=CacheConfig(**cache_kwargs))
    # Set after construction: ParallelConfig checks TP against this host's GPU count, which is not the target.
    vllm_config.parallel_config.tensor_parallel_size = tp
    vllm_config.parallel_config.decode_context_parallel_size = dcp
    return vllm_config


def _evaluate_vllm_rocm(report: dict, shape: ModelShape, gfx: str, simulate: bool, tp: int, dtype: str,
                        kv_cache_dtype: str, block_size: int | None) -> None:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.config.cache import is_known_kv_cache_dtype
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from . import plugin

    if not is_known_kv_cache_dtype(kv_cache_dtype):
        raise ValueError(f"--kv-cache-dtype: {kv_cache_dtype!r} is not a vLLM kv-cache dtype")
    plugin.register()
    heads = shape.num_heads // tp
    with rocm_platform_for(gfx, simulate) as (platform, rocm), tempfile.TemporaryDirectory() as tmp:
        if not plugin.install_priority_hook(rocm, "rocm"):
            report["notes"].append(f"{policy.BACKEND_NAME} is not in vLLM's priority list "
                                   f"({policy.PRIORITY_ENV}={policy.priority_mode()} or an unexpected vLLM "
                                   f"signature): only --attention-backend {policy.BACKEND_NAME} selects it")
        cap = platform.get_device_capability()
        report["capability"] = f"{cap.major}.{cap.minor}"
        vllm_config = _vllm_config(shape, dtype, tp, kv_cache_dtype, block_size, tmp)
        with set_current_vllm_config(vllm_config):
            selector = AttentionSelectorConfig(head_size=shape.head_size, dtype=getattr(torch, dtype),
                                               kv_cache_dtype=kv_cache_dtype, block_size=block_size, use_mla=True,
                                               use_sparse=True)
            order = rocm._get_backend_priorities(selector.use_mla, selector.use_sparse, selector.use_kv_connector)
            valid, invalid = platform.get_valid_backends(device_capability=cap, attn_selector_config=selector,
                                                         num_heads=heads)
            _fill_selection(report, order, valid, invalid, kv_cache_dtype)
            from . import indexer

            triton, why = indexer.use_triton_indexer()
            report["indexer"] = {"triton": triton, "why": why, "vllm_route": indexer.vllm_hip_route()}
        if not simulate:
            report["device"] = platform.get_device_name()
    report["notes"].append("vLLM 0.33's DeepSeek-V3.2 / GLM-5 model for ROCm (vllm.models.deepseek_v32.amd) passes "
                           "ROCM_AITER_MLA_SPARSE to its attention layers itself: this list decides for layers that "
                           "ask vLLM's selector")


class _NoVllm(Exception):
    pass


def _local_hip_arch() -> str | None:
    try:
        import torch

        if getattr(torch.version, "hip", None) and torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    except Exception:
        pass
    return None


def evaluate(*, capability: tuple[int, int] | None, shape: ModelShape, tp: int = 1, dtype: str = "bfloat16",
             kv_cache_dtype: str = "auto", block_size: int | None = None, use_vllm: bool = True,
             hip_arch: str | None = None, dcp: int = 1) -> dict:
    """The selection report for one configuration (see the module docstring); ``capability=None``: this GPU.
    ``hip_arch``: a ROCm gfx name to evaluate instead (``capability`` is then ignored); the report then also has
    ``hip_arch`` and ``indexer`` (the DSA indexer route: ``triton``, ``why``, ``vllm_route``). ``dcp``: vLLM's
    decode-context-parallel size (CUDA; its MLA layers gather q over the group, so the kernels see ``dcp`` × the
    per-GPU heads)."""
    if type(dcp) is not int or dcp < 1 or tp % dcp:
        raise ValueError(f"--dcp: expected a positive divisor of --tp {tp}, got {dcp!r}")
    if capability is None and hip_arch is None:
        hip_arch = _local_hip_arch()
    if hip_arch is not None:
        return _evaluate_rocm(hip_arch=hip_arch, shape=shape, tp=tp, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
                              block_size=block_size, use_vllm=use_vllm)
    local = _local_capability()
    if capability is None:
        if local is None:
            raise ValueError("--capability: no CUDA GPU here; give the compute capability to evaluate (e.g. 8.9)")
        capability = local
    major, minor = capability
    simulate = local != (major, minor)
    if shape.num_heads % tp:
        raise ValueError(f"--tp: {shape.num_heads} heads do not split over {tp} GPUs")
    report = _new_report(f"{major}.{minor}", (f"simulated SM {major}.{minor} (this host has no such GPU: vLLM's "
                                              f"device probes answer for SM {major}.{minor}, package checks for this "
                                              f"host's installation)") if simulate else "this GPU",
                         shape, tp, dtype, kv_cache_dtype, block_size)
    report["dcp"] = dcp
    if _try_vllm(report, use_vllm, lambda: _evaluate_vllm(report, shape, major, minor, simulate, tp, dtype,
                                                          kv_cache_dtype, block_size, dcp)):
        return report
    # This package's declarations only.
    report["validation"] = "declarations"
    if simulate:
        report["device"] = "as given (no GPU probed)"
    reasons = policy.static_reasons(capability=(major, minor), head_size=shape.head_size, dtype=dtype,
                                    kv_cache_dtype=kv_cache_dtype, kv_lora_rank=shape.kv_lora_rank,
                                    qk_rope_head_dim=shape.qk_rope_head_dim, index_topk=shape.index_topk,
                                    heads=shape.num_heads // tp)
    idx = policy.policy_index([], (major, minor), report["priority_mode"], num_heads=shape.num_heads // tp * dcp,
                              kv_cache_dtype=kv_cache_dtype)
    report["candidates"] = [{"name": policy.BACKEND_NAME, "position": None, "sparse": True,
                             "accepted": not reasons, "reasons": reasons}]
    if idx is None:
        report["notes"].append(f"{policy.BACKEND_NAME} is not in vLLM's automatic list here "
                               f"(mode {report['priority_mode']}, SM {major}.{minor})")
    report["notes"].append(policy.policy_sentence((major, minor), report["priority_mode"]))
    report["selected"] = None
    return report


def _new_report(capability: str, device: str, shape: ModelShape, tp: int, dtype: str, kv_cache_dtype: str,
                block_size: int | None) -> dict:
    return {
        "capability": capability,
        "device": device,
        "model": {"label": shape.label, **{k: v for k, v in asdict(shape).items() if k != "label"}},
        "tp": tp,
        "heads_per_gpu": shape.num_heads // tp,
        "head_size": shape.head_size,
        "dtype": dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "block_size": block_size,
        "priority_mode": policy.priority_mode(),
        "vllm_version": _vllm_version(),
        "validation": None,
        "selected": None,
        "kv_cache_dtype_used": None,
        "candidates": [],
        "notes": [],
    }


def _try_vllm(report: dict, use_vllm: bool, run_vllm) -> bool:
    """Run vLLM's evaluation into ``report``; False (with a note) when it cannot run here."""
    if use_vllm and report["vllm_version"] is not None:
        try:
            with quiet_vllm_logs(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                run_vllm()
            report["validation"] = "vllm"
            return True
        except _NoVllm as e:
            report["notes"].append(str(e))
        except ValueError:
            raise
        except Exception as e:  # a vLLM this code does not know: say so, fall back to the declarations
            report["notes"].append(f"vLLM's evaluation failed here ({type(e).__name__}: {e})")
    elif report["vllm_version"] is None:
        report["notes"].append("vLLM is not installed: only TRITON_MLA_SPARSE's own declarations were checked")
    return False


def _evaluate_rocm(*, hip_arch: str, shape: ModelShape, tp: int, dtype: str, kv_cache_dtype: str,
                   block_size: int | None, use_vllm: bool) -> dict:
    gfx = hip_arch.split(":")[0].lower()
    if shape.num_heads % tp:
        raise ValueError(f"--tp: {shape.num_heads} heads do not split over {tp} GPUs")
    simulate = _local_hip_arch() != gfx
    major, minor = _hip_capability(gfx)
    report = _new_report(f"{major}.{minor}", (f"simulated {gfx} (this host has no such GPU: vLLM's ROCm platform "
                                              f"answers for {gfx}, package checks (aiter included) for this host's "
                                              "installation)") if simulate else "this GPU",
                         shape, tp, dtype, kv_cache_dtype, block_size)
    report["hip_arch"] = gfx
    report["indexer"] = None
    if _try_vllm(report, use_vllm, lambda: _evaluate_vllm_rocm(report, shape, gfx, simulate, tp, dtype,
                                                               kv_cache_dtype, block_size)):
        return report
    report["validation"] = "declarations"
    if simulate:
        report["device"] = "as given (no GPU probed)"
    reasons = policy.static_reasons(capability=(major, minor), hip_arch=gfx, head_size=shape.head_size, dtype=dtype,
                                    kv_cache_dtype=kv_cache_dtype, kv_lora_rank=shape.kv_lora_rank,
                                    qk_rope_head_dim=shape.qk_rope_head_dim, index_topk=shape.index_topk,
                                    heads=shape.num_heads // tp)
    idx = policy.policy_index([], None, report["priority_mode"], hip_arch=gfx)
    report["candidates"] = [{"name": policy.BACKEND_NAME, "position": None, "sparse": True,
                             "accepted": not reasons, "reasons": reasons}]
    if idx is None:
        report["notes"].append(f"{policy.BACKEND_NAME} is not in vLLM's automatic list here "
                               f"(mode {report['priority_mode']}, {gfx})")
    report["notes"].append(policy.policy_sentence(None, report["priority_mode"], hip_arch=gfx))
    return report


def format_report(report: dict, show_all: bool = False) -> str:
    """The text form of one :func:`evaluate` report."""
    m = report["model"]
    lines = []
    how = "vLLM's own backend validation" if report["validation"] == "vllm" else "TRITON_MLA_SPARSE's declarations only"
    lines.append(f"sparse MLA backend selection — vLLM {report['vllm_version'] or '(not installed)'}, {how}")
    if report.get("hip_arch"):
        lines.append(f"  GPU:    {report['hip_arch']} (ROCm; vLLM's capability {report['capability']}), "
                     f"{report['device']}")
    else:
        lines.append(f"  GPU:    SM {report['capability']}, {report['device']}")
    lines.append(f"  model:  {m['label']}: {m['num_heads']} heads / TP {report['tp']} = {report['heads_per_gpu']} per "
                 f"GPU; kv_lora_rank {m['kv_lora_rank']}, qk_nope {m['qk_nope_head_dim']}, qk_rope "
                 f"{m['qk_rope_head_dim']}, v_head {m['v_head_dim']}, index_topk {m['index_topk']} "
                 f"(head_size {report['head_size']})")
    bs = report["block_size"] if report["block_size"] is not None else "auto"
    lines.append(f"  config: dtype {report['dtype']}, kv-cache-dtype {report['kv_cache_dtype']}, block size {bs}, "
                 f"TRITON_MLA_SPARSE_PRIORITY={report['priority_mode']}")
    if report["validation"] == "vllm":
        sel = report["selected"]
        if sel is None:
            lines.append("  => vLLM finds no valid sparse MLA backend (\"No valid attention backend found\")")
        else:
            kv = report["kv_cache_dtype_used"]
            extra = f" (kv cache stored as {kv})" if kv != report["kv_cache_dtype"] else ""
            lines.append(f"  => vLLM uses {sel}{extra}")
        lines.append("  candidates in vLLM's priority order:")
        dense, unknown = [], []
        for c in report["candidates"]:
            if not show_all and c["sparse"] is False:
                dense.append(c["name"])
                continue
            if not show_all and c["sparse"] is None:
                unknown.append(f"{c['name']} ({'; '.join(c['reasons'])})")
                continue
            status = "accepted" if c["accepted"] else "rejected: " + "; ".join(dict.fromkeys(c["reasons"]))
            mark = "  <- selected" if c["name"] == sel else ""
            lines.append(f"    {c['position']:>2}. {c['name']:<28} {status}{mark}")
        if dense:
            lines.append(f"    (also in the list, rejected as dense MLA backends (sparse not supported): "
                         f"{', '.join(dense)}; --all shows them in place)")
        if unknown:
            lines.append(f"    (also in the list, not evaluated on this host: {', '.join(unknown)})")
    else:
        for c in report["candidates"]:
            status = "accepted" if c["accepted"] else "rejected: " + "; ".join(c["reasons"])
            lines.append(f"  {c['name']}: {status}")
    if report.get("indexer"):
        lines.append(f"  DSA indexer: {_indexer_route(report['indexer'])}")
    for note in report["notes"]:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _indexer_route(indexer: dict, short: bool = False) -> str:
    """"Triton (why)" or "vLLM's: its route (why)" for a report's ``indexer`` entry."""
    vllm = indexer["vllm_route"] or "none (its forward_hip raises here)"
    if short:
        return "Triton" if indexer["triton"] else "vLLM's"
    if indexer["triton"]:
        return f"Triton (triton-mla-sparse): {indexer['why']}; vLLM's own here: {vllm}"
    return f"vLLM's, {vllm}: {indexer['why']}"


DESCRIPTION = ("Which sparse MLA attention backend vLLM will use for a model on a GPU, and why the others are "
               "rejected (vLLM's own validation when vLLM is installed).")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``select`` options to ``p`` (the ``select`` subparser of ``triton-mla-sparse``); returns ``p``."""
    p.add_argument("--capability", "-c", help="CUDA compute capability, e.g. 8.9, 89 or sm89, a ROCm gfx name, e.g. "
                   "gfx942 or gfx1201 ('rocm': every declared gfx target), or a comma-separated list (default: this "
                   "GPU)")
    p.add_argument("--model", "-m", choices=sorted(MODELS), help="model shape: glm5 (GLM-5/5.1) or dsv32 "
                   "(DeepSeek-V3.2); the dims below override it")
    p.add_argument("--heads", type=int, help="attention heads of the whole model (before TP)")
    p.add_argument("--kv-lora-rank", type=int)
    p.add_argument("--qk-nope", type=int, help="qk_nope_head_dim")
    p.add_argument("--qk-rope", type=int, help="qk_rope_head_dim (0 for NoPE models)")
    p.add_argument("--v-head", type=int, help="v_head_dim")
    p.add_argument("--index-topk", type=int)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--dcp", type=int, default=1, help="decode-context-parallel size (CUDA; default 1)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="vLLM's --kv-cache-dtype: auto, bfloat16, fp8, fp8_e4m3, fp8_ds_mla, ... or a comma-separated "
                   "list (default auto)")
    p.add_argument("--block-size", type=int, help="vLLM's --block-size (default: not given, vLLM picks)")
    p.add_argument("--no-vllm", action="store_true", help="check only TRITON_MLA_SPARSE's declarations")
    p.add_argument("--all", action="store_true", help="also list the dense MLA backends of vLLM's list")
    p.add_argument("--details", action="store_true", help="with several configurations: also the full reports")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object (a list for several)")
    return p


def _parser() -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(prog="triton-mla-sparse select", description=DESCRIPTION))


def _ok(report: dict) -> bool:
    if report["validation"] == "vllm":
        return report["selected"] is not None
    return bool(report["candidates"]) and report["candidates"][0]["accepted"]


def format_table(reports: list[dict]) -> str:
    """One line per (GPU, kv-cache dtype): the backend vLLM uses and how TRITON_MLA_SPARSE fared (on ROCm targets
    also the DSA indexer route)."""

    r0 = reports[0]
    m = r0["model"]
    how = "vLLM's own backend validation" if r0["validation"] == "vllm" else "TRITON_MLA_SPARSE's declarations only"
    rocm = any(r.get("hip_arch") for r in reports)
    labels = [r.get("hip_arch") or r["capability"] for r in reports]
    width = max([5] + [len(label) + 1 for label in labels]) if rocm else 5
    lines = [f"sparse MLA backend selection — vLLM {r0['vllm_version'] or '(not installed)'}, {how}",
             f"model {m['label']}: {m['num_heads']} heads / TP {r0['tp']} = {r0['heads_per_gpu']} per GPU, head_size "
             f"{r0['head_size']}, index_topk {m['index_topk']}; dtype {r0['dtype']}; TRITON_MLA_SPARSE_PRIORITY="
             f"{r0['priority_mode']}",
             f"{'GPU' if rocm else 'SM':<{width}} {'kv-cache-dtype':<15} {'vLLM uses':<29} {policy.BACKEND_NAME}"]
    for r, label in zip(reports, labels):
        ours = next((c for c in r["candidates"] if c["name"] == policy.BACKEND_NAME), None)
        if ours is None:
            mine = "not in vLLM's list"
        else:
            pos = f"#{ours['position']}/{len(r['candidates'])} " if ours["position"] is not None else ""
            mine = pos + ("accepted" if ours["accepted"] else "rejected: " + "; ".join(dict.fromkeys(ours["reasons"])))
        if r.get("indexer"):
            mine += f"; DSA indexer: {_indexer_route(r['indexer'], short=True)}"
        uses = r["selected"] or ("-" if r["validation"] == "vllm" else "(vLLM not evaluated)")
        if r["selected"] and r["kv_cache_dtype_used"] != r["kv_cache_dtype"]:
            uses += f" ({r['kv_cache_dtype_used']})"
        lines.append(f"{label:<{width}} {r['kv_cache_dtype']:<15} {uses:<29} {mine}")
    simulated = [r for r in reports if r["validation"] == "vllm" and r["device"] != "this GPU"]
    if any(not r.get("hip_arch") for r in simulated):
        lines.append("(capabilities other than this host's GPU are simulated: vLLM's device probes answer for them, "
                     "package checks for this host's installation)")
    if any(r.get("hip_arch") for r in simulated):
        lines.append("(gfx targets other than this host's GPU are simulated: vLLM's ROCm platform answers for the gfx "
                     "name, package checks (aiter included) for this host's installation)")
    return "\n".join(lines)


def select_main(argv: list[str] | None = None) -> int:
    """``triton-mla-sparse select ARGS``: :func:`run` on ``argv`` parsed by :func:`add_arguments` (exits 2 on
    unknown options, as argparse does)."""
    return run(_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The ``select`` command on parsed :func:`add_arguments` options: 0 when vLLM selects a backend for every
    requested configuration (without vLLM: when TRITON_MLA_SPARSE's own checks pass), 1 when some configuration has
    none, 2 on bad arguments (or a bad ``TRITON_MLA_SPARSE_PRIORITY``).

    ``--capability`` (compute capabilities and gfx names) and ``--kv-cache-dtype`` take comma-separated lists;
    several configurations print one table line each (``--details`` adds the full reports; ``--json`` prints a list
    of reports)."""
    try:
        targets: list = []
        for c in args.capability.split(",") if args.capability else []:
            targets += hip_targets() if c.strip().lower() == "rocm" else [parse_target(c)]
        kv_dtypes = [k.strip() for k in args.kv_cache_dtype.split(",") if k.strip()]
        if args.model is None and args.heads is None:
            raise ValueError("--model: give --model glm5|dsv32 or at least --heads (other dims default to "
                             "DeepSeek-V3.2's)")
        shape = MODELS[args.model] if args.model else replace(MODELS["dsv32"], label="custom")
        dims = {"num_heads": args.heads, "kv_lora_rank": args.kv_lora_rank, "qk_nope_head_dim": args.qk_nope,
                "qk_rope_head_dim": args.qk_rope, "v_head_dim": args.v_head, "index_topk": args.index_topk}
        dims = {k: v for k, v in dims.items() if v is not None}
        if dims:
            shape = replace(shape, **dims, label=shape.label + (" (custom dims)" if args.model else ""))
        if args.tp < 1:
            raise ValueError(f"--tp: expected a positive integer, got {args.tp}")
        reports = [evaluate(capability=None if isinstance(t, str) else t, hip_arch=t if isinstance(t, str) else None,
                            shape=shape, tp=args.tp, dtype=args.dtype, kv_cache_dtype=kv, block_size=args.block_size,
                            dcp=args.dcp, use_vllm=not args.no_vllm)
                   for t in targets or [None] for kv in kv_dtypes]
    except ValueError as e:
        print(f"triton-mla-sparse select: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    elif len(reports) == 1:
        print(format_report(reports[0], show_all=args.all))
    else:
        print(format_table(reports))
        if args.details:
            for r in reports:
                print()
                print(format_report(r, show_all=args.all))
    return 0 if all(_ok(r) for r in reports) else 1


if __name__ == "__main__":  # python -m triton_mla_sparse.integrations.vllm.select
    sys.exit(select_main())

"""Seeded, realistic-scale weights for a vLLM model, applied in place through ``LLM.apply_model``.

vLLM's dummy loader draws every weight uniformly from ±1e-3, which makes the logits nearly uniform, so two attention
backends would agree whatever attention returned. :func:`reinit` redraws each parameter in place from a normal
distribution (std 0.02, a generator seeded from the run's seed and the parameter's name, so every engine of a
comparison holds the same weights whatever its attention backend), sets norm gains to 1 and biases to 0, keeps
quantisation scales, and then recomputes what vLLM's MLA layers derive from ``kv_b_proj`` at load time (``W_UK_T``,
``W_UV``) with vLLM's own ``process_weights_after_loading``, which copies in place so captured CUDA graphs stay valid.
DeepSeek-V4 models have no ``kv_b_proj``: their attention sinks are drawn for the layer's real heads only (FlashMLA's
layer pads 8 heads to 64, so that a draw of the whole parameter would differ from ours), their hash-MoE tables
(drawn at construction from the global generator, whose state depends on what the attention layer drew before) are
redrawn from the same seeded generators, the mHC mixing scales are weights (not quantisation scales), and the
model's own load step (the first layer's broadcast mHC weight) runs again. DeepSeek-V4.1 models take the same rules
(their attention classes derive from V4.1's own ``DeepseekV4Attention`` with the same ``attn_sink`` and
``n_local_heads``; they have no hash-MoE tables) and the same load step, found inside vLLM's multimodal wrapper
(``language_model.model``).
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

#: Parameters left as loaded: quantisation scales and the MLA tensors recomputed from kv_b_proj afterwards.
KEEP_MARKERS = ("scale", "W_UK", "W_UV", "W_K", "W_V")


def rule(name: str, param: torch.Tensor) -> str:
    """What :func:`reinit` does with a parameter: ``normal``, ``ones`` (norm gains), ``zeros`` (biases), ``hash``
    (a hash-MoE token-to-expert table), ``sink`` (a per-head attention sink) or ``keep``."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "tid2eid":
        return "hash"
    if leaf == "attn_sink":
        return "sink"
    if leaf.startswith("hc_") and param.is_floating_point():  # mHC mixing weights, scales included
        return "normal"
    if any(m in leaf for m in KEEP_MARKERS) or not param.is_floating_point():
        return "keep"
    if "bias" in leaf:
        return "zeros"
    if "norm" in name and param.dim() == 1:
        return "ones"
    return "normal"


def param_seed(seed: int, name: str) -> int:
    """The generator seed of one parameter: the same name and run seed give the same draw in every process."""
    return (zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF


@torch.no_grad()
def reinit_parameters(model: torch.nn.Module, *, seed: int = 0, std: float = 0.02) -> dict[str, Any]:
    """Redraw ``model``'s parameters in place (see the module docstring); returns counts and a checksum."""
    counts = {"normal": 0, "ones": 0, "zeros": 0, "hash": 0, "sink": 0, "keep": 0}
    checksum = 0.0
    params = dict(model.named_parameters())
    for name, p in sorted(params.items(), key=lambda kv: kv[0]):
        # never materialised (V4.1's vision tower under language_model_only): unused, and nothing to draw into
        what = "keep" if p.device.type == "meta" else rule(name, p)
        counts[what] += 1
        if what == "keep":
            continue
        g = torch.Generator(device=p.device).manual_seed(param_seed(seed, name))
        drawn = p  # the part that counts in the checksum
        if what == "normal":
            p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32).mul_(std).to(p.dtype))
        elif what == "hash":  # experts: the rows of the gate's weight beside it (else the table's own range)
            gate = params.get(name.rsplit(".", 1)[0] + ".weight")
            experts = gate.shape[0] if gate is not None else int(p.max()) + 1
            p.copy_(torch.randint(0, experts, p.shape, generator=g, device=p.device, dtype=p.dtype))
        elif what == "sink":  # the layer's real heads drawn, padding heads -inf (no sink) as vLLM's loader leaves them
            owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            heads = min(int(getattr(owner, "n_local_heads", p.numel())), p.numel())
            p.fill_(float("-inf"))
            p[:heads] = torch.randn(heads, generator=g, device=p.device, dtype=torch.float32).mul_(std).to(p.dtype)
            drawn = p[:heads]
        elif what == "ones":
            p.fill_(1.0)
        else:
            p.zero_()
        checksum += float(drawn.float().abs().sum())
    return {"counts": counts, "checksum": checksum}


@torch.no_grad()
def recompute_mla(model: torch.nn.Module) -> int:
    """Re-run vLLM's load-time step of every MLA layer (``W_UK_T``/``W_UV`` from ``kv_b_proj``); returns how many."""
    n = 0
    for module in model.modules():
        if hasattr(module, "kv_b_proj") and hasattr(module, "W_UK_T") and hasattr(module, "process_weights_after_loading"):
            dtype = module.kv_b_proj.weight.dtype
            module.process_weights_after_loading(dtype)
            n += 1
    return n


def recompute_v4(model: torch.nn.Module) -> bool:
    """Re-run a DeepSeek-V4 or V4.1 model's own load step (its first layer's broadcast mHC weight, copied in place);
    returns whether ``model`` is one. V4's decoder is ``model.model``, V4.1's ``model.language_model.model`` (vLLM
    builds V4.1 as a multimodal wrapper around the text model)."""
    for inner in (getattr(model, "model", None), getattr(getattr(model, "language_model", None), "model", None)):
        if hasattr(inner, "finalize_mhc_broadcast_weights"):
            inner.finalize_mhc_broadcast_weights()
            return True
    return False


def reinit(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> dict[str, Any]:
    """The function given to ``LLM.apply_model``: :func:`reinit_parameters`, then :func:`recompute_mla` (V3.2,
    GLM-5) or :func:`recompute_v4` (DeepSeek-V4, V4.1)."""
    info = reinit_parameters(model, seed=seed, std=std)
    info["mla_layers"] = recompute_mla(model)
    info["v4"] = recompute_v4(model)
    if info["mla_layers"] == 0 and not info["v4"]:
        raise RuntimeError("no MLA layer and no DeepSeek-V4 / V4.1 model found: derived weights would keep the dummy "
                           "ones")
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return info


class ReinitExtension:
    """A vLLM worker extension (``--worker-extension-cls e2e.weights.ReinitExtension``) so that ``vllm serve``
    gets the same weights through its ``/collective_rpc`` endpoint (``VLLM_SERVER_DEV_MODE=1``), which passes
    string arguments only."""

    def e2e_reinit(self, seed: str = "0", std: str = "0.02") -> dict[str, Any]:
        return reinit(self.model_runner.get_model(), int(seed), float(std))

    def e2e_probe(self) -> dict[str, Any]:
        """What this worker runs, read from its own modules: the attention impls, whether each DSA indexer is the
        Triton one, and vLLM's batch-invariant flag as this process sees it."""
        return probe_model(self.model_runner.get_model())


def process_state() -> dict[str, Any]:
    """What this worker process holds (read in the worker, not assumed from the driver): its pid, vLLM's parallel
    ranks, and whether the plugin is registered here — the ``TRITON_MLA_SPARSE`` backend name pointing at our class,
    and the Triton indexer as vLLM's out-of-tree ``SparseAttnIndexer``."""
    import os

    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from triton_mla_sparse.integrations.vllm.policy import BACKEND_CLASS_PATH, BACKEND_NAME

    member = AttentionBackendEnum.__members__.get(BACKEND_NAME)
    indexer = op_registry_oot.get("SparseAttnIndexer")
    state: dict[str, Any] = {"pid": os.getpid(),
                             "backend_registered": member is not None and member.get_path() == BACKEND_CLASS_PATH,
                             "indexer_registered": getattr(indexer, "__name__", None) == "TritonSparseAttnIndexer"}
    try:
        from vllm.distributed import parallel_state as ps

        for name, group in (("tp", ps.get_tp_group()), ("dp", ps.get_dp_group()), ("ep", ps.get_ep_group())):
            state[name] = [group.rank_in_group, group.world_size]
    except (AssertionError, AttributeError, ImportError) as e:  # a group not initialised in this process
        state["groups_error"] = f"{type(e).__name__}: {e}"[:200]
    return state


def probe_model(model: torch.nn.Module) -> dict[str, Any]:
    """Attention impl class names and batch-invariant flags, the attention layers by class (``layer/impl``, or the
    layer alone where it is its own attention, as DeepSeek-V4's and V4.1's), and the DSA indexers' Triton flags, of
    ``model``; ``process``: :func:`process_state` of the worker holding it."""
    import vllm.envs as envs

    impls: dict[str, int] = {}
    layers: dict[str, int] = {}
    invariant_impls = 0
    indexers = {"triton": 0, "vllm": 0}
    for module in model.modules():
        name = type(module).__name__
        impl = getattr(module, "impl", None)
        if impl is not None and hasattr(impl, "forward_mqa"):
            impls[type(impl).__name__] = impls.get(type(impl).__name__, 0) + 1
            invariant_impls += bool(getattr(impl, "batch_invariant", False))
            layers[f"{name}/{type(impl).__name__}"] = layers.get(f"{name}/{type(impl).__name__}", 0) + 1
        elif name.endswith("Attention"):  # a layer that is its own attention (DeepSeek-V4's and V4.1's classes)
            layers[name] = layers.get(name, 0) + 1
        if type(module).__name__ == "TritonSparseAttnIndexer":
            indexers["triton" if module.triton else "vllm"] += 1
        elif type(module).__name__ == "SparseAttnIndexer":
            indexers["vllm"] += 1
    deterministic = None
    try:
        from triton_mla_sparse.integrations.vllm import indexer as tms_indexer

        deterministic = bool(tms_indexer._DETERMINISTIC[0])
    except ImportError:
        pass
    return {"batch_invariant_env": bool(envs.VLLM_BATCH_INVARIANT), "attention_impls": impls,
            "attention_layers": layers, "batch_invariant_impls": invariant_impls, "indexers": indexers,
            "indexer_deterministic": deterministic, "process": process_state()}

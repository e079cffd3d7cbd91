"""Loading the peers at run time (never vendored): from a folder (``--peers DIR``, else ``$TMS_PEERS_DIR``, else
``./.peers``; ``../shared/tools/get-peers.sh`` makes one), else from an installed vLLM. A peer that cannot load gets a
status saying every source tried and why it failed; it is never silently dropped."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..methods import DEEPGEMM_KEYS, EXTERNAL_PEERS
from ..util import short_exc
from .deepgemm import DEEPGEMM_FUNCTIONS

# peer module -> (module file in a peers folder, module in an installed vLLM, method keys it provides)
PEER_MODULES = {
    "flashmla": ("flash_mla_interface", "vllm.third_party.flashmla.flash_mla_interface",
                 ("flashmla_bf16", "flashmla_fp8")),
    "page1": ("triton_decode_attention", "vllm.v1.attention.ops.triton_decode_attention", ("page1_triton",)),
    # FLASH_ATTN_MLA_SPARSE's FlashAttention-3 call: only from a peers folder (get-peers.sh writes fa3_page1.py)
    "fa3": ("fa3_page1", None, ("fa3_page1",)),
}


# DeepGEMM (the indexer peer): a package folder (get-peers.sh --deepgemm makes <peers>-deepgemm/deep_gemm), else the
# copy inside an installed vLLM.
DEEPGEMM_VLLM_MODULE = "vllm.third_party.deep_gemm"


@dataclass
class Peers:
    """Loaded peer modules and a one-line status per method key ("loaded from ..." / "not available: ...")."""

    modules: dict[str, Any] = field(default_factory=dict)  # "flashmla" / "page1" / "deepgemm" -> module
    status: dict[str, str] = field(default_factory=dict)  # method key -> status line
    folder: str | None = None

    def available(self, method: str) -> bool:
        """Whether method ``method`` is loaded (or built in)."""
        return self.status.get(method, "").startswith(("loaded", "built in"))


def resolve_peers_dir(option: str | None = None, env: Mapping[str, str] | None = None,
                      cwd: str | None = None) -> tuple[str | None, str]:
    """The peers folder and how it was chosen: ``--peers DIR``, else ``$TMS_PEERS_DIR``, else ``./.peers`` when
    it exists, else ``(None, "none")``."""
    env = os.environ if env is None else env
    if option:
        return option, "--peers"
    if env.get("TMS_PEERS_DIR"):
        return env["TMS_PEERS_DIR"], "TMS_PEERS_DIR"
    cwd = os.getcwd() if cwd is None else cwd
    if os.path.isdir(os.path.join(cwd, ".peers")):
        return os.path.join(cwd, ".peers"), "./.peers"
    return None, "none"


def resolve_deepgemm_dir(option: str | None = None, env: Mapping[str, str] | None = None, cwd: str | None = None,
                         peers_dir: str | None = None) -> tuple[str | None, str]:
    """The folder holding the ``deep_gemm`` package and how it was chosen: ``--deepgemm-dir DIR``, else
    ``$TMS_DEEPGEMM_DIR``, else ``<peers folder>-deepgemm`` beside the peers folder in use (what
    ``get-peers.sh --deepgemm`` makes), else ``./.peers-deepgemm`` when it exists, else ``(None, "none")``."""
    env = os.environ if env is None else env
    if option:
        return option, "--deepgemm-dir"
    if env.get("TMS_DEEPGEMM_DIR"):
        return env["TMS_DEEPGEMM_DIR"], "TMS_DEEPGEMM_DIR"
    if peers_dir:
        return os.path.normpath(peers_dir) + "-deepgemm", "beside the peers folder"
    cwd = os.getcwd() if cwd is None else cwd
    if os.path.isdir(os.path.join(cwd, ".peers-deepgemm")):
        return os.path.join(cwd, ".peers-deepgemm"), "./.peers-deepgemm"
    return None, "none"


def deepgemm_jit_cache_dir(env: Mapping[str, str] | None = None) -> str:
    """Where DeepGEMM's JIT writes its kernels: ``$DG_JIT_CACHE_DIR`` when set, else (set by :func:`load_peers`
    before the import) a folder in the system temp dir, reused by later runs on the same machine."""
    env = os.environ if env is None else env
    import tempfile

    return env.get("DG_JIT_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "triton-mla-sparse-deepgemm-jit")


def _import_package_from_folder(name: str, folder: str) -> Any:
    """Import the package ``folder/name/`` as ``name`` (what ``sys.path.insert(0, folder); import name`` does, but
    always this folder). On failure nothing of it stays in ``sys.modules`` (an earlier module is put back)."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"folder {folder} does not exist")
    pkg = os.path.join(folder, name)
    init = os.path.join(pkg, "__init__.py")
    if not os.path.isfile(init):
        raise FileNotFoundError(f"{init} does not exist")

    def ours(k):
        return k == name or k.startswith(name + ".")

    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    for k in saved:
        del sys.modules[k]
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        for k in [k for k in sys.modules if ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)
        raise
    return mod


def _deepgemm_device_problem() -> str | None:
    """DeepGEMM's MQA-logits kernels are built for SM90 / SM100 (and SM120 in this build)."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10, 12):
        return f"DeepGEMM's MQA-logits kernels need SM90 or SM100 (SM120); this device is sm_{major}{minor}"
    return None


def _load_deepgemm(peers: Peers, wanted, *, option, env, cwd, peers_dir, use_vllm) -> None:
    """Load DeepGEMM for the method keys of :data:`DEEPGEMM_KEYS` in ``wanted`` (see :func:`load_peers`)."""
    keys = [m for m in DEEPGEMM_KEYS if m in wanted]
    if not keys:
        return
    folder, how = resolve_deepgemm_dir(option, env, cwd, peers_dir)
    reasons = []
    mod = source = None

    def set_jit_dir():  # before DeepGEMM is imported: its runtime reads the variable
        if not os.environ.get("DG_JIT_CACHE_DIR"):
            os.environ["DG_JIT_CACHE_DIR"] = deepgemm_jit_cache_dir()

    if folder:
        here = os.path.join(os.getcwd() if cwd is None else cwd, ".peers-deepgemm")
        shown = ".peers-deepgemm" if os.path.abspath(folder) == os.path.abspath(here) else f"{folder} ({how})"
        try:
            if os.path.isdir(folder):
                set_jit_dir()
            mod = _import_package_from_folder("deep_gemm", folder)
            source = f"loaded from {shown}"
        except Exception as e:  # noqa: BLE001 - e.g. OSError from the CUDA extension on a CPU-only torch
            reasons.append(f"{shown}: {short_exc(e)}")
    else:
        reasons.append("no DeepGEMM folder (--deepgemm-dir DIR, $TMS_DEEPGEMM_DIR or ./.peers-deepgemm, made by "
                       "get-peers.sh --deepgemm)")
    if mod is None and use_vllm:
        if not _vllm_installed():
            reasons.append("vLLM: not installed")
        else:
            try:
                set_jit_dir()
                mod = importlib.import_module(DEEPGEMM_VLLM_MODULE)
                import vllm

                source = f"loaded from installed vLLM {getattr(vllm, '__version__', '?')} ({DEEPGEMM_VLLM_MODULE})"
            except Exception as e:  # noqa: BLE001
                reasons.append(f"vLLM {DEEPGEMM_VLLM_MODULE}: {short_exc(e)}")
    if mod is not None:
        missing = [f for f in DEEPGEMM_FUNCTIONS if not callable(getattr(mod, f, None))]
        if missing:
            reasons.append(f"{source[len('loaded from '):]}: no {', '.join(missing)} (another DeepGEMM API)")
            mod = None
    if mod is not None:
        problem = _deepgemm_device_problem()
        if problem:
            reasons.append(problem)
            mod = None
    if mod is not None:
        peers.modules["deepgemm"] = mod
        version = getattr(mod, "__version__", None)
        source += (f", DeepGEMM {version}" if version else "") + f"; JIT cache {deepgemm_jit_cache_dir()}"
    for m in keys:
        peers.status[m] = source if mod is not None else "not available: " + "; ".join(reasons)


def _import_from_folder(modname: str, folder: str) -> Any:
    """Import ``folder/modname.py`` as module ``modname`` (what ``sys.path.insert(0, folder); import modname``
    does, but always this file)."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"folder {folder} does not exist")
    path = os.path.join(folder, modname + ".py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist")
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    old = sys.modules.get(modname)
    sys.modules[modname] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        if old is None:
            sys.modules.pop(modname, None)
        else:
            sys.modules[modname] = old
        raise
    return mod


def _vllm_installed() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def _flashmla_device_problem() -> str | None:
    """FlashMLA's sparse kernels are built for SM90 / SM100 only."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return f"FlashMLA's sparse kernels need SM90 or SM100; this device is sm_{major}{minor}"
    return None


def _fa3_device_problem() -> str | None:
    """vLLM 0.33 builds FlashAttention-3 for SM90 only."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return f"FlashAttention-3 (FLASH_ATTN_MLA_SPARSE) needs SM90; this device is sm_{major}{minor}"
    return None


def load_peers(option: str | None = None, *, env: Mapping[str, str] | None = None, use_vllm: bool = True,
               wanted: Iterable[str] = EXTERNAL_PEERS,
               cwd: str | None = None, deepgemm_dir: str | None = None) -> Peers:
    """Load the peer modules needed by the method keys in ``wanted``: each from the peers folder
    (:func:`resolve_peers_dir`), else from an installed vLLM; DeepGEMM (``deepgemm``, ``deepgemm_topk``) from its own
    folder (:func:`resolve_deepgemm_dir`), else the copy in an installed vLLM, with ``$DG_JIT_CACHE_DIR`` set to a
    writable folder when unset. Never raises: a peer that cannot load gets the status
    ``not available: <every source tried and why it failed>``."""
    folder, how = resolve_peers_dir(option, env, cwd)
    peers = Peers(folder=folder)
    shown = (".peers" if how == "./.peers" else f"{folder} ({how})") if folder else None
    for key, (file_mod, vllm_mod, provides) in PEER_MODULES.items():
        if not any(m in wanted for m in provides):
            continue
        reasons = []
        mod = source = None
        if folder:
            try:
                mod = _import_from_folder(file_mod, folder)
                source = f"loaded from {shown}"
            except Exception as e:  # noqa: BLE001 - e.g. OSError from the CUDA extension on a CPU-only torch
                reasons.append(f"{shown}: {short_exc(e)}")
        else:
            reasons.append("no peers folder (--peers DIR, $TMS_PEERS_DIR or ./.peers)")
        if mod is None and use_vllm and vllm_mod is None:
            reasons.append("not taken from an installed vLLM (its FlashAttention call is vLLM's backend code)")
        elif mod is None and use_vllm:
            if not _vllm_installed():
                reasons.append("vLLM: not installed")
            else:
                try:
                    mod = importlib.import_module(vllm_mod)
                    import vllm

                    source = f"loaded from installed vLLM {getattr(vllm, '__version__', '?')} ({vllm_mod})"
                except Exception as e:  # noqa: BLE001
                    reasons.append(f"vLLM {vllm_mod}: {short_exc(e)}")
        if mod is not None and key in ("flashmla", "fa3"):
            problem = _flashmla_device_problem() if key == "flashmla" else _fa3_device_problem()
            if problem:
                reasons.append(problem)
                mod = None
        if mod is not None:
            peers.modules[key] = mod
        for m in provides:
            if m in wanted:
                peers.status[m] = source if mod is not None else "not available: " + "; ".join(reasons)
    _load_deepgemm(peers, wanted, option=deepgemm_dir, env=env, cwd=cwd, peers_dir=folder, use_vllm=use_vllm)
    return peers

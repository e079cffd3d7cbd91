"""``triton-mla-sparse info``: the device, its architecture family, the launch table entries that apply and what
is unsupported, all read from :mod:`triton_mla_sparse.capabilities` and the attention launch table."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ..capabilities import ARCHS, D_ROPES, MAX_HEADS, MAX_TOPK, Q_DTYPES, arch_for_device, describe_device, \
    unsupported_reasons
from ..formats import ALL_KV_FORMATS, D_V

if TYPE_CHECKING:
    from ..ops.sparse_mla.configs import Launch


def run_info(arch_name: str | None = None) -> int:
    """Device, architecture family, the launch table entries that apply, and what is unsupported and why."""
    from ..ops.sparse_mla.configs import CACHE_CLASSES, GLUON_TABLE, HEAD_CLASSES, TABLE, gluon_supported

    if arch_name is not None:
        if arch_name not in ARCHS:
            print(f"unknown architecture {arch_name!r}; declared: {', '.join(ARCHS)}")
            return 2
        arch, device_line = ARCHS[arch_name], f"architecture {arch_name} (as asked; no device probed)"
    elif torch.cuda.is_available():
        dev = torch.device("cuda")
        arch = arch_for_device(dev)
        device_line = f"{torch.cuda.get_device_name(dev)}, {describe_device(dev)}, " \
                      f"{torch.cuda.get_device_properties(dev).multi_processor_count} multiprocessors"
    else:
        print("device: none (no CUDA/ROCm GPU visible to torch); kernels run only through Triton's interpreter "
              "(TRITON_INTERPRET=1, float16). `triton-mla-sparse info --arch sm90` shows an architecture's table.")
        print(f"declared architectures: {', '.join(f'{a.name} ({a.note})' for a in ARCHS.values())}")
        return 0
    print(f"device: {device_line}")
    if arch is None:
        print("architecture: not declared -> unsupported:")
        for reason in unsupported_reasons(None, device_desc=device_line):
            print(f"  - {reason}")
        return 1
    print(f"architecture family: {arch.name} ({arch.note}); backend {arch.backend}, warp size {arch.warp_size}, "
          f"shared-memory budget {arch.shared_bytes // 1024} KB, fp8 conversions "
          f"{'native' if arch.fp8_hw else 'by integer decode (no native e4m3 conversion)'}")
    if arch.spills:
        print(f"known limitation: {arch.spills}")
    q_dtypes = "/".join(str(d).removeprefix("torch.") for d in Q_DTYPES)
    d_ropes = " or ".join(str(d) for d in sorted(D_ROPES, reverse=True))
    print(f"formats: {', '.join(ALL_KV_FORMATS)}; q {q_dtypes}; D_v {D_V}, D_rope {d_ropes}; heads 1..{MAX_HEADS}; "
          f"top-k 1..{MAX_TOPK}; any block size")
    print("launch table (head class x cache class -> kernel family, block_h, block_n, warps, stages, programs/SM, "
          "variants; a Gluon family where it runs the class, else tl):")
    for hc in HEAD_CLASSES:
        cells = []
        for cc in CACHE_CLASSES:
            if (hc, cc) not in TABLE[arch.name]:  # a class the target does not run (fp8_ds_mla_v4 on RDNA3)
                continue
            launch = GLUON_TABLE.get(arch.name, {}).get((hc, cc))
            native = {"16bit": "bf16"}.get(cc, cc)
            if launch is None or not gluon_supported(launch.family, arch, native):
                launch = TABLE[arch.name][(hc, cc)]
            cell = f"{cc}: {_describe(launch)}"
            if launch.prefill is not None and gluon_supported(launch.prefill.family, arch, native):
                pre = replace(launch.prefill, block_n=launch.prefill.prefill_block_n or launch.prefill.block_n,
                              num_stages=launch.prefill.prefill_stages or launch.prefill.num_stages,
                              prefill_block_n=None, prefill_stages=None)
                cell += f"; prefill {_describe(pre)}"
            cells.append(cell)
        print(f"  H<={hc if hc < 64 else MAX_HEADS:3d}  " + " | ".join(cells))
    print("unsupported here (rejected up front with these reasons):")
    for reason in unsupported_reasons(arch, heads=MAX_HEADS + 1, topk=MAX_TOPK + 1, d_rope=32, kv_format="int8",
                                      q_dtype=torch.float32):
        print(f"  - {reason}")
    return 0


def _describe(launch: Launch) -> str:
    """One launch-table entry: family, block_h, block_n, warps, stages, programs/SM and its variants."""
    stages = f"s{launch.num_stages}" + (f"/prefill s{launch.prefill_stages}" if launch.prefill_stages else "")
    bn = f"bn{launch.block_n}" + (f"/prefill bn{launch.prefill_block_n}" if launch.prefill_block_n else "")
    flags = "".join(f" +{k}" for k in ("low_reg", "f16_dot", "overlap", "pdl", "merge", "dsplit")
                    if getattr(launch, k))
    flags += f" reg{launch.max_registers}" if launch.max_registers is not None else ""
    flags += f" waves<={launch.max_waves}" if launch.max_waves != 2 else ""
    flags += f" split>={launch.min_split_len}" if launch.min_split_len != 1 else ""
    return f"{launch.family} bh{launch.block_h} {bn} w{launch.num_warps} {stages} x{launch.programs_per_sm}{flags}"


def _run(args: argparse.Namespace) -> int:
    return run_info(args.arch)


def register(sub: argparse._SubParsersAction) -> None:
    i = sub.add_parser("info", help="device, architecture family, launch configs that apply, and what is unsupported",
                       description="What this library does on the current GPU (or on --arch without one).")
    i.add_argument("--arch", help="show a declared architecture instead of the current device (e.g. sm86, gfx1151)")
    i.set_defaults(run=_run)

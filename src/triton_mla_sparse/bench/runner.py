"""Running cases: :func:`run_case` checks every method that applies against the float32 reference on the same
inputs, refuses to time one whose error exceeds the case's tolerance, then times it (eager do_bench windows taken in
turn with the case's other methods, CUDA events for calls over :data:`~triton_mla_sparse.bench.timing.SLOW_CALL_MS`,
and CUDA-graph replay for decode). :func:`run_bench` is ``triton-mla-sparse bench``: ceilings, every case, tables,
the JSON (rewritten after every case) and the PNG."""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable

import torch

from .accuracy import case_tolerance, check_output, reference_output
from .cases import Case, bench_cases, case_group, graph_timed, parse_kinds, smoke_cases
from .inputs import CaseInputs, IndexerInputs, build_inputs
from .methods import (DEEPGEMM_KEYS, EXTERNAL_PEERS, INDEXER_METHOD_KEYS, METHOD_KEYS, METHODS, MethodFactory,
                      PeerUnavailable, Unsupported, method_applies, method_factories)
from .peers import Peers, load_peers
from .report import compare_text, format_table, ratios_text, targets_or_note
from .results import DEFAULT_OUT_DIR, load_results, resolve_commit, results_path, versions, write_json
from .timing import (DO_BENCH_WINDOWS, SLOW_CALL_MS, DoBenchTimer, graph_replays, sync, time_do_bench, time_events,
                     time_graph, time_wall)
from .util import fmt, short_exc

Timer = Callable[[Callable[[], object]], float]
GraphTimer = Callable[[Callable[[], object], float | None], float]
Log = Callable[[str], None]


def _floors(case: Case, unique_bytes: int, ceilings: dict | None) -> dict:
    """The memory floor (unique bytes / copy bandwidth) and the compute floor (FLOPs / matmul rate) in ms."""
    if not ceilings or not ceilings.get("copy_gbps") or not ceilings.get("bf16_tflops"):
        return {"memory_ms": None, "compute_ms": None}
    # The indexer's dots are fp8 e4m3 (twice the bf16 tensor-core rate on sm89+ / Hopper).
    rate = ceilings["bf16_tflops"] * (2 if case.kind == "indexer" else 1)
    return {"memory_ms": unique_bytes / (ceilings["copy_gbps"] * 1e9) * 1e3,
            "compute_ms": case.flops / (rate * 1e12) * 1e3}


def _case_record(case: Case) -> dict:
    rec = {"name": case.name, "kind": case.kind, "rows": case.rows, "heads": case.heads, "topk": case.topk,
           "ctx": case.ctx, "kv_format": case.kv_format, "block_size": case.block_size, "q_dtype": case.q_dtype,
           "softmax_scale": case.softmax_scale, "flops": case.flops, "methods": {}}
    if case.kind == "indexer":
        rec.update(phase=case.phase, requests=case.requests, pairs=case.pairs)
        del rec["softmax_scale"]
    return rec


def _free(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        try:
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001 - a broken context shows up in the next method's error
            pass
        torch.cuda.empty_cache()


def _rates(case: Case, inp: CaseInputs | IndexerInputs, ms: float, ceilings: dict | None) -> dict:
    rec = {"ms": ms, "tflops": case.flops / (ms * 1e-3) / 1e12, "gbps": inp.unique_bytes / (ms * 1e-3) / 1e9}
    if ceilings and ceilings.get("copy_gbps"):
        rec["pct_copy"] = 100.0 * rec["gbps"] / ceilings["copy_gbps"]
    return rec


def _run_method(name: str, factory: MethodFactory | None, inp: CaseInputs | IndexerInputs, ref: torch.Tensor,
                sel: torch.Tensor | None, *, device: torch.device, ceilings: dict | None, timer: Timer,
                graph_timer: GraphTimer | None, log: Log, keep: list | None = None) -> dict:
    """Accuracy check, then timing, of one method on one case's inputs. Returns its JSON record: ``ms``, ``tflops``,
    ``gbps``, ``rel_err`` (+ ``graph_ms`` for decode, ``pct_copy``, ``config``, ``timer``), or ``error``. ``keep``
    (a list): a method timed by ``timer`` is appended as (name, prepared call) for more windows (:func:`run_case`)."""
    case = inp.case
    tol = case_tolerance(case)
    m: dict = {}
    prep = None
    tag = f"  {name:<13}"
    try:
        if factory is None:
            raise PeerUnavailable(f"not available: unknown method {name!r}")
        if name in DEEPGEMM_KEYS and not getattr(factory, "unavailable", False):
            log(f"{tag} building (DeepGEMM JIT-compiles its kernels on first use: may take a minute) ...")
        prep = factory(inp)
        m["config"] = prep.config
        if prep.warmup_s is not None:
            m["warmup_s"] = prep.warmup_s
            if prep.warmup_s > 1.0:
                log(f"{tag} first call (compile / JIT warm-up) took {prep.warmup_s:.1f} s")
        out = prep.fn()
        sync(device)
        err, problem = check_output(case, out, ref, sel)
        m["rel_err"] = err
        del out
        if not err <= tol:
            m["error"] = (f"accuracy: {problem}; not timed" if problem else
                          f"accuracy: rel err {err:.3g} > {tol:g}; not timed")
            log(f"{tag} {(prep.config or '')[:44]:<44} ERROR {m['error']}")
            return m
        # On the GPU a second call (the first may have compiled) picks the timer and the graph replay count.
        call_ms = time_wall(prep.fn, device) if device.type == "cuda" else None
        if call_ms is not None and call_ms > SLOW_CALL_MS:
            ms = time_events(prep.fn, 3)
            m["timer"] = f"cuda events, median of 3 (one call > {SLOW_CALL_MS:g} ms)"
        else:
            ms = timer(prep.fn)
            m["timer"] = "do_bench median" if device.type == "cuda" else "wall clock, 1 call (smoke)"
            if keep is not None:
                keep.append((name, prep))
                m["ms_windows"] = [ms]
        rec = {**_rates(case, inp, ms, ceilings), "rel_err": err}
        if graph_timed(case) and graph_timer is not None:
            if not prep.graphable:
                rec["graph_error"] = "not graphable"
            else:
                try:
                    rec["graph_ms"] = graph_timer(prep.fn, call_ms)
                except Exception as e:  # noqa: BLE001 - the eager timing stands
                    rec["graph_error"] = short_exc(e)
                    log(f"{tag} graph timing failed: {rec['graph_error']}")
        m = {**rec, **m}
        log(f"{tag} {(prep.config or '')[:44]:<44} {ms:9.4f} ms  graph {fmt(m.get('graph_ms'), '.4f')} ms  "
            f"{m['tflops']:7.1f} TFLOP/s  {m['gbps']:7.0f} GB/s  err {err:.2e}")
        for key, vfn in prep.variants.items():  # same checks, same timer; recorded beside the main numbers
            try:
                vout = vfn()
                sync(device)
                verr, vproblem = check_output(case, vout, ref, sel)
                del vout
                if not verr <= tol:
                    m[f"ms_{key}_error"] = (f"accuracy: {vproblem}; not timed" if vproblem else
                                            f"accuracy: rel err {verr:.3g} > {tol:g}; not timed")
                    log(f"{tag} variant {key}: ERROR {m[f'ms_{key}_error']}")
                    continue
                v_ms = time_wall(vfn, device) if device.type == "cuda" else None
                m[f"ms_{key}"] = time_events(vfn, 3) if v_ms is not None and v_ms > SLOW_CALL_MS else timer(vfn)
                log(f"{tag} {'  variant ' + key:<44} {m[f'ms_{key}']:9.4f} ms")
            except Exception as e:  # noqa: BLE001 - the main numbers stand
                m[f"ms_{key}_error"] = short_exc(e)
                log(f"{tag} variant {key}: ERROR {m[f'ms_{key}_error']}")
    except PeerUnavailable as e:
        m = {"error": str(e)}
        log(f"{tag} ERROR {e}")
    except Unsupported as e:
        m["error"] = f"unsupported: {e}"
        log(f"{tag} ERROR {m['error']}")
    except Exception as e:  # noqa: BLE001 - one method's failure must not stop the run
        m["error"] = short_exc(e, 500)
        log(f"{tag} ERROR {m['error']}")
        traceback.print_exc(file=sys.stderr)
    finally:
        del prep
        _free(device)
    return m


def run_case(case: Case, method_names: Iterable[str], device: torch.device | str, *,
             factories: dict[str, MethodFactory] | None = None, ceilings: dict | None = None, seed: int = 0,
             timer: Timer | None = None, graph_timer: GraphTimer | None = None, log: Log = print,
             windows: int = 1) -> dict:
    """Build ``case`` once, then for every method in ``method_names`` that applies to it (:func:`method_applies`):
    accuracy against the float32 reference, then timing. ``windows`` > 1: after every method's first timing, each
    method timed by ``timer`` gets ``windows - 1`` more, in turn (round-robin), and its figure is the lowest
    (``ms_windows`` holds them all; the prepared calls of the case's methods stay alive until then). Returns the
    JSON record of the case."""
    device = torch.device(device)
    factories = method_factories(None) if factories is None else factories
    timer = timer or (DoBenchTimer(1) if windows > 1 else time_do_bench)
    rec = _case_record(case)
    try:
        inp = build_inputs(case, device, seed)
        rec["unique_rows"] = inp.unique_rows
        rec["unique_bytes"] = inp.unique_bytes
        rec["floors"] = _floors(case, inp.unique_bytes, ceilings)
        ref, sel = reference_output(inp)
        rec["checked_rows"] = case.rows if sel is None else int(sel.numel())
    except Exception as e:  # noqa: BLE001 - a broken case must not stop the run
        rec["error"] = short_exc(e, 500)
        log(f"  ERROR building case: {rec['error']}")
        traceback.print_exc(file=sys.stderr)
        _free(device)
        return rec
    names = list(method_names)
    if case.kind == "indexer":  # ours, ours_logits, deepgemm, deepgemm_topk, torch, then any extra
        names = [m for m in INDEXER_METHOD_KEYS if m in names] + [m for m in names if m not in INDEXER_METHOD_KEYS]
    keep = [] if windows > 1 else None
    for name in names:
        if not method_applies(name, case):
            continue
        rec["methods"][name] = _run_method(name, factories.get(name), inp, ref, sel, device=device,
                                           ceilings=ceilings, timer=timer, graph_timer=graph_timer, log=log,
                                           keep=keep)
    for _ in range(windows - 1):
        for name, prep in keep or []:
            try:
                rec["methods"][name]["ms_windows"].append(timer(prep.fn))
            except Exception as e:  # noqa: BLE001 - the first window stands
                rec["methods"][name]["windows_error"] = short_exc(e)
    for name, _ in keep or []:
        m = rec["methods"][name]
        ms = min(m["ms_windows"])
        m.update(_rates(case, inp, ms, ceilings))
        m["timer"] = (f"lowest of {len(m['ms_windows'])} do_bench medians, taken in turn with the case's other methods"
                      if device.type == "cuda" else f"wall clock, lowest of {len(m['ms_windows'])} calls (smoke)")
        log(f"  {name:<13} windows " + " ".join(f"{w:.4f}" for w in m["ms_windows"]) + f" -> {ms:.4f} ms")
    del keep, inp, ref
    _free(device)
    return rec


def timers(device: torch.device) -> tuple[Timer, GraphTimer | None, int]:
    """``(timer, graph_timer, windows)`` of a run on ``device``: do_bench windows taken in turn and CUDA-graph
    replay on a GPU, one wall-clock call on the CPU (smoke runs)."""
    if device.type == "cuda":
        def graph_timer(fn: Callable[[], object], call_ms: float | None = None) -> float:
            return time_graph(fn, replays=graph_replays(call_ms))

        return DoBenchTimer(), graph_timer, DO_BENCH_WINDOWS
    return (lambda fn: time_wall(fn, device)), None, 1


def run_bench(*, quick: bool = False, out: str | None = None, out_dir: str = DEFAULT_OUT_DIR,
              methods: Iterable[str] = METHOD_KEYS, case_filter: str | None = None, seed: int = 0,
              cpu_smoke: bool = False, peers_dir: str | None = None, peers: Peers | None = None,
              use_vllm: bool = True, budget_s: float | None = None, plot: bool = True, compare: str | None = None,
              log: Log | None = None, kinds: str | Iterable[str] | None = None, deepgemm_dir: str | None = None,
              targets_file: str | None = None, emulate: str | None = None) -> int:
    """Run the benchmark, print the tables, write the JSON (and PNG). Returns the exit status: 0 ok, 1 a case of
    'ours' (or 'ours_logits') failed (or the time budget cut the run short), 2 no GPU / bad arguments.

    ``out``: JSON path; default ``<out_dir>/<gpu>-<date>.json`` on a GPU, none for ``cpu_smoke``. The JSON is
    rewritten after every case (``complete`` false until the end), so a run cut short still leaves its results.
    ``peers``: preloaded :class:`Peers` (tests); else :func:`load_peers` with ``peers_dir`` (and ``deepgemm_dir``).
    ``budget_s``: no case starts after this many seconds (the rest are recorded with an error). ``compare``: an older
    results JSON to compare with at the end. ``kinds``: the case groups to run (:data:`KINDS`: "attention",
    "indexer"; a list or a comma-separated string; default both). Peers are loaded only for the groups that run.
    ``emulate``: also time ``ours_portable`` on the attention cases, with that family's table entries and
    instruction path (:mod:`triton_mla_sparse.bench.portable`)."""
    log = log or (lambda s: print(s, flush=True))
    t_start = time.perf_counter()
    cuda = torch.cuda.is_available()
    if not cuda and not cpu_smoke:
        print("triton-mla-sparse bench: needs a CUDA GPU (torch.cuda.is_available() is False); timings through the "
              "Triton interpreter on a CPU mean nothing. Try `triton-mla-sparse demo` instead, or the reports that "
              "need no GPU: --plot / --targets / --compare OLD.json --against NEW.json.", file=sys.stderr)
        return 2
    methods = tuple(methods)
    known = set(METHOD_KEYS) | set(METHODS)
    unknown = [m for m in methods if m not in known]
    if unknown or not methods:
        print(f"triton-mla-sparse bench: unknown method(s) {unknown}; known: {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    from .portable import EMULATED

    if emulate is not None and emulate not in EMULATED:
        print(f"triton-mla-sparse bench: --emulate: one of {', '.join(EMULATED)}, got {emulate!r}", file=sys.stderr)
        return 2
    old_doc = None
    if compare:
        try:
            old_doc = load_results(compare)
        except Exception as e:  # noqa: BLE001 - fail before the long run, not after it
            print(f"triton-mla-sparse bench: --compare {compare}: {short_exc(e)}", file=sys.stderr)
            return 2
    try:
        kinds = parse_kinds(kinds)
    except ValueError as e:
        print(f"triton-mla-sparse bench: {e}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    cases = smoke_cases(kinds) if cpu_smoke else bench_cases(quick, kinds)
    if case_filter:
        rx = re.compile(case_filter)
        cases = [c for c in cases if rx.search(c.name)]
    dev_name = torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.processor() or platform.machine()})"
    now = datetime.datetime.now(datetime.timezone.utc)
    date = now.strftime("%Y-%m-%d")
    if out is None and not cpu_smoke:
        out = results_path(dev_name, date, out_dir)
    vers = versions()
    commit, commit_source, dirty = resolve_commit()
    log(f"triton-mla-sparse bench on {dev_name}: torch {vers['torch']}, triton {vers['triton']}, commit "
        f"{commit or 'unknown'}{' (dirty)' if dirty else ''}, {len(cases)} cases ({', '.join(kinds)}), methods "
        f"{', '.join(methods)}" + (" [cpu smoke]" if cpu_smoke else "")
        + (f", budget {budget_s:g} s" if budget_s else ""))

    # Peers: load what the requested methods need for the case groups that run, and say where each came from (or
    # why it is missing).
    groups = {case_group(c) for c in cases}
    wanted = [m for m in methods if m in EXTERNAL_PEERS
              and ("indexer" if m in DEEPGEMM_KEYS else "attention") in groups]
    if peers is None:
        peers = load_peers(peers_dir, use_vllm=use_vllm, wanted=wanted, deepgemm_dir=deepgemm_dir) if wanted \
            else Peers()
    peer_status = {}
    if "torch" in methods and groups:
        parts = (["gather + matmul + softmax in q's dtype"] if "attention" in groups else []) + (
            ["indexer: paged gather, bf16 matmul, relu, weighted head sum, torch.topk"] if "indexer" in groups else [])
        peer_status["torch"] = f"built in ({'; '.join(parts)})"
    for m in wanted:
        peer_status[m] = peers.status.get(m, "not available: not loaded")
    if peer_status:
        log("peers:")
        for m, s in peer_status.items():
            log(f"  {m:<13} {s}")
    factories = method_factories(peers)

    if cuda:
        log("measuring ceilings (2 GiB device copy and read, bf16 8192^3 matmul) ...")
        try:
            from .ceilings import measure_ceilings

            ceilings = measure_ceilings(device)
            log(f"  copy {ceilings['copy_gbps']:.0f} GB/s, read {fmt(ceilings.get('read_gbps'), '.0f')} GB/s, "
                f"bf16 matmul {ceilings['bf16_tflops']:.0f} TFLOP/s")
        except Exception as e:  # noqa: BLE001
            ceilings = {"copy_gbps": None, "bf16_tflops": None, "error": short_exc(e)}
            log(f"  ceilings failed: {ceilings['error']}")
    else:
        ceilings = {"copy_gbps": None, "bf16_tflops": None}
    timer, graph_timer, windows = timers(device)

    results: list[dict] = []
    doc = {
        "device": dev_name, "date": date, "time": now.isoformat(timespec="seconds"),
        "torch": vers["torch"], "triton": vers["triton"], "python": vers["python"],
        "commit": commit, "commit_source": commit_source, "commit_dirty": dirty,
        "quick": bool(quick), "cpu_smoke": bool(cpu_smoke), "kinds": list(kinds),
        "multiprocessors": torch.cuda.get_device_properties(device).multi_processor_count if cuda else None,
        "ceilings": ceilings, "peers": peer_status, "methods": list(methods), "cases": results, "failed": [],
        "complete": False, "elapsed_s": None,
    }
    cut_short = False
    for i, case in enumerate(cases, 1):
        elapsed = time.perf_counter() - t_start
        if budget_s and elapsed > budget_s:
            rec = _case_record(case)
            rec["error"] = f"not run: the time budget of {budget_s:g} s was used up"
            results.append(rec)
            if not cut_short:
                log(f"[{i}/{len(cases)}] time budget of {budget_s:g} s used up ({elapsed:.0f} s): the remaining "
                    f"{len(cases) - i + 1} cases are recorded as not run")
            cut_short = True
            continue
        eta = "" if i == 1 else f", ~{elapsed / (i - 1) * (len(cases) - i + 1):.0f} s left"
        log(f"[{i}/{len(cases)}] {case.name} ({elapsed:.0f} s{eta})")
        results.append(run_case(case, methods, device, factories=factories, ceilings=ceilings, seed=seed,
                                timer=timer, graph_timer=graph_timer, log=log, windows=windows))
        if out:
            doc["elapsed_s"] = time.perf_counter() - t_start
            try:
                write_json(doc, out)
            except OSError as e:
                log(f"  could not write {out}: {e}")
    if emulate and cut_short:
        log(f"--emulate {emulate}: not run (the time budget was used up)")
        doc["emulate"] = {"family": emulate, "instructions": "not run: the time budget was used up"}
    elif emulate:
        from .portable import METHOD, run_portable

        ran = {r["name"] for r in results if not r.get("error")}
        port = run_portable([c for c in cases if c.name in ran], emulate, seed=seed, ceilings=ceilings, log=log)
        for r in results:
            if r["name"] in port["records"]:
                r["methods"][METHOD] = port["records"][r["name"]]
        doc["emulate"] = {"family": emulate, "instructions": port["instructions"]}
        doc["methods"] = [*doc["methods"], METHOD]
        log(f"--emulate {emulate}: {port['instructions']}")
    failed = [r["name"] for r in results
              if r.get("error") or any(m in r["methods"] and r["methods"][m].get("error")
                                       for m in ("ours", "ours_logits"))]
    doc.update(failed=failed, complete=not cut_short, elapsed_s=time.perf_counter() - t_start)
    log("")
    log(format_table(results, ceilings))
    log("")
    log(ratios_text(doc))
    if not cpu_smoke:
        log("")
        log(targets_or_note(doc, targets_file=targets_file))
    if out:
        write_json(doc, out)
        log(f"wrote {out}")
        if plot:
            from .plot import plot_results

            png = plot_results(doc, os.path.splitext(out)[0] + ".png", log=log)
            if png:
                log(f"wrote {png}")
    if old_doc is not None:
        log("")
        log(compare_text(old_doc, doc, old_label=compare, new_label=out or "this run", targets_file=targets_file))
    if failed:
        log(f"FAILED cases (ours): {', '.join(failed)}")
        return 1
    log(f"done in {time.perf_counter() - t_start:.0f} s")
    return 0

"""Reports of a results document (a dict as :func:`~triton_mla_sparse.bench.runner.run_bench` writes it); none
needs a GPU: :func:`format_table` (the run's table), :func:`ratios_text` (ours ÷ each peer), :func:`compare_text`
(old vs new) and :func:`targets_text` (the project's ours/peer targets, PASS/FAIL).

The targets are repository data, not part of the package: ``benchmarks/targets.py`` defines ``TARGETS``, a list of
``(label, spec, limit, goal)``; ``spec`` is a list of ``(numerator case selector, method, denominator case
selector, method | BEST_PEER | (method, ...))`` or the string ``"every case:<peer>"``. PASS: ratio <= limit, the
ratio of CUDA-graph replay times for graph-timed cases (attention and indexer decode) where both methods have one,
else of do_bench times.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable, Mapping

from .cases import case_group, graph_timed
from .methods import METHOD_KEYS
from .results import load_results
from .util import fmt, short_exc

BEST_PEER = "best peer"
TARGETS_FILE = os.path.join("benchmarks", "targets.py")
TARGETS_ENV = "TMS_TARGETS_FILE"
_REPO_TARGETS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                                              os.pardir, TARGETS_FILE))  # src/triton_mla_sparse/bench -> repo root
_loaded: dict[tuple[str, float], list] = {}


class TargetsNotFound(FileNotFoundError):
    """No performance-targets file (``benchmarks/targets.py`` of the repository) was found."""


def find_targets_file(path: str | None = None, env: Mapping[str, str] | None = None,
                      cwd: str | None = None) -> str:
    """The targets file: ``path`` when given, else ``$TMS_TARGETS_FILE``, else ``benchmarks/targets.py`` under
    ``cwd``, else the one of the repository checkout this package runs from. Raises :class:`TargetsNotFound`."""
    env = os.environ if env is None else env
    if path or env.get(TARGETS_ENV):
        tried = [path or env[TARGETS_ENV]]
    else:
        tried = list(dict.fromkeys([os.path.join(os.getcwd() if cwd is None else cwd, TARGETS_FILE), _REPO_TARGETS]))
    for p in tried:
        if os.path.isfile(p):
            return p
    raise TargetsNotFound(f"performance targets not found (tried {', '.join(tried)}): they are repository data; run "
                          f"from the repository root, or set ${TARGETS_ENV} to benchmarks/targets.py")


def load_targets(path: str | None = None) -> list:
    """``TARGETS`` of the targets file (:func:`find_targets_file`), loaded once per file version."""
    p = os.path.abspath(find_targets_file(path))
    key = (p, os.path.getmtime(p))
    if key not in _loaded:
        spec = importlib.util.spec_from_file_location("_tms_bench_targets", p)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if not isinstance(getattr(mod, "TARGETS", None), list):
            raise ValueError(f"{p}: no TARGETS list")
        _loaded[key] = mod.TARGETS
    return _loaded[key]


def targets_or_note(doc: dict, targets: list | None = None, targets_file: str | None = None) -> str:
    """:func:`targets_text` (``targets``, else those of ``targets_file``), or one line saying why the targets were
    not checked (no targets file)."""
    try:
        return targets_text(doc, load_targets(targets_file) if targets is None else targets)
    except TargetsNotFound as e:
        return f"targets: not checked: {e}"


def format_table(results: list[dict], ceilings: dict | None = None) -> str:
    """The run's table: one line per (case, method), errors included, then the ceilings."""
    hdr = (f"{'case':<37} {'method':<13} {'kernel+config':<44} {'ms':>9} {'graph ms':>9} {'TFLOP/s':>8} "
           f"{'GB/s':>7} {'%copy':>6} {'rel err':>8} {'floor ms':>9}")
    lines = [hdr, "-" * len(hdr)]
    for r in results:
        fl = r.get("floors") or {}
        floor = None
        if fl.get("memory_ms") is not None:
            floor = max(fl["memory_ms"], fl["compute_ms"])
        if r.get("error"):
            lines.append(f"{r['name']:<37} ERROR {r['error']}")
            continue
        for name, m in r["methods"].items():
            cfg = (m.get("config") or "")[:44]
            if m.get("error"):
                lines.append(f"{r['name']:<37} {name:<13} {cfg:<44} ERROR {m['error']}")
                continue
            lines.append(f"{r['name']:<37} {name:<13} {cfg:<44} {fmt(m.get('ms'), '9.4f'):>9} "
                         f"{fmt(m.get('graph_ms'), '9.4f'):>9} {fmt(m.get('tflops'), '8.1f'):>8} "
                         f"{fmt(m.get('gbps'), '7.0f'):>7} {fmt(m.get('pct_copy'), '6.1f'):>6} "
                         f"{fmt(m.get('rel_err'), '8.1e'):>8} {fmt(floor, '9.4f'):>9}")
            for k, v in m.items():  # timed variants of the call (ms_<variant>), e.g. page1_triton's default scales
                if k.startswith("ms_") and isinstance(v, (int, float)):
                    lines.append(f"{'':<37} {'':<13} {'  variant ' + k[3:]:<44} {v:9.4f}")
    if ceilings:
        lines.append(f"ceilings: copy {fmt(ceilings.get('copy_gbps'), '.0f')} GB/s (read + write), "
                     f"read {fmt(ceilings.get('read_gbps'), '.0f')} GB/s, "
                     f"bf16 matmul {fmt(ceilings.get('bf16_tflops'), '.0f')} TFLOP/s; floor = max(unique bytes / "
                     f"copy bandwidth, FLOPs / matmul rate)")
    return "\n".join(lines)


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 else None


def method_ms(case_rec: dict | None, method: str, key: str = "ms") -> float | None:
    """A method's timing in a case record (None when absent, errored or not a positive number)."""
    if not case_rec:
        return None
    m = (case_rec.get("methods") or {}).get(method)
    if not isinstance(m, dict) or m.get("error"):
        return None
    return _num(m.get(key))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None else None


def _case_key(c: dict) -> tuple:
    return (c.get("kind"), c.get("phase"), c.get("heads"), c.get("rows"), c.get("kv_format"), c.get("ctx"),
            c.get("topk"))


def _find_case(doc: dict, **sel: object) -> dict | None:
    """The first case of ``doc`` whose fields equal every ``sel`` item (kind, heads, rows, kv_format, ...)."""
    for c in doc.get("cases") or []:
        if all(c.get(k) == v for k, v in sel.items()):
            return c
    return None


def methods_in(doc: dict) -> list[str]:
    """The methods present in a results document: the known keys in their order, then any others."""
    seen = []
    for c in doc.get("cases") or []:
        for m in c.get("methods") or {}:
            if m not in seen:
                seen.append(m)
    return [m for m in METHOD_KEYS if m in seen] + [m for m in seen if m not in METHOD_KEYS]


def commit_of(doc: dict) -> str:
    """The commit a results document records (older files: ``git_commit``)."""
    return str(doc.get("commit") or doc.get("git_commit") or "unknown")


def _doc_label(doc: dict) -> str:
    return f"{doc.get('device', '?')}, {doc.get('date', '?')}, commit {commit_of(doc)[:12]}"


def ours_for(case_rec: dict | None, peer: str) -> str:
    """The method of ours a peer is compared with: in indexer cases DeepGEMM's logits-only ``deepgemm`` against
    ``ours_logits``; everything else against ``ours`` (for indexer cases: logits + top-k)."""
    if (case_rec or {}).get("kind") == "indexer" and peer == "deepgemm":
        return "ours_logits"
    return "ours"


def _is_ours(m: str) -> bool:
    return m in ("ours", "ours_logits", "ours_portable")


def ratio_rows(doc: dict) -> list[dict]:
    """Per case: ours ms and ``ours ÷ peer`` for every peer present (do_bench ms; ``graph`` for decode cases where
    both have a CUDA-graph time). A peer present with an error has ratio None and its error text. In indexer cases
    ``deepgemm`` (logits only) is divided into ``ours_logits``, the others into ``ours`` (:func:`ours_for`)."""
    rows = []
    for c in doc.get("cases") or []:
        methods = c.get("methods") or {}
        ours = method_ms(c, "ours")
        r = {"case": c.get("name"), "kind": c.get("kind"), "ours_ms": ours, "ratios": {}, "graph_ratios": {},
             "errors": {}}
        for p in methods:
            if _is_ours(p):
                continue
            m = methods[p] or {}
            if m.get("error"):
                r["errors"][p] = m["error"]
            mine = ours_for(c, p)
            r["ratios"][p] = _ratio(method_ms(c, mine), method_ms(c, p))
            r["graph_ratios"][p] = _ratio(method_ms(c, mine, "graph_ms"), method_ms(c, p, "graph_ms"))
        rows.append(r)
    return rows


def _cell(r: float | None, g: float | None = None) -> str:
    if r is None:
        return "-"
    return f"{r:.2f}" + (f" (g {g:.2f})" if g is not None else "")


def ratios_text(doc: dict) -> str:
    """Table: per case, ours ms and ours ÷ each peer (< 1: ours is faster); ``g``: the same under CUDA graphs."""
    peers = [m for m in methods_in(doc) if not _is_ours(m)]
    lines = [f"ours / peer (do_bench ms; < 1 means ours is faster; g = CUDA-graph times) -- {_doc_label(doc)}"]
    if any(c.get("kind") == "indexer" for c in doc.get("cases") or []):
        lines.append("  indexer cases: ours = logits + top-k; /deepgemm is ours_logits / deepgemm (logits only)")
    hdr = f"{'case':<37} {'ours ms':>9} " + " ".join(f"{'/' + p:>18}" for p in peers)
    lines += [hdr, "-" * len(hdr)]
    for r in ratio_rows(doc):
        cells = []
        for p in peers:
            if p not in r["ratios"]:
                cells.append(f"{'':>18}")
            elif p in r["errors"]:
                cells.append(f"{'error':>18}")
            else:
                cells.append(f"{_cell(r['ratios'][p], r['graph_ratios'].get(p)):>18}")
        lines.append(f"{r['case']!s:<37} {fmt(r['ours_ms'], '9.4f'):>9} " + " ".join(cells))
    return "\n".join(lines)


def compare_rows(old: dict, new: dict) -> list[dict]:
    """Per case of ``new`` (matched in ``old`` by name, else by kind/heads/rows/format/ctx/topk) and per method in
    either: old ms, new ms, new ÷ old (and the graph-time ratio where both have one)."""
    by_name = {c.get("name"): c for c in old.get("cases") or []}
    by_key = {}
    for c in old.get("cases") or []:
        by_key.setdefault(_case_key(c), c)
    rows = []
    for c in new.get("cases") or []:
        o = by_name.get(c.get("name")) or by_key.get(_case_key(c))
        names = list(c.get("methods") or {})
        for m in (o or {}).get("methods") or {}:
            if m not in names:
                names.append(m)
        names = [m for m in METHOD_KEYS if m in names] + [m for m in names if m not in METHOD_KEYS]
        for m in names:
            om, nm = method_ms(o, m), method_ms(c, m)
            og, ng = method_ms(o, m, "graph_ms"), method_ms(c, m, "graph_ms")
            rows.append({"case": c.get("name"), "method": m, "old_ms": om, "new_ms": nm, "ratio": _ratio(nm, om),
                         "old_graph_ms": og, "new_graph_ms": ng, "graph_ratio": _ratio(ng, og),
                         "in_old": o is not None})
    return rows


def compare_text(old: dict, new: dict, old_label: str = "old", new_label: str = "new", *,
                 targets: list | None = None, targets_file: str | None = None) -> str:
    """Old vs new per case and method, then the new results' ratios and targets (a note when no targets file)."""
    lines = ["compare: new / old (< 1 means faster now)",
             f"  old: {old_label} -- {_doc_label(old)}",
             f"  new: {new_label} -- {_doc_label(new)}"]
    hdr = f"{'case':<37} {'method':<13} {'old ms':>9} {'new ms':>9} {'new/old':>8} {'graph new/old':>14}"
    lines += [hdr, "-" * len(hdr)]
    prev = None
    for r in compare_rows(old, new):
        name = r["case"] if r["case"] != prev else ""
        prev = r["case"]
        note = "" if r["in_old"] else "  (case not in old)"
        lines.append(f"{name!s:<37} {r['method']:<13} {fmt(r['old_ms'], '9.4f'):>9} "
                     f"{fmt(r['new_ms'], '9.4f'):>9} {fmt(r['ratio'], '8.2f'):>8} "
                     f"{fmt(r['graph_ratio'], '14.2f'):>14}{note}")
    lines += ["", ratios_text(new), "", targets_or_note(new, targets, targets_file)]
    return "\n".join(lines)


def target_group(spec: str | list) -> str:
    """``"indexer"`` for a target over indexer cases, else ``"attention"``."""
    if isinstance(spec, str):
        return "attention"
    return "indexer" if any(nsel.get("kind") == "indexer" for nsel, _, _, _ in spec) else "attention"


def _groups_in(doc: dict) -> set[str]:
    return {case_group(c) for c in doc.get("cases") or [] if isinstance(c, dict)}


def _best_peer(c: dict, key: str = "ms", among: tuple[str, ...] | None = None) -> tuple[str | None, float | None]:
    """The fastest peer of a case (``among``: only those methods) and its time."""
    best = (None, None)
    for p in (c.get("methods") or {}):
        if _is_ours(p) or (among is not None and p not in among):
            continue
        v = method_ms(c, p, key)
        if v is not None and (best[1] is None or v < best[1]):
            best = (p, v)
    return best


def _sel_text(sel: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sel.items())


def _why_missing(c: dict | None, m: str) -> str:
    if c is None:
        return "case not in results"
    if m == BEST_PEER or isinstance(m, tuple):
        return "no peer timed"
    rec = (c.get("methods") or {}).get(m)
    if rec is None:
        return f"{m} not in results"
    if rec.get("error"):
        return f"{m}: {rec['error']}"
    return f"{m}: no time"


def _needs_gbps(c: dict | None, den_ms: float | None, limit: float) -> float | None:
    """Bandwidth (GB/s of the case's unique bytes) that a time of ``limit`` × ``den_ms`` would need. The timed calls
    start with a flushed L2, so every unique byte moves through HBM at least once: a limit that needs more than the
    read ceiling measured in the run asks for more than any kernel was seen to read on that device (and where it
    needs more than the device's nominal bandwidth, more than it can)."""
    ub = (c or {}).get("unique_bytes")
    if not ub or not den_ms:
        return None
    return ub / (limit * den_ms * 1e-3) / 1e9


def target_rows(doc: dict, targets: list | None = None) -> list[dict]:
    """One row per (target, case): ``ratio`` (do_bench ms), ``graph_ratio`` (decode, both graph-timed), ``limit``,
    ``goal``, ``status`` PASS / FAIL / n/a and ``goal_met`` judged on ``basis`` — the graph ratio for decode cases
    where both methods have one (eager decode figures carry host noise), else the do_bench ratio — and ``note``
    (which peer, or why n/a). A denominator method may be :data:`BEST_PEER` or a tuple of methods (the fastest of
    them). The targets of a case
    group (attention / indexer, :func:`target_group`) are left out when the results have cases but none of that
    group (e.g. a ``--kinds indexer`` run). ``targets``: the list of :func:`load_targets` (default: loaded)."""
    targets = load_targets() if targets is None else targets
    out = []
    groups = _groups_in(doc)
    for label, spec, limit, goal in targets:
        if groups and target_group(spec) not in groups:
            continue
        pairs = []
        if isinstance(spec, str):  # every case that has the peer
            peer = spec.split(":", 1)[1]
            for c in doc.get("cases") or []:
                if peer in (c.get("methods") or {}):
                    pairs.append((c, "ours", c, peer, c.get("name")))
            if not pairs:
                pairs.append((None, "ours", None, peer, f"(no case has {peer})"))
        else:
            for nsel, nm, dsel, dm in spec:
                nc, dc = _find_case(doc, **nsel), _find_case(doc, **dsel)
                name = nc.get("name") if nc else f"({_sel_text(nsel)})"
                if nc and dc and nc is not dc:  # two cases, e.g. ours fp8 / ours bf16
                    fmt = str(nc.get("kv_format"))
                    name = str(nc.get("name")).replace(fmt, f"{fmt} / {dc.get('kv_format')}")
                pairs.append((nc, nm, dc, dm, name))
        for nc, nm, dc, dm, name in pairs:
            num, num_g = method_ms(nc, nm), method_ms(nc, nm, "graph_ms")
            note = ""
            if dm == BEST_PEER or isinstance(dm, tuple):
                among = dm if isinstance(dm, tuple) else None
                bp, den = _best_peer(dc, among=among) if dc else (None, None)
                bpg, den_g = _best_peer(dc, "graph_ms", among=among) if dc else (None, None)
                if bp:
                    note = f"best peer: {bp} {den:.4f} ms" + (f" (graph: {bpg})" if bpg and bpg != bp else "")
            else:
                den, den_g = method_ms(dc, dm), method_ms(dc, dm, "graph_ms")
            why = [_why_missing(cc, mm) for cc, mm, v in ((nc, nm, num), (dc, dm, den)) if v is None]
            if why:
                note = "; ".join(dict.fromkeys(why))
            ratio = _ratio(num, den)
            alt = method_ms(dc, dm, "ms_default_scales") if dm == "page1_triton" else None
            if alt is not None and num is not None:
                extra = f"vs page1 as sweep.py called it (default scales): {num / alt:.2f}"
                note = f"{note}; {extra}" if note else extra
            g = _ratio(num_g, den_g) if nc and graph_timed(nc) else None
            basis, judged = ("graph", g) if g is not None else ("do_bench", ratio)
            if nc and graph_timed(nc) and g is None and ratio is not None:
                extra = "judged on do_bench times: no graph time for both"
                note = f"{note}; {extra}" if note else extra
            eps = 1e-9  # a ratio equal to the limit passes, whatever the float rounding
            status = "n/a" if judged is None else ("PASS" if judged <= limit + eps else "FAIL")
            needs = _needs_gbps(nc, den, limit) if nm.startswith("ours") else None  # our methods read all
            read = (doc.get("ceilings") or {}).get("read_gbps")
            over = needs is not None and bool(read) and needs > read
            if over:
                extra = (f"limit over the read ceiling: {limit:.2f} x {den:.4f} ms means moving the case's unique "
                         f"bytes at {needs:.0f} GB/s > {read:.0f} GB/s, the best read measured in the run")
                note = f"{note}; {extra}" if note else extra
            out.append({"target": label, "case": name, "ratio": ratio, "graph_ratio": g, "basis": basis,
                        "limit": limit, "goal": goal, "status": status,
                        "goal_met": judged is not None and judged <= goal + eps, "note": note,
                        "needs_gbps": needs, "over_read_ceiling": over})
    return out


def targets_text(doc: dict, targets: list | None = None) -> str:
    """The target rows as a table with a PASS / FAIL / n/a summary (:func:`target_rows`)."""
    targets = load_targets() if targets is None else targets
    rows = target_rows(doc, targets)
    lines = [f"targets (ours / peer; PASS = ratio <= limit, judged on CUDA-graph times where both have one (marked *), "
             f"else do_bench; goal: the aim beyond the limit) -- {_doc_label(doc)}"]
    groups = _groups_in(doc)
    skipped = sorted({target_group(spec) for _, spec, _, _ in targets} - groups) if groups else []
    if skipped:
        lines.append(f"  ({' and '.join(skipped)} targets left out: no such cases in these results)")
    hdr = (f"{'target':<46} {'case':<40} {'ratio':>6} {'graph':>7} {'limit':>6} {'goal':>5} {'status':<6} "
           f"{'goal?':<5} note")
    lines += [hdr, "-" * len(hdr)]
    prev = None
    for r in rows:
        tgt = r["target"] if r["target"] != prev else ""
        prev = r["target"]
        star = "*" if r["basis"] == "graph" else ""
        lines.append(f"{tgt:<46} {str(r['case'])[:40]:<40} {fmt(r['ratio'], '6.2f'):>6} "
                     f"{fmt(r['graph_ratio'], '6.2f') + star:>7} {r['limit']:6.2f} {r['goal']:5.2f} {r['status']:<6} "
                     f"{'met' if r['goal_met'] else '-':<5} {r['note']}")
    n = {s: sum(r["status"] == s for r in rows) for s in ("PASS", "FAIL", "n/a")}
    lines.append(f"{n['PASS']} PASS, {n['FAIL']} FAIL, {n['n/a']} n/a; goal met on {sum(r['goal_met'] for r in rows)} "
                 f"of {len(rows)} rows")
    over = [r for r in rows if r.get("over_read_ceiling")]
    if over:
        lines.append(f"{len(over)} row(s) whose limit needs more bandwidth than the read ceiling of the run: "
                     + "; ".join(f"{r['target'].split(':')[0]} / {r['case']}" for r in over))
    return "\n".join(lines)


def report_main(*, plot: str | None = None, png: str | None = None, targets: str | None = None,
                compare: str | None = None, against: str | None = None, log: Callable[[str], None] | None = None,
                targets_file: str | None = None) -> int:
    """The GPU-free modes of ``triton-mla-sparse bench``: ``--plot``, ``--targets``, ``--compare OLD --against NEW``.
    ``targets_file``: the performance targets (default: :func:`find_targets_file`). Returns 0, or 2 when a file
    cannot be read."""
    log = log or (lambda s: print(s, flush=True))
    try:
        if compare and against:
            log(compare_text(load_results(compare), load_results(against), old_label=compare, new_label=against,
                             targets_file=targets_file))
        if targets:
            doc = load_results(targets)
            spec = load_targets(targets_file)
            log(ratios_text(doc))
            log("")
            log(targets_text(doc, spec))
        if plot:
            from .plot import plot_results

            p = plot_results(plot, png, log=log)
            if p:
                log(f"wrote {p}")
    except (OSError, ValueError) as e:
        print(f"triton-mla-sparse bench: {short_exc(e)}", file=sys.stderr)
        return 2
    return 0

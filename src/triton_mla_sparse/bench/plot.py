"""The PNG of a results document: one group of bars per case, one bar per method (matplotlib, the [bench] extra)."""

from __future__ import annotations

import os
from collections.abc import Callable

from .cases import case_group
from .report import commit_of, method_ms, methods_in
from .results import load_results

METHOD_COLORS = {"ours": "#d62728", "torch": "#7f7f7f", "page1_triton": "#2ca02c", "flashmla_bf16": "#1f77b4",
                 "flashmla_fp8": "#9467bd", "ours_logits": "#ff9896", "deepgemm": "#ff7f0e",
                 "deepgemm_topk": "#8c564b", "fa3_page1": "#17becf", "ours_portable": "#e377c2"}


def plot_results(doc_or_path: dict | str | os.PathLike, png: str | None = None, *,
                 log: Callable[[str], None] = print) -> str | None:
    """Grouped bar chart of a results JSON (dict or path): one group per case, one bar per method with a time,
    log-scale ms; an × at the bottom marks a method that applies but has an error (e.g. a peer not available).
    Saved to ``png`` (default: the JSON's path with .png). Returns the PNG path, or None when matplotlib is not
    importable (printed as skipped)."""
    if isinstance(doc_or_path, (str, os.PathLike)):
        path = os.fspath(doc_or_path)
        doc = load_results(path)
        png = png or os.path.splitext(path)[0] + ".png"
    else:
        doc = doc_or_path
    if not png:
        raise ValueError("plot_results: png path required when given a dict")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:
        log(f"plot skipped: matplotlib is not importable ({e}); pip install 'triton-mla-sparse[bench]'")
        return None
    cases = [c for c in doc.get("cases") or [] if c.get("methods")]
    methods = methods_in(doc)
    n_m = max(1, len(methods))
    width = 0.8 / n_m
    fig = Figure(figsize=(max(8.0, 0.62 * len(cases) + 2.5), 6.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    all_ms = [v for c in cases for m in methods if (v := method_ms(c, m)) is not None]
    lo = min(all_ms) if all_ms else 1e-3
    err_y = lo / 2.2
    handles = []
    for j, m in enumerate(methods):
        xs, ys, ex = [], [], []
        for i, c in enumerate(cases):
            x = i - 0.4 + width * (j + 0.5)
            v = method_ms(c, m)
            if v is not None:
                xs.append(x)
                ys.append(v)
            elif m in (c.get("methods") or {}):
                ex.append(x)
        color = METHOD_COLORS.get(m) or f"C{j}"
        ax.bar(xs, ys, width=width * 0.95, color=color, zorder=3)
        handles.append(Patch(color=color, label=m))
        if ex:
            ax.scatter(ex, [err_y] * len(ex), marker="x", s=18, color=color, zorder=4)
    ax.set_yscale("log")
    if all_ms:
        ax.set_ylim(bottom=lo / 3.5, top=max(all_ms) * 2.0)
    for i in range(1, len(cases)):  # a dashed line between the attention and the indexer cases
        if case_group(cases[i]) != case_group(cases[i - 1]):
            ax.axvline(i - 0.5, color="#555555", linestyle="--", linewidth=0.8, zorder=2)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([c.get("name", "?") for c in cases], rotation=55, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.set_ylabel("ms per call (do_bench median, log scale)")
    ax.grid(axis="y", which="both", alpha=0.3, zorder=0)
    ax.set_title(f"triton-mla-sparse bench: {doc.get('device', '?')}, {doc.get('date', '?')}, "
                 f"commit {commit_of(doc)[:12]}", fontsize=10)
    if methods:
        ax.legend(handles=handles, fontsize=8, ncol=min(5, n_m), loc="upper left")
    if not all_ms:
        ax.text(0.5, 0.5, "no timings", transform=ax.transAxes, ha="center")
    fig.text(0.01, 0.01, "× = applies but errored / not available (see JSON); indexer cases: ours = logits + top-k, "
             "ours_logits / deepgemm = logits only", fontsize=7, color="#555555")
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(png))
    os.makedirs(d, exist_ok=True)
    fig.savefig(png)
    return png

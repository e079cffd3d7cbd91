"""The PNG of a results document."""

from __future__ import annotations

import json
import sys

import pytest
from bench_helpers import _doc, _indexer_doc, _new_doc

from triton_mla_sparse import bench
from triton_mla_sparse.cli import main


def _have_matplotlib() -> bool:
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _have_matplotlib(), reason="matplotlib not installed (the bench extra)")
def test_plot_redraw_from_json(tmp_path):
    p = tmp_path / "h200-2026-12-01.json"
    p.write_text(json.dumps(_new_doc()))
    assert main(["bench", "--plot", str(p)]) == 0
    png = tmp_path / "h200-2026-12-01.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    other = tmp_path / "sub" / "x.png"
    assert bench.plot_results(str(p), str(other)) == str(other) and other.stat().st_size > 1000
    assert bench.plot_results(_doc([]), str(tmp_path / "empty.png"), log=lambda s: None)  # no cases: still a PNG
    both = _doc(_new_doc()["cases"] + _indexer_doc()["cases"])  # attention and indexer cases in one plot
    assert bench.plot_results(both, str(tmp_path / "both.png")) == str(tmp_path / "both.png")
    assert (tmp_path / "both.png").stat().st_size > 1000


def test_plot_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails as if not installed
    msgs = []
    assert bench.plot_results(_new_doc(), str(tmp_path / "x.png"), log=msgs.append) is None
    assert msgs and msgs[0].startswith("plot skipped: matplotlib is not importable")
    assert not (tmp_path / "x.png").exists()

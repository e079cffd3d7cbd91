"""The end-to-end harness lives in ``benchmarks/e2e`` (outside the library): make ``import e2e`` work."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

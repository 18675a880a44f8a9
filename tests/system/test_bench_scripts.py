"""Every benchmark under bench/ loads and parses its arguments (``--help``):
one that imports a name another benchmark no longer has fails here, in
``make test``, not only in CI's ``make bench-smoke``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_loads_and_says_how_to_run_it(script: str) -> None:
    out = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=BENCH.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage:")

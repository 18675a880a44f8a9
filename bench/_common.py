"""Helpers shared by the benchmarks: side-by-side rounds and ratio printing.

The machine is shared and noisy, so every benchmark alternates the two
contenders in rounds within one run and reports the median of per-round
ratios; absolute times are printed for context only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parser(doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="run briefly; only check it runs")
    return p


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def verdict(name: str, value: float, target: str, ok: bool) -> str:
    line = f"{name}: {value:.3f} (target {target}) {'OK' if ok else 'MISSED'}"
    print(line)
    return line

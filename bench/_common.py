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


# The start of a bench's snapshot server process: a recorder with 100
# compiled graphs and 20 time distributions (``dists``) of 500 samples each;
# the bench adds how it serves and what it records next.
SERVER_PRELUDE = r"""
import json, random, sys, threading, time
from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build
from metrics import export
from tpu_info.contract.model import Unit
rng = random.Random(1)
rec = Recorder()
for i in range(100):
    rec.ledger.compiled(f"{i:064x}", f"jit(f{i})", "jax", seconds=rng.random(),
                        signature=("x: f32[8,128]",))
dists = [rec.registry.distribution(f"Metric{d}", Unit.TIME_NS) for d in range(20)]
for dist in dists:
    for _ in range(500):
        dist.observe(rng.lognormvariate(13, 1.0))
ex = export.start(lambda since: build(rec, (), since), port=0, workers=2)
"""

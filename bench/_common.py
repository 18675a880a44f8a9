"""Helpers shared by the benchmarks: side-by-side rounds and ratio printing.

The machine is shared and noisy, so every benchmark alternates the two
contenders in rounds within one run and reports the median of per-round
ratios; absolute times are printed for context only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any


def keep_ctrl_c() -> None:
    """Gives back Ctrl-C to this process and every program it starts, when it
    was started with SIGINT ignored (``nohup``, ``cmd &`` in a script): an
    ignored signal stays ignored across exec, so those programs would never
    stop on a SIGINT (exit_latency's Ctrl-C rows, run_all's stop past
    ``--timeout``). A handled one is reset to the default in an exec'd child."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parser(doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="run briefly; only check it runs")
    return p


def median(xs: list[float]) -> float:
    return statistics.median(xs)


ThreeWays = dict[str, list[tuple[float, float, float]]]


def three_ways(cases: dict[str, tuple[Callable[[], Any], int]], rounds: int,
               switch: Callable[[int], None]) -> ThreeWays:
    """Each case's ns per call unhooked, under a bare pass-through wrapper
    and hooked (``switch(which)`` puts contender 0, 1 or 2 in place), one
    row per round, the three alternated in both orders each round; the hooked
    contender is left in place."""
    for fn, _ in cases.values():
        fn()
    per: ThreeWays = {k: [] for k in cases}
    for _ in range(rounds):
        for name, (fn, reps) in cases.items():
            got = [0.0, 0.0, 0.0]
            for which in (0, 1, 2, 2, 1, 0):  # each order once per round
                switch(which)
                got[which] += timeit.timeit(fn, number=reps) / reps / 2 * 1e9
            per[name].append((got[0], got[1], got[2]))
    switch(2)
    return per


def three_way_report(bench: str, per: ThreeWays, against_bare: bool,
                     target: Callable[[str], float]) -> None:
    """Prints each case's medians, then its ratio hooked / bare wrapper (or
    hooked / unhooked) against ``target(case)``, and the other ratio beside it."""
    load = os.getloadavg()[0]
    for name, rows in per.items():
        plain, bare = median([r[0] for r in rows]), median([r[1] for r in rows])
        print(f"{name}: unhooked {plain:.0f} ns, bare wrapper {bare:.0f} ns, "
              f"hooked {median([r[2] for r in rows]):.0f} ns (load average {load:.2f})")
    for name, rows in per.items():
        vs_plain = median([r[2] / r[0] for r in rows])
        vs_bare = median([r[2] / r[1] for r in rows])
        shown, judged = ("unhooked", "bare wrapper") if against_bare else (
            "bare wrapper", "unhooked")
        print(f"{name}: hooked / {shown} {vs_plain if against_bare else vs_bare:.3f}")
        value, limit = (vs_bare if against_bare else vs_plain), target(name)
        verdict(f"{bench} {name} hooked / {judged}", value, f"<= {limit}", value <= limit)


def in_processes(script: str, size: str, rounds: int, processes: int,
                 here: Callable[[int], dict[str, Any]], timeout: float = 3600
                 ) -> list[dict[str, Any]]:
    """One result per process: ``here(rounds)`` in this one when
    ``processes`` is 1, else ``script --collect SIZE --rounds R --seed S``
    (its last stdout line, JSON) in that many fresh processes one after
    another, the rounds shared among them. A process's memory layout biases
    its figures by up to ~1 % on this machine (an A/A pair reads 0.98-1.01
    per process): fresh processes average that bias out."""
    if processes <= 1:
        return [here(rounds)]
    share = -(-rounds // processes)
    parts = []
    for i in range(processes):
        out = subprocess.run([sys.executable, script, "--collect", size, "--rounds", str(share),
                              "--seed", str(7 + i)], capture_output=True, text=True,
                             timeout=timeout)
        if out.returncode != 0:
            raise SystemExit(f"{Path(script).stem}: process {i + 1} of {processes} failed: "
                             + (out.stderr.strip().splitlines() or ["no output"])[-1])
        parts.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return parts


def pooled_interval(groups: list[list[float]], resamples: int = 2000) -> str:
    """A 95 % bootstrap interval of the pooled median of ``groups`` (one list
    of per-round ratios a process): processes are resampled, then rounds
    within each, so a process's own bias widens the interval as it should."""
    rng = random.Random(11)
    meds = []
    for _ in range(resamples):
        picked = rng.choices(groups, k=len(groups)) if len(groups) > 1 else groups
        meds.append(median([x for g in picked for x in rng.choices(g, k=len(g))]))
    meds.sort()
    return f"{meds[int(0.025 * resamples)]:.3f}-{meds[int(0.975 * resamples)]:.3f}"


def pooled(groups: list[list[float]]) -> str:
    """The pooled median of per-process ratios, its interval and, with
    several processes, each one's median: the text of a ratio row."""
    flat = [x for g in groups for x in g]
    text = f"{median(flat):.3f}"
    if len(flat) > 1:
        text += f", 95 % interval {pooled_interval(groups)}"
    if len(groups) > 1:
        text += " (processes: " + ", ".join(f"{median(g):.3f}" for g in groups) + ")"
    return text


def pooled_rates(parts: list[dict[str, Any]]) -> tuple[dict[str, float], int, str]:
    """(each contender's median wall rate over every process's rounds, the
    rounds in all, each process's load average before -> after)."""
    wall = {k: median([r[0] for p in parts for r in p["got"][k]]) for k in parts[0]["got"]}
    rounds = sum(len(p["got"]["without"]) for p in parts)
    loads = ", ".join(f"{p['load'][0]:.2f} -> {p['load'][1]:.2f}" for p in parts)
    return wall, rounds, loads


def ratio_rows(parts: list[dict[str, Any]], rows: list[tuple[str, str, str]], prefix: str,
               clocks: tuple[str, ...] = ("CPU-second",)) -> dict[tuple[str, str], float]:
    """Prints one line per ``(text, a, b)`` of ``rows``: contender a's
    per-round rate over b's (``parts[i]["got"][label]``: one tuple a round,
    wall first, then one per name in ``clocks``), pooled over the processes,
    then the median per other clock. Returns the pooled wall ratio by (a, b)."""
    def ratios(a: str, b: str, clock: int) -> list[list[float]]:
        return [[x[clock] / y[clock] for x, y in zip(p["got"][a], p["got"][b], strict=True)]
                for p in parts]

    result = {}
    for text, a, b in rows:
        r = ratios(a, b, 0)
        result[(a, b)] = median([x for xs in r for x in xs])
        line = f"{prefix} {text}: {pooled(r)}"
        if len(r[0]) > 1:
            line += "; " + ", ".join(
                f"per {name} {median([x for xs in ratios(a, b, i + 1) for x in xs]):.3f}"
                for i, name in enumerate(clocks))
        print(line)
    return result


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

"""The whole test suite on a loaded machine: 10 busy processes per core.

Every test's timing must survive a neighbour's job (issue 29: "the whole
suite passes under that load"). Run one after the other at a load of 20 on
2 cores, the suite takes about ten times as long as on a quiet machine
(100 minutes and more); so it runs in
``--shards`` pytest processes at once, the test files dealt among them by
size. That makes the machine busier still for every test (each process
gets a smaller share of a core than one run alone would), never quieter.

Usage:
    python tools/loaded_suite.py                       # 4 shards, 10x load, whole suite
    python tools/loaded_suite.py --shards 2 --load 20 -- tests/system -x
    python tools/loaded_suite.py --load 0              # shards only: the quiet reference

Prints each shard's summary line and its failures, then one verdict line;
exits 0 when every shard passed (pytest's 5, "no tests collected", counts
as passed), else 1. Shard logs go to ``--logs`` (default: a temporary
folder, printed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.load import Load, default_count  # noqa: E402


def find_test_files(paths: Sequence[str]) -> list[Path]:
    """The ``test_*.py`` files under ``paths`` (files or folders), biggest first."""
    found: list[Path] = []
    for p in paths:
        path = (ROOT / p) if not os.path.isabs(p) else Path(p)
        if path.is_file():
            found.append(path)
        else:
            found += sorted(path.rglob("test_*.py"))
    return sorted(set(found), key=lambda f: (-f.stat().st_size, str(f)))


def deal(files: Sequence[Path], shards: int) -> list[list[Path]]:
    """``files`` dealt into ``shards`` lists of about equal total size."""
    out: list[list[Path]] = [[] for _ in range(max(1, shards))]
    sizes = [0] * len(out)
    for f in files:  # biggest first, each to the lightest shard
        i = sizes.index(min(sizes))
        out[i].append(f)
        sizes[i] += f.stat().st_size
    return [s for s in out if s]


def _summary(log: Path) -> tuple[str, list[str]]:
    lines = log.read_text(errors="replace").splitlines()
    failed = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    tail = next((ln for ln in reversed(lines) if " in " in ln and ("passed" in ln or "failed" in ln
                                                                  or "error" in ln)), "")
    return tail.strip("= "), failed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load", type=int, default=default_count(),
                   help="busy processes (default: 10 per core; 0: none)")
    p.add_argument("--shards", type=int, default=4, help="pytest processes at once (default 4)")
    p.add_argument("--logs", default=None, help="folder for the shards' logs")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, rest = p.parse_args(argv[:cut]), argv[cut + 1:]
    paths = [a for a in rest if not a.startswith("-")] or ["tests"]
    options = [a for a in rest if a.startswith("-")]
    logs = Path(args.logs or tempfile.mkdtemp(prefix="loaded-suite-"))
    logs.mkdir(parents=True, exist_ok=True)
    shards = deal(find_test_files(paths), args.shards)
    print(f"loaded_suite: {len(shards)} shards, {args.load} busy processes on "
          f"{os.cpu_count()} cores; logs in {logs}", flush=True)
    load = Load(args.load) if args.load > 0 else None
    started = time.monotonic()
    procs = []
    try:
        if load is not None:
            load.start()
        for i, files in enumerate(shards):
            log = logs / f"shard{i}.log"
            out = open(log, "w")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-ra",
                 *options, *map(str, files)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL), log, out))
        for proc, _, out in procs:
            proc.wait()
            out.close()
    finally:
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if load is not None:
            load.stop()
    ok = True
    for i, (proc, log, _) in enumerate(procs):
        tail, failed = _summary(log)
        passed = proc.returncode in (0, 5)
        ok = ok and passed
        print(f"shard {i}: exit {proc.returncode}: {tail}")
        for line in failed:
            print(f"  {line}")
    minutes = (time.monotonic() - started) / 60
    print(f"loaded_suite: {'PASSED' if ok else 'FAILED'} in {minutes:.1f} min under "
          f"{args.load} busy processes ({len(shards)} shards)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""What 10,000 discovery records of dead processes cost `doctor` and `--watch`.

Writes ``--records`` records (valid JSON, this user's, mode 0600) whose pids
are dead into a fresh private runtime directory, then measures:

- ``tpu-info doctor`` (a subprocess, discovering from that directory): lines
  printed, wall and CPU seconds (CPU is the steadier figure on a shared
  machine), twice in a row (the second run shows what the first one left);
- the dashboard (``WatchApp`` headless, ``LiveSource`` discovering from that
  directory, no targets): CPU seconds per wall second over ``--seconds``,
  with the records written fresh just before it starts.

    python bench/stale_records.py                 # 10,000 records, 20 s of dashboard
    python bench/stale_records.py --smoke         # 500 records, 3 s
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, parser, verdict

DEAD_PID_BASE = 4_200_000  # above Linux's largest pid_max (4,194,304): never alive


def write_stale(directory: Path, count: int) -> None:
    """``count`` records of dead pids, as the hook writes them."""
    for i in range(count):
        pid = DEAD_PID_BASE + i
        rec = {"schema": 1, "pid": pid, "port": 20000 + i % 40000, "host": "127.0.0.1",
               "argv": ["python", "train.py"], "engine": "jax",
               "versions": {"jax": "0.10.2"}, "start_time": time.time() - 3600}
        path = directory / f"{pid}.json"
        path.write_text(json.dumps(rec))
        os.chmod(path, 0o600)


def doctor(directory: Path) -> tuple[int, float, float, int]:
    """(lines printed, wall seconds, CPU seconds, exit code) of one ``tpu-info doctor``."""
    env = dict(os.environ, TPU_INFO_RUNTIME_DIR=str(directory),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-m", "tpu_info", "--timeout", "1", "doctor"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    return len(r.stdout.splitlines()), time.monotonic() - t0, cpu, r.returncode


async def dashboard_cpu(directory: Path, seconds: float) -> float:
    """CPU seconds per wall second of the dashboard discovering from ``directory``."""
    from tui.app import WatchApp
    from tui.source import LiveSource

    source = LiveSource([], 1.0, 1.0, discover=True, runtime_dir=directory,
                        probe_libtpu=False)
    app = WatchApp(source, 1.0, tick_s=1.0)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await asyncio.sleep(1.0)
            cpu0, wall0 = time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            cpu1, wall1 = time.process_time(), time.monotonic()
            await pilot.press("q")
    finally:
        source.stop()
    return (cpu1 - cpu0) / (wall1 - wall0)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    count, seconds = (500, 3.0) if args.smoke else (args.records, args.seconds)
    print(f"load average {os.getloadavg()[0]:.2f}; {count:,} stale records")
    with tempfile.TemporaryDirectory() as tmp:
        rt = Path(tmp) / "rt"
        rt.mkdir(mode=0o700)
        write_stale(rt, count)
        for n in (1, 2):
            lines, wall, cpu, rc = doctor(rt)
            verdict(f"doctor lines, run {n}", lines, "<= 20", lines <= 20)
            left = sum(1 for _ in rt.glob("*.json"))
            print(f"doctor run {n}: {lines:,} lines, {wall:.2f} s wall, {cpu:.2f} s CPU, "
                  f"exit {rc}; "
                  f"{left:,} records left")
        for f in rt.glob("*.json"):
            f.unlink()
        write_stale(rt, count)
        ratio = asyncio.run(dashboard_cpu(rt, seconds))
        left = sum(1 for _ in rt.glob("*.json"))
        print(f"dashboard: {ratio:.3f} CPU seconds per second over {seconds:g} s; "
              f"{left:,} records left")
        verdict("dashboard cpu seconds per second with stale records", ratio, "<= 0.05",
                ratio <= 0.05)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

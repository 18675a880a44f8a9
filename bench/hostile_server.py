"""The client against a hostile server's huge reply: wall time and memory.

A real gRPC server (:mod:`tests.hostile_server`, in its own process) answers
every snapshot with 650,000 graphs (60 MB). Measured here:

- ``tpu-info --timeout 3`` one-shot: wall time and max RSS of the command
  (``wait4``'s ``ru_maxrss``), its exit code and its stderr line. The bound:
  it ends within ``--timeout`` plus start-up, and its RSS stays near a plain
  run's (the client's receive size and count bounds keep the reply out).
- ``tpu-info --watch`` in a real terminal (tmux), when tmux is installed:
  RSS after ``--watch-s`` seconds, whether it drew, and the seconds from
  ``q`` to the process's exit (the bound: 1 s).

Before issue 14 (fc0f0e4, load 2-3 on 2 cores): the one-shot took 6.2-8.8 s
and 554-569 MiB (350,000 graphs: 7.2 s, 337 MiB); the dashboard held 954 MiB
after 30 s (1.6 GB in another run), never showed the graphs, and had not quit
90 s after ``q``. After: 0.3-0.7 s and 44-48 MiB (the reply is refused unread:
over 32 MiB), 350,000 graphs 0.4-0.6 s and 172-192 MiB (cut to 2,000); the
dashboard 57-65 MiB (650,000) or 400-500 MiB flat (350,000 every 0.5 s), q
to exit 0.3-0.5 s.

    python bench/hostile_server.py            # 650,000 graphs, 20 s of --watch
    python bench/hostile_server.py --smoke    # 100,000 graphs, 4 s of --watch
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
from _common import ROOT, parser, verdict

TIMEOUT_S = 3.0
Q_BOUND_S = 1.0
RSS_BOUND_MIB = 300  # a plain run takes ~50 MiB; 350,000 graphs (under the byte bound) ~190
WATCH_RSS_BOUND_MIB = 800  # 350,000 graphs every 0.5 s: ~450-500 MiB, flat


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR="/nonexistent-tpu-info")


def start_server(graphs: int) -> tuple[subprocess.Popen[str], str, int]:
    """The hostile server in its own process: (process, target, reply bytes)."""
    p = subprocess.Popen([sys.executable, "-m", "tests.hostile_server", "huge", "--graphs",
                          str(graphs)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT, env=_env())
    assert p.stdout is not None
    target, size = p.stdout.readline().split()
    return p, target, int(size)


def one_shot(target: str) -> tuple[float, float, int, str]:
    """``tpu-info --timeout 3``: (wall s, max RSS MiB, exit code, stderr)."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "tpu_info", "--no-discovery", "--target",
                          target, "--timeout", str(TIMEOUT_S)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, env=_env())
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, p.returncode, err.strip()


def watch(target: str, seconds: float) -> tuple[float, float, str, float | None] | None:
    """``--watch`` in tmux: (RSS MiB at the end, peak RSS MiB, what it shows,
    seconds from ``q`` to its exit); None without tmux."""
    tmux = shutil.which("tmux")
    if tmux is None:
        return None
    sock = f"tpu-info-bench-{uuid.uuid4().hex[:8]}"

    def run(*args: str) -> str:
        return subprocess.run([tmux, "-L", sock, *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout

    env = " ".join(f"{k}={v}" for k, v in _env().items() if k in ("PYTHONPATH",
                                                                  "TPU_INFO_RUNTIME_DIR"))
    ended = Path(tempfile.mkdtemp()) / "ended"
    run("new-session", "-d", "-s", "w", "-x", "140", "-y", "40",
        f"cd {ROOT} && env {env} {sys.executable} -m tui --no-discovery "
        f"--target {target} --rate 0.5 --timeout {TIMEOUT_S}; date +%s.%N > {ended}; sleep 60")
    try:
        shell = psutil.Process(int(run("display", "-p", "-t", "w", "#{pane_pid}").strip()))
        deadline = time.monotonic() + 10
        while not shell.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc = shell.children()[0]
        peak = 0.0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            peak = max(peak, proc.memory_info().rss / 2**20)
            time.sleep(0.25)
        rss = proc.memory_info().rss / 2**20
        pane = run("capture-pane", "-p", "-t", "w")
        shown = ("its process row" if "huge" in pane else
                 "the target disconnected" if "disconnected" in pane else "nothing")
        sent = time.time()
        run("send-keys", "-t", "w", "q")
        quit_s: float | None = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and quit_s is None:
            if ended.exists() and ended.read_text().strip():
                quit_s = float(ended.read_text()) - sent
            time.sleep(0.05)
        if quit_s is None:
            proc.kill()
        return rss, max(peak, rss), shown, quit_s
    finally:
        subprocess.run([tmux, "-L", sock, "kill-server"], capture_output=True, timeout=30)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--graphs", type=int, default=None)
    p.add_argument("--watch-s", type=float, default=None)
    args = p.parse_args()
    graphs = args.graphs or (100_000 if args.smoke else 650_000)
    watch_s = args.watch_s or (4.0 if args.smoke else 20.0)
    server, target, size = start_server(graphs)
    try:
        print(f"hostile reply: {graphs:,} graphs, {size / 1e6:.1f} MB; "
              f"load average {os.getloadavg()[0]:.2f}")
        wall, rss, rc, err = one_shot(target)
        print(f"tpu-info --timeout {TIMEOUT_S:g}: {wall:.2f} s wall (bound {TIMEOUT_S:g} s "
              f"+ start-up), max RSS {rss:.0f} MiB, exit {rc}")
        print(f"  stderr: {err[:200]}")
        verdict("hostile one-shot wall s", wall, f"<= {TIMEOUT_S:g}", wall <= TIMEOUT_S)
        verdict("hostile one-shot max RSS MiB", rss, f"<= {RSS_BOUND_MIB}", rss <= RSS_BOUND_MIB)
        w = watch(target, watch_s)
        if w is None:
            print("--watch: tmux is not installed; skipped")
        else:
            rss_end, peak, shown, quit_s = w
            q = f"{quit_s:.2f} s" if quit_s is not None else "did not quit in 90 s"
            print(f"--watch for {watch_s:g} s: RSS {rss_end:.0f} MiB (peak {peak:.0f} MiB), "
                  f"shows {shown}, q to exit {q} (bound {Q_BOUND_S:g} s)")
            quit_value = quit_s if quit_s is not None else 90.0
            verdict("hostile watch q-to-exit s", quit_value, f"<= {Q_BOUND_S:g}",
                    quit_value <= Q_BOUND_S)
            verdict("hostile watch peak RSS MiB", peak, f"<= {WATCH_RSS_BOUND_MIB}",
                    peak <= WATCH_RSS_BOUND_MIB)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A CPU load of our own: N busy processes, started together and always stopped.

What a loaded machine looks like to tpu-info (a training job's data workers,
a compile farm, a neighbour's build): every core has several runnable
processes. Debian's ``stress-ng --cpu N`` does the same; this one needs
nothing installed, so CI and the tests use it.

The workers stay in the caller's session, so with the kernel's autogroup
scheduling every process competes on its own, as under ``stress-ng`` started
from the same shell (a command gets about 2/(N+1) of a core on 2 cores).
Each is in a process group of its own, killed as one, and dies when its
parent does (``PR_SET_PDEATHSIG``), so an interrupted test or a killed shell
never leaves them spinning.

Usage:
    python tools/load.py 20                 # 20 busy processes until Ctrl-C
    python tools/load.py 20 --seconds 60    # ... for a minute
    python tools/load.py 20 -- tpu-info -p  # ... while the command runs; its exit code

In Python:
    >>> from tools.load import Load
    >>> with Load(20):                       # doctest: +SKIP
    ...     subprocess.run(["tpu-info", "report"])
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

# One busy worker: asks the kernel to kill it when its parent dies, then spins.
_WORKER = r"""
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)  # the parent is already gone
sys.stdout.write("1"); sys.stdout.flush(); sys.stdout.close()
x = 0
while True:
    x = (x * 1103515245 + 12345) & 0xFFFFFFFF
"""

DEFAULT_FACTOR = 10  # busy processes per core: "a load of 10x the cores"


def default_count() -> int:
    """Busy processes for a load of :data:`DEFAULT_FACTOR` times the cores."""
    return DEFAULT_FACTOR * (os.cpu_count() or 1)


class Load:
    """``count`` busy processes from :meth:`start` (or ``with``) to :meth:`stop`.

    Args:
        count: how many busy processes (each wants a whole core).
        nice: their niceness (0: they compete on equal terms, as a neighbour's
            job does).
    """

    def __init__(self, count: int | None = None, nice: int = 0) -> None:
        self.count = default_count() if count is None else count
        self.nice = nice
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> Load:
        """Starts the workers and returns once every one of them is running."""
        me = str(os.getpid())
        for _ in range(self.count):
            p = subprocess.Popen([sys.executable, "-S", "-c", _WORKER, me],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 process_group=0,
                                 preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
            self.procs.append(p)
        for p in self.procs:  # each says "1" once it spins
            assert p.stdout is not None
            p.stdout.read(1)
            p.stdout.close()
        return self

    def stop(self) -> None:
        """Kills every worker and reaps it (idempotent)."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()
        self.procs.clear()

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``load.py N [--seconds S] [-- COMMAND ...]``; returns the command's exit code."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("count", type=int, nargs="?", default=default_count(),
                   help=f"busy processes (default: {DEFAULT_FACTOR} per core)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = p.parse_args(argv[:cut]), argv[cut + 1:]  # after --: the command
    # A SIGTERM ends the load as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with Load(args.count):
        try:
            if command:
                started = time.monotonic()
                rc = subprocess.call(command)
                print(f"load.py: {' '.join(command)} exited {rc} after "
                      f"{time.monotonic() - started:.2f}s under {args.count} busy processes",
                      file=sys.stderr)
                return rc
            time.sleep(args.seconds if args.seconds is not None else 1e9)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

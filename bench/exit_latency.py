"""How much longer a hooked program takes to stop: SIGTERM, Ctrl-C and a normal end.

    python bench/exit_latency.py [--smoke] [--reps N] [--only jax,compile,xla] [--modes ...]
                                 [--serve process,thread]

A preempted TPU VM or a Kubernetes pod gets a grace period between SIGTERM
and SIGKILL; the hook must not spend it. Each row starts a fresh program,
hooked (``metrics.install()``, serving from its helper, the default) or not,
in alternated pairs, lets it loop, stops it, and times the stop:

* ``sigterm``: ``kill(pid, SIGTERM)`` to the program's exit (``waitpid``);
* ``sigint``: SIGINT to the program's process group, as a terminal's Ctrl-C
  (Python raises ``KeyboardInterrupt``), to the program's exit;
* ``end``: the program's last statement (a ``CLOCK_MONOTONIC`` stamp it
  prints) to its exit: interpreter shutdown, ``atexit`` and thread joins.

Serving: from its helper (``TPU_INFO_SERVE=process``, the default: no
SIGTERM handler in the program), or in-process (``serve=thread`` rows:
``TPU_INFO_SERVE=thread``, a gRPC server in the program and its own
SIGTERM handler, which removes the record, saves the run and dies by the
signal).

Programs: a jitted JAX loop; a ``torch.compile`` loop (Inductor; its FX
graph cache is warm after the first run); a ``torch_xla.launch`` program
(PJRT_DEVICE=CPU, in the torch_xla venv, skipped with the reason when it is
missing): its parent (blocked in ``launch`` while its worker loops) and its
worker (SIGTERM to the worker; the worker's exit seen through a pidfd).
After every exit the discovery record of the process that exited must be
gone (within 2 s: a serving helper removes the record of a program SIGTERM
killed). Exit times are seen through a pidfd. Target per row: median hooked
- median plain <= 50 ms, no record left.
"""

from __future__ import annotations

import argparse
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, keep_ctrl_c, median, verdict

XLA_VENV = Path.home() / ".cache/tpu-info/xla-venv-torch2.9.0-xla2.9.0"
TARGET_S = 0.050
EXIT_WAIT_S = 60.0  # a stop slower than this is recorded as this (and counted: "hung")

# Each program prints "READY <pid>" once looping, and "END <monotonic>" as
# its last statement when it ends normally (after a few more steps).
JAX = r"""
import os, sys, time
hooked, mode = sys.argv[1] == "hooked", sys.argv[2]
import jax, jax.numpy as jnp
if hooked:
    import metrics
    metrics.install()
f = jax.jit(lambda x: (x @ x).sum())
x = jnp.ones((64, 64))
f(x).block_until_ready()
print("READY", os.getpid(), flush=True)
n = 0
while mode != "end" or n < 50:
    f(x).block_until_ready()
    if hooked:
        metrics.mark_step()
    n += 1
print("END", time.monotonic(), flush=True)
"""

COMPILE = r"""
import os, sys, time
hooked, mode = sys.argv[1] == "hooked", sys.argv[2]
import torch
if hooked:
    import metrics
    metrics.install()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
step = torch.compile(model)
x = torch.randn(16, 32)
step(x)
print("READY", os.getpid(), flush=True)
n = 0
while mode != "end" or n < 50:
    with torch.no_grad():
        step(x).sum().item()
    if hooked:
        metrics.mark_step()
    n += 1
print("END", time.monotonic(), flush=True)
"""

# sys.argv reaches the spawned worker, which imports this file as __mp_main__.
XLA = r"""
import os, sys, time
hooked, mode = sys.argv[1] == "hooked", sys.argv[2]
if hooked:
    import metrics
    metrics.install()
import torch, torch_xla

def fn(index):
    dev = torch_xla.device()
    x = torch.ones(8, 8, device=dev)
    (x @ x).sum().item()
    print("READY", os.getpid(), flush=True)
    n = 0
    while mode != "worker-end" and mode != "end" or n < 20:
        (x @ x).sum().item()
        n += 1
    if mode == "worker-end":
        print("END", time.monotonic(), flush=True)

if __name__ == "__main__":
    torch_xla.launch(fn)
    print("END", time.monotonic(), flush=True)
"""


def _default_sigint() -> None:
    """In the program, before it starts: Ctrl-C does what it does at a terminal.
    A shell starts a background job (``make bench &``, ``nohup``) with SIGINT
    ignored, and a child inherits that: Python then installs no
    KeyboardInterrupt handler and every ``sigint`` row would hang for 60 s."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Trial:
    """One program run: started, stopped as the row says, timed."""

    def __init__(self, code: str, variant: str, mode: str, python: str, runtime: str,
                 env: dict[str, str], serve: str = "process") -> None:
        # A file, not -c: torch_xla's spawned worker imports the program by path.
        script = os.path.join(os.path.dirname(runtime), f"program-{abs(hash(code))}.py")
        if not os.path.exists(script):
            Path(script).write_text(code)
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [python, script, variant, mode], stdout=subprocess.PIPE,
            stderr=self.err, stdin=subprocess.DEVNULL, text=True, cwd=ROOT,
            env={**env, "TPU_INFO_RUNTIME_DIR": runtime, "TPU_INFO_SERVE": serve},
            start_new_session=True, preexec_fn=_default_sigint)
        self.runtime = runtime

    def stderr_tail(self) -> str:
        self.err.seek(0)
        lines = self.err.read().decode(errors="replace").strip().splitlines()
        return lines[-1][:200] if lines else "(nothing on stderr)"

    def line(self, word: str, timeout: float = 600.0) -> str:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                text = self.proc.stdout.readline()
                if not text:
                    break
                if text.startswith(word + " "):
                    return text.split()[1]
        raise RuntimeError(f"the program never printed {word} (exit {self.proc.poll()})")

    def record_left(self, pid: int) -> bool:
        """Whether ``pid``'s record is still there 2 s after its exit (a
        serving helper removes the record of a program SIGTERM killed)."""
        path = os.path.join(self.runtime, f"{pid}.json")
        deadline = time.monotonic() + 2.0
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.005)
        return os.path.exists(path)

    def close(self) -> None:
        """Kills whatever is left of the program's session (a worker an
        unhooked parent's SIGTERM orphaned), and reaps the program."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        for p in Path(self.runtime).glob("*.json"):
            p.unlink(missing_ok=True)
        self.err.close()


def _wait_pidfd(pid: int, timeout: float) -> float:
    """Monotonic time ``pid`` (not our child) exited, or now + nothing after ``timeout``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone already
        return time.monotonic()
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)
        return time.monotonic()
    finally:
        os.close(fd)


def _wait_child(proc: subprocess.Popen[str], timeout: float) -> float:
    """When our child exited (a pidfd: Popen.wait's timeout polls in steps
    of up to 50 ms)."""
    done = _wait_pidfd(proc.pid, timeout)
    try:
        proc.wait(1.0)
    except subprocess.TimeoutExpired:
        pass
    return done


def one(code: str, variant: str, mode: str, python: str, runtime: str,
        env: dict[str, str], serve: str = "process") -> tuple[float, bool]:
    """(seconds from the stop to the exit, whether its record was left); a
    program still there after EXIT_WAIT_S has its last stderr line printed."""
    secs, kept, t = _one(code, variant, mode, python, runtime, env, serve)
    if secs >= EXIT_WAIT_S:
        print(f"  {variant} {mode}: still running {EXIT_WAIT_S:.0f} s after the stop; its "
              f"stderr ends: {t}", flush=True)
    return secs, kept


def _one(code: str, variant: str, mode: str, python: str, runtime: str,
         env: dict[str, str], serve: str) -> tuple[float, bool, str]:
    program_mode = "worker-end" if mode == "worker-end" else (
        "end" if mode == "end" else "loop")
    t = Trial(code, variant, program_mode, python, runtime, env, serve)
    try:
        ready = int(t.line("READY"))
        if mode in ("end", "worker-end"):
            stamp = float(t.line("END"))
            if mode == "end":
                done = _wait_child(t.proc, EXIT_WAIT_S)
                return done - stamp, t.record_left(t.proc.pid), t.stderr_tail()
            done = _wait_pidfd(ready, EXIT_WAIT_S)
            return done - stamp, t.record_left(ready), t.stderr_tail()
        time.sleep(random.uniform(0.05, 0.25))  # land somewhere in the loop
        if mode == "worker-sigterm":
            t0 = time.monotonic()
            os.kill(ready, signal.SIGTERM)
            done = _wait_pidfd(ready, EXIT_WAIT_S)
            return done - t0, t.record_left(ready), t.stderr_tail()
        t0 = time.monotonic()
        if mode == "sigint":
            os.killpg(t.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        else:
            os.kill(t.proc.pid, signal.SIGTERM)
        done = _wait_child(t.proc, EXIT_WAIT_S)
        return done - t0, t.record_left(t.proc.pid), t.stderr_tail()
    finally:
        t.close()


Row = tuple[str, str, str, str, str | None, str]


def rows(only: set[str], smoke: bool, serve: set[str] | None = None) -> list[Row]:
    """(row name, code, mode, python, reason to skip, TPU_INFO_SERVE)."""
    serve = {"process"} if serve is None else serve
    py = sys.executable
    xla_py = str(XLA_VENV / "bin/python")
    xla_skip = None if os.path.exists(xla_py) else f"no torch_xla venv at {XLA_VENV}"
    out: list[Row] = []
    if "process" in serve:
        if "jax" in only:
            out += [("jax sigterm", JAX, "sigterm", py, None, "process")]
            if not smoke:
                out += [("jax sigint", JAX, "sigint", py, None, "process"),
                        ("jax end", JAX, "end", py, None, "process")]
        if "compile" in only and not smoke:
            out += [(f"torch.compile {m}", COMPILE, m, py, None, "process")
                    for m in ("sigterm", "sigint", "end")]
        if "xla" in only and not smoke:
            out += [("xla parent sigterm", XLA, "sigterm", xla_py, xla_skip, "process"),
                    ("xla parent sigint", XLA, "sigint", xla_py, xla_skip, "process"),
                    ("xla parent end", XLA, "end", xla_py, xla_skip, "process"),
                    ("xla worker sigterm", XLA, "worker-sigterm", xla_py, xla_skip, "process"),
                    ("xla worker end", XLA, "worker-end", xla_py, xla_skip, "process")]
    if "thread" in serve and not smoke:  # the in-process server and its SIGTERM handler
        if "jax" in only:
            out += [(f"jax {m} serve=thread", JAX, m, py, None, "thread")
                    for m in ("sigterm", "sigint", "end")]
        if "xla" in only:
            out += [(f"xla parent {m} serve=thread", XLA, m, xla_py, xla_skip, "thread")
                    for m in ("sigterm", "sigint", "end")]
    return out


def main() -> int:
    keep_ctrl_c()  # the Ctrl-C rows measure nothing where SIGINT is ignored
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one JAX SIGTERM pair")
    ap.add_argument("--reps", type=int, default=10, help="pairs per row (default 10)")
    ap.add_argument("--only", default="jax,compile,xla", help="programs: jax,compile,xla")
    ap.add_argument("--modes", default="sigterm,sigint,end",
                    help="stops: sigterm,sigint,end (a worker's rows go with sigterm and end)")
    ap.add_argument("--serve", default="process,thread",
                    help="where the hooked program serves: process (its helper, the default "
                         "of the hook), thread (in the program: serve=thread rows)")
    args = ap.parse_args()
    reps = 1 if args.smoke else args.reps
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("PJRT_DEVICE", "CPU")
    env.setdefault("TPU_INFO_PORT", "0")  # never take 8431 from a real libtpu
    print(f"load average {os.getloadavg()[0]:.2f}; {reps} alternated pairs a row")
    with tempfile.TemporaryDirectory() as tmp:
        runtime = os.path.join(tmp, "runtime")
        os.mkdir(runtime, 0o700)
        modes = set(args.modes.split(","))
        for name, code, mode, python, skip, serve in rows(
                set(args.only.split(",")), args.smoke, set(args.serve.split(","))):
            if mode.removeprefix("worker-") not in modes:
                continue
            if skip:
                print(f"{name}: skipped: {skip}")
                continue
            got: dict[str, list[float]] = {"plain": [], "hooked": []}
            left, hung = 0, {"plain": 0, "hooked": 0}
            try:
                for i in range(reps):
                    for variant in (("plain", "hooked") if i % 2 == 0 else ("hooked", "plain")):
                        secs, kept = one(code, variant, mode, python, runtime, env, serve)
                        got[variant].append(secs)
                        # (a program still running keeps its record, rightly)
                        left += kept and variant == "hooked" and secs < EXIT_WAIT_S
                        hung[variant] += secs >= EXIT_WAIT_S
            except RuntimeError as e:
                print(f"{name}: failed: {e}")
                return 1
            plain, hooked = median(got["plain"]), median(got["hooked"])
            print(f"{name}: plain {plain * 1e3:.0f} ms ({min(got['plain']) * 1e3:.0f}-"
                  f"{max(got['plain']) * 1e3:.0f}), hooked {hooked * 1e3:.0f} ms "
                  f"({min(got['hooked']) * 1e3:.0f}-{max(got['hooked']) * 1e3:.0f}), "
                  f"records left {left}/{reps}; still running at {EXIT_WAIT_S:.0f} s: plain "
                  f"{hung['plain']}, hooked {hung['hooked']}", flush=True)
            # Each row's verdict as soon as it is measured: a run stopped part way
            # (run_all's timeout, Ctrl-C) still reports the rows it finished.
            extra = hooked - plain
            verdict(f"exit {name} hooked - plain seconds", extra, f"<= {TARGET_S}",
                    extra <= TARGET_S and left == 0)
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

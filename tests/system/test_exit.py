"""Stopping a hooked program: SIGTERM, Ctrl-C (SIGINT) and a normal end do
what they do without the hook, and the hook's exit work waits on nothing.

A real JAX program, hooked (serving from its helper, the default) or not,
loops until it is stopped. The assertions are structural, never wall times:

* SIGTERM kills it by the signal (status -15), as without the hook: no
  ``SystemExit`` unwinds it, so neither its ``finally`` blocks nor its
  ``atexit`` handlers run (they did not without the hook either; before, the
  hook's handler raised ``SystemExit(143)`` and a JAX loop took 0.4 s, a
  torch.compile one 2 s, a ``torch_xla.launch`` parent 60 s to leave);
* its discovery record is gone every time (after SIGTERM, the helper
  removes it: the program has no Python SIGTERM handler, which would run
  only once the main thread came back from the engine's call);
* the exit waits for no helper: with the helper frozen (SIGSTOP) the
  program still ends, the frozen helper outlives it (nobody waited out a
  timeout and killed it), and once thawed the helper leaves by itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT

PROGRAM = r"""
import atexit, os, signal, sys, time
import jax, jax.numpy as jnp
hooked, mode, marks = sys.argv[1] == "hooked", sys.argv[2], sys.argv[3]
def mark(word):
    with open(marks, "a") as out:
        out.write(word + "\n")
atexit.register(mark, "ATEXIT")
if hooked:
    import metrics
    metrics.install()
f = jax.jit(lambda x: (x @ x).sum())
x = jnp.ones((16, 16))
f(x).block_until_ready()
helper = [c.pid for c in __import__("psutil").Process().children()]
try:  # READY inside: a signal that lands right after it lands in here
    print("READY", helper[0] if helper else 0,
          signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    if mode == "end":
        sys.stdin.readline()
    else:
        while True:
            f(x).block_until_ready()
finally:
    mark("FINALLY")
"""


def _start(tmp_path: Path, variant: str, mode: str
           ) -> tuple[subprocess.Popen[str], int, Path, bool]:
    """The program looping: (it, its helper's pid or 0, where it marks what
    ran, whether its SIGTERM disposition is still the default)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_INFO_RUNTIME_DIR=str(tmp_path),
               TPU_INFO_PORT="0", TPU_INFO_SERVE="process",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    marks = tmp_path / f"{variant}-{mode}.marks"
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, variant, mode, str(marks)],
                            env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", line
    return proc, int(line[1]), marks, line[2] == "True"


def _stop(proc: subprocess.Popen[str], marks: Path, how: str) -> tuple[int, list[str]]:
    """Stops the program; (its status, the marks it left: FINALLY, ATEXIT).
    Waits for the program itself, not for its pipes (a helper holds copies)."""
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "sigint":
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
    else:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        # Still running (a Ctrl-C lost at load 30: stop 28 saw it unhooked too):
        # never leave it looping past the test (one burnt a core for an hour).
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass
    return proc.returncode, marks.read_text().split() if marks.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "sigint", "end"])
def test_a_hooked_program_stops_as_an_unhooked_one_and_waits_for_no_helper(
        tmp_path: Path, how: str) -> None:
    plain, _, plain_marks, _ = _start(tmp_path, "plain", how)
    expected = _stop(plain, plain_marks, how)
    proc, helper_pid, marks, default_sigterm = _start(tmp_path, "hooked", how)
    # No Python SIGTERM handler: one runs only when the main thread next runs
    # Python code, so the program would outlive SIGTERM by the engine call it is in.
    assert default_sigterm
    helper = psutil.Process(helper_pid)
    assert "metrics.export.helper" in " ".join(helper.cmdline())
    record = tmp_path / f"{proc.pid}.json"
    assert record.exists()
    helper.suspend()  # a helper that cannot answer or leave: nothing may wait for it
    try:
        got = _stop(proc, marks, how)
        assert got == expected  # status, finally and atexit: as without the hook
        if how != "sigterm":  # the program removed its record itself
            assert not record.exists()
        assert helper.is_running() and helper.status() == psutil.STATUS_STOPPED
    finally:
        helper.resume()
    helper.wait(30)  # thawed, it reads its end of file and leaves by itself
    assert not record.exists()  # after SIGTERM the helper removed it


def test_what_sigterm_does_without_the_hook_is_what_the_test_expects(tmp_path: Path) -> None:
    """The reference the test above compares with: killed by the signal, no
    ``finally``, no ``atexit``."""
    plain, _, marks, default_sigterm = _start(tmp_path, "plain", "sigterm")
    assert default_sigterm
    assert _stop(plain, marks, "sigterm") == (-signal.SIGTERM, [])


# Ctrl-C's exit: the hook's save turns the automatic collector off for the
# rest of the exit (its allocations would otherwise start a full collection,
# 45 ms in a JAX program), and the interpreter's finalization still collects
# what the program left, so a cycle's __del__ runs as without the hook.
GC_PROGRAM = r"""
import atexit, gc, os, sys
import jax, jax.numpy as jnp
hooked, marks = sys.argv[1] == "hooked", sys.argv[2]
fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
class Cycle:
    def __init__(self):
        self.me = self
    def __del__(self, write=os.write, fd=fd):
        write(fd, b"COLLECTED\n")
def late():  # registered before install: runs after the hook's exit work
    os.write(fd, b"GC-ON\n" if gc.isenabled() else b"GC-OFF\n")
    Cycle()  # garbage in a cycle: only a collection frees it
atexit.register(late)
if hooked:
    import metrics
    metrics.install()
jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()
raise KeyboardInterrupt
"""


@pytest.mark.slow
def test_ctrl_c_s_exit_save_starts_no_full_collection_yet_cycles_are_collected(
        tmp_path: Path) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_INFO_RUNTIME_DIR=str(tmp_path),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TPU_INFO_SAVE", None)  # the suite saves nothing; this program does
    got = {}
    for variant in ("plain", "hooked"):
        marks = tmp_path / f"{variant}.marks"
        out = subprocess.run([sys.executable, "-c", GC_PROGRAM, variant, str(marks)], env=env,
                             cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert "KeyboardInterrupt" in out.stderr, out.stderr[-2000:]
        got[variant] = marks.read_text().split()
    assert got["plain"] == ["GC-ON", "COLLECTED"]
    assert got["hooked"] == ["GC-OFF", "COLLECTED"]
    assert list((tmp_path / "runs").glob("*.tpurun")), "the hooked run was not saved"

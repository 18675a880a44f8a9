"""A SystemExit or KeyboardInterrupt raised inside the Python code a hook
runs reaches the program, under the C hot path as under the Python hooks
(which catch ``Exception`` only): where a SIGTERM handler's exit lands when
the signal came while the engine ran. Real JAX on the CPU, real signals."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from metrics.recording import native  # noqa: E402
from metrics.recording.sampling import TIME_EVERY, TIME_FIRST  # noqa: E402
from tpu_info.contract import catalog as names  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _journal(path: str) -> Any:
    """The journal a hooked path folds into: the jitted calls', the explicit
    puts' or the device->host reads'."""
    from metrics.engines import jax_state

    eng = jax_state.active
    return {"call": eng.calls, "put": eng.explicit.journal, "read": eng.implicit.journal}[path]


def _path_runner(path: str) -> Callable[[int], None]:
    """Runs ``path`` n times a call: jitted calls, numpy puts or float reads."""
    f = jax.jit(lambda x: x + 1)
    x = jnp.ones(4)
    batch = np.ones(256, np.float32)

    def run(n: int) -> None:
        for _ in range(n):
            if path == "call":
                f(x)
            elif path == "put":
                jax.device_put(batch)
            else:
                float(f(x)[0])

    return run


def _run_path(path: str, n: int) -> None:
    _path_runner(path)(n)


@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("path", ["call", "put", "read"])
@pytest.mark.parametrize("kind", ["C", "Python"])
def test_an_exit_raised_inside_a_hook_s_python_helper_reaches_the_program(
        hooks, monkeypatch, kind, path, exc):
    """The hooks swallow Exception only. A SystemExit or KeyboardInterrupt
    raised in the Python code a hook runs (here the journal's fold: where a
    SIGTERM handler's SystemExit lands when the signal came while the engine
    ran) ends the program as it would have without the hook: under C too,
    where the call's result is dropped and the exception raised from it."""
    rec = hooks(kind)
    folds = []

    def fold(batch):  # type: ignore[no-untyped-def]
        folds.append(len(batch))
        raise exc(143) if exc is SystemExit else exc

    monkeypatch.setattr(_journal(path), "_fold", fold)
    with pytest.raises(exc):
        _run_path(path, 50_000)
    assert folds, "the fold never ran"
    rec.flush()
    assert rec.registry.counter_value(names.HOOK_ERRORS) in (None, 0)


@pytest.mark.parametrize("path", ["call", "put", "read"])
def test_an_exit_raised_while_a_c_hook_counts_its_failure_reaches_the_program(
        hooks, monkeypatch, path):
    """A signal handler can run inside the code that counts a C hook's
    failure too (its ``on_error``): the SystemExit raised there ends the
    program instead of being cleared with the failure."""
    from metrics.recording.journal import Journal

    rec = hooks("C")
    run = _path_runner(path)
    run(2 * TIME_FIRST)  # compiled, past the timed calls: the usual path, in C

    def broken(self):  # type: ignore[no-untyped-def]
        raise ValueError("a broken journal")

    def interrupted(where, e):  # type: ignore[no-untyped-def]
        raise SystemExit(143)

    monkeypatch.setattr(Journal, "flush_held", broken)
    monkeypatch.setattr(rec, "hook_failed", interrupted)
    with pytest.raises(SystemExit):
        run(50_000)


def test_ctrl_c_inside_a_c_hook_s_python_helper_still_reaches_the_program(hooks, monkeypatch):
    """The Python hooks swallow Exception only; a KeyboardInterrupt raised in
    the Python code the C wrapper calls (here the numpy report) is not
    swallowed: it reaches the program from the call."""
    hooks("C")
    from metrics.engines import jax_state

    f = jax.jit(lambda x: x + 1)
    for _ in range(TIME_FIRST + 1):
        f(np.ones(2, np.float32))  # learns it takes numpy; now past the timed calls

    def interrupted(owner, args):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(jax_state.active.implicit.jit_arguments, "report", interrupted)
    with pytest.raises(KeyboardInterrupt):
        for _ in range(TIME_EVERY - 1):  # the untimed calls, in C, before the next timed one
            f(np.ones(2, np.float32))


SIGTERM_PROGRAM = r"""
import os, signal, sys
import numpy as np
import jax, jax.numpy as jnp
import metrics
from metrics.recording import native
if sys.argv[1] == "Python":
    native.NATIVE = None
metrics.install(engines=["jax"])  # serves: its SIGTERM handler stops serving, then exits
journal = {"call": lambda e: e.calls, "put": lambda e: e.explicit.journal,
           "read": lambda e: e.implicit.journal}[sys.argv[2]]
from metrics.engines import jax_state
j = journal(jax_state.active)
fold = j._fold
def fold_then_sigterm(batch):
    fold(batch)
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, in the hook's fold
j._fold = fold_then_sigterm
f = jax.jit(lambda x: x + 1)
x = jnp.ones(4)
batch = np.ones(256, np.float32)
for i in range(50_000):
    if sys.argv[2] == "call":
        x = f(x)
    elif sys.argv[2] == "put":
        jax.device_put(batch)
    else:
        float(f(x)[0])
print("still running after SIGTERM", flush=True)
"""


@pytest.mark.parametrize("path", ["call", "put", "read"])
@pytest.mark.parametrize("kind", ["C", "Python"])
def test_sigterm_landing_in_a_hook_s_fold_ends_the_program(tmp_path, kind, path):
    """A real SIGTERM whose handler runs inside the hook's Python fold (the
    next Python code after the engine ran) ends a serving program with 143,
    its discovery record removed: under the C hooks it was swallowed as a
    hook failure and the program trained on, unserved (`make demo`: 1 stop
    in 10 did not stop)."""
    if kind == "C" and native.built() is None:
        pytest.skip("the C hot path is not built here")
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_INFO_RUNTIME_DIR=str(tmp_path),
               TPU_INFO_PORT="0", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", SIGTERM_PROGRAM, kind, path], env=env,
                         capture_output=True, text=True, timeout=180)
    assert "still running" not in out.stdout
    assert out.returncode in (143, -15), out.stderr[-2000:]
    assert list(tmp_path.glob("*.json")) == []

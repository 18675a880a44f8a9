"""A SystemExit or KeyboardInterrupt raised inside the Python code a hook
runs reaches the program (the hooks catch ``Exception`` only): where a
SIGTERM handler's exit lands when the signal came while the engine ran.
Real JAX on the CPU, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from metrics.recording.sampling import TIME_FIRST  # noqa: E402
from tpu_info.contract import catalog as names  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _journal(path: str) -> Any:
    """The journal a hooked path folds into: the jitted calls', the explicit
    puts' or the device->host reads'."""
    from metrics.engines.jax.context import CONTEXT as jax_context

    eng = jax_context.active
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
def test_an_exit_raised_inside_a_hook_s_python_helper_reaches_the_program(
        hooks, monkeypatch, path, exc):
    """The hooks swallow Exception only. A SystemExit or KeyboardInterrupt
    raised in the Python code a hook runs (here the journal's fold: where a
    SIGTERM handler's SystemExit lands when the signal came while the engine
    ran) ends the program as it would have without the hook."""
    rec = hooks()
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


SIGTERM_PROGRAM = r"""
import os, signal, sys
import numpy as np
import jax, jax.numpy as jnp
import metrics
metrics.install(engines=["jax"])  # serves: its SIGTERM handler stops serving, then exits
journal = {"call": lambda e: e.calls, "put": lambda e: e.explicit.journal,
           "read": lambda e: e.implicit.journal}[sys.argv[1]]
from metrics.engines.jax.context import CONTEXT as jax_context
j = journal(jax_context.active)
fold = j._fold
def fold_then_sigterm(batch):
    fold(batch)
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, in the hook's fold
j._fold = fold_then_sigterm
f = jax.jit(lambda x: x + 1)
x = jnp.ones(4)
batch = np.ones(256, np.float32)
for i in range(50_000):
    if sys.argv[1] == "call":
        x = f(x)
    elif sys.argv[1] == "put":
        jax.device_put(batch)
    else:
        float(f(x)[0])
print("still running after SIGTERM", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("path", ["call", "put", "read"])
def test_sigterm_landing_in_a_hook_s_fold_ends_the_program(tmp_path, path):
    """A real SIGTERM whose handler runs inside the hook's Python fold (the
    next Python code after the engine ran) ends a serving program with 143,
    its discovery record removed (a hook that swallowed it as its own
    failure trained on, unserved: `make demo` once did not stop)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_INFO_RUNTIME_DIR=str(tmp_path),
               TPU_INFO_PORT="0", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", SIGTERM_PROGRAM, path], env=env,
                         capture_output=True, text=True, timeout=180)
    assert "still running" not in out.stdout
    assert out.returncode in (143, -15), out.stderr[-2000:]
    assert list(tmp_path.glob("*.json")) == []


def _inner_fold(path: str) -> Any:
    from metrics.engines.jax.context import CONTEXT as jax_context

    eng = jax_context.active
    return {"call": eng.runs._fold, "put": eng.explicit._fold, "read": eng.implicit._fold}[path]


@pytest.mark.parametrize("from_handler", [True, False])
@pytest.mark.parametrize("path", ["call", "put", "read"])
def test_an_exception_a_signal_handler_raises_in_a_fold_reaches_the_program(
        hooks, monkeypatch, path, from_handler):
    """A handler of the program's own (a SIGALRM timeout, a preemption
    handler) raising an ordinary exception while the hook folds: the program
    gets it, as it would without the hook. The same exception raised by the
    fold itself is the hook's failure: counted and swallowed."""
    rec = hooks()
    run = _path_runner(path)
    run(2 * TIME_FIRST)
    inner = _inner_fold(path)

    def on_usr1(signum, frame):  # type: ignore[no-untyped-def]
        raise TimeoutError("the program's own timeout")

    def fold(batch):  # type: ignore[no-untyped-def]
        if from_handler:
            os.kill(os.getpid(), signal.SIGUSR1)  # its handler runs here, inside the fold
        else:
            raise TimeoutError("a broken fold")
        inner(batch)

    errors = rec.registry.counter_value(names.HOOK_ERRORS) or 0
    previous = signal.signal(signal.SIGUSR1, on_usr1)
    try:
        monkeypatch.setattr(_journal(path), "_fold", rec._guarded_fold(fold))
        if from_handler:
            with pytest.raises(TimeoutError, match="own timeout"):
                run(50_000)
        else:
            run(20_000)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    monkeypatch.undo()
    after = rec.registry.counter_value(names.HOOK_ERRORS) or 0
    assert after == errors if from_handler else after > errors


PREEMPTED_PROGRAM = r"""
import os, signal, sys
import numpy as np
import jax
import metrics
metrics.install(engines=["jax"])

class Preempted(Exception):
    pass

def on_sigterm(signum, frame):  # the program's own: checkpoint on preemption
    raise Preempted()

signal.signal(signal.SIGTERM, on_sigterm)
from metrics.engines.jax.context import CONTEXT as jax_context
eng = jax_context.active
inner = eng.explicit._fold
def fold_then_sigterm(batch):
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, in the hook's fold
    inner(batch)
eng.explicit.journal._fold = metrics.recorder()._guarded_fold(fold_then_sigterm)
batch = np.ones(256, np.float32)
try:
    for i in range(50_000):
        jax.device_put(batch)
except Preempted:
    print("checkpointed after", i, "puts", flush=True)
    sys.exit(0)
print("still running after SIGTERM", flush=True)
"""


@pytest.mark.slow
def test_a_preemption_handler_s_exception_reaches_the_training_loop(tmp_path):
    """The usual preemption pattern (SIGTERM handler raising the program's own
    exception, caught around the loop to checkpoint), with the signal landing
    in the hook's fold of a serving program: the loop catches it."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_INFO_RUNTIME_DIR=str(tmp_path),
               TPU_INFO_PORT="0", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", PREEMPTED_PROGRAM], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "checkpointed after" in out.stdout


def test_which_exceptions_are_the_program_s():
    """Only an exception raised under a function installed as a signal
    handler is the program's; the same code called otherwise, or an error of
    the hook's own, is not; nor is anything on another thread."""
    import threading

    from metrics.recording import interrupts

    def on_alarm(signum, frame):  # type: ignore[no-untyped-def]
        raise TimeoutError("step too slow")

    def caught(fn):  # type: ignore[no-untyped-def]
        try:
            fn()
        except TimeoutError as e:
            return e
        raise AssertionError("no exception")

    from_handler = caught(lambda: on_alarm(signal.SIGALRM, None))
    own = caught(lambda: (_ for _ in ()).throw(TimeoutError("the hook's own")))
    assert not interrupts.from_signal_handler(from_handler)  # not installed yet
    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        assert interrupts.from_signal_handler(from_handler)
        assert not interrupts.from_signal_handler(own)
        seen = []
        t = threading.Thread(target=lambda: seen.append(interrupts.from_signal_handler(
            from_handler)))
        t.start()
        t.join()
        assert seen == [False]
    finally:
        signal.signal(signal.SIGALRM, previous)

"""The C hot path (metrics.recording._native) against the Python hooks it
stands in for: the same program gives the same readings under both, the
wrapper keeps what a jitted function offers, a failure while recording is
counted and swallowed, and the switch (TPU_INFO_PURE_PYTHON) works.

Real JAX on the CPU; each program runs under both hooks
(``metrics.recording.native.NATIVE`` is set before install, which is when
the hooks are made)."""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import subprocess
import sys
import weakref
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import metrics  # noqa: E402
from metrics.recording import native  # noqa: E402
from metrics.recording.sampling import TIME_EVERY, TIME_FIRST  # noqa: E402
from tpu_info.contract import catalog as names  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _readings(rec: Any) -> dict[str, Any]:
    rec.flush()
    reg = rec.registry
    out: dict[str, Any] = {}
    for name in (names.EXECUTE_COUNT, "ImplicitTransferToDevice", names.HOOK_ERRORS):
        out[name] = reg.counter_value(name)
    for name in (names.OUTBOUND_DATA, names.EXECUTE_TIME, names.TRANSFER_TO_DEVICE_TIME):
        data = reg.metric_data(name)
        out[name] = None if data is None else (data[0], data[1] if "Data" in name else None)
    # Graphs that ran (JAX's own small compiles happen in the first run only).
    out["executions"] = sorted((g.name, g.executions) for g in rec.ledger.snapshot()
                               if g.executions)
    steps = metrics.steps() if hasattr(metrics, "steps") else None
    out["steps"] = None if steps is None else steps.count
    return out


def _program() -> None:
    """A small training program with every usual and unusual call: numpy
    batches put explicitly and passed straight in, nested numpy, a recompile
    (a short last batch), two graphs of one function, an argument error, and
    a list put."""
    step = jax.jit(lambda p, x, y: (p - 0.01 * ((x @ p) - y).sum(), ((x @ p) - y).sum()))
    p = jnp.ones((8, 1))
    rng = np.random.default_rng(0)
    for i in range(TIME_FIRST + 5 * TIME_EVERY + 3):
        x = rng.standard_normal((4, 8), dtype=np.float32)
        y = rng.standard_normal((4, 1), dtype=np.float32)
        if i % 3 == 0:
            p, _ = step(p, x, y)  # numpy straight into the jitted call
        else:
            p, _ = step(p, jax.device_put(x), jax.device_put(y))
    p, _ = step(p, np.ones((3, 8), np.float32), np.ones((3, 1), np.float32))  # recompiles
    nested = jax.jit(lambda batch: batch[0].sum() + batch[1].sum())
    for _ in range(TIME_FIRST + 2 * TIME_EVERY):
        nested((np.ones(4, np.float32), np.ones(2, np.float32)))
    two = jax.jit(lambda x: x * 2)
    for i in range(TIME_FIRST + 3 * TIME_EVERY):
        two(jnp.ones(4 if i % 2 else 5))
    with pytest.raises(TypeError):
        step(p)  # an argument error raises through the hook, unchanged
    jax.device_put([np.ones(3, np.float32), np.ones(5, np.float32)])
    jax.block_until_ready(p)


def test_the_c_hot_path_is_built_where_a_compiler_is():
    """`make venv` compiles it; a missing module here would make every other
    test of it skip, so this one says so."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python hooks run")
    assert native.built() is not None, native.status()


def test_the_same_program_reads_the_same_under_both(hooks):
    readings = {}
    for kind in ("Python", "C"):
        rec = hooks(kind)
        _program()
        readings[kind] = _readings(rec)
    python, c = readings["Python"], readings["C"]
    assert python == c
    assert python[names.EXECUTE_COUNT] >= 3 * TIME_FIRST  # the program ran counted
    assert python[names.HOOK_ERRORS] in (None, 0)


@pytest.mark.parametrize("kind", ["Python", "C"])
def test_numpy_nested_in_a_batch_counts_once_a_call(hooks, kind):
    """The compiling first call's numpy leaves move through the numpy shard
    handler under the wrapper; they are its one transfer, not two (the C
    wrapper has no Python frame there: the handler asks
    ``native.calling()``), and each later call counts one."""
    rec = hooks(kind)
    nested = jax.jit(lambda batch: batch[0].sum() + batch[1].sum())
    calls = TIME_FIRST + 2 * TIME_EVERY
    for _ in range(calls):
        nested((np.ones(4, np.float32), np.ones(2, np.float32)))
    rec.flush()
    assert rec.registry.counter_value("ImplicitTransferToDevice") == calls
    assert rec.registry.metric_data(names.OUTBOUND_DATA)[:2] == (calls, 24.0 * calls)


def test_a_usual_training_step_runs_no_python_frame_of_the_hook(hooks):
    """Under the C hot path warm steps (the jitted call, its two puts and
    a ``float(loss)``), timed or not, run no frame in metrics/ (in Python:
    every call runs one, a timed one two)."""
    hooks("C")
    root = os.path.dirname(metrics.__file__) + os.sep
    step = jax.jit(lambda p, x, y: ((x @ p[0]) - y).sum())
    params = (jnp.ones((784, 10)),)
    x, y = np.ones((32, 784), np.float32), np.ones((32, 10), np.float32)

    def steps(n: int) -> dict[str, int]:
        frames: dict[str, int] = {}

        def profile(frame, event, arg):  # type: ignore[no-untyped-def]
            if event == "call" and frame.f_code.co_filename.startswith(root):
                frames[frame.f_code.co_name] = frames.get(frame.f_code.co_name, 0) + 1

        sys.setprofile(profile)
        try:
            for _ in range(n):
                float(step(params, jax.device_put(x), jax.device_put(y)))
        finally:
            sys.setprofile(None)
        return frames

    for _ in range(TIME_FIRST):
        float(step(params, jax.device_put(x), jax.device_put(y)))
    steps(TIME_EVERY)  # its line's first read classifies the line (once, in Python)
    metrics.recorder().flush()
    assert type(step).__name__ == "Counting"
    assert steps(TIME_EVERY) == {}
    metrics.recorder().flush()
    assert metrics.counter_value(names.EXECUTE_COUNT) == TIME_FIRST + 2 * TIME_EVERY
    assert metrics.counter_value("ImplicitTransferFromDevice") == TIME_FIRST + 2 * TIME_EVERY


def _syncs() -> None:
    """Every kind of device->host read, each from its own line, many times."""
    x, v = jnp.float32(3.0) * 2, jnp.arange(6.0)
    for _ in range(TIME_EVERY + 3):
        float(x)
        int(x)
        if x > 0:
            pass
        x.item()  # on CPU: the buffer, not _value
        v.tolist()
        repr(v)
        np.asarray(v)  # on CPU: the buffer, not _value
    jax.device_get(v)  # explicit: counted once, by its wrapper


def _sync_readings(rec: Any) -> dict[str, Any]:
    rec.flush()
    reg = rec.registry
    eng = next(e for e in metrics.installed_engines() if e.name == "jax")
    return {"implicit": reg.counter_value("ImplicitTransferFromDevice"),
            "inbound": reg.metric_data(names.INBOUND_DATA)[:2],
            "time": reg.metric_data(names.TRANSFER_FROM_DEVICE_TIME)[0],
            "errors": reg.counter_value(names.HOOK_ERRORS),
            "sites": sorted((s.location, s.kind, s.detail, s.count, s.bytes)
                            for s in eng.sites() if s.kind == "sync")}


def test_device_to_host_reads_read_the_same_under_both(hooks):
    """The ``_value`` getter in C (``SyncValue``) records what the Python
    one does: each read with its line, kind, bytes; ``jax.device_get``
    once; no hook error."""
    readings = {}
    for kind in ("Python", "C"):
        rec = hooks(kind)
        from jax._src.array import ArrayImpl

        getter = ArrayImpl.__dict__["_value"].fget
        assert (type(getter).__name__ == "SyncValue") == (kind == "C")
        _syncs()
        readings[kind] = _sync_readings(rec)
    python, c = readings["Python"], readings["C"]
    assert python == c
    # item() and np.asarray() read CPU buffers without _value (a blind spot
    # the report names): five kinds of read counted, each from its line.
    assert python["implicit"] == 5 * (TIME_EVERY + 3)
    assert len(python["sites"]) == 5 and python["errors"] in (None, 0)


def test_the_wrapper_keeps_what_a_jitted_function_offers(hooks):
    hooks("C")

    def scale(x, k=2):
        """Scales x."""
        return x * k

    jitted = jax.jit(scale, static_argnames="k")
    assert type(jitted).__name__ == "Counting"
    assert jitted.__name__ == "scale" and jitted.__doc__ == "Scales x."
    assert jitted.__wrapped__ is scale
    assert list(inspect.signature(jitted).parameters) == ["x", "k"]
    assert jitted.lower(jnp.ones(3)).as_text()  # lower() works
    assert jitted(jnp.ones(3), k=3).tolist() == [3.0, 3.0, 3.0]  # keyword arguments
    assert weakref.ref(jitted)() is jitted

    class Model:
        double = jax.jit(lambda self, x: x * 2, static_argnums=0)

    assert Model().double(jnp.ones(2)).tolist() == [2.0, 2.0]  # binds like a function
    tracked = metrics.track(jax.jit(lambda x: x + 1), name="step")
    assert tracked(jnp.ones(2)).tolist() == [2.0, 2.0]
    assert functools.wraps(scale)(jitted) is jitted


def test_a_failure_while_recording_is_counted_and_swallowed(hooks):
    rec = hooks("C")
    from metrics.engines.jax.context import CONTEXT as jax_context

    eng = jax_context.active
    step = jax.jit(lambda x: x + 1)
    saved = eng.calls_queue
    eng.calls_queue = "not a list"  # the journal the C path writes to, broken
    try:
        out = step(jnp.ones(2))
    finally:
        eng.calls_queue = saved
    assert out.tolist() == [2.0, 2.0]
    assert rec.registry.counter_value(names.HOOK_ERRORS) >= 1


def test_uninstalled_the_wrapper_passes_calls_through(hooks):
    rec = hooks("C")
    step = jax.jit(lambda x: x + 1)
    step(jnp.ones(2))
    metrics.uninstall()
    for _ in range(3 * TIME_EVERY):
        assert step(jnp.ones(2)).tolist() == [2.0, 2.0]
    rec.flush()
    assert rec.registry.counter_value(names.EXECUTE_COUNT) == 1


@pytest.mark.slow
def test_pure_python_switch():
    env = dict(os.environ, TPU_INFO_PURE_PYTHON="1", JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("import jax, metrics; from metrics.recording import native; "
            "metrics.install(engines=['jax'], serve=False); f = jax.jit(lambda x: x); "
            "print(type(f).__name__, native.status())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    kind, status = out.stdout.strip().split(" ", 1)
    assert kind == "function" and status.startswith("Python (TPU_INFO_PURE_PYTHON=1)")


def test_bytes_of_every_kind_of_array_put_are_numpy_s_own(hooks):
    """The C handler reads an array's byte count from its head (NumPy's
    layout, checked at install against numpy's own ``nbytes``); every dtype,
    a strided view, a transposed one and a 0-d array count exactly, as what
    moves (with x64 off, JAX moves float64 and int64 as 32-bit)."""
    rec = hooks("C")
    arrays = [np.ones((32, 784), np.float32), np.ones((), np.int8), np.ones(5, np.bool_),
              np.ones((6, 4), np.float64)[::2, 1:], np.ones(3, np.float16),
              np.ones((2, 2), np.int64),
              np.ones(7, np.complex64), np.ones((3, 3), np.int32).T]
    puts = [a for a in arrays for _ in range(TIME_EVERY + 1)]
    for _ in range(TIME_FIRST):  # past the timed first puts: the untimed path in C
        jax.device_put(np.ones(1, np.float32))
    rec.reset()
    for a in puts:
        jax.device_put(a)
    rec.flush()
    from jax._src.interpreters import pxla

    assert type(pxla.shard_arg_handlers[np.ndarray]).__name__ == "ShardPut"
    count, total = rec.registry.metric_data(names.OUTBOUND_DATA)[:2]
    moved = sum(a.size * np.dtype(jax.dtypes.canonicalize_dtype(a.dtype)).itemsize for a in puts)
    assert (count, total) == (len(puts), moved)


def test_a_subclass_s_bytes_are_read_from_its_head():
    """What JAX's shard handler gets is its own ndarray subclass
    (TypedNdArray, every numpy batch canonicalized): its byte count is read
    from the head too, exactly, as for a subclass of the program's own."""
    if native.built() is None:
        pytest.skip("the C hot path is not built here")
    from jax._src import dtypes

    looked_up = []

    class Tagged(np.ndarray):
        @property
        def nbytes(self) -> int:  # not asked: the head says it
            looked_up.append(1)
            return np.ndarray.nbytes.__get__(self)  # type: ignore[attr-defined,no-any-return]

    arrays = [dtypes.canonicalize_value(np.ones((64, 32), np.float32)),
              dtypes.canonicalize_value(np.ones((3, 5), np.float64)),
              np.ones((4, 6), np.int16)[:, ::3].view(Tagged)]
    assert type(arrays[0]) is not np.ndarray
    ndarray = native.array_layout(np.ndarray)
    assert ndarray is np.ndarray
    got = [native.built().array_nbytes(a, ndarray) for a in arrays]
    assert looked_up == []
    assert got == [a.nbytes for a in arrays]


def test_the_c_hooks_hold_no_reference_to_what_they_passed(hooks):
    """Every path of the C callables (usual, timed, numpy arguments, several
    graphs, a call that raises, a put, a device->host read) leaves the reference counts of the
    arguments, the owner and the function as it found them."""
    hooks("C")
    f = jax.jit(lambda x, y: x + y)
    x, a = jnp.ones(16), np.ones(16, np.float32)
    short = jnp.ones(8)

    def calls() -> None:
        for i in range(TIME_FIRST + 4 * TIME_EVERY):
            f(x, x)
            f(x, a)  # numpy: the Python timed call and the report
            f(short if i % 2 else x, short if i % 2 else x)  # two graphs: keyed
            jax.device_put(a)
            float(s)  # a device->host read: the getter in C, the usual path
            str(x)  # and through two library frames (the walk)
            with pytest.raises(TypeError):
                f(x)  # a missing argument raises through, recorded nowhere
        metrics.recorder().flush()

    s = jnp.float32(2.0) * 2
    calls()  # compiles, first timed calls, caches
    owner, fn = f._owner, f.__wrapped__
    code = calls.__code__  # the reads' user code: held once by the hook, not per read
    before = [sys.getrefcount(o) for o in (x, a, short, owner, fn, s, code)]
    calls()
    assert [sys.getrefcount(o) for o in (x, a, short, owner, fn, s, code)] == before


MULTI_DEVICE = r"""
import sys
import numpy as np, jax, metrics
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from metrics.recording import native
if sys.argv[1] == "Python":
    native.NATIVE = None
rec = metrics.install(engines=["jax"], serve=False)
mesh = Mesh(np.array(jax.devices()), ("x",))
# elementwise: no collective (an all-reduce's rendezvous between the two CPU
# devices can time out on a loaded 2-core machine and abort the process)
f = jax.jit(lambda a: a * 2, in_shardings=NamedSharding(mesh, P("x")))
for _ in range(int(sys.argv[2])):
    f(np.ones(8, np.float32))
rec.flush()
r = rec.registry
print(len(jax.devices()), r.counter_value("ImplicitTransferToDevice"),
      r.metric_data("OutboundData")[1], r.counter_value("ExecuteComputation"))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Python", "C"])
def test_numpy_arguments_on_two_devices_count_once_a_call(kind):
    """On several devices JAX's numpy shard handler runs on every call of a
    jitted function given numpy: under the C wrapper (no frame of it for the
    handler's walk) each call is still one transfer, as under Python."""
    if kind == "C" and native.built() is None:
        pytest.skip("the C hot path is not built here")
    calls = TIME_FIRST + 3 * TIME_EVERY
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", MULTI_DEVICE, kind, str(calls)], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    devices, implicit, nbytes, executions = out.stdout.split()
    assert (int(devices), int(implicit), float(nbytes), int(executions)) == (
        2, calls, 32.0 * calls, calls)


def test_a_put_in_device_put_s_scope_is_known_explicit_without_asking_jax(hooks, monkeypatch):
    """Under C, ``jax.device_put`` runs in its ``ExplicitScope``: the numpy
    handler knows its puts are explicit without JAX's transfer state (two
    calls into jaxlib a put). A put through JAX's own ``device_put`` (a
    reference taken before install), or after a put that raised, asks it and
    is still counted explicit; uninstalled, JAX's own is back."""
    from jax._src import api

    from metrics.engines.jax import to_device as jax_to_device

    asked = []
    own_state = jax_to_device._guard_state()

    def state():  # type: ignore[no-untyped-def]
        asked.append(1)
        return own_state()

    monkeypatch.setattr(jax_to_device, "_guard_state", lambda: state)
    rec = hooks("C")
    assert type(jax.device_put).__name__ == "ExplicitScope"
    assert jax.device_put.__wrapped__ is api.device_put
    assert inspect.signature(jax.device_put) == inspect.signature(api.device_put)
    a = np.ones((4, 8), np.float32)
    puts = TIME_FIRST + 2 * TIME_EVERY
    for _ in range(puts):  # timed and untimed
        jax.device_put(a)
    rec.flush()
    assert asked == []
    assert rec.registry.metric_data(names.OUTBOUND_DATA)[:2] == (puts, 128.0 * puts)
    with pytest.raises(ValueError):
        jax.device_put(a, device="no such device")  # raises inside the scope
    rec.reset()
    for _ in range(TIME_EVERY):
        api.device_put(a)  # JAX's own: the state is asked, the put explicit
    rec.flush()
    assert len(asked) == TIME_EVERY
    assert rec.registry.metric_data(names.OUTBOUND_DATA)[:2] == (TIME_EVERY, 128.0 * TIME_EVERY)
    assert rec.registry.counter_value("ImplicitTransferToDevice") in (None, 0)
    metrics.uninstall()
    assert jax.device_put is api.device_put


def test_a_marked_step_runs_no_frame_of_the_recorder(hooks):
    """Under C a recorder's ``mark_step`` is its ``StepMarker``: the same
    clock append as the Python method (``MarkStep``, ``StepTime``), no frame
    of ``metrics/recording``, and a stray argument is a TypeError."""
    from metrics.recording.recorder import Recorder

    hooks("C")  # NATIVE on: a recorder made now gets the C marker
    rec = Recorder()
    assert type(rec.mark_step).__name__ == "StepMarker"
    root = os.path.join(os.path.dirname(metrics.__file__), "recording") + os.sep
    frames: list[str] = []

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_filename.startswith(root):
            frames.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        for _ in range(50):
            rec.mark_step()
    finally:
        sys.setprofile(None)
    assert frames == []
    with pytest.raises(TypeError):
        rec.mark_step(1)  # type: ignore[call-arg]
    rec.flush()
    assert rec.registry.counter_value(names.MARK_STEP) == 50
    data = rec.registry.metric_data(names.STEP_TIME)
    assert data[0] == 49 and data[1] > 0


@pytest.mark.slow
def test_a_module_built_from_an_older_source_runs_the_python_hooks():
    """A compiled module lacking one of the callables (a checkout updated
    without reinstalling) is not used at all: every hook runs in Python and
    the status line says to reinstall."""
    code = ("import sys, types\n"
            "old = types.ModuleType('metrics.recording._native')\n"
            "old.Counting = old.ShardPut = object  # what an older build had\n"
            "sys.modules['metrics.recording._native'] = old\n"
            "from metrics.recording import native\n"
            "print(native.native() is None, native.built() is None)\n"
            "print(native.status())\n")
    if native.built() is None:
        pytest.skip("the C hot path is not built here")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TPU_INFO_PURE_PYTHON", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    flags, status = out.stdout.splitlines()
    assert flags == "True True"
    assert "older source" in status and "ExplicitScope" in status and "reinstall" in status

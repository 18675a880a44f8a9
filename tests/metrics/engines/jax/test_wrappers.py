"""The JAX hooks' wrappers (``jax.jit``'s, the numpy shard handler, the
``_value`` getter): a program's readings, what a jitted function offers kept,
a failure while recording counted and swallowed, no reference held, nothing
left after uninstall. Real JAX on the CPU.

(Until issue 32 a C extension ran the usual calls; measured against these
Python hooks on a quiet machine it was not needed for the targets: see
``bench/overhead_jax.py``.)"""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
import time
import weakref
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import metrics  # noqa: E402
from metrics.recording.sampling import TIME_EVERY, TIME_FIRST  # noqa: E402
from tpu_info.contract import catalog as names  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))


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


def test_a_program_reads_what_it_did(hooks):
    """Every usual and unusual call of a small program counted, none of it a
    hook error."""
    rec = hooks()
    _program()
    got = _readings(rec)
    assert got[names.EXECUTE_COUNT] >= 3 * TIME_FIRST
    assert got[names.HOOK_ERRORS] in (None, 0)
    assert ("jit(<lambda>)", TIME_FIRST + 5 * TIME_EVERY + 3) in got["executions"]


def test_numpy_nested_in_a_batch_counts_each_leaf_as_the_transfer_guard_does(hooks):
    """The compiling first call's numpy leaves move through the numpy shard
    handler under the wrapper (one batch: one transfer, not counted again by
    the wrapper); each later call counts one per leaf (issue 41 item 5: JAX's
    transfer guard logs two a call)."""
    rec = hooks()
    nested = jax.jit(lambda batch: batch[0].sum() + batch[1].sum())
    calls = TIME_FIRST + 2 * TIME_EVERY
    for _ in range(calls):
        nested((np.ones(4, np.float32), np.ones(2, np.float32)))
    rec.flush()
    assert rec.registry.counter_value("ImplicitTransferToDevice") == 2 * calls - 1
    assert rec.registry.metric_data(names.OUTBOUND_DATA)[:2] == (2 * calls - 1, 24.0 * calls)


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


def test_device_to_host_reads_are_counted_at_their_lines(hooks):
    """The ``_value`` getter records each read with its line, kind, bytes;
    ``jax.device_get`` once; no hook error."""
    rec = hooks()
    _syncs()
    python = _sync_readings(rec)
    # item() and np.asarray() read CPU buffers without _value (a blind spot
    # the report names): five kinds of read counted, each from its line.
    assert python["implicit"] == 5 * (TIME_EVERY + 3)
    assert len(python["sites"]) == 5 and python["errors"] in (None, 0)


def test_the_wrapper_keeps_what_a_jitted_function_offers(hooks):
    hooks()

    def scale(x, k=2):
        """Scales x."""
        return x * k

    jitted = jax.jit(scale, static_argnames="k")
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
    rec = hooks()
    from metrics.engines.jax.context import CONTEXT as jax_context

    eng = jax_context.active
    step = jax.jit(lambda x: x + 1)
    saved = eng.calls_queue
    eng.calls_queue = "not a list"  # the journal the wrapper writes to, broken
    try:
        out = step(jnp.ones(2))
    finally:
        eng.calls_queue = saved
    assert out.tolist() == [2.0, 2.0]
    assert rec.registry.counter_value(names.HOOK_ERRORS) >= 1


def test_uninstalled_the_wrapper_passes_calls_through(hooks):
    rec = hooks()
    step = jax.jit(lambda x: x + 1)
    step(jnp.ones(2))
    metrics.uninstall()
    for _ in range(3 * TIME_EVERY):
        assert step(jnp.ones(2)).tolist() == [2.0, 2.0]
    rec.flush()
    assert rec.registry.counter_value(names.EXECUTE_COUNT) == 1


def test_bytes_of_every_kind_of_array_put_are_numpy_s_own(hooks):
    """Every dtype, a strided view, a transposed one and a 0-d array count
    exactly, as what moves (with x64 off, JAX moves float64 and int64 as
    32-bit)."""
    rec = hooks()
    arrays = [np.ones((32, 784), np.float32), np.ones((), np.int8), np.ones(5, np.bool_),
              np.ones((6, 4), np.float64)[::2, 1:], np.ones(3, np.float16),
              np.ones((2, 2), np.int64),
              np.ones(7, np.complex64), np.ones((3, 3), np.int32).T]
    puts = [a for a in arrays for _ in range(TIME_EVERY + 1)]
    for _ in range(TIME_FIRST):  # past the timed first puts: the untimed path
        jax.device_put(np.ones(1, np.float32))
    rec.reset()
    for a in puts:
        jax.device_put(a)
    rec.flush()
    count, total = rec.registry.metric_data(names.OUTBOUND_DATA)[:2]
    moved = sum(a.size * np.dtype(jax.dtypes.canonicalize_dtype(a.dtype)).itemsize for a in puts)
    assert (count, total) == (len(puts), moved)


def test_the_hooks_hold_no_reference_to_what_they_passed(hooks):
    """Every path of the hooks (usual, timed, numpy arguments, several
    graphs, a call that raises, a put, a device->host read) leaves the
    reference counts of the arguments, the owner and the function as it
    found them."""
    hooks()
    f = jax.jit(lambda x, y: x + y)
    x, a = jnp.ones(16), np.ones(16, np.float32)
    short = jnp.ones(8)

    def calls() -> None:
        for i in range(TIME_FIRST + 4 * TIME_EVERY):
            f(x, x)
            f(x, a)  # numpy: the report
            f(short if i % 2 else x, short if i % 2 else x)  # two graphs: keyed
            jax.device_put(a)
            float(s)  # a device->host read: the getter's usual path
            str(x)  # and through two library frames (the walk)
            with pytest.raises(TypeError):
                f(x)  # a missing argument raises through, recorded nowhere
        metrics.recorder().flush()

    def watcher_idle() -> None:
        """The device-time watcher holds a sample's arrays until the device
        is done with them (by design): counted once it let go."""
        times = next(e for e in metrics.installed_engines() if e.name == "jax").device_times
        deadline = time.monotonic() + 10
        while (times.pending or times.held) and time.monotonic() < deadline:
            time.sleep(0.01)

    s = jnp.float32(2.0) * 2
    calls()  # compiles, first timed calls, caches
    held = inspect.getclosurevars(f).nonlocals  # the wrapper's own references
    owner, fn = held["owner"], held["fn"]
    code = calls.__code__  # the reads' user code: held once by the hook, not per read
    watcher_idle()
    before = [sys.getrefcount(o) for o in (x, a, short, owner, fn, s, code)]
    calls()
    watcher_idle()
    assert [sys.getrefcount(o) for o in (x, a, short, owner, fn, s, code)] == before


MULTI_DEVICE = r"""
import sys
import numpy as np, jax, metrics
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
rec = metrics.install(engines=["jax"], serve=False)
mesh = Mesh(np.array(jax.devices()), ("x",))
# elementwise: no collective (an all-reduce's rendezvous between the two CPU
# devices can time out on a loaded 2-core machine and abort the process)
f = jax.jit(lambda a: a * 2, in_shardings=NamedSharding(mesh, P("x")))
for _ in range(int(sys.argv[1])):
    f(np.ones(8, np.float32))
rec.flush()
r = rec.registry
print(len(jax.devices()), r.counter_value("ImplicitTransferToDevice"),
      r.metric_data("OutboundData")[1], r.counter_value("ExecuteComputation"))
"""


@pytest.mark.slow
def test_numpy_arguments_on_two_devices_count_once_a_call():
    """On several devices JAX's numpy shard handler runs on every call of a
    jitted function given numpy: each call is still one transfer."""
    calls = TIME_FIRST + 3 * TIME_EVERY
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", MULTI_DEVICE, str(calls)], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    devices, implicit, nbytes, executions = out.stdout.split()
    assert (int(devices), int(implicit), float(nbytes), int(executions)) == (
        2, calls, 32.0 * calls, calls)

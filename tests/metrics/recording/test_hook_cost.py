"""What the JAX hook's hot paths cost, counted in Python bytecode executed
inside ``metrics/`` per call (deterministic, unlike wall time on a shared
machine). The budgets hold the overhead bench's figures in place: a change
that adds work to a hot path shows here first.

Measured on CPython 3.11 / JAX 0.10.2 (before the overhead passes -> after):
float(x) 146 -> 90 -> 84 (92 at 26a32f9), a jitted call 86 -> 76 -> 74, jax.device_put of
numpy 95 -> 83 (a device_put wrapper and the numpy shard handler) -> 60 (the
handler alone: one hook per put) -> 58 (JAX's four arguments, no ``*args``).
A read's step index (the step function's call count, counted in the jit
wrapper): float(x) 86 -> 91, an untimed jitted call 53 -> 60 -> 55 (its record's
tuple made once per function). Seeing the step loop's gaps (evaluation,
checkpoints: metrics/engines/jax/gaps.py): float(x) 91 -> 94, an untimed
jitted call 55 -> 60. A host-bound step's numpy arguments: see
tests/metrics/engines/jax/test_jit_numpy.py.

Also counted here: which Python frames and C calls one hooked training step
runs (the per-call properties the overhead bench's figures rest on: JAX's
C++ fast path kept under the ``jax.jit`` wrapper, one hook per put).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

pytestmark = pytest.mark.skipif(sys.version_info[:2] != (3, 11),
                                reason="bytecode counts are CPython 3.11's")


@pytest.fixture
def fresh_metrics(fresh_metrics):  # type: ignore[no-untyped-def]
    """The JAX hooks installed afresh."""
    import metrics

    metrics.uninstall()
    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    yield rec
    metrics.uninstall()
    metrics.install(engines=["jax"], serve=False).reset()


def _past_the_first_timed(fn: Callable[[], object]) -> None:
    """Calls ``fn`` as often as each hook times every call, so the next calls
    are on the sampled path (metrics.recording.sampling), the usual one."""
    from metrics.recording.sampling import TIME_EVERY, TIME_FIRST

    for _ in range(TIME_FIRST + TIME_EVERY):
        fn()


def _opcodes_in_metrics(fn: Callable[[], object]) -> dict[str, int]:
    """Opcodes run in metrics/ code during one call of ``fn`` (after a warm-up
    call), by function name; no journal fold happens inside (emptied first)."""
    import metrics

    root = os.path.dirname(metrics.__file__) + os.sep
    counts: dict[str, int] = {}

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "opcode":
            counts[frame.f_code.co_name] = counts.get(frame.f_code.co_name, 0) + 1
        return local

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        if not frame.f_code.co_filename.startswith(root):
            return None
        frame.f_trace_opcodes = True
        return local

    fn()
    metrics.recorder().flush()  # nothing waits: this call folds nothing
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return counts


def test_float_of_an_array_costs_no_frame_walk(fresh_metrics):
    scalar = jnp.float32(3.0) * 2
    counts = _opcodes_in_metrics(lambda: float(scalar))
    assert set(counts) == {"_value"}, counts  # no call out of the hook
    # 5 of them the read's step (the step function's calls so far)
    # +3: the store that opens a loop gap (gaps.py); +12: the thread check (a
    # read on another thread than the step's is in no gap): 5 opcodes before
    # any step thread is known, 12 once one is (an earlier test's loop)
    assert sum(counts.values()) <= 106, counts


def test_a_jitted_call_stays_within_budget(fresh_metrics):
    step = jax.jit(lambda x: x + 1)  # after install: the hook's wrapper counts it
    x = jnp.ones(4)
    _past_the_first_timed(lambda: step(x))
    counts = _opcodes_in_metrics(lambda: step(x))
    # untimed (74 timed); 2 of them the try that swallows a failure while recording,
    # 7 the call count (a device->host read's step index when this is the step)
    # +5: the identity check that sees a loop gap's end or work (gaps.py)
    assert set(counts) == {"call"} and counts["call"] <= 60, counts


def test_a_device_put_runs_one_hook(fresh_metrics):
    """An explicit device_put of a batch is counted in the numpy shard
    handler, which every put of host data runs anyway: no device_put
    wrapper on top of it (two hooks and a frame check per put, before)."""
    batch = np.ones((32, 784), np.float32)
    _past_the_first_timed(lambda: jax.device_put(batch))
    fresh_metrics.reset()
    counts = _opcodes_in_metrics(lambda: jax.device_put(batch))
    assert set(counts) == {"shard_np_array"}, counts
    # untimed (the usual put): 58 timed
    assert sum(counts.values()) <= 54, counts
    assert fresh_metrics.registry.metric_data("OutboundData")[:2] == (2, 2 * batch.nbytes)


def test_the_numpy_shard_handler_takes_jax_s_four_arguments(fresh_metrics):
    """JAX calls a shard handler as ``handler(xs, shardings, layouts,
    copy_semantics)``; the hook's takes exactly those (a ``*args`` wrapper
    builds and unpacks a tuple on every put)."""
    from jax._src.interpreters import pxla

    handler = pxla.shard_arg_handlers[np.ndarray]
    assert hasattr(handler, "__wrapped__"), handler  # the hook's
    code = handler.__code__
    assert code.co_argcount == 4, code.co_varnames
    assert not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)


def _calls(fn: Callable[[], object]) -> tuple[dict[str, int], dict[str, int]]:
    """(Python frames run anywhere, C functions called from metrics/ frames)
    during one call of ``fn`` after a warm-up call, by name."""
    import metrics

    root = os.path.dirname(metrics.__file__) + os.sep
    frames: dict[str, int] = {}
    c_calls: dict[str, int] = {}

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            name = frame.f_code.co_name
            if frame.f_code.co_filename.startswith(root):
                name = "metrics:" + name
            frames[name] = frames.get(name, 0) + 1
        elif event == "c_call" and frame.f_code.co_filename.startswith(root):
            c_calls[arg.__name__] = c_calls.get(arg.__name__, 0) + 1

    fn()
    metrics.recorder().flush()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    frames.pop("<lambda>", None)  # the test's own
    return frames, c_calls


def test_a_hooked_jit_call_keeps_jax_s_cpp_fast_path(fresh_metrics):
    """A warm call of a function jitted after install runs one Python frame,
    the hook's wrapper, and JAX's C++ dispatch under it (JAX's Python path
    runs dozens of frames; a wrapper that forced it would cost far more
    than its own work)."""
    step = jax.jit(lambda p, x: (p[0] * x).sum())
    args = ((jnp.ones(4),), jnp.ones(4))
    _past_the_first_timed(lambda: step(*args))
    frames, c_calls = _calls(lambda: step(*args))
    assert frames == {"metrics:call": 1}, frames
    assert c_calls == {"extend": 1}, c_calls  # an untimed call: counted, no clock


def test_one_call_in_time_every_reads_the_clock(fresh_metrics, monkeypatch):
    """Timing is sampled (metrics.recording.sampling): past each hook's
    first TIME_FIRST calls (all timed), over TIME_EVERY calls of a jitted
    step and its two puts each hook reads the clock on exactly one call (two
    reads) and checks its journal's length there."""
    from metrics.engines.jax import device_time
    from metrics.recording.sampling import TIME_EVERY

    # Device-time samples are spaced in time: on a loaded machine 50 ms can
    # pass within the profiled calls and let one in (not what this counts).
    monkeypatch.setattr(device_time, "SPACING_NS", 1 << 62)
    # So are the intervals of the user's host work (host_lines.py: the first
    # due one checks for a profiler already set, this test's own).
    from metrics.engines import host_lines

    monkeypatch.setattr(host_lines, "FIRST_CALLS", 1 << 62)
    # And the training thread's busy samples (a second apart, with the other
    # threads' CPU read there: other_threads.py), after the first.
    from metrics.recording import thread_busy

    monkeypatch.setattr(thread_busy, "SPACING_NS", 1 << 62)
    monkeypatch.setattr(thread_busy, "FIRST_SPACING_NS", 1 << 62)
    monkeypatch.setattr(thread_busy, "WAIT_SPACING_NS", 1 << 62)

    step = jax.jit(lambda p, x, y: ((x @ p[0]) - y).sum())
    params = (jnp.ones((784, 10)),)
    x, y = np.ones((32, 784), np.float32), np.ones((32, 10), np.float32)

    def steps() -> None:
        for _ in range(TIME_EVERY):
            step(params, jax.device_put(x), jax.device_put(y))

    _past_the_first_timed(steps)
    frames, c_calls = _calls(steps)
    assert frames["metrics:call"] == TIME_EVERY, frames
    # 3 hooks x 2 reads, and the timed jit call's device-time check ahead of
    # the call (DeviceTimes.due: before the call may donate its inputs); len:
    # the timed jit call, both timed puts' journal check, and every put's len(xs).
    # That check (device_time.py): past the function's first samples one
    # every SPACING_NS at most, so in a loop this fast it looks up its
    # spacing (one dict get), and the offer after the call returns at once.
    usual = ("monotonic_ns", "extend", "len")
    assert {k: c_calls[k] for k in usual} == {
        "monotonic_ns": 7, "extend": 3 * TIME_EVERY, "len": 3 + 2 * TIME_EVERY}, c_calls
    offer = {k: v for k, v in c_calls.items() if k not in usual}
    assert offer == {"get": 1}, offer


def test_a_training_step_runs_three_hook_frames(fresh_metrics):
    """The MNIST loop's step ``step(params, device_put(x), device_put(y))``
    with every hook on: the jit wrapper and one shard handler per put, each
    calling only the journal's extend (and len of the put's list) on an
    untimed step, the usual one."""
    step = jax.jit(lambda p, x, y: ((x @ p[0]) - y).sum())
    params = (jnp.ones((784, 10)),)
    x, y = np.ones((32, 784), np.float32), np.ones((32, 10), np.float32)
    _past_the_first_timed(lambda: step(params, jax.device_put(x), jax.device_put(y)))
    frames, c_calls = _calls(lambda: step(params, jax.device_put(x), jax.device_put(y)))
    hook_frames = {k: v for k, v in frames.items() if k.startswith("metrics:")}
    assert hook_frames == {"metrics:call": 1, "metrics:shard_np_array": 2}, frames
    assert c_calls == {"len": 2, "extend": 3}, c_calls

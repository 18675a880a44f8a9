"""Numpy arguments of jitted calls (metrics.engines.jax.jit_numpy): a
host-bound loop's step ``step(params, data[j:j + B], data[j:j + B, 1:], 0.01)``
writes its transfers where the frame walk would, in one frame, with exact
counts; and the per-step work stays what it was measured at (bytecode
counted, not timed: the same under any load).

Measured on CPython 3.11 / JAX 0.10.2, one untimed step of that loop (two
numpy slices, a dict of parameters, a Python float): 7 Python frames, 588
opcodes and 25 C calls in metrics/ before (the wrapper, a report, two
host_arguments and two frame walks), 2 frames, 196 opcodes, 8 C calls after.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np
import pytest

from tests.lines import line_of

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture
def eng(fresh_metrics):  # type: ignore[no-untyped-def]
    import metrics

    engine = next(e for e in metrics.installed_engines() if e.name == "jax")
    engine.implicit.clear()
    yield engine
    engine.implicit.clear()


def _host_bound_loop() -> tuple[Callable[[int], object], np.ndarray]:
    """``one(j)``: one step of the loop, called at one line; and its data."""
    data = np.arange(64 * 9, dtype=np.float32).reshape(64, 9)
    params = {"w": jnp.ones((8, 8)), "b": jnp.zeros(8)}

    @jax.jit
    def step(p, x, y, lr):  # type: ignore[no-untyped-def]
        g = jax.grad(lambda p: jnp.mean((x @ p["w"] + p["b"] - y[:, :1]) ** 2))(p)
        return jax.tree.map(lambda a, b: a - lr * b, p, g)

    def one(j: int) -> object:
        return step(params, data[j:j + 4, :-1], data[j:j + 4, 1:], 0.01)  # THE STEP

    return one, data


def _past_the_first_timed(fn: Callable[[int], object]) -> None:
    from metrics.recording.sampling import TIME_EVERY, TIME_FIRST

    for i in range(TIME_FIRST + TIME_EVERY):
        fn(i % 32)


def test_the_usual_call_counts_what_the_walk_writes(eng):
    """Calls counted on the function's run (no record) read as the frame
    walk's records do: the same line, detail, count, bytes and steps, and the
    same counters."""
    from metrics.engines.jax.implicit import _LIB

    one, _ = _host_bound_loop()
    _past_the_first_timed(one)
    impl, ja = eng.implicit, eng.implicit.jit_arguments

    def walked(owner, args, depth):  # type: ignore[no-untyped-def]  # as before the writer
        ja.report_walked(owner, args)

    impl.hold(walked.__code__, _LIB)  # the hook's own frame, walked through
    got = []
    for fast in (True, False):
        impl.clear()
        before = eng.rec.registry.counter_value("ImplicitTransferToDevice") or 0
        if not fast:
            eng.numpy_arguments = walked
        try:
            for j in range(5):
                one(j)
        finally:
            eng.numpy_arguments = ja.report
        assert not fast or not impl.queue  # counted in place: nothing queued
        (site,) = [s for s in eng.sites() if s.kind == "implicit_to_device"]
        got.append((site.location, site.detail, site.count, site.bytes, site.occurrences,
                    eng.rec.registry.counter_value("ImplicitTransferToDevice") - before))
    assert got[0] == got[1], got
    assert got[0][2:] == (10, 10 * 4 * 8 * 4, 5, 10)


def test_runs_read_mid_loop_count_each_call_and_step_once(eng):
    """The loop read every few calls (a scraper), called from two lines and
    with a short last batch: each line's count, bytes and steps exact, as
    records per call would give them."""
    data = np.arange(64 * 9, dtype=np.float32).reshape(64, 9)
    w = jnp.ones((8, 8))

    @jax.jit
    def step(w, x):  # type: ignore[no-untyped-def]
        return w + jnp.sum(x), jnp.sum(x)

    for j in range(40):
        w, _ = step(w, data[j:j + 4, :8])  # LINE A
        if j % 7 == 3:
            eng.sites()  # a reader folds mid-run
        if j % 10 == 9:
            w, _ = step(w, data[62:64, :8])  # LINE B: two rows
    a_line, b_line = line_of(__file__, "# LINE A"), line_of(__file__, "# LINE B")
    sites = {s.location: s for s in eng.sites() if s.kind == "implicit_to_device"}
    a, b = sites[f"{__file__}:{a_line}"], sites[f"{__file__}:{b_line}"]
    assert (a.count, a.bytes) == (40, 40 * 4 * 8 * 4)
    assert (b.count, b.bytes) == (4, 4 * 2 * 8 * 4)
    assert (a.occurrences, b.occurrences) == (40, 4)  # each call in a step of its own
    assert eng.rec.registry.counter_value("ImplicitTransferToDevice") == 44
    assert not eng.implicit.queue  # counted in place


def test_a_steady_run_counts_its_unchecked_calls_exactly(eng):
    """Past STEADY checks in a row the untimed calls go unchecked (issue 40:
    1 % of a TPU host's 0.56 ms step): a reader folding at any call, and the
    snapshot at the end, still count each call and step once; a change of
    line ends the steady state, and at most the 15 calls before the check
    that saw it go to the run that was going on."""
    from metrics.engines.jax.numpy_runs import STEADY
    from metrics.recording.sampling import TIME_EVERY, TIME_FIRST

    data = np.arange(64 * 9, dtype=np.float32).reshape(64, 9)
    w = jnp.ones((8, 8))

    @jax.jit
    def step(w, x):  # type: ignore[no-untyped-def]
        return w + jnp.sum(x), jnp.sum(x)

    n_a = TIME_FIRST + (STEADY + 8) * TIME_EVERY + 5  # steady, not on a check at its end
    for j in range(n_a):
        w, _ = step(w, data[j % 32:j % 32 + 4, :8])  # STEADY A
        if j % 37 == 0:
            eng.sites()  # a reader folds mid-run, unchecked calls pending
    owner = step._tpu_info_owner
    a_line = f"{__file__}:{line_of(__file__, '# STEADY A')}"
    sites = {s.location: s for s in eng.sites() if s.kind == "implicit_to_device"}
    assert (sites[a_line].count, sites[a_line].occurrences) == (n_a, n_a)
    assert owner.numpy_steady
    for j in range(40):
        w, _ = step(w, data[j:j + 2, :8])  # STEADY B: two rows, another line
    b_line = f"{__file__}:{line_of(__file__, '# STEADY B')}"
    sites = {s.location: s for s in eng.sites() if s.kind == "implicit_to_device"}
    a, b = sites[a_line], sites[b_line]
    assert a.count + b.count == n_a + 40
    assert n_a <= a.count <= n_a + TIME_EVERY - 1, (a.count, n_a)
    assert eng.rec.registry.counter_value("ImplicitTransferToDevice") == n_a + 40


def test_a_host_bound_loop_counts_every_numpy_argument(eng):
    one, _ = _host_bound_loop()
    for j in range(100):
        one(j % 32)
    line = line_of(__file__, "# THE STEP")
    (site,) = [s for s in eng.sites() if s.kind == "implicit_to_device"]
    assert site.location == f"{__file__}:{line}"
    assert (site.count, site.bytes, site.detail) == (200, 200 * 4 * 8 * 4,
                                                    "numpy argument of jit(step)")
    assert site.occurrences == 100  # each call its own step (the step function is inferred)
    assert eng.rec.registry.counter_value("ImplicitTransferToDevice") == 200
    assert eng.rec.registry.metric_data("OutboundData")[:2] == (200, 200 * 128)


def test_a_call_from_a_library_frame_walks_to_the_user_s_line(eng):
    """The wrapper called by a library (here jax's tree_map): the writer
    hands it to the walk, which finds the user's line."""
    step = jax.jit(lambda x: x * 2)
    xs = [np.ones(4, np.float32), np.ones(4, np.float32)]
    for _ in range(3):
        jax.tree_util.tree_map(step, xs)  # THROUGH A LIBRARY
    line = line_of(__file__, "# THROUGH A LIBRARY")
    (site,) = [s for s in eng.sites() if s.kind == "implicit_to_device"]
    assert (site.location, site.count, site.bytes) == (f"{__file__}:{line}", 6, 6 * 16)


def _work(fn: Callable[[], object]) -> tuple[dict[str, int], int, int]:
    """(Python frames by name, opcodes, C calls) run in metrics/ by ``fn``,
    no journal fold inside (the journals are emptied first)."""
    import metrics

    root = os.path.dirname(metrics.__file__) + os.sep
    frames: dict[str, int] = {}
    ops = [0]
    c_calls = [0]

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "opcode":
            ops[0] += 1
        return local

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        if not frame.f_code.co_filename.startswith(root):
            return None
        frames[frame.f_code.co_name] = frames.get(frame.f_code.co_name, 0) + 1
        frame.f_trace_opcodes = True
        return local

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "c_call" and frame.f_code.co_filename.startswith(root):
            c_calls[0] += 1

    metrics.recorder().flush()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    metrics.recorder().flush()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return frames, ops[0], c_calls[0]


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="bytecode counts are CPython 3.11's")
def test_a_host_bound_step_stays_within_its_measured_work(eng, monkeypatch):
    """Over TIME_EVERY steps of the loop (one of them timed): the hook's
    frames, opcodes and C calls a step, bounded by what was measured (2
    frames, 198 opcodes, 8.2 C calls a step with the timed one's frame and
    clock reads; 90 opcodes, 1.5 C calls once its numpy run is steady, which
    is what this counts). Before the writer: 7 frames, ~590 opcodes, 25 C
    calls."""
    from metrics.engines.jax import device_time
    from metrics.engines.jax.numpy_runs import STEADY
    from metrics.recording import thread_busy
    from metrics.recording.sampling import TIME_EVERY

    one, _ = _host_bound_loop()
    _past_the_first_timed(one)
    # (the device-time samples and the thread-busy ticks past the next a spacing
    # apart: none in the window, however slow a loaded machine makes the warm-up)
    for module, names in ((device_time, ("SPACING_NS", "LATER_SPACING_NS")),
                          (thread_busy, ("SPACING_NS", "FIRST_SPACING_NS"))):
        for name in names:
            monkeypatch.setattr(module, name, 1 << 62)
    for j in range(STEADY * TIME_EVERY):  # its run steady: untimed calls unchecked
        one(j % 32)
    eng.host_lines._next = 1 << 62  # (and no host-line interval begins in it)
    # (nor a sample or tick whose due time was set before the spacings moved:
    # a warm-up faster than the last spacing leaves it due in the window)
    for spaced in eng.device_times._spacing.values():
        spaced[1] = 1 << 62
    eng.thread_busy.due_ns = eng.thread_busy.wait_due_ns = 1 << 62

    def steps() -> None:
        for j in range(TIME_EVERY):
            one(j)

    frames, ops, c_calls = _work(steps)
    # offer: the timed call's sample for the device-time watcher, which past a
    # function's first samples takes one per SPACING_NS at most (returns here)
    # tick: the step's timed call's thread-busy tick (a clock compare; one
    # thread CPU-time read a second: thread_busy.py)
    # after_step: the step's timed call hands host_lines.py its end (a clock
    # compare; an interval of the user's host work at most every 20 ms)
    # write, catch_up: the timed call's check of the steady run, the calls
    # since the last check added first (numpy_runs.py)
    # before: whether a device-time sample is due (a clock compare), ahead of
    # the call, which may donate its inputs
    assert frames == {"call": TIME_EVERY, "timed_call": 1, "write": 1, "catch_up": 1,
                      "before": 1, "due": 1, "offer": 1, "tick": 1, "after_step": 1}, frames
    # measured 198.4 (209.8 with the offer; 214.9 with the loop's gaps' one
    # identity check a call, gaps.py; 228.6 counting the call on its run,
    # numpy_runs.py: more opcodes, no allocation; on a TPU v5e host the loop
    # read 0.972-0.974 of unhooked against 0.967-0.970 with two records a call;
    # 234.4 with the run's owner check and the step's thread-busy tick; 237.4
    # with the timed call's dispatch-wait compare and host_lines' after_step;
    # 90.4 with the steady run's untimed calls unchecked, C calls 8.2 -> 1.5;
    # 92.4 and 1.56 with the device-time check ahead of the call)
    assert ops / TIME_EVERY <= 95, ops / TIME_EVERY
    assert c_calls / TIME_EVERY <= 2.0, c_calls / TIME_EVERY


def test_a_call_with_fewer_frames_above_walks(eng):
    """``depth`` past the outermost frame (a wrapper called from C with no
    Python caller): the walk, not an error."""
    from metrics.engines.jax.calls import Owner

    owner = Owner("jit(f)")
    eng.numpy_arguments(owner, (np.ones(4, np.float32), 1.0), 10_000)  # FROM NOWHERE
    (site,) = [s for s in eng.sites() if s.kind == "implicit_to_device"]
    assert (site.count, site.bytes, site.detail) == (1, 16, "numpy argument of jit(f)")
    assert site.location == f"{__file__}:{line_of(__file__, '# FROM NOWHERE')}"
    assert owner.numpy_args is True



def test_copies_before_any_step_span_no_steps(eng):
    """With no step function known a record's step field is its time: the
    line's occurrences count each, and no "steps spanned" is made of times
    (hk_mnist's set-up copies read 1,604,121,373 steps spanned)."""
    import time

    for _ in range(5):
        jnp.asarray(np.ones(4, np.float32))  # SET-UP COPY
        time.sleep(0.002)
    line = line_of(__file__, "# SET-UP COPY")
    (site,) = [s for s in eng.sites() if s.location == f"{__file__}:{line}"]
    assert (site.count, site.occurrences, site.steps_spanned) == (5, 5, 0)


def test_a_sample_waits_for_its_puts_where_the_backend_does_not_queue_them(eng) -> None:
    # On a TPU v5e a call made right after its arguments' puts, not waited
    # for, ran as slow as the call that copied them (the A/B's other arm has
    # its batches at rest): off the CPU a sample waits for its puts. The CPU
    # backend's put is done when it returns, so here the put is one whose
    # array comes late (a device computation's output), and the wait forced.
    from metrics.engines.jax import jit_numpy
    from metrics.engines.jax.calls import Owner

    jit_numpy._put()  # decided for this backend first
    assert jit_numpy._PUT_WAITS == [False]  # the CPU backend's
    late = jax.jit(lambda a: jax.lax.fori_loop(0, 400, lambda i, a: jnp.tanh(a @ a.T), a))
    host = np.ones((256, 256), np.float32)
    late(host).block_until_ready()  # compiled
    put, jit_numpy._PUT[0] = jit_numpy._PUT[0], lambda x: late(x)
    try:
        for waits in (False, True):
            jit_numpy._PUT_WAITS[0] = waits
            given = eng.implicit.jit_arguments.timed(Owner("jit(f)"), (host,), 1)
            assert type(given[0]) is not np.ndarray
            assert given[0].is_ready() is waits  # waited for: the call runs on it at rest
            given[0].block_until_ready()
    finally:
        jit_numpy._PUT[0], jit_numpy._PUT_WAITS[0] = put, False


def test_the_step_s_own_numpy_arguments_are_its_steps_once_it_is_named(eng) -> None:
    """The step's first calls come while another jitted function is the
    step's guess (a warm-up of another function first: bench/tpu_costs.py's
    optax program): they are noted as calls in that function's gap, and
    once the step is named, its own numpy arguments in the loop must not sit
    "within" a gap its own first call led (they took that gap's phase,
    ``once``, and the per-step copy, 38 % of the loop by A/B on a TPU v5e,
    went unsaid)."""
    import metrics

    data = np.ones((8, 16, 32), np.float32)

    @jax.jit
    def other(w, x):  # type: ignore[no-untyped-def]
        return w + jnp.mean(x)

    @jax.jit
    def step(w, x):  # type: ignore[no-untyped-def]
        return w - 1e-3 * jnp.mean(jnp.tanh(x @ w)), jnp.mean(x)

    w = jnp.ones((32, 32))
    other(w, jnp.asarray(data[0])).block_until_ready()  # the guessed step, first
    w, _ = step(w, jnp.asarray(data[0]))  # the step's first call: in other's gap
    for i in range(300):
        w, loss = step(w, data[i % 8])  # THE LOOP
    loss.block_until_ready()
    loop = f"{__file__}:{line_of(__file__, '# THE LOOP')}"
    s = metrics.snapshot()
    assert s.steps is not None and "step" in s.steps.basis
    site = next(x for x in s.sites if x.location == loop and x.kind == "implicit_to_device")
    assert site.within == ""
    assert site.phase == "step", (site.phase, site.within)

"""The read model's measured parts (issue 41 items 1, 4): device time per
graph and the sync latency, observed off the training thread; each read costs
``h + w - max(h, d)``. Real JAX on the CPU; the TPU's figures are checked by
bench/tpu_costs.py (A/B), never by wall-time asserts here."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from metrics.engines.jax.device_time import (
    FIRST_SAMPLES,
    KEEP,
    MAX_GRAPHS,
    QUEUE,
    SPACING_NS,
    DeviceTimes,
)
from metrics.engines.jax.drains import Model, drains
from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by

ROOT = Path(__file__).resolve().parents[4]
MS = 1_000_000


def test_a_per_step_read_costs_its_sync_latency_not_the_hosts_time():
    # The TPU v5e's per-step float(loss), as measured there: host 0.157 ms
    # between reads, each read waits 0.95 ms, the step's device time 0.15 ms,
    # a read of ready data 0.75 ms. Removing the read saved 0.92 ms a step;
    # the drain bound said min(w, h) = 0.157 ms (ratio 0.17).
    h, w = 157_000, 950_000
    measured = Model(device_ns=150_000, latency_ns=750_000, device_samples=40,
                     latency_samples=10)
    # d = max(0.15, w - L = 0.2) ms: h + w - max(h, d) = 0.907 ms (A/B: 0.92).
    assert measured.cost(h, w, steps=1) == h + w - 200_000
    # Device-bound per-step read (device 2 ms, host 0.2 ms): the latency and
    # the device's idle after the read, not the step's device work.
    w2 = 2 * MS - 200_000 + 750_000
    assert measured._replace(device_ns=2 * MS).cost(200_000, w2, steps=1) == 750_000
    # A print every 20 steps of a device-bound loop: its wait is 20 steps of
    # device work, which runs either way: it costs the latency.
    w20 = 20 * 2 * MS - 20 * 200_000 + 750_000
    assert measured._replace(device_ns=2 * MS).cost(20 * 200_000, w20, steps=20) == 750_000
    # A read after an evaluation the step's device time does not cover: the
    # wait less the latency is device work all the same (never charged).
    weval = 500 * MS
    assert measured.cost(3 * MS, weval, steps=1) == 3 * MS + 750_000
    # Nothing measured: the wait taken as all device work, min(w, h) (a lower bound).
    assert Model().cost(h, w, steps=1) == h
    # A latency but no device time: d is at least the wait less the latency.
    assert Model(latency_ns=750_000).cost(h, w, steps=1) == h + 750_000
    # Never below 0 nor above the wait.
    assert 0 <= measured.cost(0, 10, steps=5) <= 10


def test_reads_are_costed_with_the_steps_since_the_previous_read():
    # Two reads, 3 and 1 steps after the last: (kinds, starts, ends, steps).
    m = Model(device_ns=100, latency_ns=5)
    per, last = drains([0, 4, 0], [1_000, 1_210, 1_300], [1_200, 1_210, 1_360], last_end=700,
                       steps=[3, 1_210, 4], model=m, last_step=0)
    # First: h 300, w 200, d = 3 x 100 = 300 -> 300 + 200 - 300; second: h 100,
    # w 60, d = min(max(100, 55), 100 + 60 - 5) -> 60.
    assert per == [200, -1, 60] and last == 1_360
    # A record with no step index (its own end) is costed from the wait alone.
    per, _ = drains([0], [1_000], [1_200], last_end=700, steps=[1_200], model=m, last_step=0)
    assert per == [m.cost(300, 200, None)] == [300 + 200 - 300]


def test_a_read_in_a_device_bound_stretch_costs_its_latency_not_a_sampling_shortfall():
    # hk_transformer: float(loss) every 50 steps of a loop the device bounds at
    # 40.0 ms a step, while the watcher's samples said 37.7 ms. With d = 50 x
    # 37.7 ms the 2.3 ms a step short landed on the read: 115 ms plus its
    # latency each (223 ms said; removing the logging saved nothing in 5 A/B
    # rounds). The device's measured time covers >= 90 % of the stretch: it
    # was busy the whole stretch, and the read costs its latency.
    lat = 50_000
    m = Model(device_ns=37_700_000, latency_ns=lat, device_samples=42, latency_samples=8)
    h, w = 1_200 * MS, 50 * 40 * MS - 1_200 * MS + lat  # the stretch: 50 x 40 ms + the latency
    assert m.cost(h, w, steps=50) == lat
    per, _ = drains([0], [h], [h + w], last_end=0, steps=[50], model=m, last_step=0)
    assert per == [lat]
    # Below 90 % (an evaluation's device work the step's time does not cover,
    # or host work the device idled through): the model as before.
    assert m.cost(h, w, steps=40) == h + w - 40 * 37_700_000


def test_a_read_that_found_the_host_steps_ahead_costs_the_idle_after_the_previous_one():
    # hk_transformer on a less loaded machine: steps of 29.5 ms whose samples
    # said 26.45 ms (89.7 %: the 90 % rule missed it), so each log was charged
    # 153 ms. Its read waited for 32 queued steps: the host was far ahead,
    # and the device had work from the step's first call after the previous
    # read on. What the read adds is its latency and the device's idle after
    # the previous read emptied the queue, measured: from that read's end to
    # the step's next call (the GAP_END record), 2 ms here.
    from metrics.engines.jax.kinds import GAP_END

    lat = 50_000
    m = Model(device_ns=26_450_000, latency_ns=lat)
    w = 32 * 29_500_000 + lat
    h = 50 * 29_500_000 - w + lat
    prev_end, call = 1_000 * MS, 1_002 * MS
    s = prev_end + h
    kinds, starts, ends = [GAP_END, 0], [call, s], [call, s + w]
    per, _ = drains(kinds, starts, ends, last_end=prev_end, steps=[1, 51], model=m,
                    last_step=1, idle=[-1, prev_end])
    assert per == [-1, lat + 2 * MS]
    # The previous read followed by 500 ms of host work before the step's
    # next call (a data stall the drained queue no longer hid): the model's.
    late = prev_end + 500 * MS
    per, _ = drains(kinds, [late, s], [late, s + w], last_end=prev_end, steps=[1, 51],
                    model=m, last_step=1, idle=[-1, prev_end])
    assert per == [-1, m.cost(h, w, steps=50)]
    # Not known (no step call seen since the previous read): the model's.
    per, _ = drains([0], [s], [s + w], last_end=prev_end, steps=[51], model=m, last_step=1)
    assert per == [m.cost(h, w, steps=50)]


def test_a_read_after_the_steps_compile_is_not_charged_the_wait_the_compile_delayed():
    # hk_transformer's first log, at step 0: 9 s compiling jit(update), then
    # its first execution, then float(loss). The host's 9 s did not overlap
    # the step's device work (that was dispatched at their end), so taking
    # them as h charged the read its whole wait (1.1 s of the 1.2 s drain
    # said). Compile time is the compile's: not the host's time before a read.
    lat = 50_000
    m = Model(device_ns=40 * MS, latency_ns=lat)
    compile_start, compile_end = 1_000 * MS, 10_000 * MS
    s, e = compile_end + 1 * MS, compile_end + 1 * MS + 45 * MS  # dispatch, then the wait
    per, _ = drains([0], [s], [e], last_end=compile_start, steps=[1], model=m,
                    compiles=[(compile_start, compile_end)])
    assert per == [1 * MS + lat]  # the host's own 1 ms and the latency: h + w - (w - L)
    per, _ = drains([0], [s], [e], last_end=compile_start, steps=[1], model=m)
    assert per == [45 * MS]  # (without the compile span: the whole wait)


def test_a_drain_inside_the_device_time_samples_spread_is_not_claimed():
    # optax's mlp_mnist under CPU contention (load 4 to 6): a print every 20
    # steps of a device-bound loop, 40.5 ms a step; the watcher's samples
    # spread wide (wake-ups late under contention): a median of 36 ms, an
    # upper quartile above the step. With d = 20 x 36 ms the 4.5 ms a step
    # short landed on the read: 90 ms a print, where removing the print saved
    # nothing in 5 paired A/B rounds. Costed at the top of the samples'
    # spread, the stretch is the device's, and the read costs its latency.
    lat = 100_000
    m = Model(device_ns=36 * MS, latency_ns=lat, device_samples=30, latency_samples=8)
    h = 20 * 15 * MS  # the host's 20 steps of dispatch
    w = 20 * 40_500_000 - h + lat  # then the read waits for the rest of the queue
    assert m.cost(h, w, steps=20) == h + w - 20 * 36 * MS  # the median's 90 ms
    spread = m._replace(device_top_ns=41 * MS)
    assert spread.cost(h, w, steps=20) == lat
    per, _ = drains([0], [h], [h + w], last_end=0, steps=[21], model=spread, last_step=1)
    assert per == [lat]
    # A read the host's own time bounds (host 40 ms a step, device 10 to 14
    # ms): its whole wait, however the device's time is taken.
    hb, wb = 20 * 40 * MS, 30 * MS
    wide = Model(device_ns=10 * MS, latency_ns=lat, device_top_ns=14 * MS)
    assert wide.cost(hb, wb, steps=20) == wb
    per, _ = drains([0], [hb], [hb + wb], last_end=0, steps=[21], model=wide, last_step=1)
    assert per == [wb]
    # The loop's first print after an evaluation's reads (the step index of
    # another function, 40, before): its steps since are the new step's own
    # calls (1 here), not unknown (its wait taken as all device work).
    h1, w1 = 20 * MS, 30 * MS + lat
    per, _ = drains([0], [h1], [h1 + w1], last_end=0, steps=[1], model=spread, last_step=40)
    assert per == [spread.cost(h1, w1, steps=1)] == [h1 + w1 - 41 * MS]


@pytest.mark.slow  # a real loop's shares on a shared machine: one rerun before it counts
def test_a_print_every_20_steps_of_a_device_bound_loop_after_an_evaluation_raises_nothing(
        fresh_metrics):
    # The same program's shape, real: an evaluation before the loop whose
    # function hands its state back, a device-bound step, a two-line
    # f-string print of two device values every 20 steps. Removing such a
    # print saves nothing: no finding at it, and its 15 prints counted.
    import sys

    import jax
    import jax.numpy as jnp

    import metrics
    from tpu_info.views.findings import find

    @jax.jit
    def train_step(w, x):
        for _ in range(4):
            x = jnp.tanh(x @ w)
        return w - 1e-4 * x.T @ x, jnp.mean(x)

    @jax.jit
    def eval_step(w, x):
        return w, jnp.mean(jnp.tanh(x @ w))

    w, x = jnp.eye(256) * 0.5, jnp.ones((256, 256))
    for i in range(40):
        w, _ = eval_step(w, x + i)
        if i == 30:
            metrics.snapshot()  # a scrape
    for i in range(300):
        w, loss = train_step(w, x)
        if i == 0:
            metrics.snapshot()
        if i % 20 == 0:
            print(
                f"Step {i}, loss: {loss:.4f}, w:"  # the print
                f" {w[0, 0]:.2f}", file=sys.stderr)
    s = metrics.snapshot()
    (read,) = [r for r in s.sites if r.kind == "sync" and r.location.endswith(
        f":{_line_of('# the print')}")]
    assert (read.count, read.occurrences, read.steps_spanned) == (30, 15, 280)
    assert read.drain_seconds is not None and read.drain_seconds < 0.2 * read.seconds
    assert not [f for f in find(s) if f.location == read.location], [
        f.message for f in find(s) if f.location == read.location]


def _line_of(text: str) -> int:
    from tests.lines import line_of

    return line_of(__file__, text)


class _Slow:
    """An output whose completion the test holds back."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.waiting = threading.Event()
        self.nbytes = 4

    def block_until_ready(self) -> _Slow:
        self.waiting.set()
        self.release.wait(10)
        return self

    def is_ready(self) -> bool:
        return self.release.is_set()


def test_the_watcher_never_blocks_the_training_thread_and_stays_bounded():
    clock = iter(range(10**9, 10**12, 1_000)).__next__
    times = DeviceTimes(clock=clock)
    held = _Slow()
    times.offer("step", 0, (), (None, held))  # the watcher takes it and waits
    assert held.waiting.wait(10) and times.held == 1
    others = [_Slow() for _ in range(50)]
    for i, o in enumerate(others, 1):  # the training thread goes on while the watcher is held
        times.offer("step", i * SPACING_NS, (), o)
    assert len(times.pending) == QUEUE and times.dropped == 50 - QUEUE  # full: dropped
    held.release.set()
    for o in others:
        o.release.set()
    deadline = time.monotonic() + 10
    while (times.pending or times.held) and time.monotonic() < deadline:
        time.sleep(0.01)
    times.stop(timeout=10)
    assert not times._thread.is_alive()
    # The held sample is timed; the queued ones, released before the watcher
    # reached them, finished at times it cannot know: dropped, not read as
    # the device's time (a backlog inflated a 16 ms step to 500 ms).
    assert times.device_ns("step")[1] == 1 and times.late == QUEUE
    for i in range(MAX_GRAPHS + 10):  # bounded: functions, graphs and samples
        for _ in range(KEEP + 3):
            times.note(i, f"g{i}", 5)
    assert len(times.by_owner) <= MAX_GRAPHS
    assert all(len(v) <= KEEP for v in times.by_owner.values())


def test_a_call_with_nothing_pending_is_timed_from_its_return_unless_it_ran_inside_it():
    # The device could not start a call's graph before the call enqueued it:
    # with no input pending, its host time (the dispatch) is no device time.
    # On a TPU v5e a host-bound step read every step sampled 774 us from the
    # call's start where the loop ran at 205 us a step (the read's cost 0.45
    # of its A/B; 0.58 from the return). An output ready at the return ran
    # inside the call (the CPU's way with ready inputs): the call's span.
    times = DeviceTimes(clock=iter(range(10**9, 10**12, 1_000)).__next__)
    times._thread = threading.main_thread()  # no watcher: the queue as offered
    ready = _Slow()
    ready.release.set()
    times.offer("step", 100, (), _Slow(), end=700)
    times.offer("other", 100, (), ready, end=700)
    times.offer("old", 100, (), _Slow())  # no end told: the start, as before
    assert [p[2] for p in times.pending] == [700, 100, 100]


def test_a_span_from_the_calls_return_loses_the_watchers_wake_up_lag():
    # On a TPU v5e the watcher sees a completion ~650 us late: a 31 us graph
    # read 652 us from its call's return, against a ready read's 520-590 us.
    # A span from the return has that lag once; one between two completions
    # the watcher saw (an input pending) has it at both ends and keeps it.
    ticks = iter([2_000_000, 1_200_000, 2_200_000, 2_000_000])  # clock reads, in order
    times = DeviceTimes(clock=ticks.__next__)
    times.latency.extend([600_000, 640_000, 620_000])  # the reads the watcher timed
    done = _Slow()
    done.release.set()
    times._sample("step", None, 1_000_000, None, done, returned=True)
    pending = _Slow()
    pending.release.set()
    times._sample("eval", None, 1_000_000, pending, done)
    assert times.device_ns("step") == (1_000_000 - 620_000, 1)
    assert times.device_ns("eval") == (1_000_000, 1)  # 1.2 ms (its input done) to 2.2 ms
    times.latency.clear()  # no read timed yet: the span as seen
    times._sample("first", None, 1_000_000, None, done, returned=True)
    assert times.device_ns("first") == (1_000_000, 1)


PROGRAM = '''
import json, sys, time
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp
@jax.jit
def step(w, x):
    for _ in range(3):
        x = jnp.tanh(x @ w)
    return w - 1e-4 * x.T @ x, jnp.mean(x)
w = jnp.eye(256) * 0.5; x = jnp.ones((256, 256))
for i in range(150):
    w, loss = step(w, x)
    total = float(loss)  # the read
w.block_until_ready()
''' + PRINT_SNAPSHOT


@pytest.mark.slow
def test_a_real_per_step_read_is_costed_from_measured_device_time_and_latency(tmp_path):
    s = snapshot_printed_by(tmp_path, PROGRAM, "read.py")
    (g,) = [g for g in s.graphs if g.name == "jit(step)"]
    assert g.device_seconds is not None and g.device_samples >= 20  # crossed the wire
    line = next(n for n, t in enumerate(PROGRAM.splitlines(), 1) if "# the read" in t)
    (read,) = [x for x in s.sites if x.kind == "sync" and x.location.endswith(f":{line}")]
    assert read.count == 150 and read.drain_seconds is not None
    assert 0 <= read.drain_seconds <= read.seconds


def test_samples_are_spaced_in_time_after_a_functions_first():
    """A host-bound loop's timed calls come every few microseconds: after a
    function's first FIRST_SAMPLES, one sample per SPACING_NS at most (the
    watcher's share of wall time is bounded however short the step); another
    function has its own first samples."""
    times = DeviceTimes()
    times._start = lambda: None  # no watcher: the queue is only looked at
    times._thread = object()  # type: ignore[assignment]
    taken = 0
    for i in range(200):  # 200 timed calls 10 us apart: 2 ms in all
        before = len(times.pending)
        times.offer("step", i * 10_000, (), _Ready())
        taken += len(times.pending) > before
        times.pending.clear()
    assert taken == FIRST_SAMPLES
    times.offer("step", 199 * 10_000 + SPACING_NS, (), _Ready())  # a spacing later: taken
    assert len(times.pending) == 1
    times.pending.clear()
    times.offer("eval", 0, (), _Ready())
    assert len(times.pending) == 1 and times.dropped == 0


class _Ready:
    nbytes = 4

    def block_until_ready(self) -> _Ready:
        return self

    def is_ready(self) -> bool:
        return True


def test_a_step_over_a_list_of_layers_is_timed_from_its_input_not_the_queue(fresh_metrics):
    # mnist_classifier_fromscratch's update(params, batch): params a list of
    # (w, b) and its output the same. Behind a queue of such steps each
    # sample waits first for the previous step's (w, b) (the input not
    # ready), so it times the step, not the queue (before: no sample at all,
    # then the queue: a 16 ms step read 500 ms).
    import jax
    import jax.numpy as jnp

    import metrics

    eng = next(e for e in metrics.installed_engines() if e.name == "jax")

    @jax.jit
    def update(params, x):
        out = []
        for w, b in params:
            x = jnp.tanh(x @ w + b)
            out.append((w - 1e-6 * jnp.mean(x), b))
        return out

    params = [(jnp.full((400, 400), 1e-3), jnp.zeros((400,))) for _ in range(3)]
    x = jnp.ones((400, 400))
    jax.block_until_ready(update(params, x))
    own = []
    for _ in range(5):  # the step's own time, drained before each
        t = time.perf_counter()
        params = jax.block_until_ready(update(params, x))
        own.append(time.perf_counter() - t)
    for _ in range(300):  # queued: the host runs far ahead (samples every 50 ms past the first)
        params = update(params, x)
    jax.block_until_ready(params)
    deadline = time.monotonic() + 10
    while (eng.device_times.pending or eng.device_times.held) and time.monotonic() < deadline:
        time.sleep(0.01)
    ns, samples = eng.device_times.device_ns(eng.context.step_owner)
    assert samples >= 5, samples
    assert ns / 1e9 <= 3 * sorted(own)[2] + 0.005, (ns / 1e9, own)


def test_a_step_whose_state_nests_its_arrays_three_deep_is_timed(fresh_metrics):
    # dm-haiku's examples (rnn, mnist): update(state, batch) -> TrainingState(
    # params={module: {name: array}}, opt_state=(ScaleByAdamState(count, mu,
    # nu), ...)): no array within two levels of the output, so no sample was
    # ever taken (hk_rnn, hk_mnist: device time null), and every read and
    # eager op of the run fell back to its lower bound.
    from typing import NamedTuple

    import jax
    import jax.numpy as jnp

    import metrics

    class State(NamedTuple):
        params: dict
        opt_state: tuple

    eng = next(e for e in metrics.installed_engines() if e.name == "jax")

    @jax.jit
    def update(state, x):
        w = state.params["linear"]["w"]
        y = x
        for _ in range(3):
            y = jnp.tanh(y @ w)
        mu = {"linear": {"w": state.opt_state[0]["linear"]["w"] * 0.9 + y.T @ x * 1e-6}}
        return State({"linear": {"w": w - mu["linear"]["w"]}}, (mu,))

    state = State({"linear": {"w": jnp.eye(400) * 0.5}},
                  ({"linear": {"w": jnp.zeros((400, 400))}},))
    x = jnp.ones((400, 400))
    for _ in range(300):  # queued: the host runs far ahead
        state = update(state, x)
    jax.block_until_ready(state)
    deadline = time.monotonic() + 10
    while (eng.device_times.pending or eng.device_times.held) and time.monotonic() < deadline:
        time.sleep(0.01)
    timed = eng.device_times.device_ns(eng.context.step_owner)
    assert timed is not None and timed[1] >= 5, timed


def test_a_step_that_takes_a_prng_key_is_sampled_without_a_hook_error(fresh_metrics):
    """A typed PRNG key array can be waited on but has no ``is_ready``
    (dpsgd's private_update(rng, ...)): it is no array to sample, and the
    sample is taken from the step's other arrays, with no hook error."""
    import jax
    import jax.numpy as jnp

    import metrics

    eng = next(e for e in metrics.installed_engines() if e.name == "jax")

    @jax.jit
    def step(key, w):  # type: ignore[no-untyped-def]
        key, sub = jax.random.split(key)
        return key, w + jax.random.normal(sub, w.shape)

    key, w = jax.random.key(0), jnp.zeros((8,))
    for _ in range(40):
        key, w = step(key, w)
    jax.block_until_ready(w)
    deadline = time.monotonic() + 10
    while (eng.device_times.pending or eng.device_times.held) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not eng.rec.registry.counter_value("HookErrors")
    assert eng.device_times.device_ns(next(iter(eng.device_times.by_owner))) is not None


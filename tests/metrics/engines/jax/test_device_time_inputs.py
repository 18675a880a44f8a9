"""Device-time samples and the calls they come from (metrics/engines/jax/
device_time.py): a step that donates its state, and the figures read at
each gap kept between samples (real JAX on the CPU)."""

from __future__ import annotations

import time

import pytest

from metrics.engines.jax.device_time import DeviceTimes


def _donating_step():  # type: ignore[no-untyped-def]
    """A device-bound step that donates its state (``donate_argnums=0``)."""
    import functools

    import jax
    import jax.numpy as jnp

    @functools.partial(jax.jit, donate_argnums=0)
    def step(w, x):  # type: ignore[no-untyped-def]
        for _ in range(3):
            x = jnp.tanh(x @ w)
        return w - 1e-4 * x.T @ x, jnp.mean(x)
    return step


def _settled_samples(times: DeviceTimes) -> int:
    """The device-time samples kept, once the watcher has taken all offered."""
    deadline = time.monotonic() + 10
    while (times.pending or times.held) and time.monotonic() < deadline:
        time.sleep(0.01)
    return sum(len(v) for v in times.by_owner.values())


def test_the_figures_read_at_each_gap_follow_every_new_sample():
    # A read every step asks for the step's median, spread and latency at
    # each fold (gaps.py keeps them for the fold): never past a new sample.
    times = DeviceTimes(clock=iter(range(10**9, 10**12, 1_000)).__next__)
    for ns in (10, 20, 30):
        times.note("step", None, ns)
    assert times.device_ns("step") == (20, 3) and times.upper_ns("step") == 30
    assert times.device_ns("step") == (20, 3)
    times.note("step", None, 90)
    times.note("step", None, 100)
    assert times.device_ns("step") == (30, 5) and times.upper_ns("step") == 90
    assert times.latency_ns() is None
    times.latency.append(7)
    assert times.latency_ns() == (7, 1)


@pytest.mark.parametrize("read_every", [0, 1, 10])
def test_a_step_that_donates_its_state_is_sampled_without_a_hook_error(fresh_metrics,
                                                                        read_every):
    """``donate_argnums`` (jax's spmd_mnist example, most training loops):
    the call deletes its state arrays, so one pending at the call can no
    longer be waited on after it (every sample was a hook error, printed on
    the program's stderr, and the step's device time never measured). The
    inputs are looked at before the call: a sample whose pending input was
    donated is dropped and counted; where none was pending (a read empties
    the queue: the step's next call is timed when a sample is due) the
    sample is timed."""

    import jax
    import jax.numpy as jnp

    import metrics

    eng = next(e for e in metrics.installed_engines() if e.name == "jax")

    step = _donating_step()

    w, x = jnp.eye(128) * 0.5, jnp.ones((128, 128))
    total = 0.0
    for i in range(200):
        w, loss = step(w, x)
        if read_every and i % read_every == 0:
            total += float(loss)
    jax.block_until_ready(w)
    times = eng.device_times
    samples = _settled_samples(times)
    assert not eng.rec.registry.counter_value("HookErrors")
    assert samples + times.donated > 0
    if read_every:  # nothing pending at the calls after a read: measured
        assert samples >= 5, (samples, times.donated)


def test_a_donating_steps_call_after_a_read_is_sampled(fresh_metrics, monkeypatch):
    """Past its first calls a step is timed one call in 16; a donating
    device-bound step's sample is good only where its queue was empty, as
    after a read. The step's first call after a read is timed when a sample
    is due: a read every 10 steps gives a sample each time."""

    import jax
    import jax.numpy as jnp

    import metrics
    from metrics.engines.jax import device_time

    for name in ("SPACING_NS", "LATER_SPACING_NS"):
        monkeypatch.setattr(device_time, name, 0)
    eng = next(e for e in metrics.installed_engines() if e.name == "jax")

    step = _donating_step()

    w, x = jnp.eye(128) * 0.5, jnp.ones((128, 128))
    for _ in range(100):  # past the first timed calls, no read: nothing to time
        w, loss = step(w, x)
    float(loss)
    times = eng.device_times

    def settled() -> int:
        return _settled_samples(times)

    before = settled()
    total = 0.0
    for i in range(200):
        w, loss = step(w, x)
        if i % 10 == 9:
            total += float(loss)  # a log every 10 steps
    jax.block_until_ready(w)
    assert settled() - before >= 15, (before, settled(), times.donated)
    assert not eng.rec.registry.counter_value("HookErrors")

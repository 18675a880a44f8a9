"""The training thread's CPU share of the loop (``TrainingThreadBusy``): near
100 where the thread never waits, low where it sleeps or blocks; read at most
once a second; a tick from another thread starts over."""

from __future__ import annotations

import threading
import time

import pytest

from metrics.recording import thread_busy
from metrics.recording.thread_busy import ThreadBusy


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_busy, "SPACING_NS", 50_000_000)
    monkeypatch.setattr(thread_busy, "FIRST_SPACING_NS", 50_000_000)
    monkeypatch.setattr(thread_busy, "WAIT_SPACING_NS", 50_000_000)


def _ticks(work: str, seconds: float = 0.4) -> list[float]:
    seen: list[float] = []
    busy = ThreadBusy(lambda percent, at: seen.append(percent))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if work == "spin":
            sum(range(2000))
        else:
            time.sleep(0.002)  # a wait, as for the device: no CPU time
        busy.tick(time.monotonic_ns())
    return seen


def test_a_spinning_thread_reads_busy_and_a_waiting_one_idle(fast: None) -> None:
    spin, wait = _ticks("spin"), _ticks("wait")
    assert len(spin) >= 3 and len(wait) >= 3
    # (a loaded machine takes CPU from the spinner too: only the order is sure)
    assert sorted(spin)[len(spin) // 2] > sorted(wait)[len(wait) // 2]
    assert max(wait) < 50.0
    assert all(0.0 <= x <= 100.0 for x in spin + wait)


def test_at_most_one_read_a_spacing_and_a_new_thread_starts_over(fast: None) -> None:
    seen: list[float] = []
    busy = ThreadBusy(lambda percent, at: seen.append(percent))
    now = time.monotonic_ns()
    for i in range(100):
        busy.tick(now + i * 1_000_000)  # 100 ticks over 0.1 s: two reads apart
    assert len(seen) == 1
    other = threading.Thread(target=busy.tick, args=(now + 10 * thread_busy.SPACING_NS,))
    other.start()
    other.join()
    assert len(seen) == 1  # another thread's first tick is no interval of this one


def test_a_loop_of_two_seconds_has_a_median_to_stand_on() -> None:
    # On the TPU a 2 s host-bound loop (6,000 steps of 0.33 ms) had one sample
    # at one a second; the copy bound wants three (views/breakdown.host_paced).
    seen: list[float] = []
    busy = ThreadBusy(lambda percent, at: seen.append(percent))
    now = time.monotonic_ns()
    for i in range(200):  # a step's timed call every 10 ms for 2 s
        busy.tick(now + i * 10_000_000)
    assert len(seen) >= 3
    for i in range(200, 1200):  # then at most one a second: 10 s more
        busy.tick(now + i * 10_000_000)
    assert len(seen) <= thread_busy.FIRST + 10


def test_a_jitted_step_loop_reports_the_distribution(fast: None, fresh_metrics) -> None:
    import jax
    import jax.numpy as jnp

    import metrics
    from tpu_info.contract import catalog

    @jax.jit
    def step(w, x):  # type: ignore[no-untyped-def]
        return w + jnp.sum(x), jnp.sum(x)

    w, x = jnp.zeros(()), jnp.ones(8)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        w, _ = step(w, x)
    busy = metrics.snapshot().distribution(catalog.TRAINING_THREAD_BUSY)
    assert busy is not None and busy.count >= 3


def _call_waits(work: str, calls: int = 15) -> list[float]:
    """The waits a ThreadBusy reads for ``calls`` sampled calls that block
    (sleep: off the CPU with a voluntary switch, as dispatch waiting on a
    full queue) or spin (on the CPU, losing it only to the scheduler)."""
    waits: list[float] = []
    busy = ThreadBusy(lambda percent, at: None, lambda ns, at: waits.append(ns))
    for _ in range(calls):
        start = time.monotonic_ns()
        began = thread_busy.usage() if start >= busy.wait_due_ns else None
        if work == "sleep":
            time.sleep(0.02)
        else:
            end = time.monotonic() + 0.02
            while time.monotonic() < end:
                sum(range(500))
        busy.tick(time.monotonic_ns(), start, began)
    return waits


def test_a_call_that_blocks_reads_its_wait_and_one_that_runs_reads_none(fast: None) -> None:
    # The step's call waiting in dispatch for a slot in the device's queue is
    # the host's slack (views/slack.py); a call on the CPU has none, also on a
    # loaded machine where the scheduler takes the CPU from it (no voluntary
    # switch: issue 41's host-bound nnx_lifted read 39 us a call otherwise).
    slept, spun = _call_waits("sleep"), _call_waits("spin")
    assert len(slept) >= 3 and len(spun) >= 3
    assert sorted(slept)[len(slept) // 2] > 10e6  # of 20 ms asleep
    if thread_busy.usage().switches >= 0:  # Linux: voluntary switches told
        assert max(spun) == 0.0


def test_time_spent_waiting_for_a_core_is_not_time_waiting_for_the_device() -> None:
    # A host-bound thread on a loaded machine (issue 41's 2 shared cores at
    # load 7-9): half its wall time ready to run but without a core. Its CPU
    # share of the wall read 50 %; of the time it was not queued, 100 %.
    seen: list[float] = []
    waits = iter([0, 500_000_000])
    cpus = iter([0, 500_000_000])
    busy = ThreadBusy(lambda percent, at: seen.append(percent), run_queue=lambda: next(waits))
    real = time.thread_time_ns
    try:
        time.thread_time_ns = lambda: next(cpus)  # type: ignore[assignment]
        busy.tick(1_000_000_000)
        busy.tick(2_000_000_000)  # 1 s of wall: 0.5 s on a core, 0.5 s queued
    finally:
        time.thread_time_ns = real  # type: ignore[assignment]
    assert seen == [100.0]
    # Not told (gVisor): the wall time as before.
    seen.clear()
    cpus = iter([0, 500_000_000])
    busy = ThreadBusy(lambda percent, at: seen.append(percent), run_queue=lambda: None)
    try:
        time.thread_time_ns = lambda: next(cpus)  # type: ignore[assignment]
        busy.tick(1_000_000_000)
        busy.tick(2_000_000_000)
    finally:
        time.thread_time_ns = real  # type: ignore[assignment]
    assert seen == [50.0]


def test_the_share_of_the_loop_spent_waiting_for_a_core_is_observed(fast: None) -> None:
    # A loaded machine's run queue: 30 ms of each 100 ms waiting for a core
    # (schedstat's second field, here a stand-in read). Not told: nothing.
    waited = iter(range(0, 10**10, 30_000_000))
    loaded: list[float] = []
    busy = ThreadBusy(None, run_queue=lambda: next(waited),
                      loaded=lambda percent, at: loaded.append(percent))
    now = time.monotonic_ns()
    for i in range(4):
        busy.tick(now + i * 100_000_000)
    assert loaded == [pytest.approx(30.0)] * 3
    untold: list[float] = []
    busy = ThreadBusy(None, run_queue=lambda: None,
                      loaded=lambda percent, at: untold.append(percent))
    for i in range(4):
        busy.tick(now + i * 100_000_000)
    assert untold == []

"""The host's slack (views/slack.py): host work in the steps that ran while
the device still had queued steps costs nothing; only what exceeds the
time the host waited for the device (at its reads, and in the step's own
dispatch: ``DispatchWaitTime``) counts. Issue 41: nnx_mnist's nnx.jit wrapper
(2.6 ms a step) and optax_mlp's numpy batches' copy (1.3 ms a step, a
warning) in device-bound loops saved nothing by A/B; nnx_vae's wrapper (a
read every step, no wait in dispatch) and nnx_lifted's (host-bound) did."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.contract import catalog
from tpu_info.contract.model import (
    DistributionReading,
    SiteReading,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views.breakdown import breakdown
from tpu_info.views.findings import find
from tpu_info.views.sites import site_cost
from tpu_info.views.slack import host_slack

STEPS = StepsReading(600, "inferred", "jit(train_step): the jitted function with the most time",
                     18.0, first_unix=100.0, last_unix=118.0)


def _waits(mean_s: float, count: int = 12, p80: float | None = None) -> DistributionReading:
    p80 = mean_s * 2e9 if p80 is None else p80
    return DistributionReading(catalog.DISPATCH_WAIT_TIME, Unit.TIME_NS, count,
                               mean_s * 1e9 * count, 0.0, None,
                               percentiles=((50.0, 0.0), (80.0, p80)))


def _snap(*sites: SiteReading, waits: DistributionReading | None = None) -> Snapshot:
    return Snapshot(0.0, uptime_seconds=25.0, steps=STEPS, sites=sites,
                    distributions=(waits,) if waits else ())


def _wrapper(seconds: float) -> SiteReading:
    return SiteReading("library_jit", "/w/prog.py:131", 600, seconds=seconds,
                       detail="jit(train_step)", via="flax nnx.jit", timed=56, occurrences=600,
                       first_seen_unix=100.0, last_seen_unix=118.0, phase="step")


def test_a_wrapper_beside_the_steps_dispatch_waits_costs_what_exceeds_them() -> None:
    # nnx_mnist: 2.6 ms a call of a 30 ms step; the step's call waited 15 ms
    # on average (a median 0: a full queue holds one call long)
    alone = _snap(_wrapper(1.56))
    assert [f.kind for f in find(alone)].count("library_jit_overhead") == 1
    waited = _snap(_wrapper(1.56), waits=_waits(0.015))
    slack = host_slack(waited)
    assert slack is not None and slack.dispatch == pytest.approx(0.015 * 600)
    assert "library_jit_overhead" not in [f.kind for f in find(waited)]
    b = breakdown(waited)
    assert b is not None
    parts = {p.name: p.seconds for p in b.step_parts}
    assert parts["waits in dispatch"] == pytest.approx(0.015)
    # a little slack takes off only itself
    some = _snap(_wrapper(6.0), waits=_waits(0.002))
    (f,) = [f for f in find(some) if f.kind == "library_jit_overhead"]
    assert f.seconds_per_step == pytest.approx(0.010 - 0.002)
    assert "in the step's dispatch 1.2 s: mean of 12 sampled calls" in f.message


def test_an_odd_wait_is_no_full_queue() -> None:
    # nnx_vae at load 7: one sampled call of 32 waited 46 ms (another thread
    # held the interpreter lock), in a loop whose read each step drains the queue
    s = _snap(_wrapper(1.56), waits=_waits(0.046 / 32, count=32, p80=0.0))
    assert host_slack(s) is None
    assert [f.kind for f in find(s)].count("library_jit_overhead") == 1


def test_no_slack_where_the_host_set_the_pace() -> None:
    busy = DistributionReading(catalog.TRAINING_THREAD_BUSY, Unit.NUMBER, 9, 9 * 99.0, 95.0,
                               99.0, percentiles=((50.0, 99.0),))
    s = Snapshot(0.0, uptime_seconds=25.0, steps=STEPS, sites=(_wrapper(1.56),),
                 distributions=(busy, _waits(0.015)))
    assert host_slack(s) is None
    assert [f.kind for f in find(s)].count("library_jit_overhead") == 1


def test_a_copy_beside_the_queue_is_said_as_such_and_costs_what_exceeds_it() -> None:
    copy = SiteReading("implicit_to_device", "/w/prog.py:116", 1200, seconds=0.02,
                       bytes=1200 * 401_408, detail="numpy float64 argument of jit(train_step)",
                       timed=50, timed_bytes=50 * 401_408, occurrences=1200,
                       first_seen_unix=100.0, last_seen_unix=118.0, phase="step")
    whole = site_cost(_snap(copy), copy)
    assert whole.seconds > 0.4  # 20 ms over 50 timed copies of 1,200
    s = _snap(copy, waits=_waits(0.015))
    assert site_cost(s, copy).seconds == 0.0
    (f,) = [f for f in find(s) if f.kind == "per_step_implicit_transfer"]
    assert f.severity.label == "info" and "critical path" not in f.message
    assert "the copy ran while the device worked through queued steps" in f.message


# numpy batches into a jitted step whose device work is far longer than their
# copy, no read in the loop: the host runs ahead until the device's queue is
# full (CPU JAX: 32 computations in flight), then waits in the step's dispatch.
DEVICE_BOUND = '''
import json
import numpy as np
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp
N = 384
data = np.random.default_rng(0).standard_normal((9, N, N)).astype(np.float32)

@jax.jit
def step(w, x):
    h = jax.lax.fori_loop(0, 16, lambda i, h: jnp.tanh(h @ w), x)
    return w - 1e-3 * h.T @ x / N

w = jnp.eye(N)
for i in range(150):
    w = step(w, data[i % 8])  # the batch
w.block_until_ready()
''' + PRINT_SNAPSHOT


@pytest.mark.slow
def test_numpy_batches_into_a_device_bound_step_cost_it_nothing(tmp_path: Path) -> None:
    """Before: ``the copy sits on the step's critical path`` at its timed
    cost (optax_mlp: a warning at 1.3 ms a step that a device-resident data
    set did not save)."""
    s = snapshot_printed_by(tmp_path, DEVICE_BOUND, "bound.py")
    (site,) = [x for x in s.sites if x.kind == "implicit_to_device" and x.phase == "step"]
    slack = host_slack(s)
    assert slack is not None and slack.dispatch > 0 and slack.samples >= 3, slack
    c = site_cost(s, site)
    assert c.seconds == 0.0, c  # its copies (~0.1 ms) against waits of a step's length
    found = [f for f in find(s) if f.kind == "per_step_implicit_transfer"]
    assert all("critical path" not in f.message and f.severity.label == "info"
               for f in found), [f.message for f in found]

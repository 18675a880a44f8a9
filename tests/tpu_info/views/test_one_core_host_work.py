"""JAX on the CPU backend on one core (ais_vizmetrics, evaluation of JAX
programs s11, pinned with taskset: a TensorBoard scalar every step, 20 % of
the loop by A/B, said to have run "beside the device's queued steps"). On
one core the device's work (XLA's threads) and the host's take turns: the
host's work between steps is step time. Real JAX on the CPU; the process's
usable cores recorded (``ProcessCores``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.contract import catalog
from tpu_info.contract.model import DistributionReading, SiteKind, Unit
from tpu_info.views import host_work
from tpu_info.views.breakdown import breakdown

PROGRAM = """
import json, os, sys
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)
N = 256

@jax.jit
def step(w, x):
    def loss(w):
        h = x
        for _ in range(4):
            h = jnp.tanh(h @ w)
        return jnp.mean(h ** 2)
    l, g = jax.value_and_grad(loss)(w)
    return w - 1e-3 * g, l

w = jnp.asarray(rng.standard_normal((N, N), np.float32) / N ** 0.5)
x = jnp.asarray(rng.standard_normal((256, N), np.float32))
m = rng.standard_normal((120, 120))

def augment(m):
    return np.tanh(np.dot(m, m.T) / 120)  # LINE host

for i in range(400):
    w, l = step(w, x)
    m = augment(m)
w.block_until_ready()
""" + PRINT_SNAPSHOT


def _cores(n: float) -> DistributionReading:
    return DistributionReading(catalog.PROCESS_CORES, Unit.NUMBER, 8, 8 * n, n, n,
                               percentiles=((50.0, n),))


@pytest.mark.slow
def test_host_work_on_one_core_is_step_time(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, PROGRAM)
    cores = s.distribution(catalog.PROCESS_CORES)
    assert cores is not None and cores.count >= 1 and cores.max == 1, cores
    assert host_work.one_core(s)
    b = breakdown(s)
    assert b is not None
    why, idle = host_work.host_bound(s, b)
    assert idle is None and ("one core" in why or "on the CPU" in why), why
    line = next(n for n, t in enumerate(PROGRAM.splitlines(), 1) if "# LINE host" in t)
    sites = [x for x in s.sites if x.kind == SiteKind.HOST_WORK.value
             and x.location.endswith(f":{line}")]
    assert sites and "beside the device" not in host_work.not_raised(s, sites[0])
    # The same program with two cores free to it: the rule does not hold.
    two = replace(s, distributions=[d for d in s.distributions
                                    if d.name != catalog.PROCESS_CORES] + [_cores(2.0)])
    assert not host_work.one_core(two)
    assert "one core" not in host_work.host_bound(two, b)[0]

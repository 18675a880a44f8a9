"""Logging whose gaps hold host work of their own: a read every 20 steps
followed by 60 ms of drawing (d2l's ProgressBoard: a matplotlib draw every
23 steps, 19 % of its epochs by A/B, said as the read's 2 ms drain and not
raised). Its gaps' own time is the cost, at the read's line, once (no
periodic_sync beside it). Real JAX on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

PROGRAM = """
import json, time
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
N = 128

@jax.jit
def step(w, x):
    l, g = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 1e-3 * g, l

xs = np.random.default_rng(0).standard_normal((8, 64, N), np.float32)
w = jnp.ones((N, N)) / N
points = []
for i in range(200):
    w, loss = step(w, xs[i % 8])
    if i % 20 == 19:
        points.append(float(loss))  # LINE plot
        time.sleep(0.06)  # drawing the figure
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_logging_that_draws_every_20_steps_is_costed_by_its_gaps(tmp_path: Path) -> None:
    line = next(n for n, t in enumerate(PROGRAM.splitlines(), 1) if "# LINE plot" in t)
    s = snapshot_printed_by(tmp_path, PROGRAM)
    found = [f for f in find(s) if f.location and f.location.endswith(f":{line}")]
    kinds = [f.kind for f in found]
    assert kinds == ["periodic_logging"], [f.message for f in found]
    (f,) = found
    each = f.seconds_lost / f.count
    assert 0.04 <= each <= 0.2, f.message
    assert "every 20 steps" in f.message and "plot less often" in f.message, f.message

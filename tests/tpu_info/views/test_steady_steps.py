"""Issue 41 items 3, 4 and 7, JAX on the CPU: compile time never dilutes a
share of step time (steady steps and compile steps apart), a numpy batch
passed into jit costs what its timed copies measured (never an assumed
bandwidth), and opening the backend is a start-up line, never a transfer.
Each program runs in its own process and is read as the CLI reads it (the
snapshot's protobuf). Wall-clock A/B comparisons: bench/tpu_costs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.contract.model import Snapshot
from tpu_info.views.breakdown import device_idle
from tpu_info.views.cost import steps_of
from tpu_info.views.findings import find

ROOT = Path(__file__).resolve().parents[3]

TAIL = '''
w.block_until_ready()''' + PRINT_SNAPSHOT

# A jitted step with a slow first compile (a Python loop unrolled into a big
# graph) fed by eager indexing of device data each step: the eager ops are
# most of the steady step; the compile sat in the loop's first step.
EAGER = '''
import json, sys
import numpy as np
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp

@jax.jit
def step(w, x):
    h = x
    for i in range(40):
        h = jnp.tanh(h @ w + i)
    return w - 1e-4 * jnp.mean(h) * w, jnp.mean(h)

data = jnp.asarray(np.random.default_rng(0).standard_normal((4096, 16), np.float32))
w = jnp.eye(16)
for i in range(300):
    idx = (i * 37 + np.arange(8)) % 4096
    x = data[idx] * 2.0 + 1.0  # the eager indexing
    w, loss = step(w, x)
''' + TAIL

# Numpy batches straight into the jitted step, every step.
NUMPY = '''
import json, sys
import numpy as np
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp

@jax.jit
def step(w, x, y):
    return w - 1e-3 * jnp.mean((jnp.tanh(x @ w) - y) ** 2) * w, jnp.mean(x)

data = np.random.default_rng(0).standard_normal((33, 256, 128), np.float32)
w = jnp.eye(128)
for i in range(200):
    j = i % 32
    w, loss = step(w, data[j], data[j + 1])  # the numpy batch
''' + TAIL

# Opening the backend made slow (a TPU chip takes 7-11 s) and done by a tiny
# jnp.asarray, the process's first device operation.
STARTUP = '''
import json, sys, time
import numpy as np
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp
from jax._src import xla_bridge
xla_bridge.register_backend_initialization_hook(lambda backend: time.sleep(1.2))
scale = jnp.asarray(np.ones((), np.float32))  # the first device operation

@jax.jit
def step(w):
    return w * 0.99 + scale, jnp.sum(w)

w = jnp.ones((64, 64))
for i in range(60):
    w, loss = step(w)
    total = float(loss)
''' + TAIL


def _run(tmp_path: Path, name: str, program: str) -> Snapshot:
    return snapshot_printed_by(tmp_path, program, f"{name}.py")


def _line(program: str, mark: str) -> int:
    return next(n for n, text in enumerate(program.splitlines(), start=1) if mark in text)


@pytest.mark.slow
def test_eager_indexing_after_a_big_first_compile_is_a_share_of_the_steady_step(tmp_path):
    # Before: the first compile was spread over every step ("16% of step time"
    # for indexing that A/B put at 60-70%).
    s = _run(tmp_path, "eager", EAGER)
    st = steps_of(s)
    assert st is not None and st.seconds_total
    (g,) = [g for g in s.graphs if g.name == "jit(step)"]
    assert st.compile_steps >= 1
    assert st.compile_seconds >= 0.9 * g.compile_seconds_total  # the compile, and its tracing
    steady = st.steady_seconds_total
    assert steady is not None and 0 < steady < st.seconds_total - 0.9 * g.compile_seconds_total
    line = _line(EAGER, "# the eager indexing")
    # (said with JAX's whole time at the line: per_step_eager_work, ops and all)
    (f,) = [f for f in find(s) if f.kind in ("per_step_eager_ops", "per_step_eager_work")
            and f.location.endswith(f":{line}")]
    assert f.share_of_step == pytest.approx(min(1.0, f.seconds_lost / steady))
    diluted = f.seconds_lost / st.seconds_total
    assert f.share_of_step >= 1.5 * diluted, (f.share_of_step, diluted)
    from tpu_info.outputs.summary import _steps_line
    words = _steps_line(s) or ""
    assert "steady step" in words and f"in {st.compile_steps} step" in words, words


@pytest.mark.slow
def test_numpy_batches_into_jit_cost_what_their_timed_copies_measured(tmp_path):
    # Before: "~47 us/step 0.17 %, estimated at an assumed 10 GB/s" (2 of
    # 2,186 transfers timed) where A/B measured 21-27% of the step.
    s = _run(tmp_path, "numpy_batch", NUMPY)
    line = _line(NUMPY, "# the numpy batch")
    (site,) = [x for x in s.sites if x.kind == "implicit_to_device"
               and x.location.endswith(f":{line}")]
    assert site.count == 400 and 20 <= site.timed < site.count  # a sample, on >= 20
    assert site.timed_bytes == site.timed * 256 * 128 * 4 and site.seconds > 0
    (f,) = [f for f in find(s) if f.kind == "per_step_implicit_transfer"]
    assert "assumed" not in f.message and not f.cost_estimated
    assert f"timed {site.timed:,} of 400 transfers: " in f.message, f.message
    assert "GB/s to the device" in f.message
    # What the timed copies measured, scaled to all; at most the steps' time the
    # device was not busy, when its own time was measured and fits the steps.
    measured = site.seconds * site.bytes / site.timed_bytes
    idle = device_idle(s)
    bound = measured if idle is None else min(measured, idle.seconds)
    assert f.seconds_lost == pytest.approx(bound)
    assert ("the device was not busy" in f.message) == (bound < measured)
    # The timed copies are passed to the call: the step compiled once.
    assert [g.compiles for g in s.graphs if g.name == "jit(step)"] == [1]


@pytest.mark.slow
def test_opening_the_backend_is_a_start_up_line_never_a_transfer(tmp_path):
    # Before: "jnp.asarray at train.py:73 copies 4 B to the device ... 7.0 s ...
    # Convert the data once (jax.device_put)".
    s = _run(tmp_path, "startup", STARTUP)
    line = _line(STARTUP, "# the first device operation")
    at_line = [x for x in s.sites if x.location.endswith(f":{line}")]
    assert at_line and all(x.seconds < 0.5 for x in at_line), at_line
    found = find(s)
    assert not [f for f in found if f.location and f.location.endswith(f":{line}")
                and f.seconds_lost >= 0.5]
    (f,) = [f for f in found if f.kind == "backend_startup"]
    assert f.severity == "info" and 1.2 <= f.seconds_lost < 30
    assert f.message.startswith("opening the CPU backend took 1.")
    assert "not a cost of the line that asked first" in f.message
    # --json carries it (as the saved run does: both read this snapshot).
    from tpu_info.outputs.jsonview import to_json
    from tpu_info.views.values import Header, TargetView
    view = [TargetView("unix:1.sock", s)]
    kinds = [x["kind"] for x in to_json(view, header=Header(host="h", time_unix=0.0))[
        "targets"][0]["findings"]]
    assert "backend_startup" in kinds

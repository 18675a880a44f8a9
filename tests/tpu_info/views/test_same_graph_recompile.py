"""A JAX function's graph compiled again, the same program, with no cause
recorded: JAX explains no cache miss of a pmap, and no input shape changed.
equinox's bert example (``eqx.filter_pmap`` over state put with
``device_put_replicated``) compiled its step at step 0 and again at step 1,
27 s in all, and nothing was said. Real JAX on the CPU: a pmapped step whose
first call's weights were put on one device and whose later calls take its
own sharded output."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

PROGRAM = """
import json
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
devices = jax.local_devices()[:1]  # (the suite's XLA_FLAGS may give the CPU several)
step = jax.pmap(lambda w, x: (w - 0.1 * (x @ w).mean(), (x @ w).sum()), devices=devices)
w = jax.device_put(jnp.stack([jnp.ones((64, 64))]), devices[0])
x = np.ones((1, 4, 64), np.float32)
for i in range(40):
    w, loss = step(w, x)
jax.block_until_ready(w)
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_the_same_graph_compiled_again_is_said(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, PROGRAM)
    (g,) = [g for g in s.graphs if g.compiles > 1]
    assert g.compiles == 2 and not [c for c in g.causes if c.description != "first call"], g
    (f,) = [f for f in find(s) if f.kind == "recompile_same_graph"]
    assert "compiled the same graph again 1 time" in f.message, f.message
    assert "once in the step loop" in f.message and "output's sharding" in f.message, f.message
    assert f.location and f.location.endswith("prog.py:10"), f.location  # the step's call
    assert not [f for f in find(s) if f.kind == "recompile_no_cause"]


def test_a_cheap_compile_again_is_not_said() -> None:
    """JAX's own small helpers compile again for nothing worth saying
    (equinox's bert: ``jit(stage)`` 10 ms again at start-up, 0.02 % of the run)."""
    from tpu_info.contract.model import GraphRecord, Snapshot

    g = GraphRecord("a" * 64, "jit(stage)", "jax", 1.0, 2.0, compiles=2,
                    compile_seconds_total=0.02, compile_seconds_last=0.01)
    s = Snapshot(taken_at_unix=50.0, uptime_seconds=42.0, graphs=(g,))
    assert not [f for f in find(s) if f.kind == "recompile_same_graph"]
    big = GraphRecord("b" * 64, "jit(_fun)", "jax", 1.0, 2.0, compiles=2,
                      compile_seconds_total=11.0, compile_seconds_last=5.5)
    s = Snapshot(taken_at_unix=50.0, uptime_seconds=42.0, graphs=(big,))
    assert [f for f in find(s) if f.kind == "recompile_same_graph"]

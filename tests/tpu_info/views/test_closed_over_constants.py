"""A jitted function that closes over its weights (issue 41: jax-ai-stack's
digits diffusion U-Net built its blocks as closures, so nnx.jit compiled
their weights into jit(train_step) as constants: an 89 s compile with XLA's
constant-folding alarms, weights that never trained, and the advice was a
persistent cache). The hook measures the arrays a traced function closed
over (the closed jaxpr's constants) per graph, and slow_compile names them
with the advice to pass them as arguments."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.contract.model import FIRST_CALL, GraphRecord, RecompileCause, Snapshot, StepsReading
from tpu_info.views.findings import find

CLOSED_OVER = """
import json
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp
W = [jnp.ones((512, 512)) * (i + 1) for i in range(4)]  # 4 MiB, closed over

@jax.jit
def closed(x):
    for w in W:
        x = jnp.tanh(x @ w)
    return x.sum()

@jax.jit
def passed(x, ws):
    for w in ws:
        x = jnp.tanh(x @ w)
    return x.sum()

x = jnp.ones((8, 512))
for _ in range(3):
    closed(x).block_until_ready()
    passed(x, W).block_until_ready()
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_the_arrays_a_jitted_function_closed_over_are_measured(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, CLOSED_OVER)
    by_name = {g.name: g for g in s.graphs}
    assert by_name["jit(closed)"].const_bytes == 4 * 512 * 512 * 4, by_name["jit(closed)"]
    assert by_name["jit(passed)"].const_bytes == 0


def test_a_slow_compile_of_a_graph_holding_closed_over_weights_says_pass_them() -> None:
    step = GraphRecord("h2", "jit(train_step)", "jax", 1001.0, 1004.0, compiles=1,
                       compile_seconds_total=30.0, compile_seconds_last=30.0, executions=150,
                       causes=(RecompileCause(1001.0, FIRST_CALL, "/w/prog.py:541"),),
                       const_bytes=143_000_000)
    loop = StepsReading(150, "inferred", "jit(train_step): ...", seconds_total=60.0,
                        first_unix=1001.0, last_unix=1061.0, compile_steps=1,
                        compile_seconds=30.0)
    s = Snapshot(1062.0, uptime_seconds=90.0, steps=loop, graphs=(step,))
    (f,) = [f for f in find(s) if f.kind == "slow_compile"]
    assert "holds 143.0 MB of arrays the function closed over" in f.message, f.message
    assert "Pass them as arguments" in f.message and "do not train" in f.message
    # Small closed-over arrays (a table, a mask) are not named.
    small = replace(s, graphs=(replace(step, const_bytes=64 << 10),))
    (g,) = [f for f in find(small) if f.kind == "slow_compile"]
    assert "closed over" not in g.message

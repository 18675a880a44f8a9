"""JAX's control flow called outside jit with a body made anew each call
(issue 41: numpyro's CVAE example runs each epoch as a lax.fori_loop outside
jit, its body a closure made per epoch: jit(scan) compiled the same graph
again every epoch, ~5.5 s each, and was told of device placement). Real JAX
on the CPU: the recompile says the loop's body is the cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

PER_EPOCH_LOOP = """
import json
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp
from jax import lax

w = jnp.ones((64, 64))
for epoch in range(4):
    def body(i, w):  # made anew each epoch (the same graph)
        return w - 0.1 * jnp.tanh(w @ w) / 64
    w = lax.fori_loop(0, 20, body, w)  # LINE loop
    w.block_until_ready()
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_a_loop_run_outside_jit_with_a_new_body_is_told_to_jit_its_caller(
        tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, PER_EPOCH_LOOP)
    found = [f for f in find(s) if f.kind == "recompile_same_graph"]
    assert found, [(f.kind, f.message[:120]) for f in find(s)]
    (f,) = found
    assert "lax.scan or lax.fori_loop called outside jit" in f.message, f.message
    assert "Jit the function that calls it" in f.message

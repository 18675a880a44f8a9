"""A loop of a few long jitted calls (one jitted epoch each: a fori_loop
over the batches inside jit), with reads after each, has no steps of those
reads (numpyro's VAE example, evaluation of JAX programs s12: its steps were
taken from a bool() in numpyro's distributions read twice an epoch, and the
evaluation's gap held the next epoch whole: "9.4 s each" where it took
0.65 s). Real JAX on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

PROGRAM = """
import json
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
N = 128
data = jnp.asarray(np.random.default_rng(0).standard_normal((200, 32, N), np.float32))

@jax.jit
def epoch_train(w):
    def body(i, w):
        x = data[i]
        g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        return w - 1e-3 * g
    return jax.lax.fori_loop(0, 200, body, w)

@jax.jit
def eval_test(w):
    return jnp.mean(jnp.tanh(data[0] @ w) ** 2)

w = jnp.ones((N, N)) / N
for epoch in range(3):
    w = epoch_train(w)
    loss = eval_test(w)
    for k in range(5):
        if float(w[k, 0]) > 1e9:  # a check read five times an epoch
            print("big")
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_reads_between_few_long_jitted_calls_are_no_steps(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, PROGRAM)
    assert s.steps is None or "device->host sync" not in s.steps.basis, s.steps
    assert not [f for f in find(s) if f.kind in ("periodic_evaluation", "per_step_evaluation")]

"""An un-jitted evaluation after the training loop costs the time it ran,
not only its single-op graphs' compiles (issue 41: costs charged to the work
that spent them). equinox's vision transformer example evaluates its test
set eagerly after the loop: 64 single-op graphs compiled in 2.2 s, said as
the cost, where jitting the evaluation saved 13 s of wall time over its 10
batches (A/B); the ops' Python dispatch between them (vmap's batching
rules, the modules' calls) is in no op's own time. Real JAX on the CPU; the
program times its evaluation itself (ratios with generous bounds, no wall
time asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.eager import single_op
from tpu_info.views.findings import find

FINAL_EAGER_EVALUATION = """
import json, time
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)

def block(w, x):
    for a in w:
        h = x @ a
        h = (h - jnp.mean(h)) / jnp.sqrt(jnp.var(h) + 1e-5)
        p = jnp.exp(h - jnp.max(h))
        h = p / jnp.sum(p) + jax.nn.gelu(h)
        x = jnp.concatenate([h[:32], jnp.tanh(h[32:])]).reshape(8, 8).T.reshape(64)
    return jnp.mean(jnp.abs(x))

@jax.jit
def step(w, x):
    loss, g = jax.value_and_grad(lambda w: jnp.mean(jax.vmap(lambda r: block(w, r))(x)))(w)
    return [a - 1e-3 * b for a, b in zip(w, g)], loss

w = [jnp.asarray(rng.standard_normal((64, 64), np.float32) / 8) for _ in range(6)]
x = jnp.asarray(rng.standard_normal((32, 64), np.float32))
for i in range(200):
    w, loss = step(w, x)
    if i % 50 == 0:
        print(i, float(loss))
t0 = time.perf_counter()
acc = []
for b in range(60):  # the final evaluation, un-jitted
    acc.append(float(jnp.mean(jax.vmap(lambda r: block(w, r))(x + b))))  # LINE eval
with open(__file__ + ".json", "w") as f:
    json.dump({"own": time.perf_counter() - t0}, f)
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_an_eager_final_evaluation_costs_the_time_its_ops_ran(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, FINAL_EAGER_EVALUATION)
    own = json.loads((tmp_path / "prog.py.json").read_text())["own"]
    eval_line = next(n for n, text in enumerate(FINAL_EAGER_EVALUATION.splitlines(), start=1)
                     if "# LINE eval" in text)
    found = find(s)
    # (after the last step: "once" where its first ops came within a second of it)
    teardown = [f for f in found if f.kind == "eager_ops" and f.phase in ("teardown", "once")]
    assert len(teardown) == 1, [(f.kind, f.phase, f.message[:200]) for f in found]
    (f,) = teardown
    assert f.location.endswith(f":{eval_line}") or f":{eval_line}" in f.message, f.message
    compiled = sum(g.compile_seconds_total for g in s.graphs if single_op(g.name))
    assert compiled < own / 2, (compiled, own)  # the shape: most of it ran after compiling
    # Before: its compiles only (~2.5 s of an 11 s evaluation).
    assert own / 2 <= f.seconds_lost <= 2 * own, (f.seconds_lost, own, f.message)
    assert "after the last step" in f.message and "jit " in f.message

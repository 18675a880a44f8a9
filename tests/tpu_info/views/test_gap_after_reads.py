"""An evaluation about one step long every 10 steps, in a loop that reads its
loss every step with ``loss.item()`` (numpy's buffer protocol on the CPU:
a read the hook does not see). The step's work is done before the
evaluation begins (inside the step's call on the CPU backend, or at the
read), so the host's usual step period is not what the evaluation's gap
would have spent anyway (ais_translation, evaluation of JAX programs s11:
an evaluation of 1.4 s said as 92 ms, its whole step period taken off).
Real JAX on the CPU; the evaluation's own time measured in the program."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by

PROGRAM = """
import json, sys, time
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)
N = 320

@jax.jit
def train_step(w, x):
    def loss_fn(w):
        h = x
        for _ in range(6):
            h = jnp.tanh(h @ w)
        return jnp.mean(h ** 2)
    loss, g = jax.value_and_grad(loss_fn)(w)
    return w - 1e-3 * g, loss

@jax.jit
def eval_step(w, x):
    h = x
    for _ in range(6):
        h = jnp.tanh(h @ w)
    return jnp.mean(h ** 2)

xs = rng.standard_normal((8, 256, N), np.float32)
def evaluate(w):
    total = 0.0
    for k in range(4):  # ~4/3 of a step: a forward is about a third of one
        total += eval_step(w, xs[k]).item()
    return total

w = jnp.asarray(rng.standard_normal((N, N), np.float32) / N ** 0.5)
evaluate(w)  # compiled before the loop
train_step(w, xs[0])[1].item()
own = 0.0
for i in range(160):
    w, loss = train_step(w, xs[i % 8])
    loss.item()
    if i % 10 == 9:
        t0 = time.perf_counter()
        evaluate(w)  # LINE evaluate
        own += time.perf_counter() - t0
open(OWN, "w").write(repr(own))
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_an_evaluation_after_the_steps_read_keeps_its_own_time(tmp_path: Path) -> None:
    own_file = tmp_path / "own.txt"
    source = PROGRAM.replace("open(OWN,", f"open({str(own_file)!r},")
    line = next(n for n, text in enumerate(source.splitlines(), start=1)
                if "# LINE evaluate" in text)
    s = snapshot_printed_by(tmp_path, source)
    own = float(own_file.read_text())
    (site,) = [x for x in s.sites if x.kind == "call" and x.location.endswith(f":{line}")]
    assert site.gaps >= 12, site
    # Its gaps' own time against the program's own timer of the evaluations
    # (16 of them; a gap left open at the end is not counted): with the step
    # period taken off each it read ~1/4 of it.
    per_gap, per_eval = site.gap_seconds / site.gaps, own / 16
    assert 0.5 * per_eval <= per_gap <= 1.6 * per_eval, (per_gap, per_eval, site)

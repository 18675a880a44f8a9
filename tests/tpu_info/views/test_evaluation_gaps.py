"""An evaluation over many numpy batches that alternates two jitted
functions, once before the loop and every 30 steps from step 0, called
through a helper (evaluation of JAX programs, eqx_mnist: its copies were
"13 times every step", a per-step finding, and each call of one function a
"gap" of the other). The gaps are the loop's step's only (a function named
by time before the loop, whose output never fed its next call, stays a
guess); the evaluation is named at the loop's ``evaluate(w)`` line; the
copies made in it take its phase and are its, not findings of their own.
Real JAX on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.contract.model import Phase
from tpu_info.views.findings import find

# eqx_mnist's shape: equinox's MNIST example with numpy loaders.
EVAL = """
import json, sys
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)
N = 256

@jax.jit
def make_step(w, x, y):
    def loss_fn(w):
        h = x
        for _ in range(4):
            h = jnp.tanh(h @ w)
        return jnp.mean((h - y) ** 2)
    loss, g = jax.value_and_grad(loss_fn)(w)
    return w - 1e-3 * g, loss

@jax.jit
def loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

@jax.jit
def compute_accuracy(w, x, y):
    return jnp.mean(jnp.argmax(x @ w, 1) == jnp.argmax(y, 1))

ex = rng.standard_normal((80, 16, N), np.float32)
def evaluate(w):
    a = b = 0
    for k in range(80):
        x, y = ex[k], ex[(k + 1) % 80]
        a += loss(w, x, y)  # LINE evloss
        b += compute_accuracy(w, x, y)  # LINE evacc
    return a / 80, b / 80

w = jnp.asarray(rng.standard_normal((N, N), np.float32) / N ** 0.5)
xs = rng.standard_normal((8, 256, N), np.float32)
evaluate(w)
for i in range(120):
    w, tl = make_step(w, xs[i % 8], xs[(i + 1) % 8])  # LINE train
    if i % 30 == 0 or i == 119:
        l, a = evaluate(w)  # LINE evaluate
        print(f'{i} {tl.item()} {l.item()} {a.item()}', file=sys.stderr)
w.block_until_ready()
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_copies_in_an_alternating_evaluation_are_the_evaluations_not_per_step(
        tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, EVAL)
    lines = {text.rsplit("# LINE ", 1)[1]: n
             for n, text in enumerate(EVAL.splitlines(), start=1) if "# LINE " in text}
    assert s.steps is not None and s.steps.count == 120 and "make_step" in s.steps.basis
    found = find(s)
    (ev,) = [f for f in found if f.kind == "periodic_evaluation"]
    assert ev.location.endswith(f":{lines['evaluate']}"), ev.message
    assert ev.every_steps == pytest.approx(30.0, rel=0.1)
    for name in ("evloss", "evacc"):
        (copies,) = [x for x in s.sites if x.kind == "implicit_to_device"
                     and x.location.endswith(f":{lines[name]}")]
        assert copies.phase == Phase.PERIODIC.value and copies.within == ev.location
        assert not [f for f in found if (f.location or "").endswith(f":{lines[name]}")]
    assert not [f for f in found if f.kind.startswith("per_step_evaluation")]
    (train,) = [f for f in found if f.kind == "per_step_implicit_transfer"]
    assert train.location.endswith(f":{lines['train']}")

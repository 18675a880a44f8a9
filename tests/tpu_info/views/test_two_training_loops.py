"""A program that trains twice, each part with its own ``jax.jit`` of a step
of the same name and an evaluation every epoch (issue 41: optax's
reduce_on_plateau example; tutorials that compare two optimizers do the
same): the second part's step was a stranger to the first's, so its
evaluations were one long gap of the first part's step, never timed nor
named. The second loop's step of the same name takes over (its step index
going on from the first's) and its gaps join the first's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

TWO_LOOPS = """
import json
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp

def make(lr):
    @jax.jit
    def train_step(w, x):
        def loss(w):
            h = x
            for _ in range(4):
                h = jnp.tanh(h @ w)
            return (h ** 2).mean()
        l, g = jax.value_and_grad(loss)(w)
        return w - lr * g, l
    return train_step

@jax.jit
def evaluate(w, x):
    return jnp.tanh(x @ w).mean()

X, XT = jnp.ones((128, 128)), jnp.ones((32, 128))
for lr in (1e-3, 1e-2):
    step = make(lr)
    w = jnp.eye(128)
    for epoch in range(4):
        for i in range(60):
            w, l = step(w, X)
        acc = [float(evaluate(w, XT + k)) for k in range(20)]  # LINE eval
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_the_second_loop_s_evaluations_are_gaps_of_its_step(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, TWO_LOOPS)
    line = next(n for n, text in enumerate(TWO_LOOPS.splitlines(), start=1)
                if "# LINE eval" in text)
    assert s.steps is not None and s.steps.count == 480, s.steps
    (call,) = [x for x in s.sites if x.kind == "call" and x.location.endswith(f":{line}")]
    # 8 evaluations: 3 after each part's first epochs, the one between the
    # parts (closed by the second part's steps), 1 after the last step.
    assert call.gaps >= 6, call
    assert call.steps_spanned == 7 * 60, call  # the step index goes on across the parts
    assert call.work == "evaluation" and call.occurrences == 8, call
    for f in find(s):  # (said or not by its share: never every 26 steps, nor once)
        if f.kind == "periodic_evaluation":
            assert "every 60 steps" in f.message, f.message

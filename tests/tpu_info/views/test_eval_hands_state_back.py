"""An evaluation whose jitted function hands the model's state back, which the
next training step then takes (issue 41: flax's nnx.jit returns a Module's
state from every call; optax's cifar10_resnet example's ``eval_step`` every
epoch, ~10 % of its loop by A/B, was taken for the step's input being made
and went unsaid). A function whose name says evaluation is an evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by

HANDS_BACK = """
import json
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp

@jax.jit
def train_step(w, x):
    l, g = jax.value_and_grad(lambda w: (jnp.tanh(x @ w) ** 2).mean())(w)
    return w - 1e-3 * g, l

@jax.jit
def eval_step(w, x):
    return w, jnp.tanh(x @ w).mean()  # (the state back, as nnx.jit does)

w, X = jnp.eye(128), jnp.ones((64, 128))
w, acc = eval_step(w, X)  # (before training: the step's first call takes its output)
for epoch in range(4):
    for i in range(40):
        w, l = train_step(w, X)
    for k in range(4):
        w, acc = eval_step(w, X + k)  # LINE eval
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_an_evaluation_that_hands_the_state_back_is_an_evaluation(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, HANDS_BACK)
    line = next(n for n, text in enumerate(HANDS_BACK.splitlines(), start=1)
                if "# LINE eval" in text)
    (call,) = [x for x in s.sites if x.kind == "call" and x.location.endswith(f":{line}")]
    assert call.gaps >= 2 and call.work == "evaluation", call

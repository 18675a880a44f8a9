"""Two pmapped functions' graphs keep their functions' names (issue 41: JAX
0.10 compiles every ``jax.pmap`` as ``jit(_fun)``; flax's imagenet and
nlp_seq examples' evaluation compiled in the loop was merged into the train
step's "jit(_fun) 9.8 s in 3 compiles", said nowhere as its own). Real JAX on
the CPU, its own process: the graphs are named by the counted function that
ran them, and the evaluation's first compile in the loop is its own."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by  # noqa: E402

PROGRAM = textwrap.dedent('''
    import json
    import jax, jax.numpy as jnp
    import metrics
    metrics.install(engines=["jax"])

    def train_step(w, x):
        return w - 0.01 * jnp.mean(jnp.tanh(x @ w)) * w

    def eval_step(w, x):
        h = x
        for i in range(40):  # a larger graph than the step's
            h = jnp.tanh(h @ w + i)
        return jnp.mean(h)

    p_train, p_eval = jax.pmap(train_step), jax.pmap(eval_step)
    w, x = jnp.ones((1, 64, 64)) * 0.01, jnp.ones((1, 32, 64))
    for i in range(200):
        w = p_train(w, x)
        if i % 100 == 50:
            float(p_eval(w, x)[0])
''')


def test_each_pmapped_functions_graphs_carry_its_name(tmp_path: Path) -> None:
    from tpu_info.views.findings import find

    s = snapshot_printed_by(tmp_path, PROGRAM + PRINT_SNAPSHOT, "pm.py")
    names = {g.name for g in s.graphs if g.executions}
    assert {"pmap(train_step)", "pmap(eval_step)"} <= names, names
    assert not [g for g in s.graphs if g.name == "jit(_fun)" and g.executions]
    # Named on its own where compiling is said (whether "first compiled inside
    # the step loop" is said too hangs on its compile's time: 0.45-1.9 s here).
    for f in find(s):
        if f.kind == "compile_share":
            assert "pmap(eval_step)" in f.message and "jit(_fun)" not in f.message, f.message

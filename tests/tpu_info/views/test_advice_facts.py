"""Advice chosen from the facts (issue 41 item 12), on real JAX programs:

* eager initialisation before a jitted loop too short for steps (5 calls) is
  told to jit that code, never "Wrap the loop body in jax.jit";
* a static argument given two different lambdas, each made once, compiles
  once per function (expected), not "the same function re-created ... create
  it once"; the same lambda made anew on every call still is.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

pytest.importorskip("jax")

HEAD = textwrap.dedent('''
    import json
    from functools import partial
    import metrics
    metrics.install(engines=["jax"], serve=False)
    import jax
    import jax.numpy as jnp
''')

INIT = HEAD + textwrap.dedent('''
    def init(key):  # one-off eager initialisation: each op compiles on its own
        k1, _ = jax.random.split(key)
        w = jnp.clip(jax.random.normal(k1, (16, 16)) * 0.1, -1.0, 1.0)
        w = w / jnp.linalg.norm(w)
        b = jnp.zeros((16,)) + jnp.float32(0.01)
        w = jnp.tanh(w) * jnp.sqrt(jnp.float32(16.0))
        return jnp.abs(w), jnp.exp(b), jnp.sin(w).mean()

    @jax.jit
    def step(w, b, x):
        return w - 0.01 * jnp.outer(x, x), b, (x @ w).sum()

    w, b, _ = init(jax.random.PRNGKey(0))
    x = jnp.ones(16)
    for i in range(5):
        w, b, loss = step(w, b, x)
''')

LAMBDAS = HEAD + textwrap.dedent('''
    @partial(jax.jit, static_argnums=1)
    def apply(x, act):
        return act(x).sum()

    @partial(jax.jit, static_argnums=1)
    def each(x, act):
        return act(x).mean()

    x = jnp.ones(8)
    double = lambda v: v * 2.0  # noqa: E731
    shift = lambda v: v + 1.0  # noqa: E731
    for i in range(20):
        apply(x, double if i < 10 else shift)  # two functions, each made once
    for i in range(4):
        each(x, lambda v: v - 1.0)  # made anew on every call
''')


@pytest.mark.slow
def test_eager_init_before_a_jitted_loop_is_not_told_to_jit_the_loop_body(tmp_path):
    s = snapshot_printed_by(tmp_path, INIT + PRINT_SNAPSHOT)
    [f] = [f for f in find(s) if f.kind == "eager_ops"]
    # Main before: "Wrap the loop body in jax.jit (jit the step function)."
    assert "loop body" not in f.message, f.message
    assert "jit(step)" in f.message and "jit init()" in f.message


@pytest.mark.slow
def test_two_lambdas_each_made_once_are_not_a_function_re_created(tmp_path):
    s = snapshot_printed_by(tmp_path, LAMBDAS + PRINT_SNAPSHOT)
    kinds = {f.message.split(" ", 1)[0]: f for f in find(s) if f.kind.startswith("recompile_")}
    # Main before: "function re-created ... create it once" for the two lambdas.
    assert kinds["jit(apply)"].kind == "recompile_static_argument_function", kinds["jit(apply)"]
    assert kinds["jit(apply)"].severity == "info"
    # The lambda made anew on each of 4 calls: 3 recompiles of the same function.
    assert kinds["jit(each)"].kind == "recompile_function_re_created", kinds["jit(each)"]

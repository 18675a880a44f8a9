"""A function passed as a static argument, on real JAX: each distinct function
compiles once (expected, info, no "pass it as an array"); a lambda made anew
on every call is a new object each time (a warning, with the fix)."""

from __future__ import annotations

import functools

import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture(scope="module")
def findings():
    import metrics
    from tpu_info.views.findings import recompiles

    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    x = jnp.ones(3)

    @functools.partial(jax.jit, static_argnums=(1,))
    def layer(x, act):
        return act(x) * 2

    for act in (jax.nn.relu, jnp.tanh, jax.nn.gelu):  # three activations, once each
        layer(x, act).block_until_ready()

    @functools.partial(jax.jit, static_argnums=(1,))
    def head(x, act):
        return act(x) + 1

    for _ in range(3):
        head(x, lambda v: v * 3).block_until_ready()  # a new lambda every call
    return {f.message.split(" ", 1)[0]: f for f in recompiles(metrics.snapshot())}


def test_distinct_functions_compile_once_each_as_expected(findings):
    f = findings["jit(layer)"]
    assert f.kind == "recompile_static_argument_function", f.message
    assert f.severity == "info" and "pass it as an array" not in f.message
    assert "once per distinct function passed" in f.message


def test_a_lambda_made_each_call_is_a_warning(findings):
    f = findings["jit(head)"]
    assert f.kind == "recompile_function_re_created", f.message
    assert f.severity == "warning" and "outside the loop" in f.message

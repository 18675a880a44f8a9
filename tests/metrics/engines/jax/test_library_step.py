"""A train step that is not jitted, calling a library's jitted functions
(flax's examples/vae style: a plain Python ``train_step`` around optax):
the step is the user's line, never the library's function (real JAX on CPU,
a real installed-style library: ``pip install --target`` on PYTHONPATH); and a
train step jitted through a library that jits its own dispatcher, given the
user's function as a static argument (equinox's ``filter_jit``), is the user's
jitted step, not a library's function (issue 41: eqx_rnn's make_step)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[4]

LIBRARY = textwrap.dedent('''
    """A stand-in for optax: jitted helpers a plain-Python train step calls."""
    import jax
    import jax.numpy as jnp


    @jax.jit
    def _moments(g, m, v):
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        return m, v


    @jax.jit
    def _scale(m, v):
        return jax.tree.map(lambda m, v: -1e-3 * m / (jnp.sqrt(v) + 1e-8), m, v)


    def adam_update(grads, state):
        m, v = _moments(grads, *state)
        return _scale(m, v), (m, v)


    @jax.jit
    def apply_updates(params, updates):
        return jax.tree.map(lambda p, u: p + u, params, updates)
''')

PROGRAM = textwrap.dedent('''
    import json
    import metrics; metrics.install(serve=False)
    import jax, jax.numpy as jnp
    import fakeopt
    from tpu_info.views.eager import step_function
    from tpu_info.views.findings import find


    def loss_fn(params, x):
        h = jnp.tanh(x @ params["w1"])
        return jnp.mean((h @ params["w2"] - x) ** 2)


    def train_step(params, opt_state, x):  # not jitted: a plain Python function
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        updates, opt_state = fakeopt.adam_update(grads, opt_state)  # CALLS_LIBRARY
        params = fakeopt.apply_updates(params, updates)  # CALLS_LIBRARY
        return params, opt_state, loss


    key = jax.random.PRNGKey(0)
    params = {"w1": jax.random.normal(key, (32, 16)) * 0.1,
              "w2": jax.random.normal(key, (16, 32)) * 0.1}
    opt_state = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
    x = jax.random.normal(key, (64, 32))
    for i in range(40):
        params, opt_state, loss = train_step(params, opt_state, x)
        if i % 10 == 0:
            print("loss", float(loss))
    s = metrics.snapshot()
    print(json.dumps({"basis": s.steps.basis if s.steps else None,
                      "count": s.steps.count if s.steps else None,
                      "step_line": s.steps.step_line if s.steps else None,
                      "step_function": step_function(s),
                      "findings": [f.message for f in find(s)]}))
''')


def _run(tmp_path: Path, name: str, library: str, program: str) -> dict:
    lib = tmp_path / "site"  # pip install --target site: a library by the import system
    (lib / name).mkdir(parents=True)
    (lib / name / "__init__.py").write_text(library)
    (lib / f"{name}-1.0.dist-info").mkdir()
    (lib / f"{name}-1.0.dist-info" / "RECORD").write_text(
        f"{name}/__init__.py,,\n{name}-1.0.dist-info/RECORD,,\n")
    prog = tmp_path / "train.py"
    prog.write_text(program)
    r = subprocess.run([sys.executable, str(prog)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": f"{ROOT}:{lib}", "PATH": "/usr/bin:/bin",
                                         "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_step_that_is_not_jitted_is_the_users_line_not_the_librarys_function(tmp_path):
    out = _run(tmp_path, "fakeopt", LIBRARY, PROGRAM)
    prog = tmp_path / "train.py"
    lines = [n for n, text in enumerate(PROGRAM.splitlines(), 1) if "# CALLS_LIBRARY" in text]
    # The steps are the calls of the user's train step, named by its line
    # (the one that calls the library's function with the most time) ...
    assert out["count"] == 40, out
    assert any(out["basis"].startswith(f"train_step() in train.py (line {n}): not jitted")
               and out["step_line"] == f"{prog}:{n}" for n in lines), out
    # ... and no view takes the library's jitted function for the step.
    assert out["step_function"] is None, out
    assert not [m for m in out["findings"] if "The step, jit(" in m], out["findings"]
    # The eager ops in it (an un-jitted value_and_grad) are told to jit the step itself.
    eager = [m for m in out["findings"] if m.startswith("eager jnp ops at train.py:")]
    assert eager and all(f"The step, at train.py:{out['step_line'].rsplit(':', 1)[1]}, is not "
                         "jitted" in m and "Move them into the jitted step" not in m
                         for m in eager), eager


FILTER_JIT = textwrap.dedent('''
    """A stand-in for equinox's filter_jit (equinox/_jit.py): jax.jit is given
    the library's own dispatcher, named after the user's function; the user's
    function reaches it split into its arrays and ((static leaves), treedef),
    a static argument."""
    import jax


    def _partition(tree):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        arrays = tuple(x if isinstance(x, jax.Array) else None for x in leaves)
        return arrays, (tuple(None if isinstance(x, jax.Array) else x for x in leaves), treedef)


    def _combine(arrays, static):
        leaves, treedef = static
        return jax.tree_util.tree_unflatten(
            treedef, [a if s is None else s for a, s in zip(arrays, leaves)])


    def filter_jit(fun):
        def fun_wrapped(dynamic, static):
            fn = _combine(dynamic[0], static[0])
            first, rest = _combine(dynamic[1], static[1])
            return fn(first, *rest)

        fun_wrapped.__name__ = fun_wrapped.__qualname__ = fun.__name__
        jitted = jax.jit(fun_wrapped, static_argnums=1)
        dynamic_fun, static_fun = _partition(fun)

        def call(first, *rest):
            dynamic, static = _partition((first, rest))
            return jitted((dynamic_fun, dynamic), (static_fun, static))

        return call
''')

EQX_PROGRAM = textwrap.dedent('''
    import json
    import metrics; metrics.install(serve=False)
    import jax, jax.numpy as jnp
    import fakeqx
    from tpu_info.views.eager import step_function
    from tpu_info.views.findings import find


    def loss_fn(params, x):
        return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - x) ** 2)


    @fakeqx.filter_jit
    def make_step(params, x, lr):  # jitted: through the library's dispatcher
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


    def load(x):  # eager ops each step, outside the step (a data loader's)
        return jnp.roll(jnp.sin(x), 1, axis=0) * 0.999 + x * 1e-3


    key = jax.random.PRNGKey(0)
    params = {"w1": jax.random.normal(key, (32, 16)) * 0.1,
              "w2": jax.random.normal(key, (16, 32)) * 0.1}
    x = jax.random.normal(key, (64, 32))
    for i in range(40):
        x = load(x)
        params, loss = make_step(params, x, 0.1)  # CALLS_STEP
        if i % 10 == 0:
            print("loss", float(loss))
    s = metrics.snapshot()
    print(json.dumps({"basis": s.steps.basis if s.steps else None,
                      "count": s.steps.count if s.steps else None,
                      "step_line": s.steps.step_line if s.steps else None,
                      "step_function": step_function(s),
                      "findings": [f.message for f in find(s)]}))
''')


@pytest.mark.slow
def test_a_step_jitted_through_a_librarys_dispatcher_is_the_users_jitted_step(tmp_path):
    out = _run(tmp_path, "fakeqx", FILTER_JIT, EQX_PROGRAM)
    # Main before: "<module>() in train.py (line 26): not jitted; the user's line
    # that calls jit(make_step) each step, a library's jitted function", and the
    # eager op told "The step, at train.py:26, is not jitted ...".
    assert out["count"] == 40, out
    assert not out["step_line"] and "not jitted" not in out["basis"], out
    assert out["step_function"] == "jit(make_step)", out
    assert not [m for m in out["findings"] if "is not jitted" in m], out["findings"]


def test_the_first_function_among_a_librarys_arguments_decides():
    """Where the user's function sits in what equinox passes (a leaf, a bound
    method in a node's data, a class's ``__call__``), and a library's function
    found first keeping the call a library's (filter_jit(optax.apply_updates)
    given the user's model)."""
    import jax
    import jax.numpy as jnp

    from metrics.engines._frames import LibraryFrames, skip_prefixes
    from metrics.engines.jax.library_step import static_arguments, users_function

    frames = LibraryFrames(skip_prefixes(jax), user_paths=())

    class Model:  # a node whose class's __call__ is the user's
        def __init__(self, w):
            self.w = w

        def __call__(self, x):
            return self.w * x

    class Bound:  # equinox's BoundMethod: the function in the node's data
        def __init__(self, fn, model):
            self.fn, self.model = fn, model

    jax.tree_util.register_pytree_node(Model, lambda m: ((m.w,), None), lambda _, c: Model(*c))
    jax.tree_util.register_pytree_node(Bound, lambda b: ((b.model,), b.fn),
                                       lambda fn, c: Bound(fn, *c))

    def step(model, x):
        return model(x)

    def static(tree):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return tuple(None if isinstance(x, jax.Array) else x for x in leaves), treedef

    model, x = Model(jnp.ones(3)), jnp.ones(3)
    statics = static_arguments(lambda dynamic, static: None, {"static_argnums": 1})
    assert statics[0] == (1,)
    for fun in (step, Bound(Model.__call__, model), model):
        assert users_function(frames, ((x,), (static(fun), static((model,)))), {}, statics), fun
    # A library's function first, the user's model after it: a library's call.
    assert not users_function(frames, ((x,), (static(jnp.add), static((model,)))), {}, statics)
    # optax's helpers: arrays only, no function: a library's call.
    assert not users_function(frames, (x, x, x), {}, ((), ()))
    # By name: static_argnames found by position too.
    assert static_arguments(lambda a, fn: None, {"static_argnames": "fn"}) == ((1,), ("fn",))
    assert users_function(frames, (x, step), {}, ((1,), ("fn",)))

"""A train step that is not jitted, calling a library's jitted functions
(flax's examples/vae style: a plain Python ``train_step`` around optax):
the step is the user's line, never the library's function (real JAX on CPU,
a real installed-style library: ``pip install --target`` on PYTHONPATH)."""

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


@pytest.mark.slow
def test_a_step_that_is_not_jitted_is_the_users_line_not_the_librarys_function(tmp_path):
    lib = tmp_path / "site"  # pip install --target site: a library by the import system
    (lib / "fakeopt").mkdir(parents=True)
    (lib / "fakeopt" / "__init__.py").write_text(LIBRARY)
    (lib / "fakeopt-1.0.dist-info").mkdir()
    (lib / "fakeopt-1.0.dist-info" / "RECORD").write_text(
        "fakeopt/__init__.py,,\nfakeopt-1.0.dist-info/RECORD,,\n")
    prog = tmp_path / "train.py"
    prog.write_text(PROGRAM)
    r = subprocess.run([sys.executable, str(prog)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": f"{ROOT}:{lib}", "PATH": "/usr/bin:/bin",
                                         "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
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

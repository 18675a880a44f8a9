"""Eager indexing in a generator data loader (issue 41, equinox's train_rnn:
``yield tuple(array[batch_perm] for array in arrays)`` on jax arrays, 58 % of
its loop by A/B): the line is known to run in a generator, which jit cannot
hold, and the finding says to keep the data set as numpy or to gather in the
jitted step, not to move the ops into the jitted step (real JAX on the CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from metrics.engines.generators import in_generator
from tests.lines import line_of

jax = pytest.importorskip("jax")
jnp = jax.numpy
np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[4]


def _loader(arrays):
    while True:
        yield tuple(a for a in arrays)


def _plain(arrays):
    return tuple(a for a in arrays)


class _Batches:
    def __iter__(self):
        yield 1


def _nested():
    def loader(arrays):
        yield [a for a in (a + 1 for a in arrays)]
    return loader


def _genexpr(fn):
    (code,) = [c for c in fn.__code__.co_consts if getattr(c, "co_name", "") == "<genexpr>"]
    return code


def test_a_generator_and_the_expressions_in_it_are_in_a_generator_a_plain_function_is_not():
    assert in_generator(_loader.__code__) and in_generator(_genexpr(_loader))
    assert in_generator(_Batches.__iter__.__code__)
    assert in_generator(_genexpr(_nested()))  # an expression in a nested generator
    assert not in_generator(_plain.__code__) and not in_generator(_genexpr(_plain))
    assert not in_generator(None)


@pytest.fixture
def eng(fresh_metrics):
    import metrics

    engine = next(e for e in metrics.installed_engines() if e.name == "jax")
    engine.implicit.clear()
    yield engine
    engine.implicit.clear()


def test_an_eager_gather_in_a_generator_loader_is_read_as_in_a_generator(eng):
    def batches(xs, n):
        perm = np.random.permutation(xs.shape[0])
        for start in range(0, xs.shape[0] - n + 1, n):
            yield xs[perm[start:start + n]]  # GATHER(loader)

    step = jax.jit(lambda w, x: w + jnp.sum(x))
    w = jnp.zeros(())
    for x in batches(jnp.ones((64, 4)), 8):
        w = step(w, x)
        step(w, x[np.arange(4)])  # GATHER(plain)
    sites = {s.location: s for s in eng.sites() if s.kind == "eager_op"}
    loader = sites[f"{__file__}:{line_of(__file__, '# GATHER(loader)')}"]
    assert loader.in_generator and "gather" in loader.detail.split(", "), loader
    assert loader.count >= 8, loader  # once a batch (its first, compiling, may split)
    assert not sites[f"{__file__}:{line_of(__file__, '# GATHER(plain)')}"].in_generator


def test_an_indexing_op_stays_named_when_other_ops_filled_the_line_first(eng):
    def batches(xs, n):
        for start in range(0, 64 - n + 1, n):
            idx = np.arange(start, start + n)
            yield jnp.squeeze(jnp.expand_dims(jnp.transpose(jnp.reshape(xs, (4, 64))), 0))[idx]  # MANY

    step = jax.jit(lambda w, x: w + jnp.sum(x))
    w = jnp.zeros(())
    for x in batches(jnp.ones((64, 4)), 8):
        w = step(w, x)
    sites = {s.location: s for s in eng.sites() if s.kind == "eager_op"}
    names = sites[f"{__file__}:{line_of(__file__, '# MANY')}"].detail.split(", ")
    assert "gather" in names and len(names) == 4 and "reshape" in names, names


def test_a_loader_gather_is_timed_whole_not_only_its_primitives(eng):
    # equinox's train_rnn loader: jax arrays indexed with a numpy permutation
    # each step. Most of such a call is Python around its binds (index
    # normalisation, the numpy index's conversion): timed per bind it read a
    # third of the line's time (0.32 of this loop's own timer).
    own = [0]

    def dataloader(arrays, n):
        perm = np.random.permutation(arrays[0].shape[0])
        start = 0
        while True:
            batch_perm = perm[start:start + n]
            start = (start + n) % (perm.size - n)
            t = time.perf_counter_ns()
            batch = tuple(array[batch_perm] for array in arrays)  # GATHER(whole)
            own[0] += time.perf_counter_ns() - t
            yield batch

    step = jax.jit(lambda w, x, y: w + jnp.sum(x) + jnp.sum(y))
    w, batches = jnp.zeros(()), dataloader((jnp.ones((10000, 16, 2)), jnp.ones((10000, 1))), 32)
    at = f"{__file__}:{line_of(__file__, '# GATHER(whole)')}"
    for _ in range(10):  # the first calls compile (counted, not timed)
        w = step(w, *next(batches))
    before = {s.location: s for s in eng.sites() if s.kind == "eager_op"}[at]
    own[0], steps = 0, 200
    for _ in range(steps):
        w = step(w, *next(batches))
    jax.block_until_ready(w)
    site = {s.location: s for s in eng.sites() if s.kind == "eager_op"}[at]
    measured = site.seconds - before.seconds
    assert measured >= 0.6 * own[0] * 1e-9, (measured, own[0] * 1e-9)
    assert measured <= 1.2 * own[0] * 1e-9, (measured, own[0] * 1e-9)
    assert site.count - before.count == steps, site  # its two calls a batch: one time
    assert site.detail == "gather", site  # its primitives are its time, not records of their own


def test_an_eager_index_update_is_one_timed_call_and_indexing_under_jit_is_none(eng):
    data, idx = jnp.zeros((64, 4)), np.arange(8)

    @jax.jit
    def take(i):
        return data[i] + data.at[i].set(1.0)[0]  # TRACED: a constant indexed under jit

    for _ in range(6):
        data = data.at[idx].add(1.0)  # UPDATE
        take(jnp.arange(3))
    sites = {s.location: s for s in eng.sites() if s.kind == "eager_op"}
    update = sites[f"{__file__}:{line_of(__file__, '# UPDATE')}"]
    assert (update.count, update.detail) == (6, "scatter-add"), update
    assert f"{__file__}:{line_of(__file__, '# TRACED')}" not in sites


def test_uninstall_restores_the_indexing_functions(eng):
    from jax._src.numpy import indexing
    from jax._src.ops import scatter

    import metrics

    hooked = indexing.rewriting_take, scatter._scatter_update
    originals = tuple(f.__wrapped__ for f in hooked)
    metrics.uninstall()
    try:
        assert (indexing.rewriting_take, scatter._scatter_update) == originals
    finally:
        metrics.install(engines=["jax"], serve=False)
    assert indexing.rewriting_take is not originals[0]


PROGRAM = textwrap.dedent("""
    import json
    import numpy as np
    import metrics; metrics.install(serve=False)
    import jax, jax.numpy as jnp
    from tpu_info.views.findings import find

    def dataloader(arrays, batch_size):  # equinox's train_rnn example's
        n = arrays[0].shape[0]
        indices = np.arange(n)
        while True:
            perm = np.random.permutation(indices)
            start, end = 0, batch_size
            while end <= n:
                batch_perm = perm[start:end]
                yield tuple(array[batch_perm] for array in arrays)  # LOADER
                start, end = end, end + batch_size

    @jax.jit
    def step(w, x, y):
        return w - 0.01 * jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)

    xs, ys = jnp.ones((4096, 16)), jnp.ones((4096, 1))
    w = jnp.zeros((16, 1))
    for i, (x, y) in zip(range(300), dataloader((xs, ys), 32)):
        w = step(w, x, y)
        metrics.mark_step()
    s = metrics.snapshot()
    print(json.dumps([{"kind": f.kind, "location": f.location, "message": f.message}
                      for f in find(s)]))
""")


@pytest.mark.slow
def test_a_generator_loader_indexing_a_jax_array_each_step_is_told_to_index_on_the_host(
        tmp_path):
    prog = tmp_path / "train.py"
    prog.write_text(PROGRAM)
    r = subprocess.run([sys.executable, str(prog)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                         "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    findings = json.loads(r.stdout.strip().splitlines()[-1])
    line = next(n for n, text in enumerate(PROGRAM.splitlines(), 1) if "# LOADER" in text)
    # (JAX's whole time at the line: per_step_eager_work, its ops' advice)
    (f,) = [f for f in findings if f["kind"] in ("per_step_eager_ops", "per_step_eager_work")]
    assert f["location"] == f"{prog}:{line}", f
    m = f["message"]
    assert "Move them into the jitted step" not in m and "jit the function" not in m, m
    assert "dataloader() (a generator, which jit cannot hold)" in m, m
    assert "indexes a jax.Array from Python each step" in m, m
    assert "np.asarray once" in m and "pass the indices into the jitted step" in m, m

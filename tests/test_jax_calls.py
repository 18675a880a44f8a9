"""Calls of jitted functions counted without wiring (``jax.jit`` wrapped at
install), the step inferred from them, and what the wrapper keeps working;
real JAX on the CPU."""

from __future__ import annotations

import functools
import json
import sys

import numpy as np
import pytest

from tests.conftest import run_python

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _executions(rec, name: str) -> dict[tuple[str, ...], int | None]:
    return {g.signature: g.executions for g in rec.ledger.snapshot() if g.name == name}


def test_loop_without_wiring_counts_executions_and_infers_the_step(fresh_metrics):
    import metrics

    @jax.jit
    def train_step(w, x):
        return w - 0.01 * jnp.tanh(x @ w).sum() * w

    @jax.jit
    def log_norm(w):  # a helper called every 10th step: fewer calls, less time
        return jnp.linalg.norm(w)

    w, x = jnp.ones((16, 16)), jnp.ones((8, 16))
    for i in range(60):
        w = train_step(w, x)
        if i % 10 == 0:
            log_norm(w)
    x_small = jnp.ones((4, 16))  # a second graph of the same function
    for _ in range(3):
        w = train_step(w, x_small)
    w.block_until_ready()
    snap = metrics.snapshot()
    assert _executions(fresh_metrics, "jit(train_step)") == {
        ("w: f32[16,16]", "x: f32[8,16]"): 60, ("w: f32[16,16]", "x: f32[4,16]"): 3}
    assert _executions(fresh_metrics, "jit(log_norm)") == {("w: f32[16,16]",): 6}
    steps = snap.steps
    assert steps is not None and steps.source == "inferred"
    assert steps.count == 63
    assert steps.basis == "jit(train_step): the jitted function with the most time (63 calls)"
    assert steps.seconds_total is not None and steps.seconds_total > 0
    assert fresh_metrics.registry.counter_value("ExecuteComputation") == 69


def test_too_little_history_infers_no_step(fresh_metrics):
    import metrics

    f = jax.jit(lambda x: x + 1)
    for _ in range(9):
        f(jnp.ones(2))
    assert metrics.snapshot().steps is None
    dev = metrics.snapshot().devices[0]
    assert dev.busy_percent is None and "10 times" in dev.busy_reason


def test_mark_step_wins_over_inference(fresh_metrics):
    import metrics

    step = jax.jit(lambda x: x * 2)
    for _ in range(20):
        step(jnp.ones(3))
        metrics.mark_step()
    steps = metrics.snapshot().steps
    assert (steps.source, steps.count) == ("marked", 20)
    assert "mark_step" in steps.basis


def test_tracked_step_wins_and_counts_once(fresh_metrics):
    import metrics

    @jax.jit
    def busy(x):
        return (x @ x).sum()

    @jax.jit
    def step(x):
        return x + 1

    tracked = metrics.track(step)  # jitted after install: unwrapped, counted once
    for _ in range(12):
        busy(jnp.ones((64, 64)))
        tracked(jnp.ones(3))
    steps = metrics.snapshot().steps
    assert (steps.source, steps.count) == ("marked", 12)
    assert steps.basis.startswith("metrics.track(jit(step))")
    assert _executions(fresh_metrics, "jit(step)") == {("x: f32[3]",): 12}


def test_busy_percent_inferred_from_jitted_calls(fresh_metrics):
    import time

    import metrics

    work = jax.jit(lambda x: (x @ x).sum())
    x = jnp.ones((64, 64))
    for _ in range(10):
        work(x).block_until_ready()
    metrics.snapshot()  # first reading: the window starts here
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        work(x).block_until_ready()
    dev = metrics.snapshot().devices[0]
    assert dev.busy_percent is not None and 0.0 < dev.busy_percent <= 100.0
    assert dev.busy_reason.startswith("inferred")


def test_the_wrapper_keeps_what_user_code_uses(fresh_metrics):
    def power(x, n):
        """Raises x to n."""
        return x ** n

    pw = functools.partial(jax.jit, static_argnums=1)(power)
    x = jnp.arange(4.0)
    assert pw(x, 2).tolist() == [0.0, 1.0, 4.0, 9.0]
    assert pw.__wrapped__ is power and pw.__name__ == "power" and pw.__doc__ == "Raises x to n."
    compiled = pw.lower(x, 3).compile()
    assert compiled(x).tolist() == [0.0, 1.0, 8.0, 27.0]
    assert pw.trace(x, 2).jaxpr is not None
    assert pw.eval_shape(x, 2).shape == (4,)
    assert pw._cache_size() >= 1
    pw.clear_cache()
    assert pw._cache_size() == 0
    assert pw(x, 2).tolist() == [0.0, 1.0, 4.0, 9.0]  # recompiles after the clear

    donated = jax.jit(lambda a: a * 2, donate_argnums=0)
    assert donated(jnp.ones(2)).tolist() == [2.0, 2.0]
    by_name = jax.jit(static_argnames="k")(lambda a, k: a * k)  # options first: a decorator
    assert by_name(jnp.ones(2), k=3).tolist() == [3.0, 3.0]

    class Model:
        @jax.jit
        def apply(self, a):  # a method: self binds as with JAX's own
            return a + 1

    assert Model.apply(None, jnp.ones(1)).tolist() == [2.0]
    execs = [g.executions for g in fresh_metrics.ledger.snapshot() if g.name == "jit(power)"]
    assert sorted(map(str, execs)) == ["2", "None"]  # pw(x, 2) twice; the AOT graph: not counted


def test_rejit_every_call_is_one_function(fresh_metrics):
    import metrics

    def body(x):
        return x - 1

    for _ in range(15):
        jax.jit(body)(jnp.ones(5))
    assert _executions(fresh_metrics, "jit(body)") == {("x: f32[5]",): 15}
    assert metrics.snapshot().steps.count == 15


def test_numpy_arguments_go_to_the_implicit_counter(fresh_metrics):
    """Numpy arguments of a wrapped jitted function are implicit host->device
    transfers at the caller's line: one record per top-level one, one for the
    nested ones of the call (found where the compiling call had them)."""
    import metrics

    eng = next(e for e in metrics.installed_engines() if e.name == "jax")
    f = jax.jit(lambda a, b, c: a + b.sum() + c["k"].sum())
    f(np.ones(4, np.float32), jnp.ones(2), {"k": np.ones(3)}); line = sys._getframe().f_lineno  # noqa: E702
    sites = [x for x in eng.sites() if x.detail == "numpy argument of jit(<lambda>)"]
    assert [(x.kind, x.location, x.count, x.bytes) for x in sites] == [
        ("implicit_to_device", f"{__file__}:{line}", 2, 16 + 24)]


_BEFORE_INSTALL = """
import json, jax, jax.numpy as jnp
early = jax.jit(lambda x: x * 3)      # jitted before install: not counted
import metrics
metrics.install(serve=False)
late = jax.jit(lambda x: x * 4)
for _ in range(12):
    early(jnp.ones(2)); late(jnp.ones(2))
s = metrics.snapshot()
print(json.dumps({"blind": list(s.blind_spots),
                  "execs": sorted(str(g.executions) for g in s.graphs if g.name == "jit(<lambda>)"),
                  "steps": s.steps.count}))
"""


def test_functions_jitted_before_install_are_a_blind_spot():
    r = run_python(_BEFORE_INSTALL)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert any("jitted before metrics.install()" in b for b in out["blind"])
    assert any("pmap" in b for b in out["blind"])
    assert out["execs"] == ["12", "None"]  # late counted, early not
    assert out["steps"] == 12


def test_install_before_import_wraps_jit():
    """``tpu-info run`` and ``metrics.install()`` above ``import jax``: the
    hook goes in when the import finishes, so every function is counted."""
    r = run_python("import metrics\nmetrics.install(serve=False)\n"
                   "import jax, jax.numpy as jnp\n"
                   "from jax import jit\n"
                   "f = jit(lambda x: x + 1)\n"
                   "for _ in range(10): f(jnp.ones(2))\n"
                   "s = metrics.snapshot()\n"
                   "print(s.steps.count, s.steps.source)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["10", "inferred"]


def test_inferred_steps_are_shown_as_inferred(fresh_metrics):
    import metrics
    from tpu_info.render import render_text
    from tpu_info.views import TargetView, steps_label

    @jax.jit
    def train_step(x):
        return x * 0.5

    for _ in range(1200):
        train_step(jnp.ones(2))
    snap = metrics.snapshot()
    assert steps_label(snap) == "1,200 (inferred: jit(train_step))"
    assert steps_label(snap, short=True) == "~1,200"
    table = render_text([TargetView("127.0.0.1:1", snap)], 200)
    assert "1,200 (inferred: jit(train_step))" in table
    report = metrics.metrics_report()
    assert "Steps: 1,200 (inferred: jit(train_step))" in report
    assert "basis: jit(train_step): the jitted function with the most time (1,200 calls)" in report


def test_uninstall_restores_jax_jit_and_wrapped_functions_pass_through():
    r = run_python("import jax, jax.numpy as jnp, metrics\n"
                   "from jax._src import api\n"
                   "own = jax.jit\n"
                   "metrics.install(serve=False)\n"
                   "hooked = jax.jit(lambda x: x + 1)\n"
                   "swapped = jax.jit is not own\n"
                   "metrics.uninstall()\n"
                   "print(swapped, jax.jit is own, hooked(jnp.ones(2)).tolist())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "[2.0,", "2.0]"]


def test_counted_calls_leave_no_garbage_collector_work(fresh_metrics):
    """As for metrics.track: a counted call's record holds numbers and
    existing objects only, so it does not drive the garbage collector."""
    import gc

    step = jax.jit(lambda p, x: p + x.sum())
    x = jnp.ones(4)
    p = step(jnp.zeros(()), x)
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for _ in range(300):
            p = step(p, x)
        grown = gc.get_count()[0] - before
    finally:
        gc.enable()
    plain = jax.jit.__wrapped__(lambda p, x: p + x.sum())
    q = plain(jnp.zeros(()), x)
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for _ in range(300):
            q = plain(q, x)
        own = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert grown - own < 30, f"the hook left {grown - own} objects in 300 calls"


_SYNC_STEPS = """
import json, jax, jax.numpy as jnp
step = jax.jit(lambda x: x * 0.5 + 1)   # jitted before install: its calls are not seen
import metrics
metrics.install(serve=False)
x, total = jnp.ones(()), 0.0
for _ in range(15):
    x = step(x)
    total += float(x)   # the step's sync
s = metrics.snapshot()
print(json.dumps([s.steps.count, s.steps.source, s.steps.basis, s.steps.seconds_total]))
"""


def test_steps_inferred_from_the_most_frequent_sync_when_no_jitted_call_is_seen(tmp_path):
    """A step jitted before install is invisible, but its per-step float()
    is not: the steps come from that line, labelled, with no invented time."""
    script = tmp_path / "sync_steps.py"
    script.write_text(_SYNC_STEPS)
    r = run_python(f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))")
    assert r.returncode == 0, r.stderr
    count, source, basis, seconds = json.loads(r.stdout.strip().splitlines()[-1])
    assert (count, source, seconds) == (15, "inferred", None)
    line = next(i for i, t in enumerate(_SYNC_STEPS.splitlines(), 1) if "the step's sync" in t)
    assert basis.startswith(f"float() at sync_steps.py:{line}: the most frequent device->host")

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
    assert sorted(map(str, execs)) == ["1", "2"]  # pw(x, 2) twice; the AOT graph once


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
early_aot = jax.jit(lambda x: x * 5).lower(jnp.ones(2)).compile()  # counted, no graph
import metrics
metrics.install(serve=False)
late = jax.jit(lambda x: x * 4)
for _ in range(12):
    early(jnp.ones(2)); late(jnp.ones(2))
for _ in range(3):
    early_aot(jnp.ones(2))
s = metrics.snapshot()
print(json.dumps({"blind": list(s.blind_spots),
                  "execs": sorted(str(g.executions) for g in s.graphs if g.name == "jit(<lambda>)"),
                  "steps": s.steps.count,
                  "counted": metrics.recorder().registry.counter_value("ExecuteComputation")}))
"""


@pytest.mark.slow
def test_functions_jitted_before_install_are_a_blind_spot():
    r = run_python(_BEFORE_INSTALL)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert any("jitted or pmapped before metrics.install()" in b for b in out["blind"])
    assert not any("not counted: jax.stages" in b or "pmap could not" in b for b in out["blind"])
    assert out["execs"] == ["12", "None"]  # late counted, early not
    assert out["steps"] == 12
    assert out["counted"] == 12 + 3  # late's calls and the AOT ones compiled before install
    assert any("compiled before metrics.install() are counted but not attributed" in b
               for b in out["blind"])


@pytest.mark.slow
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
    from tpu_info.outputs.render import render_text
    from tpu_info.views.values import TargetView, steps_label

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


@pytest.mark.slow
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


def test_counted_calls_leave_no_garbage_collector_work(fresh_metrics, monkeypatch):
    """As for metrics.track: a counted call's record holds numbers and
    existing objects only, so it does not drive the garbage collector. Past
    a function's first calls (all timed, their device-time samples and
    feedback checks), with the samplers spaced in time held off: on a loaded
    machine 300 calls span more of their spacings (the margin went at load 5)."""
    import gc

    from metrics.engines.jax import device_time
    from metrics.recording import thread_busy

    monkeypatch.setattr(device_time, "SPACING_NS", 1 << 62)
    monkeypatch.setattr(thread_busy, "SPACING_NS", 1 << 62)
    monkeypatch.setattr(thread_busy, "FIRST_SPACING_NS", 1 << 62)
    monkeypatch.setattr(thread_busy, "WAIT_SPACING_NS", 1 << 62)  # (a wait's usage tuples)
    step = jax.jit(lambda p, x: p + x.sum())
    x = jnp.ones(4)
    p = step(jnp.zeros(()), x)
    for _ in range(100):  # past the first timed calls and samples
        p = step(p, x)
    from metrics.engines.jax.context import CONTEXT

    if CONTEXT.active is not None:  # (a sample due from before the patch: held off too)
        CONTEXT.active.thread_busy.due_ns = CONTEXT.active.thread_busy.wait_due_ns = 1 << 62
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
import json, time, jax, jax.numpy as jnp

@jax.jit
def step(w, x):   # jitted before install: its calls are not seen
    for _ in range(4):
        w = jnp.tanh(x @ w)
    return w, (w * w).sum()

import metrics
metrics.install(serve=False)
w, x = jnp.full((256, 256), 0.01), jnp.ones((256, 256))
for _ in range(2):   # compiled for the loop's own arguments before it
    w, loss = step(w, x)
    float(loss)
start = time.perf_counter()
for _ in range(40):
    w, loss = step(w, x)
    total = float(loss)   # the step's sync
loop = (time.perf_counter() - start) / 40
s = metrics.snapshot()
dev = s.devices[0]
print(json.dumps([s.steps.count, s.steps.source, s.steps.basis, s.steps.seconds_per_step, loop,
                  dev.busy_percent, dev.busy_reason]))
"""


@pytest.mark.slow
def test_steps_inferred_from_the_most_frequent_sync_when_no_jitted_call_is_seen(tmp_path):
    """A step jitted before install is invisible, but its per-step float()
    is not: the steps come from that line, labelled, and the time between
    its first and last sync over the syncs between is the step time (within
    a wide factor of the loop's own measure: wall times on a shared machine);
    busy % is the wait at that line."""
    script = tmp_path / "sync_steps.py"
    script.write_text(_SYNC_STEPS)
    r = run_python(f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))")
    assert r.returncode == 0, r.stderr
    count, source, basis, per_step, loop, busy, reason = json.loads(
        r.stdout.strip().splitlines()[-1])
    assert (count, source) == (40, "inferred")
    line = next(i for i, t in enumerate(_SYNC_STEPS.splitlines(), 1) if "the step's sync" in t)
    assert basis == (f"float() at sync_steps.py:{line}: the most frequent device->host sync "
                     "(40 times); step time from its first sync to its last")
    assert per_step is not None and 0.5 * loop <= per_step <= 2.0 * loop, (per_step, loop)
    assert busy is not None and 0.0 <= busy <= 100.0
    assert reason.startswith("inferred (a lower bound): host time waiting at float() at "
                             f"sync_steps.py:{line}, the step's sync"), reason


def test_aot_compiled_calls_count_as_executions_of_their_graph(fresh_metrics):
    """``f.lower(x).compile()`` then the Compiled called: each call is an
    execution of the graph it runs, whether or not compile() compiled anew
    (JAX reuses the executable of a call with the same signature)."""
    import metrics

    def triple(x):
        return x * 3

    f = jax.jit(triple)
    x = jnp.ones(5)
    f(x)  # the graph compiles here; compile() below reuses it
    compiled = f.lower(x).compile()
    for _ in range(7):
        compiled(x)

    def shift(v):
        return v - 1

    fresh = jax.jit(shift).lower(jnp.ones(3)).compile()  # compiles only here
    for _ in range(12):
        fresh(jnp.ones(3))
    assert _executions(fresh_metrics, "jit(triple)") == {("x: f32[5]",): 8}
    assert _executions(fresh_metrics, "jit(shift)") == {("v: f32[3]",): 12}
    assert fresh_metrics.registry.counter_value("ExecuteComputation") == 20
    steps = metrics.snapshot().steps
    assert (steps.count, steps.source) == (12, "inferred")
    assert steps.basis.startswith("jit(shift): the jitted function with the most time")
    assert not any("compile()" in b and "not counted" in b for b in metrics.snapshot().blind_spots)


def test_a_tracked_aot_compiled_function_counts_once(fresh_metrics):
    import metrics

    def halve(x):
        return x / 2

    compiled = jax.jit(halve).lower(jnp.ones(4)).compile()
    tracked = metrics.track(compiled)
    for _ in range(5):
        tracked(jnp.ones(4))
    steps = metrics.snapshot().steps
    assert (steps.count, steps.source) == (5, "marked")
    assert steps.basis.startswith("metrics.track(jit(halve))")
    assert _executions(fresh_metrics, "jit(halve)") == {("x: f32[4]",): 5}


_PMAP = """
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp
import metrics
metrics.install(serve=False)

def double(x):
    return x * 2

p = jax.pmap(double)
x = jnp.ones((2, 3))   # not yet sharded: each call reshards it (its own graph)
for _ in range(12):
    p(x)
s = metrics.snapshot()
print(json.dumps({"execs": {g.name: g.executions for g in s.graphs if g.executions},
                  "steps": [s.steps.count, s.steps.basis],
                  "blind": list(s.blind_spots)}))
"""


@pytest.mark.slow
def test_pmap_calls_count_as_executions_of_their_graph():
    """``jax.pmap`` is wrapped at install like ``jax.jit``: each call is an
    execution of the pmapped graph (in JAX 0.10 a jit of shard_map), not of
    the resharding graph its first call compiles after it; the graph (JAX's
    ``jit(_fun)``) named by the function that ran it."""
    r = run_python(_PMAP)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["execs"] == {"pmap(double)": 12}, out
    assert out["steps"] == [12, "pmap(double): the jitted function with the most time (12 calls)"]
    assert not any("pmap could not" in b for b in out["blind"])


_AOT_PMAP_MISSING = """
import json
import jax, jax.numpy as jnp
import jax._src.stages as stages
compiled_class, pmap = stages.Compiled, jax.pmap
del stages.Compiled, jax.pmap   # as in a JAX that moved them
import metrics
metrics.install(serve=False)
stages.Compiled, jax.pmap = compiled_class, pmap
eng = next(e for e in metrics.installed_engines() if e.name == "jax")
run = jax.jit(lambda x: x + 1).lower(jnp.ones(2)).compile()
print(json.dumps([eng.blind_spots(), eng.degraded, run(jnp.ones(2)).tolist()]))
"""


@pytest.mark.slow
def test_missing_aot_and_pmap_names_degrade_with_a_reason_and_a_blind_spot():
    r = run_python(_AOT_PMAP_MISSING)
    assert r.returncode == 0, r.stderr
    spots, degraded, value = json.loads(r.stdout.strip().splitlines()[-1])
    assert value == [2.0, 2.0]
    assert "jax.pmap could not be wrapped: calls of pmapped functions are not counted." in spots
    assert any(s.startswith("Calls of ahead-of-time compiled functions (f.lower(x).compile()(x)) "
                            "are not counted") for s in spots)
    assert any("AOT-compiled calls not counted: jax._src.stages missing" in d for d in degraded)
    assert any("pmap missing" in d for d in degraded)


@pytest.mark.slow
def test_numpy_arguments_are_counted_after_a_second_install():
    """A function jitted under one install and called after uninstall and a
    new install: its numpy arguments count in the new hook's site table (its
    run belongs to the hook that made it)."""
    r = run_python("import numpy as np, jax, metrics\n"
                   "metrics.install(serve=False)\n"
                   "f = jax.jit(lambda x: x + 1)\n"
                   "def calls(n):\n"
                   "    for _ in range(n):\n"
                   "        f(np.ones(4, np.float32))  # THE CALL\n"
                   "def counted():\n"
                   "    return sum(s.count for s in metrics.snapshot().sites\n"
                   "               if s.kind == 'implicit_to_device' and ':6' in s.location)\n"
                   "calls(10); first = counted()\n"
                   "metrics.uninstall(); calls(5)\n"
                   "metrics.install(serve=False); calls(10)\n"
                   "print(first, counted())")  # the new hook's table: its own calls
    assert r.returncode == 0, r.stderr
    first, more = map(int, r.stdout.split())
    assert first == 10 and more == 10, (first, more)

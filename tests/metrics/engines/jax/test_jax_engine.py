"""The JAX hook against real JAX on the CPU."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from tests.conftest import run_python

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _graphs(rec, name: str):
    return [g for g in rec.ledger.snapshot() if g.name == name]


def test_compiles_and_recompiles_counted_exactly(fresh_metrics):
    rec = fresh_metrics

    @jax.jit
    def loss(params, batch):
        return jnp.sum(params @ batch.T)

    w = jnp.ones((4, 128))
    a, b = jnp.ones((32, 128)), jnp.ones((31, 128))
    before = rec.registry.counter_value("UncachedCompile") or 0
    for x in (a, a, a, b, b, a):
        loss(w, x).block_until_ready()
    graphs = _graphs(rec, "jit(loss)")
    assert len(graphs) == 2
    assert sum(g.compiles for g in graphs) == 2
    assert (rec.registry.counter_value("UncachedCompile") or 0) - before >= 2
    first, second = sorted(graphs, key=lambda g: g.first_seen_unix)
    assert first.causes[-1].description == "first call"
    cause = second.causes[-1]
    assert (cause.argument, cause.before, cause.after) == ("batch", "f32[32,128]", "f32[31,128]")
    assert (cause.kind, cause.dim) == ("batch_size", 0)  # typed by the hook
    assert cause.location and cause.location.endswith("test_jax_engine.py:" + str(
        _line_of("loss(w, x).block_until_ready()")))
    assert second.signature == ("params: f32[4,128]", "batch: f32[31,128]")
    kinds = [e.kind for e in rec.events.since(0)[0] if e.name == "jit(loss)"]
    assert kinds == ["compile", "recompile"]


def _line_of(text: str, source: str | None = None) -> int:
    if source is None:
        with open(__file__) as f:
            source = f.read()
    for i, line in enumerate(source.splitlines(), 1):
        if text in line and "_line_of" not in line:
            return i
    raise AssertionError(text)


def test_dtype_and_weak_type_in_signature(fresh_metrics):
    @jax.jit
    def scale(x, s):
        return x * s

    scale(jnp.ones(3), 2.0)
    scale(jnp.ones(3, dtype=jnp.int32), 2.0)
    graphs = sorted(_graphs(fresh_metrics, "jit(scale)"), key=lambda g: g.first_seen_unix)
    assert graphs[0].signature == ("x: f32[3]", "s: f32[]{weak}")
    assert graphs[1].causes[-1].before == "f32[3]" and graphs[1].causes[-1].after == "i32[3]"


def test_transfers_counted_with_bytes(fresh_metrics):
    reg = fresh_metrics.registry
    host = np.ones((256, 256), dtype=np.float32)
    on_device = jax.device_put(host)
    jax.device_put({"a": np.zeros(10, np.int8), "b": np.zeros(6, np.float64)})
    back = jax.device_get(on_device)
    assert back.shape == (256, 256)
    # The bytes that moved: float64 goes to the device as float32 (x64 off).
    assert reg.metric_data("OutboundData")[:2] == (2, 256 * 256 * 4 + 10 + 6 * 4)
    assert reg.metric_data("InboundData")[:2] == (1, 256 * 256 * 4)
    assert reg.metric_data("TransferToDeviceTime")[0] == 2
    assert reg.metric_data("TransferFromDeviceTime")[0] == 1
    kinds = [e.kind for e in fresh_metrics.events.since(0)[0]]
    assert kinds.count("transfer_to_device") == 2 and kinds.count("transfer_from_device") == 1


def test_track_and_mark_step(fresh_metrics):
    import metrics

    @jax.jit
    def step(x):
        return x + 1

    tracked = metrics.track(step)
    x = jnp.ones(8)
    for _ in range(5):
        x = tracked(x)
        metrics.mark_step()
    tracked(jnp.ones(9))
    reg = fresh_metrics.registry
    assert reg.counter_value("ExecuteComputation") == 6
    assert reg.counter_value("MarkStep") == 5
    assert reg.metric_data("StepTime")[0] == 4
    execs = {g.signature: g.executions for g in _graphs(fresh_metrics, "jit(step)")}
    assert execs == {("x: f32[8]",): 5, ("x: f32[9]",): 1}


def test_records_waiting_to_be_folded_make_no_garbage_collector_work(fresh_metrics):
    """A hooked step (two transfers, a tracked call, mark_step) leaves no new
    container objects behind in the journals, so it does not drive the
    program's garbage collector: tuples per record used to leave three per
    step, a young collection every ~230 steps and, in time, full ones."""
    import gc

    import metrics

    jax_own_jit = jax.jit.__wrapped__  # the hook counts calls of functions jitted after install
    step = jax_own_jit(lambda p, x, y: p + x.sum() + y.sum())
    plain_put = getattr(jax.device_put, "__wrapped__", jax.device_put)  # counted in JAX's handler
    tracked = metrics.track(step)
    batches = [(np.ones((8, 4), np.float32), np.ones((8, 1), np.float32))] * 10

    def left_behind(fn, put, hooked: bool) -> int:  # type: ignore[no-untyped-def]
        p = fn(jnp.zeros(()), *batches[0])  # compiled outside the count
        gc.collect()
        gc.disable()  # the count then only grows by what stays allocated
        try:
            before = gc.get_count()[0]
            for _ in range(30):
                for x, y in batches:
                    p = fn(p, put(x), put(y))
                    if hooked:
                        metrics.mark_step()
            return gc.get_count()[0] - before
        finally:
            gc.enable()

    for _ in range(2):  # the second round of each: first ones allocate caches
        plain = left_behind(step, plain_put, False)  # JAX's own, for comparison
        hooked = left_behind(tracked, jax.device_put, True)
    assert hooked - plain < 60, f"the hook left {hooked - plain} objects in 300 steps"
    assert fresh_metrics.registry.counter_value("ExecuteComputation") == 602


def test_install_twice_is_harmless(fresh_metrics):
    import metrics

    assert metrics.install(serve=False) is fresh_metrics
    engines = [e.name for e in metrics.installed_engines()]
    assert metrics.install(engines=["jax"], serve=False) is fresh_metrics
    assert metrics.install(serve=False) is fresh_metrics
    assert [e.name for e in metrics.installed_engines()] == engines
    assert engines.count("jax") == 1

    @jax.jit
    def once(x):
        return x * 3

    once(jnp.ones(2))
    assert sum(g.compiles for g in _graphs(fresh_metrics, "jit(once)")) == 1
    jax.device_put(np.ones(4, np.float32))
    assert fresh_metrics.registry.metric_data("OutboundData")[0] == 1


def test_unknown_engine_names_the_valid_ones():
    import metrics

    with pytest.raises(ValueError, match=r"'bogus'.*valid engines: jax"):
        metrics.install(engines=["bogus"])


def test_exception_in_hook_never_reaches_program(fresh_metrics, monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(fresh_metrics.ledger, "compiled", broken)
    monkeypatch.setattr(fresh_metrics.events, "emit", broken)

    @jax.jit
    def f(x):
        return x - 1

    assert float(f(jnp.float32(3))) == 2.0
    assert float(f(jnp.ones(()) * 5)) == 4.0
    assert jax.device_get(jax.device_put(np.ones(3))).sum() == 3
    assert fresh_metrics.registry.counter_value("HookErrors") >= 1
    assert sum("injected" in r.getMessage() for r in caplog.records) <= 2  # logged once per place


def test_device_memory_on_cpu_comes_from_live_arrays(fresh_metrics):
    import metrics

    keep = jax.device_put(np.ones((1024, 1024), np.float32), jax.devices()[0])
    snap = metrics.snapshot()
    # Other engines (torch, when loaded by other tests) report their own devices.
    jax_devices = [d for d in snap.devices if d.memory.source == "live_arrays"]
    dev0 = next(d for d in jax_devices if d.id == keep.devices().pop().id)
    assert dev0.memory.source == "live_arrays"
    assert dev0.memory.used_bytes >= 4 * 1024 * 1024
    assert dev0.memory.limit_bytes and dev0.memory.limit_bytes > dev0.memory.used_bytes
    assert dev0.memory.reason
    assert len(jax_devices) == len(jax.local_devices())


def test_report_in_process_has_graphs_and_findings(fresh_metrics):
    import metrics

    @jax.jit
    def train_step(batch):
        return batch.sum()

    for n in (32, 32, 31):
        train_step(jnp.ones((n, 4)))
    text = metrics.metrics_report()
    assert "Counter: UncachedCompile" in text
    assert "jit(train_step) compiled 2 times" in text
    assert "argument 'batch' changed f32[32,4] -> f32[31,4]" in text
    assert "Pad or bucket the last batch" in text


# --- separate processes --------------------------------------------------

HASH_PROGRAM = """
import json, jax, jax.numpy as jnp, metrics
metrics.install()
{padding}
@jax.jit
def moved(x, y):
    return jnp.tanh(x @ y).sum()
moved(jnp.ones((8, 8)), jnp.ones((8, 8)))
print(json.dumps([g.hash for g in metrics.snapshot().graphs if g.name == "jit(moved)"]))
"""


@pytest.mark.slow
def test_graph_hash_stable_across_processes_and_source_moves(tmp_path):
    hashes = []
    for padding in ("", "\n" * 50, "\n" * 50):
        script = tmp_path / f"prog{len(hashes)}.py"
        script.write_text(HASH_PROGRAM.format(padding=padding))
        r = run_python(f"exec(open({str(script)!r}).read())")
        assert r.returncode == 0, r.stderr
        hashes.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert len(hashes[0]) == 1 and len(hashes[0][0]) == 64
    assert hashes[0] == hashes[1] == hashes[2]


RECOMPILE_PROGRAM = textwrap.dedent("""
    import jax, jax.numpy as jnp, metrics
    {user_flag}
    metrics.install()
    f = jax.jit(lambda x: x + 1)
    f(jnp.ones(3)); f(jnp.ones(4))
    print("causes", [c.description for g in metrics.snapshot().graphs for c in g.causes])
""")


@pytest.mark.slow
def test_explanations_not_printed_unless_user_asked():
    r = run_python(RECOMPILE_PROGRAM.format(user_flag=""))
    assert r.returncode == 0, r.stderr
    assert "TRACING CACHE MISS" not in r.stderr
    assert "changed f32[3] -> f32[4]" in r.stdout
    r = run_python(RECOMPILE_PROGRAM.format(
        user_flag='jax.config.update("jax_explain_cache_misses", True)'))
    assert r.returncode == 0, r.stderr
    assert "TRACING CACHE MISS" in r.stderr
    assert "changed f32[3] -> f32[4]" in r.stdout


@pytest.mark.slow
def test_a_miss_is_explained_against_the_previous_variant_only(fresh_metrics, monkeypatch):
    """jax_explain_cache_misses compares each miss with every cached variant
    (1,225 comparisons over 50 variants); the hook compares with one."""
    from jax._src.interpreters import partial_eval as pe

    compared = []
    diff = pe.diff_tracing_cache_keys
    monkeypatch.setattr(pe, "diff_tracing_cache_keys",
                        lambda new, old: compared.append(1) or diff(new, old))

    @jax.jit
    def grow(x):
        return x * 2

    for rows in range(1, 51):
        grow(jnp.zeros((rows, 3)))
    assert len(compared) == 49  # one per recompile of grow, none for JAX's own functions
    assert not jax.config.jax_explain_cache_misses  # the hook left the flag off
    causes = [c.description for g in _graphs(fresh_metrics, "jit(grow)") for c in g.causes]
    assert causes.count("first call") == 1
    assert "argument 'x' changed f32[49,3] -> f32[50,3]" in causes


LATE_FLAG_PROGRAM = textwrap.dedent("""
    import jax, jax.numpy as jnp, metrics
    metrics.install()
    f = jax.jit(lambda x: x + 1)
    f(jnp.ones(3)); f(jnp.ones(4))
    print("flag after install", jax.config.jax_explain_cache_misses, flush=True)
    jax.config.update("jax_explain_cache_misses", True)
    f(jnp.ones(5))
    metrics.uninstall()
    print("flag after uninstall", jax.config.jax_explain_cache_misses)
    print("causes", [c.description for g in metrics.snapshot().graphs for c in g.causes])
""")


@pytest.mark.slow
def test_explanations_the_user_turns_on_later_are_printed_once():
    r = run_python(LATE_FLAG_PROGRAM)
    assert r.returncode == 0, r.stderr
    assert "flag after install False" in r.stdout
    assert "flag after uninstall True" in r.stdout
    # Only the miss after the user's update is printed, by JAX itself (which
    # compares with every variant), once.
    assert r.stderr.count("TRACING CACHE MISS") == 1, r.stderr
    assert "* at x, now f32[5] and before" in r.stderr
    assert "changed f32[3] -> f32[4]" in r.stdout and "-> f32[5]" in r.stdout


FALLBACK_PROGRAM = textwrap.dedent("""
    import jax, jax.numpy as jnp, metrics
    from jax._src.interpreters import partial_eval
    del partial_eval.explain  # a JAX without the routine the hook calls
    metrics.install()
    f = jax.jit(lambda x: x + 1)
    f(jnp.ones(3)); f(jnp.ones(4))
    print("degraded", metrics.installed_engines()[0].degraded)
    print("flag", jax.config.jax_explain_cache_misses)
    print("causes", [c.description for g in metrics.snapshot().graphs for c in g.causes])
    metrics.uninstall()
    print("flag after uninstall", jax.config.jax_explain_cache_misses)
""")


@pytest.mark.slow
def test_without_the_cheap_explainer_the_flag_gives_causes_and_is_put_back():
    r = run_python(FALLBACK_PROGRAM)
    assert r.returncode == 0, r.stderr
    assert "cost O(variants) per compile: partial_eval.explain missing" in r.stdout
    assert "flag True" in r.stdout and "flag after uninstall False" in r.stdout
    assert "changed f32[3] -> f32[4]" in r.stdout
    assert "TRACING CACHE MISS" not in r.stderr


PERSISTENT_CACHE_PROGRAM = textwrap.dedent("""
    import json, jax, jax.numpy as jnp, metrics
    from tpu_info.views.findings import recompiles
    jax.config.update("jax_compilation_cache_dir", {cache!r})
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    metrics.install()
    @jax.jit
    def cached_fn(x, lr):
        return jnp.sin(x) * lr
    cached_fn(jnp.ones(16), 0.5).block_until_ready()
    cached_fn(jnp.ones(16), jnp.float32(0.5)).block_until_ready()  # the recompile
    s = metrics.snapshot()
    gs = [g for g in s.graphs if g.name == "jit(cached_fn)"]
    print(json.dumps({{"compiles": [g.compiles for g in gs], "hits": [g.cache_hits for g in gs],
                      "hashes": [g.hash for g in gs],
                      "cached": metrics.counter_value("CachedCompile"),
                      "uncached": metrics.counter_value("UncachedCompile"),
                      "events": [(e.kind, e.detail) for e in s.events
                                 if e.name == "jit(cached_fn)"],
                      "findings": [(f.kind, f.message) for f in recompiles(s)]}}))
""")


@pytest.mark.slow
def test_persistent_cache_hit_is_a_compile_whose_backend_was_loaded(tmp_path):
    """A warm persistent cache skips only the backend compile: the function is
    still traced, lowered and recompiled for the same cause, so the second run
    shows the recompile, its cause and "backend cache hit" (it showed
    "Compiles 0, Hits 1" and no finding)."""
    code = PERSISTENT_CACHE_PROGRAM.format(cache=str(tmp_path / "cache"))
    cold, warm = (json.loads(run_python(code).stdout.strip().splitlines()[-1])
                  for _ in range(2))
    assert (cold["compiles"], cold["hits"]) == ([1, 1], [0, 0])
    assert (warm["compiles"], warm["hits"]) == ([1, 1], [1, 1])
    assert warm["cached"] >= 2 and not warm["uncached"]
    assert cold["hashes"] == warm["hashes"]
    cause = "argument 'lr' changed f32[] (weak) -> f32[]"
    assert warm["events"] == [["compile", "backend cache hit"],
                              ["recompile", f"{cause}; backend cache hit"]]
    line = _line_of("# the recompile", PERSISTENT_CACHE_PROGRAM)
    [(kind, message)] = warm["findings"]
    assert kind == "recompile_weak_type", message
    assert message.startswith("jit(cached_fn) compiled 2 times (") and \
        ", 2 backend cache hits; 1 recompile" in message
    assert f"{cause} (weak type) at <string>:{line}. " in message
    assert "Pad or bucket" not in message and "persistent compilation cache" not in message


@pytest.mark.slow
def test_busy_percent_needs_tracked_calls():
    r = run_python("import jax, jax.numpy as jnp, metrics\n"
                   "metrics.install(serve=False)\n"
                   "jax.jit(lambda x: x + 1)(jnp.ones(2))\n"
                   "d = metrics.snapshot().devices[0]\n"
                   "print(d.busy_percent, '|', d.busy_reason)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("None |") and "metrics.track" in r.stdout


@pytest.mark.slow
def test_import_metrics_and_tpu_info_import_no_engine():
    r = run_python("import sys, metrics, tpu_info, tpu_info.outputs.textreport, tpu_info.commands.cli\n"
                   "bad = [m for m in ('jax', 'torch', 'jaxlib') if m in sys.modules]\n"
                   "print(bad)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_busy_percent_from_tracked_calls(fresh_metrics):
    import time

    import metrics

    @jax.jit
    def work(x):
        return (x @ x).sum()

    step = metrics.track(work)
    x = jnp.ones((64, 64))
    step(x).block_until_ready()
    metrics.snapshot()  # first reading: the window starts here
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        step(x).block_until_ready()
    dev = [d for d in metrics.snapshot().devices if d.memory.source == "live_arrays"][0]
    assert dev.busy_percent is not None and 0.0 < dev.busy_percent <= 100.0


def _module_imports(path, package: str = "metrics.engines.jax") -> set[str]:
    """Every module of ``package`` a file imports, at module level or inside
    functions (a lazy import is still an edge of the graph), not for type
    hints only (``if TYPE_CHECKING:``); ``from package import part`` counts
    as ``package.part``."""
    import ast

    found: set[str] = set()
    nodes: list[ast.AST] = [ast.parse(path.read_text())]
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            nodes.extend(node.orelse)
            continue
        nodes.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                found.update(f"{package}.{a.name}" for a in node.names)
            elif node.module.startswith(f"{package}."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(f"{package}."))
    return found


def test_the_jax_modules_import_one_way_and_stay_small():
    """The JAX package's parts form no import cycle, and none imports the
    engine (``engine.py``) back: the wrappers reach the installed engine
    through the shared context. Only the front door (``__init__``) loads
    the engine, and only when asked. Every part keeps under 500 lines."""
    from pathlib import Path

    import metrics.engines.jax

    here = Path(metrics.engines.jax.__file__).parent
    graph = {f"metrics.engines.jax.{p.stem}": _module_imports(p)
             for p in here.glob("*.py") if p.stem != "__init__"}
    engine = "metrics.engines.jax.engine"
    assert not any(engine in deps for name, deps in graph.items() if name != engine), graph

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        for dep in graph.get(name, ()):
            visit(dep, (*path, name))

    for name in graph:
        visit(name, ())
    for p in here.glob("*.py"):
        lines = len(p.read_text().splitlines())
        assert lines <= 500, f"{p.name} has {lines} lines"


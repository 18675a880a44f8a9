"""The Prometheus data model (issue 17, item 2): one family per concept with
labels, every counter present from the start, stable bounded per-graph series,
the default process collectors, busy time as a counter, promtool clean."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
import urllib.request

import jax
import jax.numpy as jnp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metrics.export import prometheus as prom
from metrics.recording import snapshot as snapshot_build
from metrics.recording.recorder import Recorder
from tests.metrics.export.test_prometheus import make_snapshot, samples
from tpu_info.contract import catalog
from tpu_info.contract.model import CounterReading, GraphRecord


def parse(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def exposition(snapshot_fn, top_graphs: int = prom.TOP_GRAPHS) -> tuple[str, CollectorRegistry]:
    reg = CollectorRegistry()
    reg.register(prom.SnapshotCollector(snapshot_fn, top_graphs))
    return generate_latest(reg).decode(), reg


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not shutil.which(promtool):
        pytest.skip("promtool not installed (Debian package prometheus)")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


@pytest.mark.slow
def test_engine_op_counters_are_one_family_with_an_op_label():
    ops = {"lazy::add": 5, "lazy::mm": 2, "xla::addmm": 3, "aten::nonzero": 1}
    snap = dataclasses.replace(make_snapshot(), counters=make_snapshot().counters + tuple(
        CounterReading(name, n) for name, n in ops.items()))
    text, _ = exposition(lambda: snap)
    fams = parse(text)
    assert not [n for n in fams if n.startswith(("tpu_info_lazy_", "tpu_info_xla_",
                                                 "tpu_info_aten_"))], sorted(fams)
    got = {(s.labels["op_namespace"], s.labels["op"]): s.value for s in fams["tpu_info_ops"].samples}
    assert got == {("lazy", "add"): 5, ("lazy", "mm"): 2, ("xla", "addmm"): 3,
                   ("aten", "nonzero"): 1}
    assert fams["tpu_info_ops"].type == "counter"
    promtool_check(text)


@pytest.mark.slow
def test_every_counter_is_present_at_zero_before_the_first_event():
    snap = snapshot_build.build(Recorder())  # a real recorder that saw nothing yet
    text, _ = exposition(lambda: snap)
    fams = parse(text)
    for name in ("cached_compile", "uncached_compile", "hook_errors", "graphs_evicted",
                 "mark_step"):
        s = samples(fams[f"tpu_info_{name}"])
        assert s == {(f"tpu_info_{name}_total", ()): 0.0}, name
    for kind_name, (kind, unit, _) in catalog.CATALOG.items():
        # counters every engine records: at zero; histograms: with their first sample
        there = kind == "counter" and kind_name not in catalog.ENGINES
        assert (prom.metric_name(kind_name, unit) in fams) == there, kind_name
    other = ("tpu_info_graph_compiles_total",
             (("computation", "other"), ("engine", ""), ("graph", "other"),
              ("name", "other graphs")))
    assert samples(fams["tpu_info_graph_compiles"]) == {other: 0.0}
    promtool_check(text)


def test_each_engine_gets_its_own_families_and_a_mirror_is_left_out():
    """Issue 30, item 3: a JAX process shows no torch.compile family (not even
    at zero), a torch.compile one no JAX family; a histogram comes with its
    first sample; JAX's jax.monitoring copy of CompileTime is left out beside it."""
    base = make_snapshot()

    def names(engine: str, dists) -> set[str]:
        snap = dataclasses.replace(base, process=dataclasses.replace(base.process,
                                                                     engine=engine),
                                   distributions=dists)
        return set(parse(exposition(lambda: snap)[0]))

    compile_time, outbound = base.distributions
    mirror = dataclasses.replace(compile_time, name="/jax/core/compile/backend_compile_duration")
    empty = dataclasses.replace(outbound, name="StepTime", count=0, total=0.0, buckets=None,
                                min=None, max=None)
    jax_names = names("jax", (compile_time, mirror, empty))
    assert {"tpu_info_jax_monitoring_dropped", "tpu_info_device_busy_time_seconds",
            "tpu_info_compile_time_seconds"} <= jax_names
    assert not {"tpu_info_graph_breaks", "tpu_info_eager_fallback_time_seconds",
                "tpu_info_jax_core_compile_backend_compile_duration_seconds",
                "tpu_info_step_time_seconds"} & jax_names
    torch_names = names("torch_compile,torch_lazy", (compile_time,))
    assert "tpu_info_graph_breaks" in torch_names
    assert not {"tpu_info_jax_monitoring_dropped", "tpu_info_implicit_transfer_to_device",
                "tpu_info_lowering_time_seconds"} & torch_names
    # The engine's record alone (no CompileTime beside it) is exported.
    alone = names("jax", (mirror,))
    assert "tpu_info_jax_core_compile_backend_compile_duration_seconds" in alone


def test_a_one_off_figure_is_one_gauge_not_a_histogram():
    """The backends' start-up (BackendStartTime, one sample a process) is
    tpu_info_backend_start_seconds, a gauge of its total: no buckets."""
    from tpu_info.outputs.prometheus import families

    base = make_snapshot()
    compile_time, _ = base.distributions
    start = dataclasses.replace(compile_time, name=catalog.BACKEND_START_TIME, count=1,
                                total=7.5e9, min=7.5e9, max=7.5e9)
    fams = {f.name: f for f in families(dataclasses.replace(base,
                                                            distributions=(compile_time, start)))}
    assert fams["tpu_info_backend_start_seconds"].type == "gauge"
    assert [s.value for s in fams["tpu_info_backend_start_seconds"].samples] \
        == [pytest.approx(7.5)]
    assert "tpu_info_backend_start_time_seconds" not in fams
    assert fams["tpu_info_compile_time_seconds"].type == "histogram"
    unstarted = {f.name for f in families(dataclasses.replace(base, distributions=(
        compile_time, dataclasses.replace(start, count=0, total=0.0))))}
    assert "tpu_info_backend_start_seconds" not in unstarted  # from its first sample on


def _graph(i: int, compiles: int, seconds: float) -> GraphRecord:
    return GraphRecord(hash=f"{i:04x}" + "0" * 60, name=f"jit(f{i})", engine="jax",
                       first_seen_unix=float(i), last_seen_unix=float(i), compiles=compiles,
                       compile_seconds_total=seconds, cache_hits=compiles, executions=compiles)


def test_graph_series_are_stable_and_grow_across_graph_churn():
    """Graphs come and go (the ledger evicts; later graphs compile longer, so a
    top-by-compile-time rule would swap series): the set of series stays the
    same, bounded, and no value goes down."""
    top = 5
    ledgers = [
        [_graph(i, 1, 0.1) for i in range(8)],
        [_graph(i, 2, 0.2) for i in range(8)],
        # g0..g3 evicted, g8..g19 arrive with long compiles
        [_graph(i, 2, 0.2) for i in range(4, 8)] + [_graph(i, 3, 9.0) for i in range(8, 20)],
        # g0 compiles again: a fresh ledger entry, its counts from 1
        [_graph(0, 1, 0.1)] + [_graph(i, 3, 9.0) for i in range(8, 20)],
    ]
    rounds = iter(ledgers)
    base = make_snapshot()
    collector_fn = lambda: dataclasses.replace(base, graphs=tuple(next(rounds)))  # noqa: E731
    reg = CollectorRegistry()
    reg.register(prom.SnapshotCollector(collector_fn, top))
    series_sets, previous = [], {}
    for _ in ledgers:
        fams = parse(generate_latest(reg).decode())
        now = {}
        for fam in ("tpu_info_graph_compiles", "tpu_info_graph_compile_seconds",
                    "tpu_info_graph_cache_hits", "tpu_info_graph_executions"):
            now.update(samples(fams[fam]))
        series_sets.append(set(now))
        for key, value in previous.items():
            assert now[key] >= value, (key, value, now[key])
        previous = now
    assert all(s == series_sets[0] for s in series_sets), series_sets
    assert len(series_sets[0]) == 4 * (top + 1)
    compiles = {dict(k[1])["graph"]: v for k, v in previous.items()
                if k[0] == "tpu_info_graph_compiles_total"}
    assert compiles[f"{0:04x}" + "0" * 8] == 2 + 1  # kept 2, then counted 1 more
    # other: g5..g7 (2 each, evicted later) + g8..g19 (3 each)
    assert compiles["other"] == 3 * 2 + 12 * 3
    assert samples(fams["tpu_info_graphs_evicted"]) == {("tpu_info_graphs_evicted_total",
                                                          ()): 0.0}


@pytest.mark.slow
def test_families_add_constant_labels_to_every_series_and_stay_promtool_clean():
    """The host exporter's call: one process's families with host/pid/rank on
    every series (the process info's own host/pid give way)."""
    from tpu_info.outputs import prometheus as families_mod

    snap = dataclasses.replace(make_snapshot(), counters=make_snapshot().counters
                               + (CounterReading("lazy::add", 4),))
    labels = {"host": "tpu-vm-3", "pid": "4242", "rank": "7"}
    state = families_mod.SeriesState()

    class One:
        def collect(self):
            return families_mod.families(snap, labels, state=state)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(One())
    text = generate_latest(reg).decode()
    every = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert every and all({k: s.labels.get(k) for k in labels} == labels for s in every)
    [info] = [s for s in every if s.name == "tpu_info_process_info"]
    assert info.labels["name"] == "train.py" and info.labels["pid"] == "4242"
    promtool_check(text)


@pytest.mark.slow
def test_served_endpoint_has_the_default_process_and_python_collectors():
    from prometheus_client.openmetrics import parser as om_parser

    with prom.start_http(make_snapshot, port=0, environ={}) as server:
        body = urllib.request.urlopen(server.url, timeout=10).read().decode()
        om = urllib.request.Request(server.url, headers={
            "Accept": "application/openmetrics-text; version=1.0.0"})
        om_body = urllib.request.urlopen(om, timeout=10).read().decode()
    om_names = {f.name for f in om_parser.text_string_to_metric_families(om_body)}
    assert {"process_cpu_seconds", "tpu_info_ops", "tpu_info_graph_compiles"} <= om_names
    fams = parse(body)
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds", "python_info", "python_gc_collections"):
        assert name in fams, name
    assert "tpu_info_uncached_compile" in fams
    promtool_check(body)


def test_busy_time_is_a_counter_of_the_tracked_time(fresh_metrics):
    import metrics

    @jax.jit
    def work(x):
        return (x @ x).sum()

    def step(x):
        time.sleep(0.005)
        return work(x).block_until_ready()

    tracked = metrics.track(step)
    x = jnp.ones((32, 32))
    tracked(x)
    before = metrics.snapshot().counter(catalog.DEVICE_BUSY_TIME)
    start = time.monotonic_ns()
    for _ in range(20):
        tracked(x)
    wall_ns = time.monotonic_ns() - start
    snap = metrics.snapshot()
    busy_ns = snap.counter(catalog.DEVICE_BUSY_TIME) - before
    assert 20 * 5_000_000 <= busy_ns <= wall_ns  # at least the sleeps, at most the loop
    fams = parse(exposition(lambda: snap)[0])
    [(key, value)] = samples(fams["tpu_info_device_busy_time_seconds"]).items()
    assert key[0] == "tpu_info_device_busy_time_seconds_total"
    assert fams["tpu_info_device_busy_time_seconds"].type == "counter"
    assert value == pytest.approx(snap.counter(catalog.DEVICE_BUSY_TIME) / 1e9)


LAZY_PROGRAM = """
import json, torch, torch._lazy, torch._lazy.ts_backend
import metrics
from prometheus_client import CollectorRegistry, generate_latest
from metrics.export import prometheus as prom
torch._lazy.ts_backend.init()
metrics.install(engines=["torch_lazy"], serve=False)
x, w = torch.ones(5, 7, device="lazy"), torch.ones(7, 2, device="lazy")
for _ in range(3):
    y = (x @ w).tanh() + 1
    torch._lazy.mark_step()
reg = CollectorRegistry()
reg.register(prom.SnapshotCollector(metrics.snapshot))
print(generate_latest(reg).decode())
"""


@pytest.mark.slow
def test_real_torch_lazy_ops_are_one_family():
    pytest.importorskip("torch._lazy")
    from tests.conftest import run_python

    r = run_python(LAZY_PROGRAM, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    fams = parse(r.stdout)
    assert not [n for n in fams if n.startswith("tpu_info_lazy_")], sorted(fams)
    ops = {s.labels["op"]: s.value for s in fams["tpu_info_ops"].samples
           if s.labels["op_namespace"] == "lazy"}
    assert ops.get("tanh") == 3 and len(ops) >= 3, ops
    promtool_check(r.stdout)


def test_the_computation_label_is_the_same_where_only_the_rank_made_hashes_differ():
    """jax.distributed ranks compile one global jit under different cache keys
    (the compile options carry the process index): ``computation`` (name and
    input signature) is the same for them, and differs for other arguments."""
    from tpu_info.outputs.graph_series import GraphSeries

    rank0 = GraphRecord("a" * 64, "jit(step)", "jax", 1.0, 1.0, compiles=1,
                        signature=("x: f32[8] sharded('data',)",))
    rank1 = dataclasses.replace(rank0, hash="b" * 64)
    other_shape = dataclasses.replace(rank0, hash="c" * 64, signature=("x: f32[16]",))
    rows = GraphSeries(named=5).rows([rank0, rank1, other_shape])
    graph, computation = [r.labels[0] for r in rows], [r.labels[3] for r in rows]
    assert graph[0] != graph[1] and computation[0] == computation[1] != computation[2]
    assert computation[3] == "other"

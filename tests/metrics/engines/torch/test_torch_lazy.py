"""The torch._lazy (lazy-tensor core, TorchScript backend) hook, real engine."""

from __future__ import annotations

import pytest

from tests.conftest import run_python

torch = pytest.importorskip("torch")
lazy = pytest.importorskip("torch._lazy")


@pytest.fixture(scope="module")
def ts_backend():
    import torch._lazy.ts_backend

    torch._lazy.ts_backend.init()
    return "lazy"


@pytest.fixture
def rec(ts_backend):
    import metrics

    r = metrics.install(engines=["torch_lazy"], serve=False)
    metrics.clear_all()
    r.ledger.clear()
    r.events.clear()
    yield r
    metrics.uninstall()


def _engine_counter(name: str) -> int:
    import torch._lazy.metrics as lm

    return lm.counter_value(name) or 0


def test_counters_are_the_engines_own_and_not_double_counted(rec, ts_backend):
    import metrics

    base = {n: _engine_counter(n) for n in ("UncachedCompile", "CachedCompile", "MarkStep")}
    x = torch.ones(5, 7, device=ts_backend)
    w = torch.ones(7, 2, device=ts_backend)
    lazy.mark_step()
    for _ in range(4):
        y = (x @ w).tanh()
        lazy.mark_step()
    assert y.cpu().shape == (5, 2)
    for name in ("UncachedCompile", "CachedCompile", "MarkStep"):
        assert metrics.counter_value(name) == _engine_counter(name) - base[name], name
    assert metrics.counter_value("MarkStep") == 5
    assert metrics.counter_value("lazy::tanh") == 4  # lazy:: op counters come through
    assert rec.registry.counter_value("UncachedCompile") is None  # never counted by us
    compiles = sum(g.compiles for g in rec.ledger.snapshot())
    assert compiles == metrics.counter_value("UncachedCompile")
    assert rec.registry.metric_data("CompileTime")[0] == compiles
    # cached steps ran a known graph: executions, with their time
    cached = metrics.counter_value("CachedCompile")
    assert cached >= 2
    assert sum(g.executions or 0 for g in rec.ledger.snapshot()) == cached
    assert rec.registry.metric_data("ExecuteTime")[0] == cached
    metrics.mark_step()  # our marker on the same steps: the larger count wins
    assert metrics.counter_value("MarkStep") == 5
    metrics.clear_all()
    assert metrics.counter_value("MarkStep") is None and _engine_counter("MarkStep") > 0


def test_graph_hashes_one_per_graph_and_cause_says_what_changed(rec, ts_backend):
    x = torch.ones(3, 3, device=ts_backend)
    lazy.mark_step()
    for op in ("relu", "sigmoid", "relu", "sigmoid"):
        _ = getattr(x * 2, op)()
        lazy.mark_step()
    graphs = {g.hash: g for g in rec.ledger.snapshot()}
    relu = [g for g in graphs.values() if g.compiles and g.executions]
    assert len(graphs) >= 2 and all(len(h) == 32 for h in graphs)
    assert relu, graphs  # relu compiled once, then ran again from the cache
    changed = [c.description for g in graphs.values() for c in g.causes]
    assert any("new ops aten::sigmoid" in d for d in changed), changed


def test_text_hash_ignores_source_lines():
    from metrics.engines.torch.lazy import diff_graphs, text_hash

    a = 'graph(%p0 : Tensor):\n  %1 : Tensor = aten::relu[source="a.py f 3"](%p0)\n  return (%1)\n'
    b = a.replace("a.py f 3", "b.py g 90")
    assert text_hash(a) == text_hash(b)
    c = a.replace("relu", "tanh")
    assert text_hash(a) != text_hash(c)
    assert diff_graphs(a, c) == "graph changed: new ops aten::tanh; ops gone aten::relu"


def test_graph_hash_helper_matches_engine(ts_backend):
    from torch._lazy import computation

    from metrics.engines.torch.lazy import graph_hash

    y = torch.ones(2, device=ts_backend) + 1
    assert graph_hash([y]) == computation.get_graph_hash([y]).hex()


@pytest.mark.slow
def test_auto_detects_lazy_after_ts_backend_init():
    code = """
import torch, metrics
import torch._lazy, torch._lazy.ts_backend
torch._lazy.ts_backend.init()
metrics.install(serve=False)
print(sorted(e.name for e in metrics.installed_engines()))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['torch_compile', 'torch_lazy']"

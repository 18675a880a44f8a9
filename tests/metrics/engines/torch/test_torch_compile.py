"""The torch.compile (Dynamo) hook against real torch on the CPU.

Dynamo behaviour is tested with the "eager" and "aot_eager" backends (no
Inductor compile); one test compiles with Inductor, the default backend.
"""

from __future__ import annotations

import pytest

from tests.conftest import patient, run_python
from tests.lines import line_of

torch = pytest.importorskip("torch")


@pytest.fixture
def rec():
    """The global recorder with the torch_compile hook, emptied around the test."""
    import metrics

    r = metrics.install(engines=["torch_compile"], serve=False)
    metrics.clear_all()
    r.ledger.clear()
    r.events.clear()
    torch._dynamo.reset()
    yield r
    metrics.clear_all()
    r.ledger.clear()
    r.events.clear()


def _line_of(text: str) -> int:
    return line_of(__file__, text)


def _graphs(rec, name: str):
    return sorted((g for g in rec.ledger.snapshot() if g.name == name),
                  key=lambda g: g.first_seen_unix)


class BatchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x).relu()


def test_batch_size_change_recompiles_with_cause(rec):
    model = torch.compile(BatchNet(), backend="eager")
    for n in (4, 4, 8, 8, 5):
        model(torch.ones(n, 3))  # the call site
    graphs = _graphs(rec, "compile(BatchNet.forward)")
    assert [g.compiles for g in graphs] == [1, 1]
    # automatic dynamic shapes: the second graph serves 8 and 5
    assert [g.executions for g in graphs] == [2, 3]
    first, second = graphs
    assert first.signature == ("x: f32[4,3]",)
    assert second.signature[0].startswith("x: f32[s") and second.signature[0].endswith(",3]")
    assert first.causes[-1].description == "first call"
    cause = second.causes[-1]
    assert cause.description == "tensor 'x' size mismatch at index 0. expected 4, actual 8"
    assert (cause.argument, cause.before, cause.after) == ("x", "f32[4,3]", "f32[8,3]")
    assert (cause.kind, cause.guard, cause.dim) == ("batch_size", "size", 0)  # typed by the hook
    assert cause.location.endswith(f"test_torch_compile.py:{_line_of('# the call site')}")
    reg = rec.registry
    assert reg.counter_value("UncachedCompile") == 2
    assert reg.counter_value("ExecuteComputation") == 5
    assert reg.metric_data("CompileTime")[0] == 2
    assert reg.metric_data("ExecuteTime")[0] == 5
    kinds = [e.kind for e in rec.events.since(0)[0] if e.name == "compile(BatchNet.forward)"]
    assert kinds == ["compile", "recompile"]
    import metrics

    report = metrics.metrics_report()
    assert "tensor 'x' size mismatch at index 0: 4 -> 8" in report
    # 4 -> 8 at one call site: the batch size varies (not a short last batch).
    assert "(batch size varies)" in report and "Pad or bucket batches" in report
    assert "Pad or bucket the last batch" not in report


def test_graph_hash_is_stable_and_names_the_graph(rec):
    def double(x):
        return x * 2 + 1

    compiled = torch.compile(double, backend="eager")
    compiled(torch.ones(3))
    (g,) = _graphs(rec, "compile(test_graph_hash_is_stable_and_names_the_graph.<locals>.double)")
    torch._dynamo.reset()
    rec.ledger.clear()
    torch.compile(double, backend="eager")(torch.ones(3))
    (again,) = rec.ledger.snapshot()
    assert again.hash == g.hash and len(g.hash) == 32
    torch._dynamo.reset()
    torch.compile(double, backend="eager")(torch.ones(3, dtype=torch.float64))
    assert len({x.hash for x in rec.ledger.snapshot()}) == 2


def test_graph_break_detected_with_reason_line_and_measured_time(rec):
    import metrics

    def chatty(x):
        y = x * 2
        print("step")  # graph break here
        return y + 1

    compiled = torch.compile(chatty, backend="aot_eager")
    for _ in range(6):
        compiled(torch.ones(4))
        metrics.mark_step()
    assert rec.registry.counter_value("GraphBreaks") == 1
    (brk,) = [e for e in rec.events.since(0)[0] if e.kind == "graph_break"]
    assert "print" in brk.detail and brk.detail.startswith("Failed to trace builtin operator")
    assert brk.location.endswith(f"test_torch_compile.py:{_line_of('# graph break here')}")
    names = {g.name for g in rec.ledger.snapshot()}
    line = _line_of("# graph break here")
    fn = "test_graph_break_detected_with_reason_line_and_measured_time.<locals>.chatty"
    assert names == {f"compile({fn})", f"compile({fn}@{line})"}  # the rest: its own graph
    from tpu_info.views import findings

    snap = metrics.snapshot()
    # The Python between the two graphs: every crossing counted, timed where
    # Dynamo did not compile in between (the first call compiles the rest).
    (site,) = [x for x in snap.sites if x.kind == "graph_break"]
    assert site.location.endswith(f"test_torch_compile.py:{line}") and site.count == 6
    assert site.function == f"compile({fn})" and site.seconds > 0
    (f,) = [f for f in findings.find(snap) if f.kind == "graph_break"]
    assert "print" in f.message and f":{line}" in f.message
    assert "Each crossing runs Python between the two graphs" in f.message
    assert "6 times, 1.0 per step" in f.message and "measured" in f.message
    assert f.seconds_lost == site.seconds and f.share_of_step is not None and f.count == 6


def _split(x):
    y = x * 2
    torch._dynamo.graph_break()  # splits _split in two graphs
    return y + 1


def test_recompile_of_a_function_split_by_a_break_is_one_finding(rec):
    """Both parts of a function recompile for one new size: one finding, with
    the function's own argument (``x``, not the resumed part's local ``y``)."""
    import metrics
    from tpu_info.views import findings

    compiled = torch.compile(_split, backend="eager")
    for n in (4, 4, 8, 8):
        compiled(torch.ones(n, 3))  # the split call
    line = _line_of("# splits _split")
    assert sorted(g.name for g in rec.ledger.snapshot()) == [
        "compile(_split)", "compile(_split)", f"compile(_split@{line})",
        f"compile(_split@{line})"]
    (f,) = [f for f in findings.find(metrics.snapshot()) if f.kind.startswith("recompile")]
    assert f.kind == "recompile_batch_size_varies", f.message
    assert f.message.startswith("compile(_split) compiled 2 times") and "1 recompile," in f.message
    assert "tensor 'x' size mismatch at index 0: 4 -> 8" in f.message
    assert "compiling in 2 graphs split by graph breaks" in f.message
    assert f.location.endswith(f"test_torch_compile.py:{_line_of('# the split call')}")


class _Part:
    def __init__(self, function, line, grad: bool = True) -> None:
        self.function, self.break_key = function, None if line is None else (function, line)
        self.grad = grad


def test_break_gaps_pair_parts_of_one_function_only():
    from metrics.engines.torch.compile.breaks import BreakGaps

    f = ("t.py", "f")
    head, rest, other = _Part(f, None), _Part(f, 7), _Part(("t.py", "g"), None)
    gaps = BreakGaps()
    gaps.located(f, 7, "/src/t.py:7", "compile(f)")
    gaps.fold([head, rest], [0, 150], [100, 200])  # 50 ns of Python in between
    gaps.compiled(1150)  # Dynamo compiled in the next gap: counted, not timed
    gaps.fold([head, rest, head, other, rest], [1000, 1200, 2000, 2200, 2300],
              [1100, 1300, 2100, 2250, 2400])  # another function's graph in between: none
    gaps.fold([head], [3000], [3100])
    gaps.fold([rest], [3160], [3200])  # a crossing split between two folds: 60 ns
    gaps.fold([rest, rest], [4000, 4500], [4100, 4600])  # the same part again: no crossing
    (site,) = gaps.sites(training=True)
    assert (site.kind, site.location, site.function) == ("graph_break", "/src/t.py:7",
                                                         "compile(f)")
    assert site.count == 3 and site.seconds == pytest.approx((50 + 60) / 2 * 3 / 1e9)
    assert site.work == ""
    # Crossings with gradients off in a program that trains: its evaluation's, apart.
    gaps.fold([_Part(f, None, False), _Part(f, 7, False)], [5000, 5100], [5050, 5200])
    steps, evals = sorted(gaps.sites(training=True), key=lambda x: x.work)
    assert (steps.count, evals.count, evals.work) == (3, 1, "evaluation")
    assert evals.seconds == pytest.approx(50 / 1e9)
    assert {x.work for x in gaps.sites(training=False)} == {""}  # inference: its steps
    gaps.clear()
    assert gaps.sites(training=True) == []


def test_hook_failure_is_counted_not_raised(rec, monkeypatch):
    from metrics.engines.torch.compile import record

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(record, "describe", broken)
    compiled = torch.compile(lambda x: x - 1, backend="eager")
    assert compiled(torch.ones(2)).tolist() == [0.0, 0.0]
    assert rec.registry.counter_value("HookErrors") >= 1


@pytest.mark.slow
def test_inductor_mlp_compiles_once_and_counts_steps(rec):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    compiled = torch.compile(model)  # default backend: Inductor
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(4):
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    graphs = rec.ledger.snapshot()
    assert len(graphs) == 1
    (g,) = graphs
    # A warm Inductor cache (an earlier run) loads the backend: still one Dynamo compile.
    assert g.compiles == 1 and g.cache_hits in (0, 1) and g.executions == 4
    assert g.signature == ("input: f32[8,16]",) or g.signature[0].endswith("f32[8,16]")
    assert rec.registry.counter_value("ExecuteComputation") == 4


@pytest.mark.slow
def test_uninstall_restores_dynamo():
    code = """
import torch, torch._dynamo, metrics
from torch._dynamo.output_graph import OutputGraph
before = OutputGraph.call_user_compiler
metrics.install(engines=["torch_compile"], serve=False)
assert OutputGraph.call_user_compiler is not before
metrics.uninstall()
assert OutputGraph.call_user_compiler is before
import torch._dynamo.utils as u
assert u.log_compilation_event.__module__ == "torch._utils_internal"
print("ok")
"""
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.slow
def test_lazy_dynamo_hooks_and_import_cost():
    code = """
import sys, metrics
assert "torch" not in sys.modules
import torch
metrics.install(serve=False)
assert [e.name for e in metrics.installed_engines()] == ["torch_compile"]
assert "torch._dynamo" not in sys.modules  # hooks wait for torch.compile
f = torch.compile(lambda x: x + 1, backend="eager")
f(torch.ones(2))
print(metrics.counter_value("UncachedCompile"))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


WARM_PROGRAM = r"""
import json, re
import metrics
metrics.install(engines=["torch_compile"], serve=False)
import torch
from tpu_info.views import findings

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x).relu()

model = torch.compile(Net())  # Inductor: its FX-graph cache is what warms up
for n in (24, 24, 40):
    model(torch.ones(n, 3))
s = metrics.snapshot()
print(json.dumps({
    "graphs": [[g.compiles, g.cache_hits, g.compile_seconds_total,
                [[c.description, c.location] for c in g.causes]] for g in s.graphs],
    "counters": {c.name: c.value for c in s.counters},
    "events": [[e.kind, e.detail] for e in s.events if e.kind in ("compile", "recompile")],
    "findings": [[f.kind, re.sub(r"compiled (\d+) times \([^)]*\)", r"compiled \1 times (T)",
                                   f.message)]
                 for f in findings.find(s)],
}))
"""


@pytest.mark.slow
def test_warm_inductor_cache_still_counts_the_recompile_and_its_cause(tmp_path):
    """Second run with the same TORCHINDUCTOR_CACHE_DIR: Dynamo still traces
    and recompiles on the failed guard, only Inductor's output is loaded."""
    import json

    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cold, warm = (run_python(WARM_PROGRAM, env=env, timeout=patient(240)) for _ in range(2))
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr[-2000:] + warm.stderr[-2000:]
    cold_doc, warm_doc = json.loads(cold.stdout), json.loads(warm.stdout)
    assert [g[:2] for g in cold_doc["graphs"]] == [[1, 0], [1, 0]]
    assert [g[:2] for g in warm_doc["graphs"]] == [[1, 1], [1, 1]]  # compiled, backend loaded
    assert all(g[2] > 0 for g in warm_doc["graphs"])  # Dynamo's own time, not 0 ns
    assert [g[3] for g in warm_doc["graphs"]] == [g[3] for g in cold_doc["graphs"]]
    assert warm_doc["graphs"][1][3][0][0] == (
        "tensor 'x' size mismatch at index 0. expected 24, actual 40")
    assert warm_doc["counters"].get("CachedCompile") == 2
    assert "UncachedCompile" not in warm_doc["counters"]
    assert [d for _, d in warm_doc["events"]] == [
        "backend cache hit",
        "tensor 'x' size mismatch at index 0. expected 24, actual 40; backend cache hit"]
    # A cold Inductor compile can take a large share of this short run (a
    # slow_compile finding, timing-dependent); the recompile reads the same warm.
    cold_found, warm_found = ([f for f in doc["findings"] if f[0] != "slow_compile"]
                              for doc in (cold_doc, warm_doc))
    assert warm_found == cold_found
    (kind, message), = warm_found
    assert kind == "recompile_batch_size_varies" and "size mismatch at index 0: 24 -> 40" in message


def _cause_of_last_recompile(rec, calls):
    from tpu_info.views.causes import classify

    for call in calls:
        call()
    graphs = sorted(rec.ledger.snapshot(), key=lambda g: g.first_seen_unix)
    cause = graphs[-1].causes[-1]
    return cause, classify(cause)


def _scale(x, n):
    return x * n


def _call_fn(x, fn):
    return fn(x)


@pytest.mark.parametrize("case,calls,words,kind", [
    ("size", lambda f: [f(torch.ones(24, 3)), f(torch.ones(40, 3))],
     "tensor 'x' size mismatch at index 0: 24 -> 40", "batch size varies"),
    ("dtype", lambda f: [f(torch.ones(4)), f(torch.ones(4, dtype=torch.float64))],
     "tensor 'x' dtype changed float32 -> float64", "dtype"),
    ("requires_grad", lambda f: [f(torch.ones(4)), f(torch.ones(4, requires_grad=True))],
     "tensor 'x' requires_grad changed False -> True", "requires_grad"),
    ("rank", lambda f: [f(torch.ones(4, 3)), f(torch.ones(4, 3, 2))],
     "tensor 'x' rank changed 2 -> 3", "shape change (rank)"),
])
def test_tensor_guard_failures_in_words(rec, case, calls, words, kind):
    compiled = torch.compile(lambda x: x * 2, backend="eager")
    cause, k = _cause_of_last_recompile(rec, [lambda: calls(compiled)])
    assert (k.words, k.kind) == (words, kind), cause
    assert "Pad or bucket" not in k.advice or kind == "batch size varies"


def test_grad_mode_guard_and_the_size_cause_after_it(rec):
    compiled = torch.compile(lambda x: x * 2, backend="eager")

    def evaluate(n):
        with torch.no_grad():
            compiled(torch.ones(n))

    cause, k = _cause_of_last_recompile(rec, [lambda: compiled(torch.ones(4)),
                                              lambda: evaluate(4)])
    assert k.kind == "grad_mode" and "torch.no_grad()" in k.advice and k.expected
    assert "Pad" not in k.advice and "bucket" not in k.advice.lower()
    # Back in training with a new size: the graph for grad mode fails on the
    # size; the eval graph's grad_mode failure must not hide it.
    cause, k = _cause_of_last_recompile(rec, [lambda: compiled(torch.ones(8))])
    assert (k.kind, k.words) == ("batch size varies", "tensor 'x' size mismatch at index 0: 4 -> 8")


def test_python_number_and_identity_guards_in_words(rec):
    scale = torch.compile(_scale, backend="eager")
    cause, k = _cause_of_last_recompile(rec, [lambda: scale(torch.ones(4), 2),
                                              lambda: scale(torch.ones(4), 3)])
    assert (k.words, k.kind) == ("argument 'n' changed 2 -> 3", "Python int specialized")
    assert "torch.tensor(n)" in k.advice and "dynamic" in k.advice
    torch._dynamo.reset()
    cause, k = _cause_of_last_recompile(rec, [lambda: scale(torch.ones(4), 2.0),
                                              lambda: scale(torch.ones(4), 3.5)])
    assert (k.words, k.kind) == ("argument 'n' changed 2.0 -> 3.5", "Python float specialized")
    torch._dynamo.reset()
    call = torch.compile(_call_fn, backend="eager")
    cause, k = _cause_of_last_recompile(rec, [lambda: call(torch.ones(4), lambda t: t + 1),
                                              lambda: call(torch.ones(4), lambda t: t + 1)])
    assert k.kind == "object identity" and k.words.startswith("'fn.__code__' is another object")
    assert "outside the loop" in k.advice


class RecurrentNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True)
        self.fc = torch.nn.Linear(16, 1)

    def forward(self, x):
        out, _ = self.lstm(x)  # unresumable break
        return self.fc(out[:, -1])


def test_unresumable_graph_break_says_time_outside_graphs_and_dynamos_hint(rec):
    import metrics
    from tpu_info.views import findings

    model = RecurrentNet()
    compiled = torch.compile(model, backend="eager")
    assert compiled._orig_mod is model  # still torch's OptimizedModule
    x = torch.randn(4, 10, 8)
    for _ in range(6):
        compiled(x)
        metrics.mark_step()
    (f,) = [f for f in findings.find(metrics.snapshot()) if f.kind == "graph_break_unresumable"]
    line = _line_of("# unresumable break")
    assert f"test_torch_compile.py:{line}" in f.message and "cannot resume from" in f.message
    assert "LSTM" in f.message and "torch._dynamo.config.allow_rnn=True" in f.message
    assert "of step time is spent outside compiled graphs" in f.message and "measured" in f.message
    assert "Python in between" not in f.message and f.seconds_lost > 0
    assert rec.registry.metric_data("EagerFallbackTime")[0] == 5  # the calls after the first


def _compiled_step(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(backend="eager")
    def step():
        opt.step()

    return step


def test_a_new_optimizer_is_said_replaced_not_other(rec):
    """pytorch/tutorials' compiling_optimizer_lr_scheduler makes a second Adam
    and compiles its step: Dynamo's "Cache line invalidated because L['self']
    got deallocated" was `recompile_other`, told to keep shapes fixed."""
    from tpu_info.views.causes import classify

    model = torch.nn.Linear(4, 4)
    model(torch.ones(4)).sum().backward()
    for _ in range(2):
        step = _compiled_step(model)
        step()
        step()
    causes = [c for g in rec.ledger.snapshot() for c in g.causes if c.kind != "first_call"]
    assert causes and all(c.kind == "object_replaced" for c in causes), causes
    k = classify(next(c for c in causes if c.argument == "self"))
    assert k.kind == "object replaced" and not k.expected
    assert k.words.startswith("'self' was freed and a new object took its place")
    assert "Create it once and reuse it" in k.advice and "shapes" not in k.advice

"""compile_share says the graphs first compiled inside the step loop as such,
first, with the advice that fits (warm them before the loop, or the cache
across runs): haiku's LSTM example compiled jit(loss) (0.5 s) at its first
validation, step 0, and compile_share listed it among "the other graphs";
optax's adversarial_training example compiled jit(pgd_attack) (1.9 s, 7 % of
a 27 s loop, under slow_compile's bar) at its first evaluation, and no
finding said it (compiling was 19 % of the run, under compile_share's bar)."""

from __future__ import annotations

from tpu_info.contract.model import (
    FIRST_CALL,
    DistributionReading,
    GraphRecord,
    ProcessRecord,
    RecompileCause,
    SiteReading,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views.findings import find

JAX = ProcessRecord(pid=7, name="prog.py", engine="jax")
CUT = 600  # the report's cut of a finding's words (FINDING_TEXT)


def _graph(name: str, seconds: float, ended: float, calls: int, line: str) -> GraphRecord:
    first = RecompileCause(ended - seconds - 0.01, FIRST_CALL, f"/w/{line}")
    return GraphRecord(name.ljust(64, "0"), name, "jax", ended, ended + 1.0, compiles=1,
                       compile_seconds_total=seconds, executions=calls, causes=(first,))


def _snap(graphs: tuple[GraphRecord, ...], uptime: float, steps: StepsReading,
          sites: tuple[SiteReading, ...]) -> Snapshot:
    total = sum(g.compile_seconds_total for g in graphs)
    ct = DistributionReading("CompileTime", Unit.TIME_NS, len(graphs), total * 1e9,
                             0.005e9, 30e9)
    return Snapshot(200.0, JAX, graphs=graphs, distributions=(ct,), uptime_seconds=uptime,
                    steps=steps, sites=sites)


def _share(s: Snapshot):
    (f,) = [f for f in find(s) if f.kind == "compile_share"]
    return f


def test_a_graph_compiled_at_step_0s_evaluation_is_said_so_first():
    # haiku_lstms: `if step % 100 == 0: loss(...)` before `update(...)`, so
    # jit(loss)'s compile ended 5 ms before the loop's start (update's first call).
    steps = StepsReading(2001, "inferred", "jit(update): the jitted function with the most "
                         "time (2,001 calls)", 5.8, first_unix=100.0, last_unix=106.0)
    graphs = (_graph("jit(_truncated_normal)", 1.2, 95.0, 2, "prog.py:120"),
              _graph("jit(loss)", 0.507, 99.995, 22, "prog.py:150"),
              _graph("jit(update)", 2.2, 102.3, 2001, "prog.py:153"),
              _graph("jit(apply_fn)", 28.7, 140.0, 57, "prog.py:200"))
    evaluation = SiteReading("call", "/w/prog.py:150", 20, phase="periodic", work="evaluation",
                             occurrences=20, first_seen_unix=100.5, last_seen_unix=105.9)
    f = _share(_snap(graphs, 55.0, steps, (evaluation,)))
    assert f.severity.label == "info"
    said = ("jit(loss) 507 ms first compiled inside the step loop (at step 0: the evaluation "
            "at prog.py:150, before the first step), so the loop waited for it: call it once "
            "before the loop on inputs of the same shapes, or enable the persistent "
            "compilation cache")
    assert said in f.message, f.message
    assert f.message.index("jit(loss)") < f.message.index("jit(apply_fn)")  # said first
    assert f.message.index("_min_compile_time_secs to 0") < CUT  # its advice within the cut
    assert "jit(update) 2.2 s first compiled" not in f.message  # the step's own first compile


def test_a_graph_first_compiled_at_an_evaluation_in_the_loop_is_news_on_its_own():
    # optax_adv: compiling 12% of the run (under compile_share's 25%), jit(pgd_attack)
    # 1.9 s (under slow_compile's 10% of the loop) at the first evaluation.
    steps = StepsReading(30, "inferred", "jit(train_step): the jitted function with the "
                         "most time (30 calls)", 27.2, first_unix=100.0, last_unix=127.2)
    graphs = (_graph("jit(init)", 2.0, 95.0, 1, "adv.py:150"),
              _graph("jit(train_step)", 1.56, 101.9, 30, "adv.py:168"),
              _graph("jit(accuracy)", 0.189, 102.3, 90, "adv.py:134"),
              _graph("jit(pgd_attack)", 1.92, 104.4, 46, "adv.py:135"))
    sites = (SiteReading("call", "/w/adv.py:171", 63, phase="periodic", work="evaluation",
                         occurrences=3, first_seen_unix=102.0, last_seen_unix=125.0),
             SiteReading("implicit_to_device", "/w/adv.py:135", 90, phase="periodic",
                         within="/w/adv.py:171", first_seen_unix=102.4, last_seen_unix=126.0),
             SiteReading("implicit_to_device", "/w/adv.py:134", 89, phase="periodic",
                         within="/w/adv.py:171", first_seen_unix=102.1, last_seen_unix=126.0))
    s = _snap(graphs, 47.0, steps, sites)
    f = _share(s)
    assert f.severity.label == "info"
    assert ("jit(pgd_attack) 1.9 s, jit(accuracy) 189 ms first compiled inside the step loop "
            "(in the evaluation led by adv.py:171), so the loop waited for them: call them "
            "once before the loop" in f.message), f.message
    assert "jit(train_step) 1.6 s first" not in f.message and len(f.message) <= CUT
    # Without the evaluation's compiles in the loop, a small share says nothing.
    quiet = _snap(graphs[:2], 47.0, steps, sites)
    assert not [f for f in find(quiet) if f.kind == "compile_share"]

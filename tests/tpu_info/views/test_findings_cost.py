"""Findings a performance engineer would write: kind, line, how often per step,
cost per step and share of step time (measured or estimated, said so), advice
that fits, ranked by cost in every output. Snapshots are built from model
records (data, not mocks); the JAX tests run real JAX on CPU."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from tests.tui.waiting import until_drawn
from tpu_info.contract.model import (
    CounterReading,
    DistributionReading,
    Event,
    GraphRecord,
    ProcessRecord,
    RecompileCause,
    SiteReading,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views.findings import find

ROOT = Path(__file__).resolve().parents[3]
JAX = ProcessRecord(pid=7, name="train.py", engine="jax")
STEPS = StepsReading(1200, "inferred", "jit(train_step): the compiled function with the most "
                     "time, 1,200 calls", seconds_total=164.0)


def _sync(count=1200, seconds=4.92, detail="float()", line=88) -> SiteReading:
    return SiteReading("sync", f"/src/train.py:{line}", count, bytes=4 * count,
                       seconds=seconds, function="train", detail=detail)


def _h2d(count=1200, nbytes=32_000_000 * 1200, seconds=0.0) -> SiteReading:
    return SiteReading("implicit_to_device", "/src/train.py:80", count, bytes=nbytes,
                       seconds=seconds, function="train", detail="numpy argument of jit(step)")


# This program's own timed host->device transfers: 20 of 1 GB in 2 s (10 GB/s),
# the rate an untimed copy is costed at (issue 41: measured, never assumed).
RATE = (DistributionReading("TransferToDeviceTime", Unit.TIME_NS, 20, 2e9, 1e8, 1e8),
        DistributionReading("OutboundData", Unit.BYTES, 1220, 2e10 + 32e6 * 1200, 1e9, 1e9))


def _snap(*sites: SiteReading, steps: StepsReading | None = STEPS, **kw) -> Snapshot:
    return Snapshot(taken_at_unix=0.0, process=JAX, sites=sites, steps=steps,
                    uptime_seconds=200.0, **kw)


def _one(s: Snapshot, kind: str):
    (f,) = [f for f in find(s) if f.kind == kind]
    return f


# Sites ------------------------------------------------------------------------------

def test_per_step_sync_names_line_frequency_and_measured_cost():
    f = _one(_snap(_sync()), "per_step_sync")
    assert f.message == (
        "float() at train.py:88 reads a value back to the host every step (1,200 times, 1.0 "
        "per step, 4.1 ms/step, 3.0% of step time, measured; at most this: the wait includes "
        "the device's own work, which runs either way): the host waits for the device "
        "to finish, then the device waits for the host. Log every N steps if it is logged (or "
        "accumulate it with jnp and read once); test every N steps if it decides when to stop "
        "(or keep the test on the device: lax.while_loop); read it once before the loop if it "
        "never changes.") and f.severity == "warning"
    assert f.location == "/src/train.py:88" and f.count == 1200 and f.per_step == 1.0
    assert f.seconds_per_step == pytest.approx(0.0041) and not f.cost_estimated
    assert f.share_of_step == pytest.approx(4.92 / 164) and f.seconds_lost == pytest.approx(4.92)


def test_sync_advice_fits_how_the_value_was_read():
    printed = _one(_snap(_sync(detail="print")), "per_step_sync").message
    branched = _one(_snap(_sync(detail="bool() (if x > 0:)")), "per_step_sync").message
    assert "jax.debug.print" in printed and "accumulate" not in printed
    assert "lax.cond" in branched and "jnp.where" in branched


def test_sync_with_steps_unknown_gives_the_total_and_no_per_step_figure():
    f = _one(_snap(_sync(), steps=None), "per_step_sync")
    assert ("float() at train.py:88 reads a value back to the host 1,200 times (1,200 times, "
            "4.9 s in all, measured; steps are not known, so no per-step figure)") in f.message
    assert f.per_step is f.seconds_per_step is f.share_of_step is None and f.count == 1200


def test_cheap_or_rare_sites_are_not_findings():
    cheap_most = _sync(count=700, seconds=0.0005)  # in 58% of the steps: not every step
    rare = _sync(count=100, seconds=3.0, line=90)  # one step in 12: logging every N steps already
    assert not [f for f in find(_snap(cheap_most, rare)) if f.kind == "per_step_sync"]


def test_explicit_device_get_already_counted_at_a_line_is_not_counted_twice():
    d2h = DistributionReading("TransferFromDeviceTime", Unit.TIME_NS, 1200, 4.92e9, 1e6, 1e7)
    fs = [f for f in find(_snap(_sync(), distributions=(d2h,))) if f.kind == "per_step_sync"]
    assert len(fs) == 1 and fs[0].location == "/src/train.py:88"


# Ranking and kinds --------------------------------------------------------------------

def _recompile(lost: float) -> tuple[GraphRecord, GraphRecord]:
    cause = RecompileCause(2.0, "argument 'batch' changed f32[32,128] -> f32[17,128]",
                           "/src/train.py:40", "batch", "f32[32,128]", "f32[17,128]")
    return (GraphRecord("a" * 64, "jit(train_step)", "jax", 1.0, 1.0, compiles=1,
                        compile_seconds_total=1.0, compile_seconds_last=1.0),
            GraphRecord("b" * 64, "jit(train_step)", "jax", 2.0, 2.0, compiles=1,
                        compile_seconds_total=lost, compile_seconds_last=lost,
                        causes=(cause,)))


def test_findings_rank_by_cost_and_every_one_has_a_snake_case_kind():
    s = _snap(_sync(), _h2d(seconds=9.0), graphs=_recompile(2.0),
              counters=(CounterReading("aten::nonzero", 3), CounterReading("HookErrors", 1)))
    fs = find(s)
    assert [f.kind for f in fs[:3]] == ["per_step_implicit_transfer", "per_step_sync",
                                        "recompile_short_last_batch"]
    assert [f.seconds_lost for f in fs] == sorted((f.seconds_lost for f in fs), reverse=True)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", f.kind) for f in fs), [f.kind for f in fs]
    rc = fs[2]
    assert "1 recompile, 2.0 s: 0.00083 per step, 1.7 ms/step, 1.2% of step time, measured" \
        in rc.message and rc.share_of_step == pytest.approx(2.0 / 164)


def test_recompile_kinds_name_the_cause():
    from tpu_info.views.causes import CauseAdvice
    from tpu_info.views.findings import cause_kind_name
    assert cause_kind_name(CauseAdvice("second batch size, e.g. evaluation vs training",
                                     "", "", "")) == "recompile_second_batch_size"
    assert cause_kind_name(CauseAdvice("global state: grad_mode", "", "", "")) == \
        "recompile_global_state_grad_mode"
    assert cause_kind_name(CauseAdvice("weak type: a Python scalar and an array alternate",
                                     "", "", "")) == "recompile_weak_type"


# Eager work, compile share, graph breaks ---------------------------------------------

def _eager_with_step() -> Snapshot:
    ops = ["jit(matmul)", "jit(_argmax)", "jit(equal)", "jit(_mean)"]
    tiny = [GraphRecord(f"{i:064x}", ops[i % 4], "jax", 1.0, 1.0, compiles=1,
                        compile_seconds_total=0.05, compile_seconds_last=0.05)
            for i in range(40)]
    step = GraphRecord("f" * 64, "jit(train_step)", "jax", 1.0, 1.0, compiles=1,
                       compile_seconds_total=0.5, compile_seconds_last=0.5, executions=1200)
    lines = ["/src/mnist.py:40"] * 30 + ["/src/mnist.py:41"] * 10
    events = tuple(Event(i + 1, 1.0, "compile", g.name, g.hash, location=loc)
                   for i, (g, loc) in enumerate(zip(tiny, lines, strict=True)))
    ct = DistributionReading("CompileTime", Unit.TIME_NS, 41, 2.5e9, 0.05e9, 0.5e9)
    return Snapshot(0.0, JAX, graphs=(*tiny, step), events=events, distributions=(ct,),
                    steps=STEPS, uptime_seconds=5.0)


def test_eager_ops_name_the_outer_call_when_nested_functions_led_to_the_ops():
    s = _eager_with_step()
    via = "called from accuracy() at /src/mnist.py:104 via predict()"
    own = "called from accuracy() at /src/mnist.py:104"
    init = "called from init() at /src/mnist.py:90"
    details = [via] * 20 + [own] * 15 + [init] * 5
    s = replace(s, events=tuple(replace(e, detail=d) for e, d in zip(s.events, details,
                                                                      strict=True)))
    f = _one(s, "eager_ops")
    assert f.location == "/src/mnist.py:104"
    assert ("in accuracy(), called at mnist.py:104 (its ops at mnist.py:40 in predict() and "
            "2 other lines; 1 other call compiles ops too)") in f.message, f.message
    assert "jit accuracy() (called at mnist.py:104), so it compiles once" in f.message


def test_eager_ops_name_their_line_and_say_jit_that_function_when_the_step_is_jitted():
    s = _eager_with_step()
    f = _one(s, "eager_ops")
    assert f.location == "/src/mnist.py:40"
    assert "eager, un-jitted code at mnist.py:40 (and 1 other line)" in f.message
    assert "The step, jit(train_step), is already jitted" in f.message
    assert "jit the function that holds mnist.py:40" in f.message
    assert "accuracy/eval function" in f.message
    assert "wrap the loop body" not in f.message.lower()
    assert "40 times" not in f.message and "2.0 s compiling, 0.033 per step" in f.message
    fs = find(s)
    assert not any("persistent compilation cache" in x.message for x in fs)
    assert not any(x.kind.startswith("recompile") for x in fs)  # jit(_argmax) is one op


def test_compile_share_advice_fits_the_engine():
    big = tuple(GraphRecord(f"{i:064x}", f"forward_{i}", "torch_compile", 1.0, 1.0,
                            compiles=1, compile_seconds_total=3.0) for i in range(3))
    ct = DistributionReading("CompileTime", Unit.TIME_NS, 3, 9e9, 3e9, 3e9)
    s = Snapshot(0.0, ProcessRecord(1, "t.py", engine="torch_compile"), graphs=big,
                 distributions=(ct,), uptime_seconds=10.0)
    f = _one(s, "compile_share")
    assert "TORCHINDUCTOR_CACHE_DIR" in f.message and "jax_compilation_cache_dir" not in f.message


def test_unresumable_graph_break_gives_share_outside_graphs_and_dynamo_hint():
    detail = ("Encountered graph break that we cannot resume from. Compiling up to the "
              "previous resumable state, then skipping the rest of the function.\n"
              "Hint: Remove the torch.nn.LSTM call or move it out of the compiled region.")
    ex = DistributionReading("ExecuteTime", Unit.TIME_NS, 100, 1e9, 1e7, 1e7)
    steps = StepsReading(100, "marked", "metrics.mark_step", seconds_total=100.0)
    s = Snapshot(0.0, ProcessRecord(1, "t.py", engine="torch_compile"),
                 counters=(CounterReading("GraphBreaks", 1),), distributions=(ex,),
                 steps=steps, events=(Event(1, 1.0, "graph_break", "forward",
                                            location="/src/lstm.py:30", detail=detail),))
    f = _one(s, "graph_break_unresumable")
    assert "graph break in forward at lstm.py:30 that Dynamo cannot resume from" in f.message
    assert "99% of step time runs outside compiled graphs" in f.message
    assert "estimated as step time minus compiled-graph time" in f.message
    assert "Dynamo's hint: Remove the torch.nn.LSTM call" in f.message
    assert "Python in between" not in f.message
    assert f.cost_estimated and f.share_of_step == pytest.approx(0.99)


def test_the_hooks_unresumable_marker_is_the_contracts():
    """The torch.compile hook marks an unresumable break with the contract's
    marker (one spelling, read by the findings): no words of Dynamo's needed."""
    from tpu_info.contract.model import UNRESUMABLE_REST
    detail = f"Unsupported: LSTM {UNRESUMABLE_REST} Hint: move it out"
    s = Snapshot(0.0, ProcessRecord(1, "t.py", engine="torch_compile"),
                 counters=(CounterReading("GraphBreaks", 1),),
                 events=(Event(1, 1.0, "graph_break", "forward", location="/src/m.py:3",
                               detail=detail),))
    f = _one(s, "graph_break_unresumable")
    assert "runs the rest of it eagerly" in f.message and "move it out" in f.message


# Nothing seen ------------------------------------------------------------------------

BLIND = "np.asarray(x) on CPU: numpy's zero-copy buffer protocol bypasses the hook"


def test_no_problems_found_is_never_said_over_blind_spots():
    from tpu_info.outputs.textreport import metrics_report
    from tpu_info.views.values import TargetView, no_findings_text
    busy = Snapshot(0.0, JAX, graphs=(GraphRecord("a" * 64, "jit(step)", "jax", 1.0, 1.0,
                                                  compiles=1),), blind_spots=(BLIND,))
    said = no_findings_text([TargetView("t", busy)])
    assert said == f"No problems seen; not counted here: {BLIND}."
    report = metrics_report(busy)
    assert "No problems found" not in report and f"not counted here: {BLIND}" in report
    quiet = Snapshot(0.0, JAX, blind_spots=(BLIND,))
    (f,) = find(quiet)
    assert f.kind == "nothing_recorded" and BLIND in f.message


# Outputs -----------------------------------------------------------------------------

def _busy() -> Snapshot:
    return _snap(_sync(), _h2d(), graphs=_recompile(2.0), distributions=RATE)


def test_json_findings_carry_kind_count_and_cost():
    from tests.tpu_info.outputs.test_render import validate
    from tpu_info.outputs.jsonview import dumps, to_json
    from tpu_info.views.values import Header, TargetView
    doc = to_json([TargetView("127.0.0.1:8431", _busy())], header=Header(host="h",
                                                                          time_unix=0.0))
    validate(doc)
    fs = doc["targets"][0]["findings"]
    assert [f["kind"] for f in fs][:3] == ["per_step_sync", "per_step_implicit_transfer",
                                           "recompile_short_last_batch"]
    sync = fs[0]
    assert sync["count"] == 1200 and sync["per_step"] == 1.0 and not sync["cost_estimated"]
    assert sync["seconds_per_step"] == pytest.approx(0.0041)
    assert sync["share_of_step"] == pytest.approx(0.03)
    h2d = next(f for f in fs if f["kind"] == "per_step_implicit_transfer")
    assert h2d["cost_estimated"] is True
    dumps(doc)  # strict JSON


def test_cli_table_and_report_rank_with_cost():
    from rich.console import Console

    from tpu_info.outputs.render import findings_table
    from tpu_info.outputs.textreport import metrics_report
    from tpu_info.views.values import TargetView
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(findings_table([TargetView("127.0.0.1:8431", _busy())], None, 200))
    text = console.export_text()
    assert "Cost" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("warn")]
    assert "4.1 ms/step 3.0%" in rows[0] and "float() at train.py:88" in rows[0]
    assert "~3.2 ms/step 2.3%" in rows[1]  # an estimate
    assert "1.7 ms/step 1.2%" in rows[2]
    report = metrics_report(_busy())
    tail = report.split("Findings:\n")[1].splitlines()
    assert tail[0].startswith("  - [per_step_sync] float() at train.py:88")
    assert tail[1] == "    cost: 4.1 ms/step 3.0%"  # the table's cost cell
    assert tail[2].startswith("  - [per_step_implicit_transfer] numpy argument of jit(step)")
    assert tail[3] == "    cost: ~3.2 ms/step 2.3%"
    assert tail[4].startswith("  - [recompile_short_last_batch]")


async def test_tui_findings_panel_ranks_and_shows_cost():
    from datetime import UTC

    from tui.app import WatchApp
    from tui.fake import MAIN, FakeSource, FrozenClock
    from tui.source import Conn, Update
    from tui.widgets.findings import FindingsPanel
    snap = Snapshot(1.0, ProcessRecord(pid=7, name="train.py", engine="jax"),
                    sites=(_sync(), _h2d()), steps=STEPS, graphs=_recompile(2.0),
                    distributions=RATE)
    app = WatchApp(FakeSource([Update(MAIN, Conn.STREAMING, snap)]), 1.0,
                   clock=FrozenClock(), tz=UTC, tick_s=None)
    async with app.run_test(size=(200, 50)) as pilot:
        def lines() -> list[str]:
            text = "\n".join(app.main.query_one(FindingsPanel).plain_rows())
            return [ln for ln in text.splitlines() if ln.startswith(("warn", "info"))]

        await until_drawn(pilot, lines)
        drawn = lines()
    assert drawn[0].split()[1:3] == ["4.1", "ms/step"] and "float() at train.py:88" in drawn[0]
    assert "~3.2 ms/step" in drawn[1] and "copies 32.0 MB" in drawn[1]
    assert "jit(train_step) compiled" in "".join(drawn[2:])


def _scrape(snapshot: Snapshot) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from metrics.export import prometheus as prom
    reg = CollectorRegistry()
    reg.register(prom.SnapshotCollector(lambda: snapshot))
    return generate_latest(reg).decode()


@pytest.mark.slow
def test_prometheus_gauges_per_finding_kind():
    from prometheus_client.parser import text_string_to_metric_families
    text = _scrape(_busy())
    fams = {f.name: {s.labels["kind"]: s.value for s in f.samples}
            for f in text_string_to_metric_families(text) if f.name.startswith(
                ("tpu_info_finding", "tpu_info_findings"))}
    assert fams["tpu_info_findings"] == {"per_step_sync": 1.0,
                                         "per_step_implicit_transfer": 1.0,
                                         "recompile_short_last_batch": 1.0}
    assert fams["tpu_info_finding_seconds_lost"]["per_step_sync"] == pytest.approx(4.92)
    assert fams["tpu_info_finding_share_of_step_ratio"]["per_step_sync"] == \
        pytest.approx(0.03)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


# Real JAX ----------------------------------------------------------------------------

EAGER_PROGRAM = textwrap.dedent("""
    import metrics; metrics.install()
    import jax, jax.numpy as jnp
    from tpu_info.views.findings import find

    @jax.jit
    def train_step(w, x):
        return w - 0.01 * jnp.mean(x @ w)

    def accuracy(w, x):
        logits = x @ w
        return jnp.mean(jnp.argmax(logits, axis=1) == 0)

    train_step = metrics.track(train_step)
    w, x = jnp.ones((8, 4)), jnp.ones((16, 8))
    for i in range(24):
        w = train_step(w, x if i < 23 else jnp.ones((9, 8)))
        loss = jax.device_get(w[0, 0])
        metrics.mark_step()
        if i % 2 == 0:
            acc = accuracy(w, jnp.ones((16 + i, 8)))
    for f in find(metrics.snapshot()):
        print(f.kind, f.location, getattr(f, "per_step", None), "|", f.message)
""")


@pytest.mark.slow
def test_real_jax_eager_eval_recompile_and_sync(tmp_path: Path):
    prog = tmp_path / "mnist_like.py"
    prog.write_text(EAGER_PROGRAM)
    r = subprocess.run([sys.executable, str(prog)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                         "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    by_kind = {line.split()[0]: line for line in r.stdout.splitlines()}
    eager = by_kind["eager_ops"]
    assert f"{prog}:21 " in eager, eager  # the top-level call of accuracy()
    # accuracy()'s own line with argmax, mean and ==
    assert "eager, un-jitted code in accuracy(), called at mnist_like.py:21 (its ops at " \
        "mnist_like.py:12" in eager, eager
    assert "The step, jit(train_step), is already jitted" in eager
    assert "jit accuracy() (called at mnist_like.py:21)" in eager
    assert "wrap the loop body" not in eager.lower() and "persistent" not in r.stdout
    assert "of step time, measured" in eager or "more than the steps took" in eager  # no cap
    rc = by_kind["recompile_short_last_batch"]
    # One recompile in the loop is one-off work: said once, never spread over the steps.
    assert "(short last batch) at mnist_like.py:17" in rc and "per step" not in rc, rc
    assert "once in the step loop" in rc and "of run time" in rc, rc
    assert "per_step_sync" in by_kind and "1.0 per step" in by_kind["per_step_sync"]
    kinds = list(by_kind)
    assert kinds.index("eager_ops") < kinds.index("recompile_short_last_batch")


def test_torch_xla_value_reads_and_syncs_get_torch_xla_advice():
    xla = ProcessRecord(pid=3, name="t.py", engine="torch_xla")
    d2h = DistributionReading("TransferFromDeviceTime", Unit.TIME_NS, 100, 8.4e6, 8e4, 9e4)
    s = Snapshot(0.0, xla, counters=(CounterReading("MarkStep", 100),
                                     CounterReading("aten::_local_scalar_dense", 100)),
                 distributions=(d2h,))
    read = _one(s, "value_read")
    assert read.count == 100 and read.per_step == 1.0 and "1.0 per step" in read.message
    assert "after torch_xla.sync()" in read.message
    sync = _one(s, "per_step_sync")
    assert "loss.item()" in sync.message and "jax" not in sync.message


def test_torch_xla_occasional_value_reads_after_the_sync_are_not_a_warning():
    # pytorch/xla's test_train_mp_mnist.py logs loss.item() every 20 steps in a step
    # closure, after the sync: no extra graph, nothing to move.
    xla = ProcessRecord(pid=3, name="t.py", engine="torch_xla")
    s = Snapshot(0.0, xla, counters=(CounterReading("MarkStep", 770),
                                     CounterReading("aten::_local_scalar_dense", 77)))
    read = _one(s, "value_read")
    assert read.severity == "info" and "nothing to do" in read.message
    assert "one every 10 steps" in read.message and "cuts the graph" not in read.message
    # Two reads every 4 steps (float(loss) and isnan(loss).item() in one closure):
    # fewer reads than steps is still not every step.
    s = Snapshot(0.0, xla, counters=(CounterReading("MarkStep", 12),
                                     CounterReading("aten::_local_scalar_dense", 6)))
    read = _one(s, "value_read")
    assert read.severity == "info" and "one every 2 steps" in read.message, read.message


async def test_findings_say_the_same_words_in_cli_json_tui_and_report():
    """One snapshot with findings through all four outputs: each shows every finding's words
    and cost as the views derive them, and its kind where the output names kinds (JSON, report)."""
    from datetime import UTC

    from tpu_info.outputs.jsonview import to_json
    from tpu_info.outputs.render import render_text
    from tpu_info.outputs.textreport import metrics_report
    from tpu_info.views.derived import findings_of
    from tpu_info.views.values import Header, TargetView
    from tui.app import WatchApp
    from tui.fake import MAIN, FakeSource, FrozenClock
    from tui.source import Conn, Update
    from tui.widgets.findings import FindingsPanel

    snap = replace(_busy(), taken_at_unix=1.0)
    lines = findings_of(snap)
    assert len(lines) >= 3 and {f.cost for f in lines} - {"-"}
    head = Header(host="h", time_unix=0.0, tz=UTC)
    cli = render_text([TargetView(MAIN, snap)], 200, header=head)
    doc = to_json([TargetView(MAIN, snap)], header=head)["targets"][0]["findings"]
    report = metrics_report(snap)
    app = WatchApp(FakeSource([Update(MAIN, Conn.STREAMING, snap)]), 1.0,
                   clock=FrozenClock(), tz=UTC, tick_s=None)
    async with app.run_test(size=(200, 50)) as pilot:
        panel = app.main.query_one(FindingsPanel)
        for _ in range(100):  # until the update is drawn (a loaded machine takes a while)
            await pilot.pause(0.05)
            if panel.row_keys and not panel.row_keys[0].startswith("~"):
                break
        tui = "\n".join(panel.plain_rows())

    def squeeze(text: str) -> str:  # tables wrap long words over lines
        return "".join(text.split())

    cli_findings = cli[cli.index("\nFindings"):]
    assert [f["kind"] for f in doc] == [f.kind for f in lines]
    for f, j in zip(lines, doc, strict=True):
        for name, shown in (("cli", cli_findings), ("tui", tui), ("report", report)):
            assert squeeze(f.text) in squeeze(shown), (name, f.kind)
        assert j["message"] == f.text and j["cost"] == f.cost
        assert f"  - [{f.kind}] {f.text}" in report
        if f.cost != "-":
            assert f"  - [{f.kind}] {f.text}\n    cost: {f.cost}\n" in report + "\n"
            for name, shown in (("cli", cli_findings), ("tui", tui)):
                # the row that starts the finding carries its level and cost
                assert any(ln.lstrip().startswith(f.level) and f.cost in ln
                           and squeeze(f.text)[:20] in squeeze(ln)
                           for ln in shown.splitlines()), (name, f.kind)

"""Two runs compared: the figures that moved, graphs new by computation (not
hash), causes and findings new in B, and the --fail-on gate CI uses."""

from __future__ import annotations

import pytest

from tpu_info.contract.model import (
    DistributionReading,
    GraphRecord,
    ProcessRecord,
    RecompileCause,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views import diff

PROC = ProcessRecord(7, "train.py", engine="jax")


def _snap(step_s: float, graphs: tuple[GraphRecord, ...] = ()) -> Snapshot:
    ct = DistributionReading("CompileTime", Unit.TIME_NS, max(1, sum(g.compiles for g in graphs)),
                             sum(g.compile_seconds_total for g in graphs) * 1e9, 1e8, 1e9)
    return Snapshot(100.0, PROC, uptime_seconds=60.0, graphs=graphs, distributions=(ct,),
                    steps=StepsReading(1000, "marked", "metrics.mark_step", step_s * 1000))


STEP = GraphRecord("a" * 64, "jit(step)", "jax", 1.0, 2.0, compiles=1,
                   compile_seconds_total=0.5, compile_seconds_last=0.5,
                   signature=("f32[32,64]",))
# The same computation after a code move: another hash, the same signature.
STEP_MOVED = GraphRecord("c" * 64, "jit(step)", "jax", 1.0, 2.0, compiles=1,
                         compile_seconds_total=0.5, compile_seconds_last=0.5,
                         signature=("f32[32,64]",))
SHORT = GraphRecord("b" * 64, "jit(step)", "jax", 1.0, 2.0, compiles=1,
                    compile_seconds_total=0.4, compile_seconds_last=0.4,
                    signature=("f32[31,64]",),
                    causes=(RecompileCause(1.5, "argument 'x' changed f32[32,64] -> f32[31,64]",
                                           "/w/train.py:9", "x", "f32[32,64]", "f32[31,64]"),))


def test_a_recompile_added_in_b_is_a_new_graph_a_new_cause_and_fails_the_gate():
    a, b = _snap(0.010, (STEP,)), _snap(0.011, (STEP_MOVED, SHORT))
    c = diff.compare(a, b)
    assert c.new_graphs == ["jit(step)(f32[31,64])"] and not c.gone_graphs  # not by hash
    assert c.new_causes == ["jit(step): argument 'x' changed f32[32,64] -> f32[31,64]"]
    assert c.row("compiles").change == 1 and not c.row("compiles").worse()  # a total
    assert c.row("compiles_per_1k_steps").worse()  # the same length: the rate says it
    assert c.row("step_time_p50").change_words() == "+10%"
    conds = diff.parse_conditions("step_time_p50>+5%, compiles>+0, steps_per_s<-50%")
    held = [h for h, _ in diff.failed(conds, c)]
    assert held == [True, True, False]
    words = diff.failed(conds, c)[1][1]
    assert words == "compiles>+0: compiles +1 (1 -> 2)"


def test_the_same_run_twice_changes_nothing():
    c = diff.compare(_snap(0.01, (STEP,)), _snap(0.01, (STEP_MOVED,)))
    assert not c.new_graphs and not c.new_causes and not c.new_findings
    assert all(not r.worse() for r in c.rows)
    assert not any(h for h, _ in diff.failed(diff.parse_conditions("compiles>+0"), c))


@pytest.mark.parametrize("bad", ["", "speed>+5%", "compiles>>1", "compiles=+1"])
def test_a_condition_that_does_not_parse_says_how_to_write_one(bad):
    with pytest.raises(ValueError) as e:
        diff.parse_conditions(bad)
    assert "step_time_p50" in str(e.value) or "compiles" in str(e.value)


def _run(steps: int, step_s: float, compiles: int, h2d: int) -> Snapshot:
    """A run of ``steps`` steps at ``step_s`` each, ``compiles`` compiles, and
    ``h2d`` host->device transfers in all."""
    ct = DistributionReading("CompileTime", Unit.TIME_NS, compiles, compiles * 0.5e9, 4e8, 6e8)
    tt = DistributionReading("TransferToDeviceTime", Unit.TIME_NS, h2d, h2d * 1e5, 1e5, 1e5)
    return Snapshot(100.0, PROC, uptime_seconds=60.0, distributions=(ct, tt),
                    steps=StepsReading(steps, "marked", "metrics.mark_step", step_s * steps))


def test_runs_of_different_length_are_judged_by_their_rates_never_their_totals():
    """A 10,000-step baseline and a 3,000-step run of the same program: the
    totals move by -70% and nothing is worse (issue 43: "total steps -70%
    (worse)"); a rate that moved is."""
    a = _run(10_000, 0.010, compiles=20, h2d=10_000)
    b = _run(3_000, 0.010, compiles=6, h2d=3_000)
    c = diff.compare(a, b)
    steps = c.row("steps")
    assert steps.kind == diff.TOTAL and steps.change_words() == "-70%" and not steps.worse()
    assert not any(r.worse() for r in c.rows)
    assert c.row("compiles").change_words() == "-70%" and not c.row("compiles").judged
    assert c.row("compiles_per_1k_steps").a == c.row("compiles_per_1k_steps").b == 2.0
    assert c.row("h2d_per_step").change_words() == "same"
    assert c.length_words() == "B ran 70% fewer steps than A (3,000 vs 10,000)"
    # The same short run with twice the transfers per step and a slower step: worse.
    worse = diff.compare(a, _run(3_000, 0.012, compiles=6, h2d=6_000))
    assert {r.key for r in worse.rows if r.worse()} == {"steps_per_s", "step_time_p50",
                                                          "h2d_per_step"}
    assert [r.kind for r in worse.rows] == sorted((r.kind for r in worse.rows),
                                                  key=lambda k: k != diff.RATE)


def test_the_printed_diff_puts_rates_and_totals_apart_and_json_says_which(tmp_path, capsys):
    from tpu_info.commands.cli import main
    from tpu_info.wire import runfile
    from tpu_info.wire.encoder import snapshot_to_bytes

    paths = []
    for name, run in (("a", _run(10_000, 0.010, 20, 10_000)), ("b", _run(3_000, 0.010, 6, 3_000))):
        p = tmp_path / f"{name}{runfile.SUFFIX}"
        runfile.write(p, runfile.encode(snapshot_to_bytes(run), "exit", 200.0))
        paths.append(str(p))
    assert main(["diff", *paths]) == 0
    out = capsys.readouterr().out
    assert "(worse)" not in out
    rates, totals = out.index("Rates ("), out.index("Totals (")
    assert rates < out.index("compiles per 1,000 steps") < totals < out.index("\nsteps ")
    assert "B ran 70% fewer steps than A" in out
    assert main(["diff", *paths, "--json"]) == 0
    import json

    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["steps"]["kind"] == "total" and rows["steps"]["worse"] is None
    assert rows["steps_per_s"]["kind"] == "rate" and rows["steps_per_s"]["worse"] is False

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
    assert c.row("compiles").change == 1 and c.row("compiles").worse()
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

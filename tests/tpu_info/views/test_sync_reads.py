"""Reads of device values (syncs) in the step: named by count where they are
cheap on this CPU (a pipeline drain on an accelerator), and never twice for
one line (a graph break's read is the break's finding)."""

from __future__ import annotations

from tests.tpu_info.views.test_findings_cost import _one, _snap, _sync
from tpu_info.contract.model import SiteReading, StepsReading
from tpu_info.views.findings import find
from tpu_info.views.sites import not_raised


def test_a_cheap_read_in_every_step_is_named_as_info_for_what_it_costs_on_an_accelerator():
    # loss.item() every iteration costs microseconds on a CPU and a pipeline
    # drain on a GPU or TPU: named, as info, with the line and why.
    f = _one(_snap(_sync(seconds=0.0005, detail="Tensor.item()")), "per_step_sync")
    assert f.severity == "info" and f.location == "/src/train.py:88"
    assert "every step" in f.message and "0.42 us/step" in f.message
    assert "cheap on this CPU, but on a GPU or TPU each read drains the pipeline" in f.message
    few = _snap(_sync(count=5, seconds=0.0001),
                steps=StepsReading(5, "inferred", "jit(step)", seconds_total=1.0))
    assert not [f for f in find(few) if f.kind == "per_step_sync"]


def test_a_read_at_a_graph_break_line_is_the_breaks_finding_not_a_second_one():
    # `if h.mean().item() > 10.0:` in a compiled forward: Dynamo breaks the
    # graph there and the eager part reads the value every step.
    brk = SiteReading("graph_break", "/src/train.py:56", 1200, seconds=0.5,
                      detail="Tensor.item()")
    read = _sync(seconds=0.0005, detail="item()", line=56)
    s = _snap(brk, read)
    assert not [f for f in find(s) if f.kind == "per_step_sync"]
    assert "graph break at this line" in not_raised(s)[s.sites.index(read)]

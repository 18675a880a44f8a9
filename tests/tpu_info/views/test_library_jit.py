"""A library jit wrapper's own host time (``library_jit`` sites) as a finding
and a part of the step: said where the host's work is the step's (issue 41's
nnx_vae: nnx.jit's split/merge, a third of the step by A/B), not where the
host waited at its reads for the device's queued work (optax_mlp: the same
wrapper, 5% of a device-bound step, nnx.cached_partial saved nothing), and
never for an evaluation's wrapper."""

from __future__ import annotations

from dataclasses import replace

from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
from tpu_info.views.breakdown import breakdown
from tpu_info.views.findings import find
from tpu_info.views.library_jit import not_raised

STEPS = StepsReading(1600, "inferred", "jit(train_step): the jitted function with the most time",
                     14.5, first_unix=100.0, last_unix=114.5)


def _wrapper(seconds: float, detail: str = "jit(train_step)", count: int = 1600) -> SiteReading:
    return SiteReading("library_jit", "/w/prog.py:165", count, seconds=seconds,
                       detail=detail, via="flax nnx.jit", timed=118, occurrences=count,
                       first_seen_unix=100.0, last_seen_unix=114.5, phase="step")


def _snap(*sites: SiteReading) -> Snapshot:
    return Snapshot(0.0, uptime_seconds=20.0, steps=STEPS, sites=sites)


def test_a_large_share_is_a_warning_at_the_users_line_with_flaxs_fix():
    s = _snap(_wrapper(6.27))
    [f] = [f for f in find(s) if f.kind == "library_jit_overhead"]
    assert f.location == "/w/prog.py:165" and f.severity.label == "warn"
    assert 0.4 < (f.share_of_step or 0) < 0.45 and f.seconds_per_step is not None
    assert "median of 118 sampled calls: 3.9 ms" in f.message
    assert "nnx.cached_partial(train_step, model, optimizer)" in f.message
    assert "saves less than this figure" in f.message
    b = breakdown(s)
    assert b is not None
    part = {p.name: p.seconds for p in b.step_parts}["jit wrapper (flax nnx.jit)"]
    assert abs(part - 6.27 / 1600) < 1e-9


def test_a_host_that_waited_for_the_devices_queued_work_hid_it():
    # optax_mlp: a print every 20 steps waited 6.4 s, of which 6.4 s the device's queued work.
    read = SiteReading("sync", "/w/prog.py:123", 30, seconds=6.42, detail="format()",
                       drain_seconds=0.0034, phase="periodic", first_seen_unix=101.0,
                       last_seen_unix=114.0)
    s = _snap(_wrapper(0.485, count=1600), read)
    assert not [f for f in find(s) if f.kind == "library_jit_overhead"]
    why = not_raised(s, s.sites[0])
    assert "ran beside the device's work" in why and "said from 5.0%" in why


def test_an_evaluations_wrapper_is_no_step_cost():
    s = _snap(_wrapper(6.27, detail="jit(eval_step)", count=1000))
    assert not [f for f in find(s) if f.kind == "library_jit_overhead"]
    assert not_raised(s, s.sites[0]) == "not the step's function (jit(train_step))"
    b = breakdown(s)
    assert b is not None and not [p for p in b.step_parts if p.name.startswith("jit wrapper")]


def test_what_cached_partial_leaves_is_told_to_go_functional_not_cached_again():
    s = _snap(replace(_wrapper(1.36), via="flax nnx.cached_partial"))
    [f] = [f for f in find(s) if f.kind == "library_jit_overhead"]
    assert f.message.startswith("flax nnx.cached_partial around jit(train_step) at prog.py:165")
    assert "nnx.split" in f.message and "step = nnx.cached_partial" not in f.message

"""A torch DataLoader's batches the loop waits for (``data_loader`` sites) as a
finding and a part of the step: pytorch/examples' vae loads each sample with
PIL and transforms in the training process (num_workers=0), 24-25 % of its
loop by A/B, and was said by nothing (nothing timed the DataLoader). An
evaluation's loader is its evaluation's time, and a cheap loader is said
why not in ``--json``."""

from __future__ import annotations

from dataclasses import replace

from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
from tpu_info.outputs.jsonview import report_json
from tpu_info.views.breakdown import breakdown
from tpu_info.views.data_loading import not_raised
from tpu_info.views.findings import find

# vae's shape: 469 batches an epoch, 2 epochs, a 17.5 ms step.
STEPS = StepsReading(938, "inferred", "optimizer.step(): 938 calls (Adam)", 16.4,
                     first_unix=100.0, last_unix=116.4)


def _loader(seconds: float, count: int = 938, workers: int = 0, **kw: object) -> SiteReading:
    fields: dict[str, object] = dict(
        seconds=seconds, detail=f"num_workers={workers}", first_seen_unix=99.99,
        last_seen_unix=116.39, phase="step", occurrences=count)
    fields.update(kw)
    return SiteReading("data_loader", "/w/main.py:95", count, **fields)  # type: ignore[arg-type]


def _snap(*sites: SiteReading) -> Snapshot:
    return Snapshot(0.0, uptime_seconds=25.0, steps=STEPS, sites=sites)


def test_loading_in_the_training_process_is_a_warning_at_the_for_line():
    s = _snap(_loader(5.8))  # 6.2 ms a batch of a 17.5 ms step
    [f] = [f for f in find(s) if f.kind == "per_step_data_loading"]
    assert f.location == "/w/main.py:95" and f.severity.label == "warn"
    assert abs((f.seconds_per_step or 0) - 5.8 / 938) < 1e-9
    assert 0.33 < (f.share_of_step or 0) < 0.37
    assert "loads every batch in the training process (num_workers=0)" in f.message
    assert "num_workers=N" in f.message and "pin_memory=True" in f.message
    assert "cache them" in f.message
    assert not_raised(s, s.sites[0]) == ""
    b = breakdown(s)
    assert b is not None
    part = {p.name: p for p in b.step_parts}["data loading"]
    assert abs(part.seconds - 5.8 / 938) < 1e-9 and "938 batches timed" in part.basis
    assert "data loading 6.2 ms" in b.lines()[1]
    (site,) = report_json("t", s)["target"]["sites"]
    assert site["kind"] == "data_loader" and site["not_raised"] is None


def test_workers_that_do_not_keep_up_are_said_with_their_count():
    s = _snap(_loader(4.9, workers=2))
    [f] = [f for f in find(s) if f.kind == "per_step_data_loading"]
    assert "waits for the batches of the DataLoader iterated at main.py:95 (num_workers=2)" \
        in f.message
    assert "Its 2 workers did not keep up" in f.message


def test_workers_that_outnumber_the_cores_are_not_told_to_add_more():
    # makemore: 4 workers on 2 cores (its step 28.6 ms, 40.0 ms with none):
    # "add workers (up to the free cores)" did not fit.
    s = _snap(replace(_loader(4.9, workers=4), detail="num_workers=4, cores=2"))
    [f] = [f for f in find(s) if f.kind == "per_step_data_loading"]
    assert "(num_workers=4)" in f.message and "add workers" not in f.message
    assert "Its 4 workers match or outnumber the 2 cores" in f.message
    assert "use fewer workers (num_workers=1 at most, leaving the step a core)" in f.message


def test_workers_on_one_core_are_told_to_load_in_the_training_process():
    # pytorch/tutorials' cifar10: 2 workers on 1 core, 4.8 ms a batch of wait
    # while its samples' work was 0.34 ms; num_workers=0 saved 41 % of the loop.
    # "more workers will not help. Make each sample cheaper" put the wrong fix first.
    s = _snap(replace(_loader(4.5, workers=2), detail="num_workers=2, cores=1"))
    [f] = [f for f in find(s) if f.kind == "per_step_data_loading"]
    assert "Its 2 workers match or outnumber the 1 core this process may use" in f.message
    advice = f.message[f.message.index("Its 2 workers"):]
    assert "use fewer workers (num_workers=0" in advice
    assert advice.index("num_workers=0") < advice.index("cheaper")
    assert "add workers" not in f.message and "1 cores" not in f.message


def test_loading_in_the_training_process_on_one_core_is_not_told_to_add_workers():
    # yunjey's GAN tutorial pinned to one core: per-sample loading 38 % of
    # the loop's CPU (A/B: batches made once); workers would take turns with
    # the step there, so the advice is the per-sample work done once.
    s = _snap(replace(_loader(5.8), detail="num_workers=0, cores=1"))
    [f] = [f for f in find(s) if f.kind == "per_step_data_loading"]
    assert "num_workers=N" not in f.message and "On the 1 core" in f.message
    assert "before the loop and caching them" in f.message
    two = _snap(replace(_loader(5.8), detail="num_workers=0, cores=2"))
    [f] = [f for f in find(two) if f.kind == "per_step_data_loading"]
    assert "num_workers=N" in f.message  # a core to spare: workers beside the step


def test_a_cheap_loader_is_said_why_not_in_json():
    s = _snap(_loader(0.3))
    assert not [f for f in find(s) if f.kind == "per_step_data_loading"]
    why = not_raised(s, s.sites[0])
    assert "1.8% of step time (said from 5.0%)" in why, why
    (site,) = report_json("t", s)["target"]["sites"]
    assert site["not_raised"] == why


def test_an_evaluations_loader_is_its_evaluations_time():
    test = _loader(2.0, count=158, within="/w/main.py:120", phase="periodic",
                   occurrences=158)
    s = _snap(_loader(5.8), replace(test, location="/w/main.py:121"))
    [f] = [f for f in find(s) if f.kind == "per_step_data_loading"]
    assert f.location == "/w/main.py:95"
    assert "its time is that finding's" in not_raised(s, s.sites[1])
    b = breakdown(s)
    assert b is not None
    part = {p.name: p for p in b.step_parts}["data loading"]
    assert abs(part.seconds - 5.8 / 938) < 1e-9  # the evaluation's batches are not the step's
    # A loader used before the loop only (set-up) costs no step.
    setup = _snap(_loader(5.8, count=100, phase="setup", last_seen_unix=99.0))
    assert not [f for f in find(setup) if f.kind == "per_step_data_loading"]
    assert "setup work, not in the steps" in not_raised(setup, setup.sites[0])

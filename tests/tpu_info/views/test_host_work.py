"""The user's own host code between steps (``host_work`` sites) as a finding
and a part of the step: said where the loop is host-bound (issue 41's
nnx_lifted: ``dataset()``'s np.random.choice and numpy indexing, 54-77
us of a ~260 us step by A/B, read as "other"), at most the step's host time
no other part took, not where the device's steps hide it."""

from __future__ import annotations

import dataclasses

from tpu_info.contract import catalog
from tpu_info.contract.model import (
    DistributionReading,
    GraphRecord,
    SiteReading,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views.breakdown import breakdown
from tpu_info.views.findings import find
from tpu_info.views.host_work import not_raised

# 10,000 steps of 260 us: 2.6 s.
STEPS = StepsReading(10_000, "inferred", "jit(train_step): the jitted function with the most "
                     "time", 2.6, first_unix=100.0, last_unix=102.6)


def _line(line: int, per_interval: float, intervals: int = 60, generator: bool = True,
          function: str = "dataset", detail: str = "") -> SiteReading:
    return SiteReading("host_work", f"/w/prog.py:{line}", intervals,
                       seconds=per_interval * intervals, function=function, detail=detail,
                       timed=intervals, occurrences=intervals, first_seen_unix=100.1,
                       last_seen_unix=102.5, phase="step", in_generator=generator)


def _snap(*sites: SiteReading, device: float = 0.00008, busy: float | None = 99.0,
          wrapper: float = 0.0) -> Snapshot:
    graphs = (GraphRecord("a" * 64, "jit(train_step)", "jax", 0.0, 0.0, compiles=1,
                          executions=10_000, device_seconds=device, device_samples=64),)
    dists = ()
    if busy is not None:
        dists = (DistributionReading(catalog.TRAINING_THREAD_BUSY, Unit.NUMBER, 9, 9 * busy,
                                     busy, busy, percentiles=((50.0, busy),)),)
    if wrapper:
        sites = (*sites, SiteReading("library_jit", "/w/prog.py:90", 10_000,
                                     seconds=wrapper * 10_000, detail="jit(train_step)",
                                     via="flax nnx.cached_partial", timed=200,
                                     occurrences=10_000, first_seen_unix=100.0,
                                     last_seen_unix=102.6, phase="step"))
    return Snapshot(0.0, uptime_seconds=4.0, steps=STEPS, graphs=graphs, sites=sites,
                    distributions=dists)


def test_a_generators_lines_on_a_host_paced_loop_are_one_finding_at_its_costliest():
    s = _snap(_line(30, 38e-6, detail="RandomState.choice"), _line(31, 22e-6))
    [f] = [f for f in find(s) if f.kind == "per_step_host_work"]
    assert f.location == "/w/prog.py:30" and f.severity.label == "warn"
    assert abs((f.seconds_per_step or 0) - 60e-6) < 1e-9
    assert 0.22 < (f.share_of_step or 0) < 0.24
    assert "dataset(), a generator the loop draws its batches from" in f.message
    assert "lines 30 (RandomState.choice), 31" in f.message
    assert "median of 60 sampled intervals between steps" in f.message
    assert "Make the batches ahead of the loop" in f.message
    b = breakdown(s)
    assert b is not None
    part = {p.name: p.seconds for p in b.step_parts}["your code between steps"]
    assert abs(part - 60e-6) < 1e-9
    assert not_raised(s, s.sites[1]) == "part of dataset()'s host work at prog.py:30"


def test_never_more_than_the_steps_host_time_no_other_part_took():
    # A wrapper's 240 us of a 260 us step leaves 20 us for the user's code.
    s = _snap(_line(30, 60e-6), wrapper=240e-6)
    [f] = [f for f in find(s) if f.kind == "per_step_host_work"]
    assert abs((f.seconds_per_step or 0) - 20e-6) < 1e-9


def test_several_lines_together_never_more_than_the_step_costliest_first():
    """jraph's five host-work lines, each capped at the step's host time
    alone, summed 131 % of the step: costliest first, each at most what the
    ones before left."""
    lines = [_line(20 + k, us * 1e-6, generator=False, function=f"make{k}")
             for k, us in enumerate((120, 100, 80, 40, 30))]  # 370 us of a 260 us step
    s = _snap(*lines)
    said = {f.location: f for f in find(s) if f.kind == "per_step_host_work"}
    per_step = {loc: f.seconds_per_step or 0.0 for loc, f in said.items()}
    assert sum(per_step.values()) <= 260e-6 + 1e-9, per_step
    assert list(per_step) == ["/w/prog.py:20", "/w/prog.py:21", "/w/prog.py:22"], per_step
    assert abs(per_step["/w/prog.py:22"] - 40e-6) < 1e-9, per_step
    assert "at most the 40 us the costlier lines left" in said["/w/prog.py:22"].message
    assert "said from 5.0%" in not_raised(s, lines[3])  # nothing left for it


def test_beside_a_device_bound_loops_steps_it_is_not_raised():
    # The device busy 250 of the 260 us (the thread waited for it): the
    # batches were made while the queued steps ran.
    s = _snap(_line(30, 60e-6), device=250e-6, busy=30.0)
    assert not [f for f in find(s) if f.kind == "per_step_host_work"]
    why = not_raised(s, s.sites[0])
    assert "ran beside the device's queued steps" in why and "not host-bound" in why


def test_where_the_host_did_not_set_the_pace_at_most_the_devices_idle_time():
    # The device busy 180 of 260 us by its samples (an upper bound): idle 80
    # us or more; the user's 100 us a step is said at the 80.
    s = _snap(_line(30, 100e-6), device=180e-6, busy=None)
    [f] = [f for f in find(s) if f.kind == "per_step_host_work"]
    assert abs((f.seconds_per_step or 0) - 80e-6) < 1e-9
    assert "the device idle 31% of the step or more" in f.message


def test_few_intervals_or_a_small_share_are_not_said():
    few = _snap(_line(30, 60e-6, intervals=5))
    assert not [f for f in find(few) if f.kind == "per_step_host_work"]
    assert not_raised(few, few.sites[0]) == "5 sampled intervals (said from 8)"
    small = _snap(_line(89, 5e-6, generator=False, function="<module>"))
    assert not [f for f in find(small) if f.kind == "per_step_host_work"]
    assert "said from 5.0%" in not_raised(small, small.sites[0])


def test_plain_code_is_told_to_be_done_once_or_vectorised_not_a_generators_fix():
    s = _snap(_line(70, 90e-6, generator=False, function="augment"))
    [f] = [f for f in find(s) if f.kind == "per_step_host_work"]
    assert f.message.startswith("host code in augment() runs between steps at prog.py:70")
    assert "generator" not in f.message and "vectorise it" in f.message


def test_an_older_hook_without_the_sites_reads_as_before():
    s = dataclasses.replace(_snap(), sites=())
    b = breakdown(s)
    assert b is not None and not [p for p in b.step_parts if p.name == "your code between steps"]


def test_on_a_busy_cpu_backend_host_work_is_an_upper_bound_at_information():
    # flax's seq2seq on the CPU backend at load 4-14 on 2 cores: get_batch
    # said 21-42 ms/step (68-100 % of the step, "the device waits for it")
    # where removing it saved 1.8 ms/step at load 2: XLA ran the step on the
    # same busy cores, and the interval's wall time held its waits for one.
    from tpu_info.contract.model import DeviceRecord, MemoryReading

    cpu = (DeviceRecord(0, "TFRT_CPU_0", "cpu", MemoryReading(None)),)
    s = dataclasses.replace(_snap(_line(30, 38e-6, detail="RandomState.choice")), devices=cpu)
    [free] = [f for f in find(s) if f.kind == "per_step_host_work"]
    assert free.severity.label == "warn" and "The device waits for it" in free.message
    queue = DistributionReading(catalog.TRAINING_THREAD_RUN_QUEUE, Unit.NUMBER, 9, 9 * 60.0,
                                50.0, 70.0, percentiles=((50.0, 60.0),))
    busy = dataclasses.replace(s, distributions=(*s.distributions, queue))
    [f] = [f for f in find(busy) if f.kind == "per_step_host_work"]
    assert f.severity.label == "info" and f.seconds_per_step == free.seconds_per_step
    assert "an upper bound" in f.message and "waited for a core 60%" in f.message
    assert "The device waits for it" not in f.message


def test_eager_torch_on_the_cpu_its_host_work_is_step_time_with_torchs_fixes():
    # charrnn (issue 41): randomTrainingExample() at the loop's line, 145 us of
    # a ~1.9 ms step by split timing; no device time to compare, no thread's
    # CPU share: eager torch on the CPU runs every op on the host.
    from tpu_info.contract.model import ProcessRecord

    steps = StepsReading(15_000, "inferred", "backward(): 15,000 calls", 28.5,
                         first_unix=100.0, last_unix=128.5)
    site = dataclasses.replace(_line(181, 145e-6, generator=False, function="<module>",
                                     detail="randomTrainingExample()"),
                               first_seen_unix=100.1, last_seen_unix=128.4)
    s = Snapshot(0.0, uptime_seconds=30.0, steps=steps, sites=(site,),
                 process=ProcessRecord(1, "char_rnn.py", engine="torch_compile"))
    [f] = [f for f in find(s) if f.kind == "per_step_host_work"]
    assert f.location == "/w/prog.py:181" and 0.07 < (f.share_of_step or 0) < 0.08
    assert "DataLoader" in f.message and "jitted" not in f.message
    assert "randomTrainingExample()" in f.message and "eager PyTorch" in f.message
    # The same line in a JAX snapshot with nothing measured of its device: not said.
    jax = dataclasses.replace(s, process=ProcessRecord(1, "prog.py", engine="jax"))
    assert not [f for f in find(jax) if f.kind == "per_step_host_work"]


def test_a_lines_copies_are_its_eager_work_findings_not_a_transfer_finding():
    # equinox's parallelism example: eqx.filter_shard of each numpy batch at
    # one line, an eager call that copies the batch: the copies' advice (put
    # the data set on the device once) made the loop 56 % slower (issue 41).
    eager = SiteReading("eager_work", "/w/prog.py:96", 60, seconds=120e-6 * 60,
                        function="<module>", detail="equinox filter_shard", timed=60,
                        occurrences=60, first_seen_unix=100.1, last_seen_unix=102.5,
                        phase="step")
    copies = SiteReading("implicit_to_device", "/w/prog.py:96", 20_000, bytes=512 * 20_000,
                         seconds=20_000 * 8e-6, detail="jax.device_put", timed=20_000,
                         timed_bytes=512 * 20_000, occurrences=10_000, first_seen_unix=100.0,
                         last_seen_unix=102.6, phase="step")
    before = [f.kind for f in find(_snap(copies))]
    assert "per_step_implicit_transfer" in before, before
    found = [f.kind for f in find(_snap(eager, copies))]
    assert "per_step_eager_work" in found and "per_step_implicit_transfer" not in found, found

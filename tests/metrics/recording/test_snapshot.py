"""metrics.snapshot: an engine's own readings merged with the registry's,
and one clock for the times a snapshot carries."""

from __future__ import annotations

import numpy as np

from metrics.engines._foreign import distribution as foreign_distribution
from metrics.engines.base import EngineBase
from metrics.recording.recorder import Recorder
from metrics.recording.registry import Registry
from metrics.recording.snapshot import build
from tpu_info.contract import catalog
from tpu_info.contract.model import (
    PERCENTILES,
    CounterReading,
    DistributionReading,
    Unit,
)
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import codec as wire
from tpu_info.wire import encoder


class _OwnReadings(EngineBase):
    """An engine that keeps a metric of its own (as torch_xla does)."""

    name = "own"
    keeps_readings = True

    def __init__(self, dists: list[DistributionReading]) -> None:
        super().__init__()
        self.dists = dists

    def extra_readings(self) -> tuple[list[CounterReading], list[DistributionReading]]:
        return [], self.dists


def _observed(values: np.ndarray) -> DistributionReading:
    reg = Registry()
    d = reg.distribution(catalog.COMPILE_TIME, Unit.TIME_NS)
    for v in values:
        d.observe(float(v))
    (reading,) = reg.snapshot()[1]
    return reading


def test_a_merged_distribution_keeps_its_buckets_through_the_wire() -> None:
    rng = np.random.default_rng(7)
    ours, theirs = rng.lognormal(15, 1, 2_000), rng.lognormal(18, 0.5, 500)
    rec = Recorder()
    own = rec.distribution(catalog.COMPILE_TIME)
    for v in ours:
        own.observe(float(v))
    snap = build(rec, [_OwnReadings([_observed(theirs)])])
    d = snap.distribution(catalog.COMPILE_TIME)
    assert d is not None and d.count == len(ours) + len(theirs)
    assert d.buckets is not None, "the merge dropped the buckets"
    b = d.buckets
    assert sum(b.positive.values()) + sum(b.negative.values()) + b.zero == d.count
    both = np.concatenate([ours, theirs])
    for p, v in d.percentiles:  # from the added buckets, not from the larger part
        want = float(np.percentile(both, p))
        assert abs(v - want) <= 0.01 * want, (p, v, want)
    assert [p for p, _ in d.percentiles] == list(PERCENTILES)
    decoded = wire.snapshot_from_proto(pb.Snapshot.FromString(encoder.snapshot_to_bytes(snap)))
    got = decoded.distribution(catalog.COMPILE_TIME)
    assert got is not None and got.buckets is not None
    assert dict(got.buckets.positive) == dict(b.positive)


def test_a_part_without_buckets_leaves_the_merge_without_buckets() -> None:
    rec = Recorder()
    rec.distribution(catalog.COMPILE_TIME).observe(1e6)
    engine_metric = foreign_distribution(catalog.COMPILE_TIME, Unit.TIME_NS, 3, 6e6,
                                         [(1.0, 1e6), (2.0, 2e6), (3.0, 3e6)])
    d = build(rec, [_OwnReadings([engine_metric])]).distribution(catalog.COMPILE_TIME)
    assert d is not None and d.count == 4 and d.buckets is None
    assert d.percentiles == engine_metric.percentiles  # the larger part's


def test_an_event_and_its_sample_carry_one_time() -> None:
    """Steps are dated once: the step event and StepTime's sample of the same
    step agree to the last bit (one monotonic -> unix offset, not two)."""
    rec = Recorder()
    for _ in range(3):
        rec.mark_step()
    snap = build(rec)
    steps = [e.time_unix for e in snap.events if e.kind == "step"]
    step_time = snap.distribution(catalog.STEP_TIME)
    assert step_time is not None and len(steps) == 3
    assert [t for t, _ in step_time.recent] == steps[1:]

"""Builds a :class:`tpu_info.contract.model.Snapshot` from a recorder at scrape time.

All expensive work (percentiles, device memory, copies) happens here, on the
caller's thread, never on the program's hot path.

What it reads of an engine is a :class:`~metrics.recording.sources.Source`,
declared in recording and met by every engine adapter: recording never
imports the engines; the caller (``metrics``' installed engines) hands them in.
Engines that keep their own counters (torch._lazy, torch_xla) contribute
them here through :meth:`~metrics.recording.sources.Source.extra_readings`, read now and
merged with the registry's by name: counters of the same name add up (each
source counts different events: our hooks never count what the engine
counts), except ``MarkStep``, where several markers may mark the same steps
and the larger count wins; distributions of the same name add counts and
totals, and their buckets when both have buckets of one width (percentiles
then come from the added buckets; else from the larger one, with no buckets).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from dataclasses import replace

from metrics.recording import ranks, whoami
from metrics.recording.ranks import Rank
from metrics.recording.recorder import Recorder
from metrics.recording.sources import Source
from tpu_info.contract import catalog as names
from tpu_info.contract.buckets import merge_buckets, percentiles
from tpu_info.contract.model import (
    PERCENTILES,
    STEPS_MARKED,
    BucketCounts,
    CounterReading,
    DeviceRecord,
    DistributionReading,
    ProcessRecord,
    Samples,
    SiteReading,
    Snapshot,
    StepsReading,
)
from tpu_info.contract.phases import phase_of

_process_cache: dict[tuple[object, ...], ProcessRecord] = {}


def process_record(recorder: Recorder, engines: Iterable[Source],
                   waiting: Iterable[str] = ()) -> ProcessRecord:
    """Who this process is; built once per set of engines hooked and waited
    for (and after a fork)."""
    engines = list(engines)
    wait = ",".join(waiting)
    rank = job_rank(engines)
    key = (os.getpid(), ",".join(e.name for e in engines), tuple(sys.argv),
           recorder.start_time_unix, wait, rank)
    cached = _process_cache.get(key)
    if cached is None:
        if len(_process_cache) > 8:
            _process_cache.clear()
        cached = _process_cache[key] = replace(
            _build_process_record(recorder, engines, wait),
            process_index=rank.index if rank else None, process_count=rank.count if rank else None,
            process_index_source=rank.source if rank else "")
    return cached


def job_rank(engines: Iterable[Source]) -> Rank | None:
    """This process's rank, read now (a program may join its process group
    after install()): the first engine that knows of more than one process,
    else ``$RANK``, else what an engine said (rank 0 of 1)."""
    single = None
    for e in engines:
        try:
            rank = e.rank()
        except Exception:  # noqa: BLE001 - a rank probe never breaks a scrape
            rank = None
        if rank is not None and (rank.count or 0) > 1:
            return rank
        single = single or rank
    return ranks.from_environment() or single


def _build_process_record(recorder: Recorder, engines: list[Source],
                          waiting: str = "") -> ProcessRecord:
    versions: dict[str, str] = {"python": sys.version.split()[0]}
    for e in engines:
        try:
            versions.update(e.versions())
        except Exception:  # noqa: BLE001 - a version probe never breaks a scrape
            pass
    argv = whoami.argv()
    return ProcessRecord(
        pid=os.getpid(),
        name=whoami.program(argv),
        argv=argv,
        host=whoami.host(),
        user=whoami.user(),
        engine=",".join(e.name for e in engines),
        waiting=waiting,
        versions=versions,
        start_time_unix=recorder.start_time_unix,
    )


_MAX_MERGED = frozenset({names.MARK_STEP})


def _merge_counter(a: CounterReading, b: CounterReading) -> CounterReading:
    value = max(a.value, b.value) if a.name in _MAX_MERGED else a.value + b.value
    return replace(a, value=value, help=a.help or b.help)


def _merge_distribution(a: DistributionReading, b: DistributionReading) -> DistributionReading:
    if not b.count:
        return a
    if not a.count:
        return b
    mins = [v for v in (a.min, b.min) if v is not None]
    maxs = [v for v in (a.max, b.max) if v is not None]
    rates = [r for r in (a.rate_per_second, b.rate_per_second) if r is not None]
    vrates = [r for r in (a.value_rate_per_second, b.value_rate_per_second) if r is not None]
    count, lo, hi = a.count + b.count, min(mins) if mins else None, max(maxs) if maxs else None
    buckets = _merged_buckets(a, b)
    if buckets is not None:
        pct = tuple(zip(PERCENTILES, percentiles(buckets, count, PERCENTILES, lo, hi),
                        strict=True))
    else:
        pct = (a if a.count >= b.count else b).percentiles
    return replace(
        a, count=count, total=a.total + b.total, min=lo, max=hi,
        rate_per_second=sum(rates) if rates else None,
        value_rate_per_second=sum(vrates) if vrates else None,
        percentiles=pct,
        recent=Samples.of(sorted([*a.recent, *b.recent])[-64:]),
        buckets=buckets, help=a.help or b.help,
        # Two sources' series cannot be interleaved: the one that saw more.
        series=max((x.series for x in (a, b) if x.series is not None),
                   key=lambda r: r.count, default=None),
    )


def _merged_buckets(a: DistributionReading, b: DistributionReading) -> BucketCounts | None:
    """Both parts' buckets added, when each part holds all its samples in
    buckets of one width; else None (an engine's own metric keeps no buckets)."""
    if a.buckets is None or b.buckets is None:
        return None
    try:
        return merge_buckets((a.buckets, b.buckets))
    except ValueError:  # different bucket widths cannot be added
        return None


def readings(
    recorder: Recorder, engines: Iterable[Source] = ()
) -> tuple[tuple[CounterReading, ...], tuple[DistributionReading, ...]]:
    """The registry's counters and distributions merged with every engine's
    own (see the module docstring), sorted by name."""
    counters, dists = recorder.registry.snapshot()
    c_map = {c.name: c for c in counters}
    d_map = {d.name: d for d in dists}
    for e in engines:
        if not e.keeps_readings:
            continue
        try:
            more_c, more_d = e.extra_readings()
        except Exception as err:  # noqa: BLE001 - an engine's readings never break a scrape
            recorder.hook_failed(f"{e.name}.readings", err)
            continue
        for c in more_c:
            c_map[c.name] = _merge_counter(c_map[c.name], c) if c.name in c_map else c
        for d in more_d:
            d_map[d.name] = _merge_distribution(d_map[d.name], d) if d.name in d_map else d
    return (tuple(c_map[k] for k in sorted(c_map)), tuple(d_map[k] for k in sorted(d_map)))


def _marked_steps(recorder: Recorder, counters: tuple[CounterReading, ...],
                  dists: tuple[DistributionReading, ...]) -> StepsReading | None:
    marks = next((c.value for c in counters if c.name == names.MARK_STEP), 0)
    if not marks:
        return None
    step_time = next((d for d in dists if d.name == names.STEP_TIME), None)
    total = step_time.total / 1e9 if step_time is not None and step_time.count else None
    if step_time is not None and step_time.count and step_time.count != marks:
        total = total / step_time.count * marks if total is not None else None
    first_unix = last_unix = None
    first, last = recorder.first_step_ns, recorder.last_step_ns
    if first is not None and last is not None:
        # A mark ends a step: the loop began one (mean) step before the first.
        mean = total / marks if total is not None else 0.0
        first_unix = first / 1e9 + recorder.mono_to_unix - mean
        last_unix = last / 1e9 + recorder.mono_to_unix
    return StepsReading(count=marks, source=STEPS_MARKED, seconds_total=total,
                        basis="metrics.mark_step / metrics.track, or the engine's own steps",
                        first_unix=first_unix, last_unix=last_unix)


def diagnosis(recorder: Recorder, engines: list[Source], counters: tuple[CounterReading, ...],
              dists: tuple[DistributionReading, ...]) -> tuple[
                  tuple[SiteReading, ...], StepsReading | None, tuple[str, ...]]:
    """Every engine's sites (costliest first, each with its phase), the steps
    and blind spots; an engine that fails here is counted in ``HookErrors``
    and skipped. Steps the program marked (``metrics.mark_step``) win over an
    engine's inference (its optimizer's steps, its step function's calls),
    which wins over an engine's own ``MarkStep`` count: torch_xla counts
    every sync, and a step of ``torch_xla.compile(step_fn)`` under a device
    loader syncs three times."""
    sites: list[SiteReading] = []
    blind: list[str] = []
    marked = _marked_steps(recorder, counters, dists)
    steps = marked if recorder.first_step_ns is not None or recorder.steps_so_far() else None
    for e in engines:
        try:
            sites.extend(e.sites())
            if steps is None:
                steps = e.steps()
            blind.extend(e.blind_spots())
        except Exception as err:  # noqa: BLE001 - diagnosis never breaks a scrape
            recorder.hook_failed(f"{e.name}.diagnosis", err)
    if steps is None:
        steps = marked
    sites.sort(key=lambda x: (-x.seconds, -x.count, x.location))
    if steps is not None:  # each line's phase, told now that the step loop is known
        untold = [not x.phase for x in sites]
        sites = [replace(x, phase=phase_of(x.first_seen_unix or x.last_seen_unix,
                                           x.last_seen_unix, x.occurrences or x.count,
                                           steps).value)
                 if not x.phase else x for x in sites]
        # What sat in a gap of the loop (an evaluation's batches and reads) is
        # in that gap's phase, however often its own records changed step.
        gap_phase = {x.location: x.phase for x in sites if x.work and x.gaps}
        sites = [replace(x, phase=gap_phase[x.within])
                 if new and x.within and x.within in gap_phase else x
                 for x, new in zip(sites, untold, strict=True)]
    return tuple(sites), steps, tuple(dict.fromkeys(blind))


def build(
    recorder: Recorder,
    engines: Iterable[Source] = (),
    events_since: int = 0,
    max_events: int | None = 1000,
    waiting: Iterable[str] = (),
) -> Snapshot:
    """A whole snapshot: process, devices, counters, distributions, graphs,
    and the events after ``events_since``; ``waiting``: engines the hook
    waits for (not imported yet)."""
    engines = list(engines)
    counters, dists = readings(recorder, engines)
    evicted = recorder.ledger.evicted
    if evicted:
        counters = tuple(sorted(
            counters + (CounterReading(names.GRAPHS_EVICTED, evicted,
                                       help=names.help_for(names.GRAPHS_EVICTED)),),
            key=lambda c: c.name,
        ))
    devices: list[DeviceRecord] = []
    seen: set[tuple[str, int]] = set()
    for e in engines:
        try:
            found = e.devices()
        except Exception as err:  # noqa: BLE001
            recorder.hook_failed(f"{e.name}.devices", err)
            continue
        for d in found:
            # Two engines in one process (JAX and torch) see the same host
            # CPU; the first engine's reading of a device wins.
            if (d.platform, d.id) not in seen:
                seen.add((d.platform, d.id))
                devices.append(d)
    # last_seq as the events were read, not after diagnosis: a reader asks next
    # for the events after it, and would skip any emitted in between.
    events, _dropped, last_seq = recorder.events.since_through(events_since, limit=max_events)
    sites, steps, blind_spots = diagnosis(recorder, engines, counters, dists)
    now = time.time()
    return Snapshot(
        taken_at_unix=now,
        process=process_record(recorder, engines, waiting),
        devices=tuple(devices),
        counters=counters,
        distributions=dists,
        graphs=recorder.ledger.snapshot(),
        events=tuple(events),
        last_seq=last_seq,
        uptime_seconds=now - recorder.start_time_unix,
        sites=sites,
        steps=steps,
        blind_spots=blind_spots,
    )

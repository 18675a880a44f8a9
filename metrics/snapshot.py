"""Builds a :class:`tpu_info.model.Snapshot` from a recorder at scrape time.

All expensive work (percentiles, device memory, copies) happens here, on the
caller's thread, never on the program's hot path.
"""

from __future__ import annotations

import getpass
import os
import socket
import sys
import time
from typing import Iterable

from tpu_info.model import CounterReading, DeviceRecord, ProcessRecord, Snapshot

from metrics import names
from metrics.engines import Engine
from metrics.recorder import Recorder


def process_record(recorder: Recorder, engines: Iterable[Engine]) -> ProcessRecord:
    engines = list(engines)
    versions: dict[str, str] = {"python": sys.version.split()[0]}
    for e in engines:
        try:
            versions.update(e.versions())
        except Exception:  # noqa: BLE001 - a version probe never breaks a scrape
            pass
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001
        user = str(os.getuid())
    argv = tuple(sys.argv)
    return ProcessRecord(
        pid=os.getpid(),
        name=os.path.basename(argv[0]) if argv and argv[0] else "python",
        argv=argv,
        host=socket.gethostname(),
        user=user,
        engine=",".join(e.name for e in engines),
        versions=versions,
        start_time_unix=recorder.start_time_unix,
    )


def build(
    recorder: Recorder,
    engines: Iterable[Engine] = (),
    events_since: int = 0,
    max_events: int | None = 1000,
) -> Snapshot:
    """A whole snapshot: process, devices, counters, distributions, graphs,
    and the events after ``events_since``."""
    engines = list(engines)
    counters, dists = recorder.registry.snapshot()
    evicted = recorder.ledger.evicted
    if evicted:
        counters = tuple(sorted(
            counters + (CounterReading(names.GRAPHS_EVICTED, evicted,
                                       help=names.help_for(names.GRAPHS_EVICTED)),),
            key=lambda c: c.name,
        ))
    devices: list[DeviceRecord] = []
    for e in engines:
        try:
            devices.extend(e.devices())
        except Exception as err:  # noqa: BLE001
            recorder.hook_failed(f"{e.name}.devices", err)
    events, _dropped = recorder.events.since(events_since, limit=max_events)
    now = time.time()
    return Snapshot(
        taken_at_unix=now,
        process=process_record(recorder, engines),
        devices=tuple(devices),
        counters=counters,
        distributions=dists,
        graphs=recorder.ledger.snapshot(),
        events=tuple(events),
        last_seq=recorder.events.last_seq,
        uptime_seconds=now - recorder.start_time_unix,
    )

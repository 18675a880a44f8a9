"""Every ``jax.monitoring`` record, by its own name, bounded.

User code and libraries (checkpointing, data loading, orbax, grain) report
through ``jax.monitoring``; JAX reports its own compile stages there too. The
hook's listeners (one of each kind, registered once per process) keep:

* ``record_event(name)`` -> a counter ``name`` (``/jax/compilation_cache/cache_hits``);
* ``record_event_duration_secs(name, s)`` -> a time distribution ``name``, in ns
  (``/myapp/checkpoint/save``): ``metrics_report()`` prints it as torch_xla
  prints ``CompileTime``, Prometheus as ``tpu_info_myapp_checkpoint_save_seconds``;
* ``record_scalar(name, v)`` -> a plain-number distribution ``name``, except
  the start times JAX records as scalars under its own ``*_duration`` names.

Keyword labels (``fun_name=...``) are not kept: they would make a series per
function. At most :data:`MAX_NAMES` distinct names are kept; records under
any further name count in ``JaxMonitoringDropped``. A name used for both a
duration and a scalar keeps the second under ``name:scalar`` (or
``name:duration``), so one metric has one unit. Time spans
(``record_event_time_span``) are not listened to: JAX records a duration with
each of its own.

A record costs one dict lookup and the metric's O(1) record (a list append);
a new name takes a lock once.

Example:
    >>> from metrics.engines.jax.context import JaxContext
from metrics.recording.recorder import Recorder
    >>> rec = Recorder()
    >>> m = MonitoringRecords(rec)
    >>> m.duration("/myapp/checkpoint/save", 0.2)
    >>> rec.registry.metric_data("/myapp/checkpoint/save")[:2]
    (1, 200000000.0)
"""

from __future__ import annotations

import threading
from typing import Any

from metrics.engines.jax.context import JaxContext
from metrics.recording.recorder import Recorder
from metrics.recording.registry import Counter, Distribution
from tpu_info.contract import catalog as names
from tpu_info.contract.model import Unit

MAX_NAMES = 256

_HELP = {
    "counter": "jax.monitoring event {name}: times recorded.",
    "duration": "jax.monitoring duration {name}.",
    "scalar": "jax.monitoring scalar {name}.",
}


class MonitoringRecords:
    """The metrics of one recorder's ``jax.monitoring`` records."""

    def __init__(self, rec: Recorder, max_names: int = MAX_NAMES) -> None:
        self.rec = rec
        self.max_names = max_names
        self._events: dict[str, Counter] = {}
        self._durations: dict[str, Distribution] = {}
        self._scalars: dict[str, Distribution] = {}
        self._kept = 0
        self._lock = threading.Lock()
        self._dropped = rec.counter(names.MONITORING_DROPPED)

    # The listeners' side (each record of the program) -------------------------

    def event(self, name: str) -> None:
        c = self._events.get(name)
        if c is None and (c := self._new(self._events, name, "counter")) is None:
            return
        c.inc()

    def duration(self, name: str, seconds: float) -> None:
        d = self._durations.get(name)
        if d is None and (d := self._new(self._durations, name, "duration")) is None:
            return
        d.observe(seconds * 1e9)

    def scalar(self, name: str, value: float) -> None:
        d = self._scalars.get(name)
        if d is None:
            if name.startswith("/jax/") and name.endswith("_duration"):
                return  # JAX's own: the start time of the duration of that name
            if (d := self._new(self._scalars, name, "scalar")) is None:
                return
        d.observe(value)

    # New names (once each) ----------------------------------------------------

    def _new(self, table: dict[str, Any], name: str, kind: str) -> Any:
        """The metric for ``name`` in ``table``, made now; None (counted as
        dropped) past ``max_names`` or for a name that is not a string."""
        with self._lock:
            made = table.get(name)
            if made is not None:
                return made
            if self._kept >= self.max_names or not isinstance(name, str):
                self._dropped.inc()
                return None
            made = self._make(name, kind)
            self._kept += 1
            table[name] = made
            return made

    def _make(self, name: str, kind: str) -> Counter | Distribution:
        key = f"jax.monitoring:{name}" if name in names.CATALOG else name
        if kind == "counter":
            return self.rec.counter(key, Unit.NUMBER, _HELP[kind].format(name=name))
        unit = Unit.TIME_NS if kind == "duration" else Unit.NUMBER
        existing = self.rec.registry.existing_distribution(key)
        if existing is not None and existing.unit is not unit:
            key = f"{key}:{kind}"  # the name's other kind came first
        return self.rec.distribution(key, unit, _HELP[kind].format(name=name))


def listen(context: JaxContext) -> list[str]:
    """Registers the listeners with ``jax.monitoring``, once per process
    (JAX cannot unregister them): each hands its record to the installed
    engine (``context.active``: its :class:`MonitoringRecords`, and its
    compiles for JAX's own durations and cache hits), nothing while none is.
    Returns what could not be listened to, in words."""
    if context.listeners_missing is not None:
        return list(context.listeners_missing)
    import jax.monitoring as mon

    def on_duration(event: str, duration_secs: float, **kw: str | int) -> None:
        eng = context.active
        if eng is not None:
            try:
                eng.monitoring.duration(event, duration_secs)
                fun_name = kw.get("fun_name")
                eng.compiles.on_duration(event, duration_secs,
                                         fun_name if isinstance(fun_name, str) else None)
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                eng.rec.hook_failed("jax.monitoring", e)

    def on_event(event: str, **_: str | int) -> None:
        eng = context.active
        if eng is not None:
            try:
                eng.monitoring.event(event)
                eng.compiles.on_event(event)
            except Exception as e:  # noqa: BLE001
                eng.rec.hook_failed("jax.monitoring", e)

    def on_scalar(event: str, value: float, **_: str | int) -> None:
        eng = context.active
        if eng is not None:
            try:
                eng.monitoring.scalar(event, value)
            except Exception as e:  # noqa: BLE001
                eng.rec.hook_failed("jax.monitoring", e)

    mon.register_event_duration_secs_listener(on_duration)
    mon.register_event_listener(on_event)
    missing = []
    add = getattr(mon, "register_scalar_listener", None)
    if add is None:
        missing.append("jax.monitoring scalars not recorded: "
                       "jax.monitoring.register_scalar_listener missing")
    else:
        add(on_scalar)
    context.listeners_missing = missing
    return list(missing)

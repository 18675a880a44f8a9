"""The torch_xla-style reading calls of :mod:`metrics` (``counter_names``,
``metric_data``, ``executed_fallback_ops``, ``clear_*``): the recorder's own
readings merged with those of engines that keep counters of their own
(torch._lazy, torch_xla), read when asked.

Example:
    >>> import metrics
    >>> from metrics.recording import readings
    >>> readings.counter_names(metrics.recorder(), metrics.installed_engines())  # doctest: +SKIP
    ['MarkStep']
"""

from __future__ import annotations

from collections.abc import Sequence

from metrics.recording import snapshot as _snapshot
from metrics.recording.recorder import Recorder
from metrics.recording.sources import Source


def _extra(engines: Sequence[Source]) -> list[Source]:
    """The engines that keep counters of their own (torch._lazy, torch_xla)."""
    return [e for e in engines if e.keeps_readings]


def counter_names(rec: Recorder, engines: Sequence[Source]) -> list[str]:
    """Counters that hold something, engines' own counters included."""
    extra = _extra(engines)
    if not extra:
        return rec.registry.counter_names()
    return [c.name for c in _snapshot.readings(rec, extra)[0]]


def counter_value(rec: Recorder, engines: Sequence[Source], name: str) -> int | None:
    """A counter's value (engines' own counters merged), None if it never counted."""
    extra = _extra(engines)
    if not extra:
        return rec.registry.counter_value(name)
    for c in _snapshot.readings(rec, extra)[0]:
        if c.name == name:
            return c.value
    return None


def metric_names(rec: Recorder, engines: Sequence[Source]) -> list[str]:
    """Metrics (distributions) that hold samples, engines' own included."""
    extra = _extra(engines)
    if not extra:
        return rec.registry.metric_names()
    return [d.name for d in _snapshot.readings(rec, extra)[1]]


def metric_data(rec: Recorder, engines: Sequence[Source],
                name: str) -> tuple[int, float, tuple[tuple[float, float], ...]] | None:
    """``(total_samples, accumulator, ((unix_time, value), ...))`` or None."""
    extra = _extra(engines)
    if not extra:
        return rec.registry.metric_data(name)
    for d in _snapshot.readings(rec, extra)[1]:
        if d.name == name:
            return (d.count, d.total, tuple(d.recent))
    return None


def clear(rec: Recorder, engines: Sequence[Source], *, counters: bool, metrics: bool) -> None:
    """Clears the recorder's counters and/or metrics and the engines' own."""
    if counters and metrics:
        rec.registry.clear_all()
    elif counters:
        rec.registry.clear_counters()
    elif metrics:
        rec.registry.clear_metrics()
    for e in _extra(engines):
        try:
            e.clear_readings(counters=counters, metrics=metrics)
        except Exception as err:  # noqa: BLE001
            rec.hook_failed(f"{e.name}.clear", err)

"""What an engine adapter is: :class:`Engine`, the typed protocol that
``metrics.install()`` and the report call (it extends
:class:`metrics.recording.sources.Source`, what the snapshot builder reads:
recording declares it, engines meet it), and
:class:`EngineBase`, the base class that gives every optional reading its
"nothing here" default.

An adapter subclasses :class:`EngineBase`, sets ``name`` (its entry in
:mod:`metrics.engines.registry`), defines :meth:`~Engine.install` and
:meth:`~Engine.uninstall`, and overrides only the readings it has. Every
method but ``install`` runs at scrape time on the server's (or report's)
thread; an exception there is counted in ``HookErrors`` and skipped by the
caller, never raised into the program.

Example:
    >>> class Quiet(EngineBase):
    ...     name = "quiet"
    ...     def install(self) -> None: ...
    ...     def uninstall(self) -> None: ...
    >>> e = Quiet()
    >>> e.sites(), e.steps(), e.blind_spots(), e.extra_readings(), e.keeps_readings, e.rank()
    ([], None, [], ((), ()), False, None)
    >>> isinstance(e, Engine)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from metrics.recording.ranks import Rank
from metrics.recording.sources import Readings, Source
from tpu_info.contract.model import (
    DeviceRecord,
    SiteReading,
    StepsReading,
)

__all__ = ["DeviceTrace", "Engine", "EngineBase", "Readings"]


class DeviceTrace(Protocol):
    """One window of an engine's own device profiler (``jax.profiler``,
    ``torch.profiler``: :mod:`metrics.engines.device_profilers`)."""

    # Whose profiler: engines that share a library start it once.
    library: str

    def start(self, folder: Path) -> None:
        """Starts recording into ``folder`` (raises when it cannot)."""

    def stop(self) -> tuple[list[Path], list[str]]:
        """Stops; returns the files written and notes about them."""


@runtime_checkable
class Engine(Source, Protocol):
    """One engine's adapter, as its callers see it: a
    :class:`~metrics.recording.sources.Source` the snapshot reads (devices,
    versions, own readings and their clearing, sites, steps, blind
    spots, rank), plus what
    ``metrics.install()`` and the profiler call."""

    # What the hook could not set up here (a private name missing, ...): one
    # reason each; shown as the engine's degraded notes, never raised.
    degraded: list[str]

    def install(self) -> None:
        """Installs the hooks (idempotent)."""

    def uninstall(self) -> None:
        """Removes the hooks; what was recorded stays."""

    def device_trace(self) -> DeviceTrace | None:
        """A new window of the engine's device profiler (None: it has none)."""


class EngineBase:
    """Defaults for every optional reading: an adapter overrides what it has."""

    name: str = ""
    keeps_readings: bool = False
    # The engine's device profiler (metrics.engines.device_profilers), if any.
    device_trace_kind: Callable[[], DeviceTrace] | None = None

    def __init__(self) -> None:
        self.degraded: list[str] = []

    def install(self) -> None:
        raise NotImplementedError

    def uninstall(self) -> None:
        raise NotImplementedError

    def devices(self) -> list[DeviceRecord]:
        return []

    def versions(self) -> dict[str, str]:
        return {}

    def extra_readings(self) -> Readings:
        return (), ()

    def clear_readings(self, counters: bool = True, metrics: bool = True) -> None:
        return None

    def sites(self) -> list[SiteReading]:
        return []

    def steps(self) -> StepsReading | None:
        return None

    def blind_spots(self) -> list[str]:
        return []

    def rank(self) -> Rank | None:
        return None

    def device_trace(self) -> DeviceTrace | None:
        return self.device_trace_kind() if self.device_trace_kind is not None else None
